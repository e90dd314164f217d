# The plugin's own tests drive pytest in-process and in subprocesses through pytester.
pytest_plugins = ["pytester"]
