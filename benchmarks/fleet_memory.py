"""The fleet summary's memory and time as the reports grow: 1,000 nodes' reports, and three reports of 45 MiB.

The 1,000 reports are copies of one real report (`--report PATH`, else a fresh `pytest --gb-sku=cpu suites/` run),
as benchmarks/fleet_summary.py makes its 20: hostnames node-0001 on, every numeric value within +-2%. The three
large ones are that report with each figure's sample series (the `samples_*` lists in a measurement's details, as a
long sweep writes them) grown until the file is 45 MiB. Each case runs `python -m pytest_gbvalidate.fleet summary`
in a fresh process and prints its peak resident memory (the child's ru_maxrss) and its wall time, with the
reports' size on disk; and the bare interpreter with the fleet's imports, for what the reports themselves add.

    python benchmarks/fleet_memory.py [--report PATH] [--nodes 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fleet_summary import node_reports, real_report

LARGE_MIB = 45


def fleet(args: list[str]) -> tuple[float, float]:
    """(peak resident MiB, wall seconds) of one fresh `python -m pytest_gbvalidate.fleet` process."""
    command = [sys.executable, "-c", _MEASURED, *args]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr)
    return float(done.stdout.strip().splitlines()[-1]), elapsed


# The child prints its own peak after the command: RUSAGE_CHILDREN would give the largest of all children so far.
_MEASURED = """
import contextlib, io, resource, sys
from pytest_gbvalidate.fleet.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(sys.argv[1:]) if len(sys.argv) > 1 else None
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def large_report(source: dict[str, Any], path: Path, host: str) -> Path:
    """`source` with its sample series grown until the file is LARGE_MIB."""
    report = json.loads(json.dumps(source))
    report["node"]["hostname"] = host
    series = [m["details"][k] for m in report["measurements"] for k in m["details"] if k.startswith("samples_")]
    if not series:
        raise SystemExit("the report has no sample series to grow")

    def grow(samples: int) -> int:
        for values in series:
            values.extend([values[0] if values else 1.0] * samples)
        return len(json.dumps(report, indent=1))

    before = len(json.dumps(report, indent=1))
    after = grow(100)  # what a sample more in every series adds, measured
    grow(int((LARGE_MIB * 2**20 - after) / ((after - before) / 100)))
    path.write_text(json.dumps(report, indent=1))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, help="a real report to copy (default: run the cpu suites)")
    parser.add_argument("--nodes", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        source_path = args.report or real_report(directory)
        source = json.loads(source_path.read_text())
        bare_mib, _ = fleet([])
        load = os.getloadavg()[0]
        print(f"interpreter with the fleet's imports: {bare_mib:.0f} MiB; {sys.executable}, load {load:.2f}")
        print(f"{'case':40} {'on disk':>10} {'peak RSS':>10} {'wall':>8}")
        paths = node_reports(source, directory / "nodes", args.nodes)
        large = [large_report(source, directory / f"large-{i}.json", f"big-{i}") for i in range(1, 4)]
        for name, given in ((f"{args.nodes} node reports", paths), (f"3 reports of {LARGE_MIB} MiB", large)):
            on_disk = sum(p.stat().st_size for p in given) / 2**20
            peak, wall = fleet(["summary", "--out", str(directory / "out"), *map(str, given)])
            print(f"{name:40} {on_disk:8.0f} MiB {peak:6.0f} MiB {wall:7.1f} s")
        print(f"one report: {source_path.stat().st_size / 1024:.0f} KiB, {len(source['measurements'])} measurements")


if __name__ == "__main__":
    main()
