"""The pytest run's own wing: what only a pytest run of the plugin uses (the session and its hooks, the files
it checks and writes, the report's run-level sections, pytest's JUnit XML and HTML page, markers, signals, what a
test hands the report). Suites and operators meet the modules at the package's root; nothing here is theirs."""
