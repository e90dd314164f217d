"""The files a run reads and writes besides its tests, checked before anything runs: no output is an input of the
run or another of its outputs (files.py), a baseline is recorded only at the full level, this node's directory
in --gb-history, and the earlier report --gb-compare names (or `last`: the node's latest there). A problem is a
usage error naming the setting."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_gbvalidate import labels
from pytest_gbvalidate.run import junit_hooks
from pytest_gbvalidate.setting_values import SettingError, parse_output_path
from pytest_gbvalidate.settings import Settings

if TYPE_CHECKING:
    from pytest_gbvalidate.ranks.world import World
    from pytest_gbvalidate.report.earlier import EarlierReport, SameNode
    from pytest_gbvalidate.report.history import Entry
    from pytest_gbvalidate.report.records import WritableInputRecord
    from pytest_gbvalidate.target import Target


def check_outputs(config: pytest.Config, s: Settings, keeps_history: bool) -> Path | None:
    """Refuse a run whose outputs clash with its inputs or each other (--gb-record may replace the baseline the
    run reads, re-recording a SKU; nothing else may). This node's directory in --gb-history where this process
    keeps the reports (`keeps_history`: the controller), else None."""
    if s.record.value is not None and s.level.value != "full":
        # A recording holds only what the run measured: from part of the checks it would drop the rest.
        raise pytest.UsageError(
            f"{s.record.source}: a baseline is recorded from every check, at --gb-level full; "
            f"{s.level.source} asks for {s.level.value}"
        )
    from pytest_gbvalidate.files import clashes

    written = {s.report.source: s.report.value, "--junitxml on the command line": junit_hooks.junit_path(config)}
    written[s.prometheus.source] = s.prometheus.value
    written["--html on the command line"] = html_page_path(config)
    outputs = {k: v for k, v in written.items() if v is not None}
    recorded = {s.record.source: s.record.value} if s.record.value is not None else {}
    cwd = Path(config.invocation_params.dir)
    read = {f"the test path {arg}": cwd / arg.split("::")[0] for arg in config.args}
    read |= {f"the ini file {config.inipath}": config.inipath} if config.inipath is not None else {}
    read |= {s.compare.source: s.compare.value} if isinstance(s.compare.value, Path) else {}
    history_dir = None
    if s.history.value is not None and keeps_history:
        history_dir, kept = node_history(s)
        read |= {f"the history's {e.path}": e.path for e in kept}
    baselines = {f"the baseline {p}": p for p in sorted(s.baselines.value.glob("*.yaml"))}
    found = clashes({**outputs, **recorded}, read) + clashes(outputs, baselines)
    # pytest's and pytest-html's own files get --gb-report's checks: else a directory they cannot write in stops the
    # run with a traceback once every check has run.
    for source in ("--junitxml on the command line", "--html on the command line"):
        if (path := written[source]) is not None:
            try:
                parse_output_path(str(path), cwd)
            except SettingError as exc:
                found.append(f"{source}: {exc}")
    if s.history.value is not None:
        found += _inside_history(s, {**outputs, **recorded})
    if found:
        raise pytest.UsageError("\n".join(dict.fromkeys(found)))
    return history_dir


def _inside_history(s: Settings, outputs: dict[str, Path]) -> list[str]:
    """A line for each output inside the --gb-history directory: a file there under a report's name would be read
    as the node's report by the next --gb-compare=last or the fleet's history."""
    assert s.history.value is not None
    root = Path(os.path.realpath(s.history.value))
    return [
        f"{source}: {path} is inside the history directory {s.history.value} ({s.history.source}): the history "
        "holds only the reports the runs keep there"
        for source, path in outputs.items()
        if Path(os.path.realpath(path)).is_relative_to(root)
    ]


def check_record(s: Settings, target: Target) -> None:
    """--gb-record never replaces another SKU's baseline: a file of the baselines directory named for another SKU,
    or a baseline (anywhere) whose `sku` is another."""
    path = s.record.value
    if path is None:
        return
    from pytest_gbvalidate.baselines.loading import declared_sku
    from pytest_gbvalidate.files import same_file

    other = declared_sku(path)
    if other is None and os.path.lexists(path) and same_file(path.parent, target.baselines_dir):
        other = path.stem
    if other is not None and other != target.sku:
        raise pytest.UsageError(
            f"{s.record.source}: {path} is the baseline of SKU {labels.printable(other)!r}, and this run checks "
            f"{target.sku!r} ({target.source}): record a SKU's baseline on a node of that SKU, or name another file"
        )


def node_history(s: Settings) -> tuple[Path, list[Entry]]:
    """This node's directory in --gb-history (by its hostname, checked) and its reports, oldest first."""
    from pytest_gbvalidate.report import history

    root = s.history.value
    assert root is not None  # settings.resolve refuses --gb-compare=last without a history
    try:
        directory = history.node_directory(root, labels.hostname())
        return directory, history.entries(directory)
    except history.HistoryError as exc:
        raise pytest.UsageError(f"{s.history.source}: {exc}") from None


