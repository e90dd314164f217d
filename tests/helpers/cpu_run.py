"""One run of every shipped suite on the `cpu` SKU, as an operator runs it (`pytest suites/ --gb-sku=cpu`, JUnit XML
with the measurements, the JSON report, skip reasons), made once per test session and read by every test that
asserts on such a run: each suite's end-to-end test reads its own checks' results from it rather than running
the suite again. Under pytest-xdist the workers share it: the first that needs it runs it (about 25 s on an idle
2-core machine), holding a lock the others wait on, and each reads what it wrote."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.reports import schema_problems
from tests.helpers.runs import SUITES, XUNIT1, junit_cases

# The operator's command line, with every output a test reads; -rs lists the skip reasons.
COMMAND = [str(SUITES), "--gb-sku=cpu", *XUNIT1, "--gb-report=r.json", "-p", "no:cacheprovider", "-rs"]


@dataclass(frozen=True)
class CpuRun:
    """What the run left: its directory (r.xml, r.json, the busbw plot), exit status, terminal output, JUnit test
    cases by name (test names are unique across the suites) and the JSON report."""

    directory: Path
    returncode: int
    stdout: str
    cases: dict[str, dict[str, Any]]
    report: dict[str, Any]

    def measurements(self, suite: str) -> list[dict[str, Any]]:
        """The report's measurements made by the tests of suites/<suite> (e.g. `test_pretrain.py`)."""
        return [m for m in self.report["measurements"] if m["test_id"].startswith(f"suites/{suite}::")]

    def outcomes(self, suite: str) -> dict[str, int]:
        """How many of suites/<suite>'s tests passed, skipped, failed (the report has each test's deciding phase)."""
        counts = {"passed": 0, "skipped": 0, "failed": 0}
        for test in self.report["tests"]:
            if test["test_id"].startswith(f"suites/{suite}::"):
                counts[test["outcome"]] += 1
        return counts


def shared_directory(config: pytest.Config, factory: pytest.TempPathFactory) -> Path:
    """The session's base temporary directory, the one xdist's workers share (each has its own under it)."""
    base = factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


def run_once(
    config: pytest.Config,
    factory: pytest.TempPathFactory,
    name: str,
    args: list[str],
    files: dict[str, str] | None = None,
) -> tuple[Path, int, str]:
    """`python -m pytest ARGS` run once this session in a directory of its own, <shared base>/<name>, with FILES
    written there first (and it on PYTHONPATH), by the first xdist worker that asks (the others wait on its lock,
    then read what it left): (directory, exit status, output)."""
    root = shared_directory(config, factory)
    directory = root / name
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = root / f"{name}.done.json"
        if not done.exists():
            directory.mkdir(exist_ok=True)
            for file, text in (files or {}).items():
                (directory / file).write_text(text)
            clean = {k: v for k, v in os.environ.items() if not k.startswith(("GBVALIDATE_", "PYTEST_"))}
            command = [sys.executable, "-m", "pytest", *args]
            path = os.pathsep.join([str(directory), *filter(None, [clean.get("PYTHONPATH")])])
            run = subprocess.run(
                command, cwd=directory, env=clean | {"PYTHONPATH": path}, capture_output=True, text=True, timeout=600
            )
            done.write_text(json.dumps({"returncode": run.returncode, "stdout": run.stdout + run.stderr}))
        finished = json.loads(done.read_text())
    return directory, int(finished["returncode"]), str(finished["stdout"])


def cpu_run(config: pytest.Config, factory: pytest.TempPathFactory) -> CpuRun:
    directory, returncode, stdout = run_once(config, factory, "cpu-run", COMMAND)
    assert (directory / "r.json").exists() and (directory / "r.xml").exists(), stdout
    problems = schema_problems(directory)
    assert not problems, "reports that do not fit the schema:\n" + "\n".join(problems)
    return CpuRun(
        directory=directory,
        returncode=returncode,
        stdout=stdout,
        cases=junit_cases(directory / "r.xml"),
        report=json.loads((directory / "r.json").read_text()),
    )


# Every check the shipped suites collect on the cpu SKU, with its level, printed at the end of collection.
LEVELS_PROBE = """\
from pytest_gbvalidate.run.markers import check_level


def pytest_collection_finish(session):
    for item in session.items:
        print("LEVEL", item.path.name, item.originalname, check_level(item))
"""


def suite_levels(config: pytest.Config, factory: pytest.TempPathFactory) -> list[tuple[str, str, str]]:
    """(file, test function, level) of every test the shipped suites collect on the cpu SKU, in order: one
    collection (`--collect-only`) a session, shared like the cpu run."""
    args = [str(SUITES), "--gb-sku=cpu", "-p", "levels_probe", "--collect-only", "-q", "-p", "no:cacheprovider"]
    _, returncode, stdout = run_once(config, factory, "suite-levels", args, {"levels_probe.py": LEVELS_PROBE})
    assert returncode == 0, stdout
    lines = [line.split() for line in stdout.splitlines() if line.startswith("LEVEL ")]
    return [(file, test, level) for _, file, test, level in lines]
