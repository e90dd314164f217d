"""The plugin's markers, applied at collection: `gb_gpu` (a check that needs NVIDIA GPUs, skipped on a SKU without
them) and `gb_level` (the level a check belongs to: --gb-level deselects the checks of the levels above); and the
warning filter that leaves a WARN to the reports."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_gbvalidate.levels import DEFAULT_LEVEL, LEVELS, MARKER, Level, LevelError, parse_level, runs

if TYPE_CHECKING:
    from pytest_gbvalidate.node.preconditions import Unmet

GPU_MARKER = "gb_gpu"
WARN_FILTER = "ignore::pytest_gbvalidate.hooks.GbValidateWarning"
# How our collection errors begin: pytest-xdist's controller gets a worker's as text, and ends the run as a usage error.
USAGE_ERROR = "gbvalidate usage error: "


def register(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{GPU_MARKER}: needs NVIDIA GPUs; skipped when the run checks the cpu SKU, run (and failed "
        "if the GPUs are missing) on every GPU SKU",
    )
    config.addinivalue_line(
        "markers",
        f"{MARKER}(level): the level a check belongs to, one of {', '.join(LEVELS)}; --gb-level runs a level's "
        "checks and those of the levels below it (a check with no level is a full check)",
    )


def leave_warns_to_the_reports(config: pytest.Config) -> None:
    """A WARN is the run's verdict, in every report, not a Python warning in pytest's warnings summary:
    GbValidateWarning is ignored unless the operator's filters name it (`-W
    error::pytest_gbvalidate.expect.GbValidateWarning` fails a test on a WARN; an ini file's `filterwarnings` too)."""
    named = [*config.getini("filterwarnings"), *(config.getoption("pythonwarnings", None) or [])]
    if not any("GbValidateWarning" in str(f) for f in named):
        config.addinivalue_line("filterwarnings", WARN_FILTER)


def narrowed_by(config: pytest.Config) -> list[str]:
    """What narrows a run's checks beyond its level, as given: pytest's -k and -m expressions, --deselect, and a
    test id (`path::test`) where a path names all the checks it holds. Empty: the level's whole selection."""
    option = config.option
    found = [f"-k {option.keyword!r}"] if getattr(option, "keyword", "") else []
    found += [f"-m {option.markexpr!r}"] if getattr(option, "markexpr", "") else []
    found += [f"--deselect {d}" for d in getattr(option, "deselect", None) or ()]
    rerun = getattr(option, "gb_rerun_failed", None)
    found += [f"--gb-rerun-failed {rerun}"] if rerun else []
    return found + [arg for arg in config.args if "::" in arg]


def check_level(item: pytest.Item) -> Level:
    """The level of a check: its closest `gb_level` marker's, else full (for items level_problems let through)."""
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return DEFAULT_LEVEL
    return parse_level(marker.args[0] if len(marker.args) == 1 and not marker.kwargs else None)


@functools.cache
def shipped_suites() -> Path | None:
    """The directory of the suites this package ships (pytest_gbvalidate.suites), None where it is not found."""
    spec = importlib.util.find_spec("pytest_gbvalidate.suites")
    locations = None if spec is None else spec.submodule_search_locations
    return Path(locations[0]).resolve() if locations else None


def holds_no_check_at(path: Path, run_level: Level) -> bool:
    """Whether the module at `path` holds no check a `run_level` run takes, read from its source without importing
    it: every `gb_level` mark in it names a level above `run_level` (a check with none is a full check). Such a
    module is not collected, so a passive run loads no torch (levels.py). A mark whose level is not a literal, or a
    source that does not parse, says nothing: the module is collected and its checks deselected as ever."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return False
    marked: list[Level] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == MARKER:
            arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
            if not isinstance(arg, ast.Constant):
                return False
            try:
                marked.append(parse_level(arg.value))
            except LevelError:
                return False  # collected, and named by level_problems
    return not any(runs(run_level, level) for level in marked or [DEFAULT_LEVEL])


def level_problems(nodes: list[pytest.Item | pytest.Collector]) -> str | None:
    """One line per collected check whose `gb_level` marker names no level (it would silently never run), or None:
    a collection error, which pytest-xdist's controller shows as its own (a usage error there is an INTERNALERROR)."""
    found = []
    for item in nodes:
        if not isinstance(item, pytest.Item):
            continue
        try:
            check_level(item)
        except LevelError as exc:
            marker = item.get_closest_marker(MARKER)
            assert marker is not None
            written = ", ".join([*map(repr, marker.args), *(f"{k}={v!r}" for k, v in marker.kwargs.items())])
            found.append(f"{item.nodeid}: @pytest.mark.{MARKER}({written}): {exc}")
    return "\n".join(found) or None


def select(
    config: pytest.Config,
    items: list[pytest.Item],
    run_level: Level,
    gpu_sku: str | None,
    unusable: Unmet | None = None,
) -> None:
    """Deselect the checks above `run_level`, as -m deselects; skip the GPU checks where the SKU (`gpu_sku`: its
    name when it has no GPUs) has none, and the checks that depend on a precondition the node's GPUs do not meet
    (`unusable`), naming it: the run fails once, for the precondition."""
    selected = {item: runs(run_level, check_level(item)) for item in items}
    if not all(selected.values()):
        config.hook.pytest_deselected(items=[item for item, kept in selected.items() if not kept])
        items[:] = [item for item, kept in selected.items() if kept]
    if unusable is not None:
        blocked = pytest.mark.skip(reason=unusable.skip_reason())
        for item in items:
            if unusable.blocks(item.get_closest_marker(GPU_MARKER) is not None, set(getattr(item, "fixturenames", ()))):
                item.add_marker(blocked)
    if gpu_sku is None:
        return
    skip = pytest.mark.skip(reason=f"needs NVIDIA GPUs; this run checks the {gpu_sku} SKU, which has none")
    for item in items:
        if item.get_closest_marker(GPU_MARKER) is not None:
            item.add_marker(skip)


def gangs_at_once(config: pytest.Config, items: list[pytest.Item]) -> str | None:
    """Why checks that start ranks cannot run here, or None: under pytest-xdist with more than one worker each
    worker would start a gang of its own, at once, on the same GPUs. A gang needs the whole node."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers <= 1:
        return None
    from pytest_gbvalidate.node.preconditions import RANK_FIXTURES

    ranked = [i.nodeid for i in items if RANK_FIXTURES & set(getattr(i, "fixturenames", ()))]
    if not ranked:
        return None
    return (
        f"{ranked[0]}{f' and {len(ranked) - 1} more' if len(ranked) > 1 else ''} start ranks on the node's GPUs, "
        f"and pytest-xdist runs {workers} workers, each of which would start a gang of its own at once: run "
        "them without -n (or with -n 0)"
    )
