"""The JSON report's sections about the run as a whole, made from the resolved target and settings: the header
(SKU, node, settings, NCCL environment, the earlier report compared with, the torchrun / srun world), the gang,
the busbw plot and the recorded baseline. No pytest here: session.py calls these at the right moments."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_gbvalidate.levels import BUDGET_S
from pytest_gbvalidate.report.records import (
    AllowedRegressionRecord,
    GangRecord,
    NcclVariableRecord,
    NodeRecord,
    RunCompareRecord,
    WritableInputRecord,
)
from pytest_gbvalidate.report.writer import RunReport
from pytest_gbvalidate.settings import Setting, Settings

if TYPE_CHECKING:
    from pytest_gbvalidate.ranks.gang import Gang
    from pytest_gbvalidate.report.earlier import EarlierReport, SameNode
    from pytest_gbvalidate.target import Target


def nccl_environment(target: Target, environ: Mapping[str, str]) -> dict[str, NcclVariableRecord]:
    """What the ranks' NCCL runs with: the baseline's `params.nccl_env` (what its figures were taken with), except
    where this process's environment sets a variable (the operator's word wins), plus every other NCCL_* variable of
    the environment. Raises BaselineError."""
    from pytest_gbvalidate import baselines as bl

    asked = {} if target.baseline is None else bl.nccl_env(target.baseline)
    env: dict[str, NcclVariableRecord] = {}
    for name, (value, where) in sorted(asked.items()):
        source = f"baseline {target.sku} ({where} params)"
        if name in environ and environ[name] != value:
            env[name] = {"value": environ[name], "source": f"environment (the baseline asks for {value})"}
        else:
            env[name] = {"value": value, "source": source}
    for name in sorted(environ):
        if name.startswith("NCCL_") and name not in env:
            env[name] = {"value": environ[name], "source": "environment"}
    return env


def describe_run(
    report: RunReport,
    target: Target,
    settings: Settings,
    timeout: Setting[float],
    node: NodeRecord,
    nccl_env: dict[str, NcclVariableRecord],
    comparison: tuple[EarlierReport, SameNode] | None,
    world_size: int | None,
    narrowed_by: list[str],
    writable: list[WritableInputRecord],
) -> None:
    """The report's header: what is checked against what, on which node and software, with which settings."""
    settings_section = settings.report_section()
    settings_section["timeout"] = {"value": timeout.value, "source": timeout.source}  # the SKU's default resolved
    baseline_file = str(target.baseline_file) if target.baseline else None
    report.set("sku", {"name": target.sku, "source": target.source, "baseline_file": baseline_file})
    report.set("level", settings.level.value)
    report.set("level_budget_s", BUDGET_S[settings.level.value])
    report.set("node", node)
    report.set("settings", settings_section)
    report.set("nccl_env", nccl_env)
    report.set("created_directories", [{"path": str(path), "for": source} for source, path in settings.created_dirs])
    if comparison is not None:
        report.set("compare", compare_section(settings, *comparison))
    if world_size is not None:
        report.set("world", {"world_size": world_size})
    report.set("narrowed_by", narrowed_by)
    if writable:
        report.set("writable_inputs", writable)


def header_lines(
    report: RunReport,
    target: Target,
    settings: Settings,
    facts: Mapping[str, str],
    world_rank: int | None,
    comparison: tuple[EarlierReport, SameNode] | None,
    compare_note: str | None,
) -> list[str]:
    """The terminal's header: the report's header in a few lines."""
    baseline = str(target.baseline_file) if target.baseline else "none yet (recording)"
    stack = ", ".join(f"{k} {facts[k]}" for k in ("driver", "cuda_driver", "nccl", "torch") if k in facts)
    level = settings.level
    line = f"gbvalidate: SKU {target.sku} ({target.source}); level {level.value}"
    line += "" if level.is_default else f" ({level.source})"
    chosen = settings.baselines
    line += f"; baseline {baseline} ({'bundled with the plugin' if chosen.is_default else chosen.source})"
    if world_rank not in (None, 0):  # the node facts and the reports are global rank 0's
        return [f"{line}; rank {world_rank} of a torchrun / srun world (rank 0 writes the reports)"]
    created = [f"gbvalidate: {source}: creating missing directory {path}" for source, path in settings.created_dirs]
    lines = [f"{line}; {stack}", *created]
    if comparison is not None:
        earlier, same = comparison
        lines.append(f"gbvalidate: comparing with {earlier.path} ({settings.compare.source}): {'; '.join(same.notes)}")
    if compare_note is not None:
        lines.append(f"gbvalidate: {settings.compare.source}: {compare_note}")
    for found in report.data.get("writable_inputs", []):
        lines.append(
            f"gbvalidate: {found['input']} {found['path']} decides verdicts, and others could have written it: "
            f"{found['problem']}"
        )
    return lines


def compare_section(settings: Settings, earlier: EarlierReport, same: SameNode) -> RunCompareRecord:
    allowed = settings.compare_fail.value
    allowed_pct: AllowedRegressionRecord | None = None
    if allowed is not None:
        allowed_pct = {"default_pct": allowed.default_pct, "by_metric": dict(allowed.by_metric)}
    return {
        "path": str(earlier.path),
        "source": settings.compare.source,
        "earlier_date": earlier.date,
        "earlier_status": earlier.status,
        "allowed": allowed_pct,
        "allowed_source": settings.compare_fail.source,
        "replaced_gpus": dict(same.replaced),
        "notes": list(same.notes),
    }


