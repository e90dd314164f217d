"""A node health check for Slurm and Kubernetes (`python -m pytest_gbvalidate.healthcheck slurm|npd`): a level of the
shipped suites run in a subprocess within a deadline (level_run), its report judged (verdict), one line printed and,
for Slurm, the node drained (slurm, npd, cli). No pytest here. Recipes: contrib/slurm/, contrib/kubernetes/."""
