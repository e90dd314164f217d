"""The command line of `python -m pytest_gbvalidate.fleet`: `summary`, `history` and `offenders` (their helps here)."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_gbvalidate.files import atomic_write_text, clashes, same_file, unwritable
from pytest_gbvalidate.fleet import junit, render
from pytest_gbvalidate.fleet.history import DEFAULT_FAILED, DEFAULT_OF, read_history, render_offenders, repeat_offenders
from pytest_gbvalidate.fleet.history import render as history_text
from pytest_gbvalidate.fleet.history_plots import plot_history  # matplotlib: imported only where it draws
from pytest_gbvalidate.fleet.plots import PLOT_NAME, plot_fleet
from pytest_gbvalidate.fleet.summary import Summary, summarize
from pytest_gbvalidate.labels import printable_exactly
from pytest_gbvalidate.report.history import HistoryError
from pytest_gbvalidate.rules import breaker, noise, outliers

PROG = "python -m pytest_gbvalidate.fleet"
OUT_FILES = ("summary.md", "nodes.csv", "metrics.csv", "fleet.xml")  # in --out; plots/ beside them
NO_PLOTS = "plots not drawn (--plots draws them)"

SUMMARY_HELP = f"""\
One verdict per node and the fleet view, from the JSON reports of `pytest --gb-report` run on each node.

Writes to DIR: summary.md (Markdown), nodes.csv (one row per node, then one per report not merged),
metrics.csv (per metric across the nodes), fleet.xml (JUnit: one testsuite per node, named by hostname) and, with
--plots, plots/fleet.png (needs matplotlib; skipped with a note without it). Prints a compact summary and, for
the nodes to take out of service, `scontrol update nodename=HOST state=drain reason=...` lines and `kubectl
cordon`, `kubectl taint nodes NODE gbvalidate/fault=CATEGORY:NoSchedule` and `kubectl label nodes NODE
gbvalidate/fault=CATEGORY` lines (printed, never run; each names one node, validated).

Outliers: per metric (metric, scope, and placement and reference tool where given; gated measurements only),
a node is flagged when it is worse than the fleet median (by the metric's direction) by all of: more than K scaled
MADs -- the modified z-score of Iglewicz & Hoaglin, 0.6745*(x-median)/MAD -- (far from its peers in robust terms;
where MAD is 0 any deviation is), beyond the practical margin (the resolution the metric needs, as its reports say,
as a log ratio; else, or with --below-median-pct, PCT%, a log ratio too), and more than the
fleet's noise allows: each report gives its figures' spread beside them, and a node's dip must exceed
{noise.NOISE_K:g} times the fleet's typical spread (the median of the other nodes' spreads) for the node and the
median combined -- never the node's own spread: scatter buys no pass, and a metric noisy on every node drains
nobody. The MAD is at least the other nodes' typical run-to-run spread where more than half of them give one
(--gb-history with --gb-compare). A node whose own spread for a figure is far beyond the fleet's (more than K scaled
MADs, at least {outliers.DEFAULT_MAD_K:g}, of the other nodes' spreads, and more than {outliers.TOO_NOISY_RATIO:g} times
their median) and that is no outlier of it is too noisy to judge on it: listed, neither drained nor passed. A
node is flagged even when it passed its baseline. --noise-floor-pct adds a percent every dip must exceed, for
reports that do not give their noise. Needs at least {outliers.MIN_NODES} nodes with a finished report. Pass 0 to
switch the K or the PCT rule off.

Reports: one per hostname counts, the latest by start_time (earlier ones are listed as superseded). Reports of
another SKU than the fleet's (--sku, else the most common) are listed and left out of the statistics. A corrupt
report (not JSON, not an object, another schema, a field its writer never writes so) or a partial one (status
running or interrupted) is listed with the reason. A report in which no check ran (--collect-only, every test
skipped) or pytest failed by itself gives no verdict: listed, not drained. Multi-node runs (gang.nodes > 1) are
summarised apart, with their weak scaling against single-node runs. Every text from a report is shown escaped.

Exit status: 0 when there is nothing to drain and every report gave a verdict; 1 when a node fails, is an outlier,
is too noisy to judge on a figure, is found at fault by a multi-node run, ran less than its peers, has a partial
report or gave no verdict, a report is corrupt, another SKU's report did not pass its own checks, a multi-node run
did not pass, or no report of the fleet's SKU is given (superseded reports do not count); 2 on a usage error (a
report path that does not exist, an output that would replace a report).
"""

HISTORY_HELP = """\
One node's runs over time, from the JSON reports `pytest --gb-history DIR` kept in DIR/<hostname>/ (named by their
UTC start time). Prints first the gated figures that moved most in the latest run, then, per measurement a
baseline gates (metric and scope, sizes in numeric order; with --all every measurement), a table of its runs:
time, value, the verdict the run gave it (`regressed` where it failed against the run before), the change from
the run before and from the median of all the runs. With --plots OUT, draws
OUT/<metric>.png for each metric (needs matplotlib; skipped with a note without it).

Reports: each is read as the fleet summary reads one. A corrupt one, or another node's (node.hostname is not the
directory's name), is listed with why and left out; a partial one (the run was interrupted) is listed and left out.

