"""What the plugin costs a pytest run that does not use it.

Times `pytest --collect-only` on an unrelated test file in fresh processes, with the plugin loaded (as it is in
every run of an environment where it is installed) and with it disabled (`-p no:gbvalidate`), interleaved so
both see the same machine load. Prints the medians side by side.

    python benchmarks/startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def collect_once(project: Path, *extra: str) -> float:
    # With bytecode caching, as an installed package has it (pip compiles on install): where
    # PYTHONDONTWRITEBYTECODE is set, every process would compile our sources again and time that.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *extra],
        cwd=project,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        project = Path(tmp)
        (project / "test_unrelated.py").write_text("def test_a():\n    assert 1 + 1 == 2\n")
        with_plugin, without_plugin = [], []
        collect_once(project)  # warm the file cache
        for _ in range(args.runs):
            with_plugin.append(collect_once(project))
            without_plugin.append(collect_once(project, "-p", "no:gbvalidate"))
    on, off = statistics.median(with_plugin), statistics.median(without_plugin)
    print(f"pytest --collect-only, unrelated test file, median of {args.runs} fresh processes each")
    print(f"  without pytest-gbvalidate (-p no:gbvalidate): {off * 1e3:7.1f} ms")
    print(f"  with pytest-gbvalidate loaded:                {on * 1e3:7.1f} ms")
    print(f"  plugin cost:                                  {(on - off) * 1e3:+7.1f} ms ({(on / off - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
