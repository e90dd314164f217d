"""`python -m pytest_gbvalidate.layout_sweep`: the layout sweep's command line (cli.py)."""

from pytest_gbvalidate.layout_sweep.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