Exit status: 0 when every report was read; 1 when one is corrupt or another node's, or there is no finished one;
2 on a usage error.
"""

OFFENDERS_HELP = """\
The nodes that fail again and again: for each node directory DIR/<hostname>/ the history keeps (`pytest
--gb-history DIR`), its last N finished runs of its latest SKU, read as `history` reads them; a node that failed in
at least K of them is named, with its failed checks' fault categories over those runs, the largest share of
failed runs first.

Exit status: 0 when no node is named; 1 when one is; 2 on a usage error.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Fleet views of pytest-gbvalidate run reports.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    summary, node, offenders = (
        commands.add_parser(name, help=about, description=text, formatter_class=argparse.RawDescriptionHelpFormatter)
        for name, about, text in (
            ("summary", "one verdict per node, fleet statistics and outliers, the nodes to drain", SUMMARY_HELP),
            ("history", "one node's runs over time, from the reports --gb-history kept", HISTORY_HELP),
            ("offenders", "the nodes that fail again and again, from the reports --gb-history kept", OFFENDERS_HELP),
        )
    )
    add_summary_options(summary)
    node.add_argument("directory", type=_path, metavar="DIR/HOSTNAME", help="the node's directory in --gb-history")
    node.add_argument("--plots", type=_path, metavar="OUT", help="also draw OUT/<metric>.png, one per metric (created)")
    node.add_argument("--all", action="store_true", help="also the measurements no baseline gates (sweep sizes)")
    offenders.add_argument("root", type=_path, metavar="DIR", help="the history's root: DIR/<hostname>/ per node")
    add_repeat_options(offenders)
    return parser


def add_summary_options(summary: argparse.ArgumentParser) -> None:
    summary.add_argument("reports", nargs="+", type=_path, metavar="REPORT.json", help="the nodes' JSON reports")
    summary.add_argument("--out", required=True, type=_path, metavar="DIR", help="where the files go (created)")
    summary.add_argument("--sku", type=_sku, help="the fleet's SKU (default: the most common among the reports)")
    mad_k = (
        "outlier only when worse than the median by more than K (0 or more) scaled MADs (default: per metric, "
        "the family-wise cut-off: what a healthy node's worst figure stays within in 99%% of fleets of as many nodes "
        f"and figures, at least {outliers.DEFAULT_MAD_K:g}, Iglewicz & Hoaglin's recommendation for one figure)"
    )
    summary.add_argument("--mad-k", type=_not_negative, metavar="K", help=mad_k)
    pct = (
        "outlier only when worse than the median by more than PCT%% (0 or more) as a log ratio (default: per "
        "metric, the resolution its reports say it needs, as a log ratio; where they give none, "
        f"{outliers.DEFAULT_PCT:g}%%)"
    )
    summary.add_argument("--below-median-pct", type=_not_negative, metavar="PCT", help=pct)
    floor = (
        "outlier only when worse than the median by more than PCT%% of it too (default 0: off); set it to "
        "the metric's run-to-run noise on one node where the reports do not give their noise"
    )
    summary.add_argument("--noise-floor-pct", type=_not_negative, default=0.0, metavar="PCT", help=floor)
    plots = "also draw plots/fleet.png (about a second more: importing matplotlib)"
    summary.add_argument("--plots", action="store_true", help=plots)
    history = "also name the fleet's nodes that fail again and again in this --gb-history root (see `offenders`)"
    summary.add_argument("--history", type=_path, metavar="DIR", help=history)
    summary.add_argument(
        "--confirm",
        action="store_true",
        help="take a failed node out only for the checks that failed again in a second run of them among the "
        "reports (pytest --gb-rerun-failed=ITS_REPORT); one that passed is flapping, listed and not drained; a failed "
        "node with no second run here is not confirmed: no drain line",
    )
    summary.add_argument(
        "--shadow",
        action="store_true",
        help="shadow mode, to trial the gate on a fleet: everything judged and written, the nodes it would take out "
        "listed as such, no drain or kubectl line printed, exit 0",
    )
    breaker.add_options(summary, "print no drain line")
    add_repeat_options(summary)


def add_repeat_options(parser: argparse.ArgumentParser) -> None:
    failed = f"a node that failed in at least K (1 or more) of its last N runs (default {DEFAULT_FAILED})"
    parser.add_argument("--failed", type=_count, default=DEFAULT_FAILED, metavar="K", help=failed)
    of = f"its last N (1 or more) runs (default {DEFAULT_OF})"
    parser.add_argument("--of", type=_count, default=DEFAULT_OF, metavar="N", help=of)


def _path(text: str) -> Path:
    if not text:  # Path("") is the current directory: an empty variable in a script must not write there
        raise argparse.ArgumentTypeError("an empty path")
    return Path(text)


def _sku(text: str) -> str:
    if not (text and text.isascii() and text.isprintable()):
        raise argparse.ArgumentTypeError(f"{text[:40]!a}: a SKU's name is printable ASCII, e.g. ND_GB200_v6")
    return text


