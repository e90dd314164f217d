"""The `torch_version` marker stays honest: every module of the package (and of the suites) whose behaviour can
change with the torch release -- a version check, a probe of what torch has (`hasattr(torch, ...)`,
`getattr(dist, ...)`), or an API that moved or grew between the oldest torch admitted (2.9) and the newest
(`torch.accelerator`, pipelining, DTensor, compile, the private `_scaled_mm`) -- is listed in VERSIONED with the
test modules that reach it, and those carry the marker. CI's oldest-torch stage runs only the marked tests: a new
version-dependent branch without a marked test fails here."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("pytest_gbvalidate", "suites")

# Dotted names (after `import torch.distributed as dist` and the like are resolved) whose use depends on the release.
VERSIONED_NAMES = (
    "torch.__version__",
    "torch.accelerator",
    "torch.Event",
    "torch.compile",
    "torch._dynamo",
    "torch._scaled_mm",
    "torch.distributed.pipelining",
    "torch.distributed.tensor",
    "torch.distributed.device_mesh",
)
# Functions whose call is a version check of ours.
VERSION_CHECKS = ("torch_release",)

# Each version-dependent module, and the marked test modules that reach its version-dependent lines. The session's
# run of every suite on the cpu SKU (tests/helpers/cpu_run.py), read by marked tests, reaches every suite.
VERSIONED: dict[str, tuple[str, ...]] = {
    "pytest_gbvalidate/bench/aggregate.py": ("tests/unit/test_aggregate.py", "tests/e2e/test_node_suites.py"),
    "pytest_gbvalidate/bench/collectives.py": ("tests/unit/test_collectives.py", "tests/e2e/test_plugin_reports.py"),
    "pytest_gbvalidate/bench/gemm.py": ("tests/unit/test_gemm.py", "tests/e2e/test_plugin_reports.py"),
    "pytest_gbvalidate/bench/on_rank.py": ("tests/unit/test_aggregate.py", "tests/unit/test_triad.py"),
    "pytest_gbvalidate/bench/timing.py": ("tests/unit/test_collectives.py", "tests/e2e/test_plugin_reports.py"),
    "pytest_gbvalidate/node/nccl_stack.py": ("tests/e2e/test_node_suites.py",),
    "pytest_gbvalidate/ranks/gang.py": ("tests/unit/test_gang.py",),
    "pytest_gbvalidate/workloads/llama/fp8.py": ("tests/unit/test_llama_levers.py",),
    "pytest_gbvalidate/workloads/llama/generate.py": (
        "tests/unit/test_llama_generate.py",
        "tests/e2e/test_inference_suite.py",
    ),
    "pytest_gbvalidate/workloads/llama/model.py": ("tests/unit/test_llama_model.py",),
    "pytest_gbvalidate/workloads/llama/parallelize.py": ("tests/unit/test_llama_parallel.py",),
    "pytest_gbvalidate/workloads/llama/train.py": (
        "tests/unit/test_llama_parallel.py",
        "tests/unit/test_pretrain_engine.py",
        "tests/e2e/test_pretrain_suite.py",
        "tests/e2e/test_multinode.py",
    ),
}


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (`dist` -> `torch.distributed`)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    names[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _is_versioned(name: str) -> bool:
    return any(name == v or name.startswith(v + ".") for v in VERSIONED_NAMES)


def version_dependent_lines(source: str) -> list[str]:
    """What in `source` depends on the torch release, one entry per construct (its line and what it is)."""
    tree = ast.parse(source)
    aliases = _aliases(tree)
    chained = {id(p.value) for p in ast.walk(tree) if isinstance(p, ast.Attribute)}  # inner links of a chain
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and _is_versioned(node.module):
            found.append(f"{node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _is_versioned(a.name)]
        elif isinstance(node, ast.Attribute):
            name = _dotted(node, aliases)
            # the outermost attribute of a chain only (torch.accelerator.synchronize, not also torch.accelerator)
            if name and _is_versioned(name) and id(node) not in chained:
                found.append(f"{node.lineno}: {name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in VERSION_CHECKS:
                found.append(f"{node.lineno}: {node.func.id}()")
            elif node.func.id in ("hasattr", "getattr") and node.args:
                probed = _dotted(node.args[0], aliases)
                if probed and (probed == "torch" or probed.startswith("torch.")):
                    found.append(f"{node.lineno}: {node.func.id}({probed}, ...)")
    return found


def version_dependent_modules() -> dict[str, list[str]]:
    modules: dict[str, list[str]] = {}
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            lines = version_dependent_lines(path.read_text())
            if lines:
                modules[path.relative_to(REPO).as_posix()] = lines
    return modules


def test_the_scan_finds_each_kind_of_version_dependence() -> None:
    source = """\
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from pytest_gbvalidate.workloads.llama.train import torch_release

def f(device):
    torch.accelerator.synchronize(device)
    fn = getattr(dist, "all_gather_single", None)
    if hasattr(torch, "float8_e8m0fnu") or torch_release() < (2, 10):
        return torch.compile(f)
    return f"torch {torch.__version__}"
"""
    assert sorted(version_dependent_lines(source)) == [
        "10: torch.compile",
        "11: torch.__version__",
        "3: from torch.distributed.pipelining import",
        "7: torch.accelerator.synchronize",
        "8: getattr(torch.distributed, ...)",
        "9: hasattr(torch, ...)",
        "9: torch_release()",
    ]
    assert version_dependent_lines("import torch\nx = torch.ones(3).sum()\n# torch.compile in a comment\n") == []


def test_every_version_dependent_module_has_marked_tests() -> None:
    found = version_dependent_modules()
    unlisted = {module: lines for module, lines in found.items() if module not in VERSIONED}
    assert not unlisted, (
        "modules whose behaviour depends on the torch release, with no entry in VERSIONED (name the test modules "
        f"that reach these lines, and mark them `torch_version`): {unlisted}"
    )
    stale = sorted(set(VERSIONED) - set(found))
    assert not stale, f"VERSIONED lists modules with nothing version-dependent left: {stale}"


def test_the_listed_test_modules_carry_the_marker() -> None:
    for module, tests in VERSIONED.items():
        for test in tests:
            path = REPO / test
            assert path.is_file(), f"{module}: {test} does not exist"
            assert "pytest.mark.torch_version" in path.read_text(), f"{module}: {test} is not marked torch_version"
