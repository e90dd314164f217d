"""Soak: run the `cpu` suites over and over in one process and show that nothing leaks between runs.

    python benchmarks/soak.py [--runs 20] [--sku cpu] [-- extra pytest arguments]

Each run is `pytest.main` on the bundled suites (a fresh gang of ranks each time, JUnit and JSON reports written
to a temporary directory), in this one process, as a CI agent or an operator's loop would repeat the gate. After
each run it prints the exit status, this process's open file descriptors, its live child processes (gang ranks
not reaped; multiprocessing's one resource tracker aside), and the gang directories left in the temporary
directory. It exits non-zero when a run failed, when a child process or a gang directory is left after any run,
or when the descriptors grew from the first run to the last (the first run opens what stays open for good:
torch's, pytest's).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

SUITES = Path(__file__).resolve().parents[1] / "suites"


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def gang_dirs() -> list[str]:
    return sorted(p.name for p in Path(tempfile.gettempdir()).glob("gbvalidate-gang-*"))


def _resource_tracker(process: psutil.Process) -> bool:
    """multiprocessing's resource tracker: started with the first spawned rank, it lives as long as this process
    by design (one, however many runs)."""
    try:
        return "resource_tracker" in " ".join(process.cmdline())
    except psutil.Error:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--sku", default="cpu")
    parser.add_argument("extra", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args()
    leftover = gang_dirs()
    if leftover:
        print(f"gang directories present before the first run (not counted): {leftover}")
    rows, failures = [], []
    with tempfile.TemporaryDirectory() as out:
        for i in range(args.runs):
            junit, report = Path(out) / f"run{i}.xml", Path(out) / f"run{i}.json"
            # --assert=plain: a second pytest.main in one process cannot rewrite the modules it imported.
            argv = [str(SUITES), f"--gb-sku={args.sku}", "-q", "-p", "no:cacheprovider", "--assert=plain"]
            argv.append(f"--junitxml={junit}")
            exit_code = pytest.main([*argv, f"--gb-report={report}", *args.extra])
            children = [c for c in psutil.Process().children(recursive=True) if not _resource_tracker(c)]
            row = (i + 1, int(exit_code), open_fds(), len(children), [d for d in gang_dirs() if d not in leftover])
            rows.append(row)
            print(f"soak: run {row[0]}: exit {row[1]}, open fds {row[2]}, child processes {row[3]}, gang dirs {row[4]}")
            if exit_code != 0:
                failures.append(f"run {i + 1} exited {int(exit_code)}")
            if children or row[4]:
                failures.append(f"run {i + 1} left {len(children)} child process(es) and gang dirs {row[4]}")
    print("\nrun  exit  open_fds  children  gang_dirs")
    for run, code, fds, n_children, dirs in rows:
        print(f"{run:>3}  {code:>4}  {fds:>8}  {n_children:>8}  {len(dirs):>9}")
    if rows and rows[-1][2] > rows[0][2]:
        failures.append(f"open file descriptors grew from {rows[0][2]} after run 1 to {rows[-1][2]}")
    verdict = "\n".join(f"LEAK/FAIL: {f}" for f in failures) if failures else f"soak: {len(rows)} runs, nothing left"
    print("\n" + verdict)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
