"""The layout sweep: `python -m pytest_gbvalidate.layout_sweep --sku SKU --out DIR` trains every valid layout of a
grid of MBS, TP, PP and CP with the SKU's `pretrain` workload (cli.py). No pytest here."""
