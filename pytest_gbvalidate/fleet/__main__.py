"""`python -m pytest_gbvalidate.fleet`: the fleet summary's command line (cli.py)."""

import sys

from pytest_gbvalidate.fleet.cli import main

if __name__ == "__main__":
    sys.exit(main())