def kept_reports(s: Settings) -> tuple[Path | None, list[Path]]:
    """With --gb-history: this node's directory in it and the kept reports that count, oldest first: not dated in
    the future (history.in_future), chosen before this run keeps its own. (None, []) without."""
    if s.history.value is None:
        return None, []
    from pytest_gbvalidate.report import history

    directory, entries = node_history(s)
    return directory, [e.path for e in entries if not history.in_future(e.start)]


def kept_runs(s: Settings, sku: str) -> tuple[dict[tuple[str, str, str, str], float], ...]:
    """With --gb-history: the node's kept runs of `sku` (report/earlier.py's node_runs); () without."""
    from pytest_gbvalidate.report import earlier as earlier_reports

    _, kept = kept_reports(s)
    return earlier_reports.node_runs(kept, sku, labels.hostname()) if kept else ()


def earlier_report(
    s: Settings, target: Target, world: World | None
) -> tuple[tuple[EarlierReport, SameNode] | None, str | None]:
    """--gb-compare: the node's earlier report, checked to be this node's, and what changed since; or None and
    why nothing is compared (a first run with `last`), else (None, None) where nothing was asked."""
    setting = s.compare
    if setting.value is None:
        return None, None
    from pytest_gbvalidate.report import earlier as earlier_reports

    if world is not None:
        raise pytest.UsageError(
            f"{setting.source}: compares a node with its own earlier single-node run; under torchrun / srun "
            "each node is compared in its own run, or the fleet summary compares the nodes"
        )
    hostname = labels.hostname()
    directory, kept = kept_reports(s)
    try:
        if isinstance(setting.value, Path):
            earlier = earlier_reports.load_earlier(setting.value)
        else:  # `last`: this node's latest report of this SKU
            latest = _latest_of_sku(kept, target.sku)
            if latest is None:  # a first run has nothing to regress from: it is judged on its baseline alone
                return None, f"no earlier report of this node and SKU in {directory} yet: nothing compared"
            earlier = latest
        gpus_now = earlier_reports.gpus_of_this_node(target.is_gpu)
        same = earlier_reports.check_same_node(earlier, target.sku, hostname, gpus_now)
    except earlier_reports.CompareError as exc:
        raise pytest.UsageError(f"{setting.source}: {exc}") from None
    return (earlier_reports.with_history(earlier, earlier_reports.node_runs(kept, target.sku, hostname)), same), None


def _latest_of_sku(kept: list[Path], sku: str) -> EarlierReport | None:
    """The newest finished run of `sku` among the node's kept reports `kept` (oldest first). One that cannot be read
    is a usage error naming it (CompareError), not passed over: the node's last evidence is unreadable, and the
    operator has to say what it means."""
    from pytest_gbvalidate.report import earlier as earlier_reports

    for path in reversed(kept):
        earlier = earlier_reports.load_earlier(path)
        if earlier.sku == sku and earlier.status == "finished":
            return earlier
    return None


def html_page_path(config: pytest.Config) -> Path | None:
    """Where pytest-html writes its page (--html, as it reads it), or None."""
    given = config.getoption("htmlpath", None)
    if not given:
        return None
    return Path(config.invocation_params.dir) / os.path.expanduser(os.path.expandvars(str(given)))


def writable_inputs(target: Target, earlier: EarlierReport | None) -> list[WritableInputRecord]:
    """The inputs that decide this run's verdicts (the baseline, the earlier report) which others than root and this
    user could have written. They are used, and the report says so: a shared baselines directory is common, and
    refusing it would stop every gate that uses one."""
    from pytest_gbvalidate.files import writable_by_others

    inputs = [("the baseline", target.baseline_file), ("the earlier report", None if earlier is None else earlier.path)]
    found: list[WritableInputRecord] = []
    for what, path in inputs:
        problem = None if path is None else writable_by_others(path)
        if path is not None and problem is not None:
            found.append({"input": what, "path": str(path), "problem": problem})
    return found
