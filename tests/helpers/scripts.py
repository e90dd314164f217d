"""The GPU smoke script (benchmarks/gpu_smoke.py), loaded as a module."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.helpers.runs import REPO

SCRIPT = REPO / "benchmarks" / "gpu_smoke.py"


def gpu_smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
