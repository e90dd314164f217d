"""What the health check's tests share: a stub `scontrol` that records its arguments, node reports with given test
records, and the environment a real health check run gets."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.helpers.reports import minimal_report

FAULT: dict[str, Any] = {"category": "gpu_hardware", "title": "GPU hardware fault", "disposition": "ISOLATE"}
FAULT |= {"action": "replace the GPU (drain the node, open a hardware ticket)", "why": "a GPU is missing"}


# What Slurm 22.05's `scontrol show node -o NODE` prints (one line; Reason= last, then who set it and when).
NODE_LINE = (
    "NodeName={node} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=2 NodeAddr=10.0.0.17 NodeHostName={node} "
    "Version=22.05.8 RealMemory=1 Sockets=2 Boards=1 State={state} ThreadsPerCore=1 Partitions=debug{reason}"
)


def stub_scontrol(
    directory: Path, status: int = 0, say: str = "", state: str = "IDLE", reason: str | None = None, config: str = ""
) -> Path:
    """An executable `scontrol` in `directory` that appends its arguments (a JSON list a line) to the file returned.
    `show node -o NODE` prints the node in `state` (with `reason`), `show config` prints `config`, as Slurm 22.05
    does; `update` writes `say` to stderr and exits `status`."""
    calls = directory / "scontrol.calls"
    script = directory / "scontrol"
    shown = "" if reason is None else f" Reason={reason} [root@2026-11-27T02:54:03]"
    line = NODE_LINE.format(node="{node}", state=state, reason=shown)
    script.write_text(
        f"#!{sys.executable}\nimport json, sys\n"
        f"with open({str(calls)!r}, 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1:3] == ['show', 'node']:\n"
        f"    print({line!r}.format(node=sys.argv[-1]))\n    sys.exit(0)\n"
        f"if sys.argv[1:3] == ['show', 'config']:\n    print({config!r})\n    sys.exit(0)\n"
        f"sys.stderr.write({say!r})\nsys.exit({status})\n"
    )
    script.chmod(0o755)
    return calls


def scontrol_calls(calls: Path) -> list[list[str]]:
    """The calls that change something (`update`): what was drained."""
    return [call for call in scontrol_asked(calls) if call[:1] == ["update"]]


def scontrol_asked(calls: Path) -> list[list[str]]:
    """Every call, questions (`show`) included."""
    return [json.loads(line) for line in calls.read_text().splitlines()] if calls.exists() else []


def record(test_id: str, outcome: str, when: str = "call", fault: dict[str, Any] | None = None) -> dict[str, Any]:
    test: dict[str, Any] = {"test_id": test_id, "when": when, "outcome": outcome, "duration_s": 0.1}
    test |= {"message": None if outcome == "passed" else f"{test_id} {outcome}", "text": None}
    return test if fault is None else test | {"fault": fault}


def report_with(tests: list[dict[str, Any]], **changes: Any) -> Any:
    """A finished report (as the writer makes them) with these test records and changes."""
    return minimal_report() | {"tests": tests} | changes


def run_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """The environment of a health check run in a test: none of this run's own pytest or gbvalidate settings, the
    stub scontrol first on PATH, temporary files under `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GBVALIDATE_", "PYTEST_", "SLURM"))}
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env |= {"PATH": f"{tmp_path}{os.pathsep}{env.get('PATH', '')}", "TMPDIR": str(tmp_path / "tmp")}
    return env | more
