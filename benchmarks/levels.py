"""What each level takes: the suites at --gb-level passive, quick, standard and full, side by side, on the SKU given.

Runs `pytest suites/ --gb-level=LEVEL` in a fresh process per level (interleaved over --runs rounds, so every
level sees the same machine load) and prints, per level, the median wall time of the whole process (pytest's and
torch's start-up included, as a prolog pays them), the checks' own time as the JSON report's `level_times` sums
it, how many tests ran, and the level's budget (which is for a 4-GPU ND GB200 v6 node, not this machine).

    python benchmarks/levels.py [--sku cpu] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_gbvalidate.levels import BUDGET_S, LEVELS, Level

SUITES = Path(__file__).resolve().parents[1] / "suites"


def run_level(level: Level, sku: str, report: Path) -> tuple[float, float, int, int]:
    """Wall seconds, the checks' summed seconds, tests run, pytest's exit status."""
    command = [sys.executable, "-m", "pytest", str(SUITES), f"--gb-sku={sku}", f"--gb-level={level}"]
    command += [f"--gb-report={report}", "-q", "-p", "no:cacheprovider"]
    start = time.perf_counter()
    status = subprocess.run(command, capture_output=True, check=False).returncode
    wall_s = time.perf_counter() - start
    data = json.loads(report.read_text())
    times = data.get("level_times", {})
    return wall_s, sum(t["duration_s"] for t in times.values()), sum(t["tests"] for t in times.values()), status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sku", default="cpu")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    results: dict[Level, list[tuple[float, float, int, int]]] = {level: [] for level in LEVELS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for level in LEVELS:
                results[level].append(run_level(level, args.sku, Path(tmp) / f"{level}.json"))
    print(f"pytest suites/ --gb-sku={args.sku} --gb-level=LEVEL, median of {args.runs} fresh process(es) each")
    print(f"  {'level':<9} {'wall s':>8} {'checks s':>9} {'tests':>6} {'exit':>5}  budget (4-GPU ND GB200 v6)")
    for level, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        checks = statistics.median(r[1] for r in runs)
        tests, status = runs[-1][2], runs[-1][3]
        print(f"  {level:<9} {wall:8.1f} {checks:9.1f} {tests:6d} {status:5d}  {BUDGET_S[level]:.0f} s")


if __name__ == "__main__":
    main()
