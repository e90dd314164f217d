"""The benchmark scripts the plugin's tests load as modules: the GPU smoke run (benchmarks/gpu_smoke.py) and the
multi-rank harness (benchmarks/gpu_ranks.py)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.helpers.runs import REPO


def script(name: str) -> ModuleType:
    """benchmarks/<name>.py as the module `name` (in sys.modules: its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def gpu_smoke() -> ModuleType:
    return script("gpu_smoke")


def gpu_ranks() -> ModuleType:
    return script("gpu_ranks")
