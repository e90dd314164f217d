"""How long the fleet summary of 20 node reports takes.

Makes 20 reports from one real report (`--report PATH`, else a fresh `pytest --gb-sku=cpu suites/` run of about
half a minute): hostnames node-01 to node-20, every numeric measurement scaled by a factor drawn uniformly within
+-2% (seeded), and node-07's host copy bandwidth 60% lower (past the 60% the `cpu` SKU needs to tell, as a log
ratio) so that the outputs have an outlier and a drain line. Then times `python -m pytest_gbvalidate.fleet
summary` in fresh processes, without and with --plots, interleaved, and the same in-process through `main()`: the
first call (which imports matplotlib) and the median of the rest.

    python benchmarks/fleet_summary.py [--report PATH] [--runs 7]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
NODES = 20
JITTER = 0.02  # the +-2% the values vary by between nodes
SLOW_NODE, SLOW_METRIC, SLOW_FACTOR = "node-07", "host_copy_bandwidth_gbps", 0.4


def real_report(directory: Path) -> Path:
    path = directory / "real.json"
    command = [sys.executable, "-m", "pytest", "--gb-sku=cpu", "suites/", "-q", "-p", "no:cacheprovider"]
    subprocess.run([*command, f"--gb-report={path}"], cwd=REPO, check=False, capture_output=True)
    if not path.exists():
        raise SystemExit(f"the cpu suites wrote no report at {path}")
    return path


def node_reports(source: dict[str, Any], directory: Path, nodes: int = NODES) -> list[Path]:
    rng = random.Random(0)  # noqa: S311 -- test data, seeded for repeatable figures
    directory.mkdir()
    paths = []
    for i in range(1, nodes + 1):
        report = copy.deepcopy(source)
        host = f"node-{i:02d}"
        report["node"]["hostname"] = host
        for m in report["measurements"]:
            if isinstance(m["value"], (int, float)):
                m["value"] *= 1 + rng.uniform(-JITTER, JITTER)
                if host == SLOW_NODE and m["metric"] == SLOW_METRIC:
                    m["value"] *= SLOW_FACTOR
        path = directory / f"{host}.json"
        path.write_text(json.dumps(report, indent=1))
        paths.append(path)
    return paths


def fresh_process(args: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one `python -m pytest_gbvalidate.fleet` process. The CPU
    time is what the wall time would be on an idle machine (the command is one thread), whatever else runs."""
    # With bytecode caching, as an installed package has it: otherwise every process compiles our sources again.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest_gbvalidate.fleet", *args], env=env, capture_output=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(done.stderr.decode())
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def in_process(args: list[str]) -> float:
    from pytest_gbvalidate.fleet.cli import main

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        main(args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, help="a real report to copy (default: run the cpu suites)")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        source_path = args.report or real_report(directory)
        source = json.loads(source_path.read_text())
        paths = node_reports(source, directory / "reports")
        size_kib = sum(p.stat().st_size for p in paths) / 1024
        summary = ["summary", *map(str, paths), "--out", str(directory / "out")]
        plots = [*summary, "--plots"]
        fresh_process(plots)  # warm the file cache and the bytecode
        with_plots, without_plots = [], []
        for _ in range(args.runs):
            with_plots.append(fresh_process(plots))
            without_plots.append(fresh_process(summary))
        first_s = in_process(plots)
        warm_s = [in_process(plots) for _ in range(args.runs)]
        warm_no_plots_s = [in_process(summary) for _ in range(args.runs)]
    gated = sum(1 for m in source["measurements"] if m.get("verdict") != "info")
    print(
        f"fleet summary of {NODES} reports ({len(source['measurements'])} measurements each, {gated} gated; "
        f"{size_kib:.0f} KiB in all), {sys.executable}"
    )
    print(f"python -m pytest_gbvalidate.fleet summary, median of {args.runs} fresh processes (os.getloadavg: ", end="")
    print(f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}):")
    for name, runs in (("default", without_plots), ("--plots", with_plots)):
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        wall, cpu = statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3
        print(f"  {name + ':':13} wall {wall:7.1f} ms (max {max(walls) * 1e3:.1f}), cpu {cpu:7.1f} ms")
    print("in-process main():")
    print(f"  first call, --plots (imports matplotlib):    {first_s * 1e3:7.1f} ms")
    print(f"  later calls, --plots, median of {args.runs}:          {statistics.median(warm_s) * 1e3:7.1f} ms")
    print(f"  later calls, default, median of {args.runs}:          {statistics.median(warm_no_plots_s) * 1e3:7.1f} ms")


if __name__ == "__main__":
    main()