def gang_section(gang: Gang, in_world: bool, device_type: str) -> GangRecord:
    """The ranks the run measured on, their nodes by rank and hostname, and start-ups that failed and were retried."""
    return {
        "kind": "world" if in_world else "local",
        "world_size": gang.world_size,
        "device_type": device_type,
        "nodes": len(gang.hosts),
        "hosts": [{"node_rank": rank, "hostname": host} for rank, host in sorted(gang.hosts.items())],
        "failed_starts": list(gang.failed_starts),
    }


def attach_busbw_plot(report: RunReport, base: Path | None, sku: str) -> str | None:
    """A PNG of busbw against size next to `base` (the JSON report, else the JUnit XML), named in the report; why
    it could not be written (for the terminal), else None. Without matplotlib, the report's `plot_note` says so."""
    from pytest_gbvalidate.files import atomic_write_bytes
    from pytest_gbvalidate.report import collective_tables

    if base is None or not collective_tables.sweep_records(report.measurements):
        return None
    path = base.with_name(f"{base.stem}.busbw.png")
    try:
        png = collective_tables.busbw_png(report.measurements, f"{sku}: bus bandwidth per message size")
        atomic_write_bytes(path, png)
    except OSError as exc:  # OutputError: the plot is a picture of the report, not evidence: noted
        note = f"busbw plot NOT written: {exc}"
        report.set("plot_note", note)
        return note
    except ImportError:
        report.set("plot_note", "busbw plot: needs matplotlib (pip install 'pytest-gbvalidate[plots]')")
        return None
    report.add_record("plots", {"metric": "busbw_gbps", "path": str(path)})
    return None


def record_baseline(
    report: RunReport,
    target: Target,
    path: Path,
    node_facts: dict[str, str],
    why_not: str | None,
    runs: Sequence[Mapping[tuple[str, str, str, str], float]] = (),
) -> str | None:
    """Write the recorded baseline to `path` from this run's figures and the node's kept `runs`, unless `why_not`
    says the run did not complete; the outcome goes in the report's `record` section. Why it could not be written,
    or fell short of a figure the SKU requires, else None."""
    from pytest_gbvalidate.baselines.recording import write_recorded_baseline
    from pytest_gbvalidate.files import OutputError

    error, written = None, False
    if why_not is None:
        try:
            measurements = [dict(m) for m in report.measurements]
            skipped, not_gated = write_recorded_baseline(
                path, target.baseline, measurements, node_facts, target.node_gpu_count, runs
            )
            written = True
            note = f"recorded baseline: {path}"
            if skipped:  # failed or broken measurements: no expected value of 0 or "nan"
                note += f"; left out, not measured validly: {'; '.join(skipped)}"
            required = [n for n in not_gated if n.required]
            if not_gated:
                note += f"; {len(not_gated)} figure(s) too noisy to record, written not gated:"
                note += "".join(f"\n  {'required by the SKU: ' if n.required else ''}{n.line()}" for n in not_gated)
            if required:  # written all the same: what could be recorded is
                error = f"{path}: written without {len(required)} figure(s) the SKU's baseline gates"
                note += f"\n{error}; the run fails"
        except OutputError as exc:
            error = str(exc)
            note = f"baseline NOT recorded: {exc}; the run fails"
    else:
        kept = "left as it was" if path.exists() else "not written"
        note = f"nothing recorded: the run did not complete ({why_not}); {path} {kept}"
    report.set("record", {"path": str(path), "written": written, "note": note})
    return error


def output_lost(report: RunReport, line: str) -> None:
    """A file of the run that could not be written, named in the report (`outputs_lost`)."""
    report.add_record("outputs_lost", line)


def keep_started(report: RunReport, history_dir: Path) -> Path | None:
    """The report as the checks start (`running`) kept in the node's history, so that a run killed outright is still
    a run of the node there; its path, or None where it could not be written (the end tries again, and says so)."""
    from pytest_gbvalidate.files import OutputError
    from pytest_gbvalidate.report import history

    try:
        return history.keep(history_dir, report.data)
    except OutputError:
        return None


def keep_report(
    report: RunReport, history_dir: Path | None, prometheus: Path | None, started: Path | None = None
) -> list[str]:
    """The finished report kept in the node's history (over the record kept as it `started`, where there is one),
    then written as a Prometheus file, which then says whether the history could be kept. Lines for the terminal
    summary; a file that could not be written is in the report's `outputs_lost`, and fails the run."""
    from pytest_gbvalidate.files import OutputError
    from pytest_gbvalidate.report import history

    written = []
    if history_dir is not None:
        try:
            kept = history.replace(started, report.data) if started else history.keep(history_dir, report.data)
            written.append(f"report kept in the history: {kept}")
        except OutputError as exc:
            output_lost(report, f"report NOT kept in the history: {exc}")
            report.set("exit_status", report.data["exit_status"] or 1)  # pytest's TESTS_FAILED
    if prometheus is not None:
        from pytest_gbvalidate.report.prometheus import write

        try:
            write(prometheus, report.data)
            written.append(f"Prometheus file: {prometheus}")
        except OutputError as exc:
            output_lost(report, f"Prometheus file NOT written: {exc}")
    return written
