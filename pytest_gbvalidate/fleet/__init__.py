"""Fleet views of the nodes' run reports: `python -m pytest_gbvalidate.fleet summary REPORT.json... --out DIR`
gives one verdict per node, per-metric statistics across the nodes with robust outlier detection, multi-node
weak scaling, the nodes to take out of service (with Slurm drain and kubectl cordon, taint and label lines,
printed), and Markdown, CSV, JUnit and PNG outputs; `history` and `offenders` read the reports --gb-history kept.
Pure Python on the JSON reports: no pytest, no torch. Each module's docstring says its part.
"""
