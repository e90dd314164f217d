"""The JSON run report as a declared, versioned contract (records.py, report.schema.json), how it is written
(writer.py), and how it is shown: JUnit properties (junit_properties.py), the terminal summary (terminal.py), the
HTML page's fragments (html_fragments.py), and the collective sweeps' tables and busbw plot (collective_tables.py).
No pytest here."""
