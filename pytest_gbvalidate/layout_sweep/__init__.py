"""The layout sweep's command line: `python -m pytest_gbvalidate.layout_sweep --sku SKU --out DIR` trains every
valid layout of a grid of MBS, TP, PP and CP (workloads/llama/layout_grid.py) with the SKU's baseline's `pretrain`
workload and writes the table and plots. No pytest here."""
