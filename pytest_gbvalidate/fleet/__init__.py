"""Fleet views of the nodes' run reports: `python -m pytest_gbvalidate.fleet summary REPORT.json... --out DIR`
gives one verdict per node, per-metric statistics across the nodes with robust outlier detection, multi-node
weak scaling, the nodes to take out of service (with Slurm drain commands, printed), and Markdown, CSV, JUnit
and PNG outputs. Pure Python on the JSON reports: no pytest, no torch.

Modules: reports (reading and sorting the reports), stats (median, MAD, outliers), scaling (weak scaling),
summary (the summary as data, the exit code), render (Markdown, CSV, terminal), junit, plots, cli.
"""