def _count(text: str) -> int:
    if not (text.isdecimal() and len(text) <= 6 and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"{text[:40]!a}: a whole number from 1 to 999999")
    return int(text)


def _not_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number")
    if value < 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or a positive number")
    return value


def say(lines: Sequence[str]) -> None:
    """Print `lines`. A reader that stops early (`| head -1`) has what it wanted: the rest goes nowhere, the files
    are written and the exit status is still the verdict's, with no traceback (Python's own advice for SIGPIPE)."""
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "history":
            return node_history(parser, args.directory, args.plots, args.all)
        if args.command == "offenders":
            return offenders(parser, args.root, args.failed, args.of)
        return fleet_summary(parser, args)
    except HistoryError as exc:  # a history that cannot be read: a usage error
        parser.error(str(exc))


def fleet_summary(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    out: Path = args.out
    if out.exists() and not out.is_dir():
        parser.error(f"--out {out}: not a directory")
    missing = [str(path) for path in args.reports if not path.exists()]
    if missing:  # a mistyped path, or a shell pattern that matched nothing: no node's report, nothing to judge
        parser.error(f"no such report: {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}")
    # Every output is checked before anything is read: none may replace what is not a regular file, or a report.
    outputs = {f"--out's {name}": out / name for name in OUT_FILES}
    refused = [f"{path}: {why}" for path in outputs.values() if (why := unwritable(path)) is not None]
    refused += clashes(outputs, {f"the report {path}": path for path in args.reports})
    if args.plots:  # plots/fleet.png, fleet-2.png, ...: as many pages as the metrics need, none of them a report
        refused += [
            f"--plots: the report {path} is in {out / 'plots'}, where the plots go: an output must be a file of its own"
            for path in args.reports
            if same_file(path.parent, out / "plots") and PLOT_NAME.fullmatch(path.name)
        ]
    if refused:
        parser.error("; ".join(refused))
    if args.history is not None and not args.history.is_dir():
        parser.error(f"--history {args.history}: not a directory (the root of a --gb-history)")
    if args.history is not None and args.failed > args.of:
        parser.error(f"--failed {args.failed} is more than --of {args.of}: no node could fail that often")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out {out}: cannot create it: {exc.strerror or exc}")
    gate = breaker.from_options(args)
    summary = summarize(
        args.reports, args.sku, args.mad_k, args.below_median_pct, args.noise_floor_pct, gate, args.confirm, args.shadow
    )
    try:
        lines = write(summary, out, plots=args.plots)
    except OSError as exc:  # OutputError names the file
        parser.error(str(exc))
    if args.history is not None:  # the fleet's repeat offenders, marked for the drain list's reader
        found, _ = repeat_offenders(args.history, args.failed, args.of)
        hostnames = {n.hostname for n in summary.nodes}
        ours = [o for o in found if printable_exactly(o.hostname) in hostnames]  # a directory's name against a report's
        offending = render_offenders(args.history, ours, len(hostnames), args.failed, args.of)
        lines += ["", "repeat offenders among this fleet's nodes:", *offending]
    say(lines)
    return summary.exit_code


def write(summary: Summary, out: Path, plots: bool = False) -> list[str]:
    """Write the files to `out`; the terminal summary's lines."""
    plot_paths, plot_note = plot_fleet(summary, out / "plots") if plots else ([], NO_PLOTS)
    texts = [render.markdown(summary, plot_paths, plot_note, out), render.nodes_csv(summary)]
    texts += [render.metrics_csv(summary), junit.fleet_junit(summary)]
    files = {out / name: text for name, text in zip(OUT_FILES, texts, strict=True)}
    for path, text in files.items():
        atomic_write_text(path, text)
    return render.terminal(summary, [*files, *plot_paths], plot_note)


def node_history(parser: argparse.ArgumentParser, directory: Path, plots: Path | None, everything: bool) -> int:
    if not directory.is_dir():
        parser.error(f"{directory}: not a directory (a node's, DIR/<hostname>, in --gb-history DIR)")
    if plots is not None and plots.exists() and not plots.is_dir():
        parser.error(f"--plots {plots}: not a directory")
    history = read_history(directory)
    nodes = [] if history.runs or history.left_out else sorted(d.name for d in directory.iterdir() if d.is_dir())
    if nodes:  # the history's root: its nodes' directories are below it
        parser.error(f"{directory}: no reports here; name a node's directory: {directory / nodes[0]}, ...")
    lines = history_text(history, everything)
    if plots is not None:
        try:
            paths, note = plot_history(history, plots)
        except OSError as exc:  # OutputError names the file
            parser.error(str(exc))
        lines += ["", *(f"plot: {path}" for path in paths), *([note] if note else [])]
    say(lines)
    return history.exit_code


def offenders(parser: argparse.ArgumentParser, root: Path, failed: int, of: int) -> int:
    if not root.is_dir():
        parser.error(f"{root}: not a directory (the root of a --gb-history, DIR)")
    if failed > of:
        parser.error(f"--failed {failed} is more than --of {of}: no node could fail that often")
    found, nodes = repeat_offenders(root, failed, of)
    say(render_offenders(root, found, nodes, failed, of))
    return 1 if found else 0
