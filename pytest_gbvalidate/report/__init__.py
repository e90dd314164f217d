"""The JSON run report as a declared, versioned contract (records.py, report.schema.json), how it is written
(writer.py), and how it is shown (terminal.py, html_fragments.py, junit_properties.py). No pytest here."""
