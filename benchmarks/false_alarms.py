"""False alarms and detection: the `cpu` SKU run over and over on one healthy machine, then with degradations.

    python benchmarks/false_alarms.py --out DIR [--runs 10] [--degraded-runs 3] [--pairwise-runs 3]
                                      [--sibling-trials 10] [--speed 0.75] [-k EXPR]

Healthy, as an operator tries a gate on one unchanged machine:
1. `--gb-record` a baseline of this machine (over the bundled cpu baseline's limits);
2. `--first-runs` runs against that recording, as a node's first runs are: each kept in the node's history
   (`--gb-history`) and compared with the one before (`--gb-compare=last`), while the history is still too short
   to show the node's run-to-run spread (noise.MIN_RUNS kept runs); their false alarms are printed apart;
3. `--runs` runs more, the same way, now with the node's history behind each comparison; per run: failed tests,
   WARNs, compare regressions (and changes within the noise, shown, not failed);
4. those `--runs` reports as a fleet of as many nodes (each relabelled node-01, ...): the nodes the fleet summary
   drains.

Degraded (`--speed` 0.75: every timed copy, GEMM, collective and training step 25% slower; tests/helpers/
slow_device.py, in every process of the run through a sitecustomize this script writes):
5. a slowed run, `--degraded-runs` times, against the recording and the last healthy run (`--gb-compare=last`,
   on a copy of the healthy history): caught when the run fails; named when the fleet of the healthy reports and
   it drains exactly it;
6. a slowed node: four torchrun nodes on this machine run the pairwise all_reduce (one rank each), one of them
   slowed, `--pairwise-runs` times, and as many times with none slowed: named when exactly that node is;
7. a slowed GPU of a four-device fake: four devices measured in turns, as the suite's siblings check measures
   GPUs (host copies of 256 MiB, the measurement code a GPU's copy runs), one slowed, judged by the siblings rule
   `gb_expect.siblings` applies (measured again before naming), `--sibling-trials` times, and as many with none slowed.

It prints the false alarms and the detection rate, and writes them to DIR/false_alarms.json. The goal on an idle
2-core machine: no false alarm in 10 healthy runs, every degradation of 25% or more caught, naming exactly the
degraded node or device. A machine shared with other work adds interference the figures then include.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.helpers.slow_device
SUITES = REPO / "suites"
SITECUSTOMIZE = "from tests.helpers.slow_device import install_from_environment\n\ninstall_from_environment()\n"
SIBLING_BYTES = 256 * 2**20  # as the cpu SKU's host copy check: large against the last-level cache


@dataclass
class RunCount:
    """What one run of the suites said."""

    report: str
    exit_status: int
    failed_tests: list[str]
    warns: list[str]
    regressed: list[str]  # gated measurements: each fails its test
    regressed_ungated: int  # sweep sizes no baseline gates marked regressed: reported, never failing
    within_noise: int


@dataclass
class Figures:
    first_runs: list[RunCount] = field(default_factory=list)
    healthy_runs: list[RunCount] = field(default_factory=list)
    healthy_fleet_drained: list[str] = field(default_factory=list)
    slowed_runs: list[dict[str, Any]] = field(default_factory=list)
    pairwise: list[dict[str, Any]] = field(default_factory=list)
    siblings: list[dict[str, Any]] = field(default_factory=list)


def environment(hook: Path, speed: float | None, node_file: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GBVALIDATE_", "PYTEST_", "FALSE_ALARMS_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(hook), str(REPO)])
    if speed is not None:
        env["FALSE_ALARMS_SPEED"] = str(speed)
    if node_file is not None:
        env["FALSE_ALARMS_NODE_FILE"] = str(node_file)
    return env


def run_suites(out: Path, name: str, args: list[str], env: dict[str, str], select: str | None) -> RunCount:
    """One `pytest --gb-sku=cpu suites/` run; its report is out/NAME.json."""
    report = out / f"{name}.json"
    command = [sys.executable, "-m", "pytest", "--gb-sku=cpu", str(SUITES), f"--gb-report={report}"]
    command += [f"--junitxml={out / f'{name}.xml'}", "-p", "no:cacheprovider", "-q", *args]
    command += ["-k", select] if select else []
    with (out / f"{name}.log").open("w") as log:
        status = subprocess.run(command, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    data = json.loads(report.read_text())
    measurements = data["measurements"]
    return RunCount(
        report=str(report),
        exit_status=status,
        failed_tests=[t["test_id"] for t in data["tests"] if t["outcome"] == "failed"],
        warns=[m["message"] for m in measurements if m["verdict"] == "warn"],
        regressed=[m["compare"]["message"] for m in measurements if _regressed(m) and m["verdict"] != "info"],
        regressed_ungated=sum(1 for m in measurements if _regressed(m) and m["verdict"] == "info"),
        within_noise=sum(1 for m in measurements if m.get("compare", {}).get("verdict") == "within_noise"),
    )


def _regressed(measurement: Mapping[str, Any]) -> bool:
    return bool(measurement.get("compare", {}).get("verdict") == "regressed")


def as_node(report: Path, hostname: str, directory: Path) -> Path:
    """A copy of `report` as another node's (the fleet summary keeps one report per hostname)."""
    data = json.loads(report.read_text())
    data["node"]["hostname"] = hostname
    path = directory / f"{hostname}.json"
    path.write_text(json.dumps(data))
    return path


def drained(paths: list[Path]) -> list[str]:
    from pytest_gbvalidate.fleet.summary import summarize

    return [n.hostname for n in summarize(paths).drained]


def pairwise_round(out: Path, hook: Path, speed: float | None, name: str) -> dict[str, Any]:
    """Four torchrun nodes (one rank each) on loopback run the pairwise all_reduce; with a `speed`, one agent's
    processes run at it. Which nodes the check named, and which one was slowed."""
    slow = speed is not None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    node_file = out / "slowed-node"
    node_file.unlink(missing_ok=True)
    agents = []
    for node in range(4):
        env = environment(hook, speed if node == 1 else None, node_file if slow and node == 1 else None)
        env["GLOO_SOCKET_IFNAME"] = "lo"
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=4", "--nproc-per-node=1"]
        command += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--max-restarts=0"]
        command += ["-m", "pytest", "--gb-sku=cpu", str(SUITES / "test_collectives.py"), "-k", "pairwise"]
        command += [f"--gb-report={out / f'node{node}.json'}", "-p", "no:cacheprovider", "-q"]
        with (out / f"agent{node}.log").open("w") as log:
            agents.append(subprocess.Popen(command, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT))
    for agent in agents:
        agent.wait(timeout=300)
    (written,) = [p for p in (out / f"node{n}.json" for n in range(4)) if p.exists()]
    report = json.loads(written.read_text())
    texts = " ".join(t.get("text") or "" for t in report["tests"])
    named = sorted({int(n) for n in re.findall(r"node(\d) \([^)]*\): slow in all", texts)})
    written.rename(out / f"{name}.json")
    slowed = int(node_file.read_text()) if slow else None
    pairs = {
        m["scope"]: (round(m["value"], 4), m["details"].get("error_pct"))
        for m in report["measurements"]
        if m["metric"] == "pairwise_all_reduce_busbw_gbps"
    }
    exact = named == ([] if slowed is None else [slowed])
    shown = None if slowed is None else shown_slowdown_pct(pairs, slowed)
    return {"slowed": slowed, "named": named, "exact": exact, "shown_pct": shown, "pairs": pairs}


def shown_slowdown_pct(pairs: Mapping[str, tuple[float, Any]], node: int) -> float | None:
    """How much slower the first pass found `node`'s pairs than the pairs without it (medians): the slowdown the
    injected one became. Four nodes sharing two vCPUs absorb part of it: the sleeping rank's partner and the other
    pair take the cores meanwhile."""
    first = {scope: gbps for scope, (gbps, _) in pairs.items() if "second pass" not in scope}
    own = [gbps for scope, gbps in first.items() if f"node{node}" in scope.split("+")]
    others = [gbps for scope, gbps in first.items() if f"node{node}" not in scope.split("+")]
    if not own or not others:
        return None
    return round((1 - statistics.median(own) / statistics.median(others)) * 100, 1)


def sibling_trial(slow: int | None, speed: float) -> dict[str, Any]:
    """Four devices' host copies, device `slow` at `speed`, measured in turns as the suite's siblings check
    measures its GPUs, and judged as it judges them (outliers.sibling_verdict: measured again before naming)."""
    import torch

    from pytest_gbvalidate.bench.copy import copy_bandwidth
    from pytest_gbvalidate.bench.timing import MIN_TIMED_ITERATIONS
    from pytest_gbvalidate.rules import noise, outliers
    from suites.test_bandwidth import SIBLING_ROUNDS
    from tests.helpers.slow_device import slowed

    cpu = torch.device("cpu")

    def measure() -> dict[str, tuple[float, dict[str, Any]]]:
        rounds = []
        for _ in range(SIBLING_ROUNDS):
            figures = {}
            for index in range(4):
                with slowed(speed if index == slow else 1.0):
                    r = copy_bandwidth(cpu, cpu, SIBLING_BYTES, warmup=3, iterations=MIN_TIMED_ITERATIONS)
                figures[f"gpu{index}"] = (r.bandwidth_gbps, {"samples_gbps": r.samples_gbps})
            rounds.append(figures)
        return noise.in_rounds(rounds)

    found, _ = outliers.sibling_verdict(measure(), "higher", again=measure)
    named = [o.host for o in found]
    expected = [] if slow is None else [f"gpu{slow}"]
    return {"slowed": slow, "named": named, "exact": named == expected}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="where the runs' files go (emptied first)")
    parser.add_argument("--first-runs", type=int, default=4, help="a node's first runs, kept (default %(default)s)")
    parser.add_argument("--runs", type=int, default=10, help="healthy runs after those (default %(default)s)")
    parser.add_argument("--degraded-runs", type=int, default=3, help="slowed runs (default %(default)s)")
    parser.add_argument(
        "--pairwise-runs", type=int, default=3, help="4-node pairwise rounds, each way (default %(default)s)"
    )
    parser.add_argument(
        "--sibling-trials", type=int, default=10, help="4-device trials, each way (default %(default)s)"
    )
    parser.add_argument("--speed", type=float, default=0.75, help="a degraded device's speed (default %(default)s)")
    parser.add_argument("-k", dest="select", help="pytest -k expression for the suite runs (default: all)")
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    shutil.rmtree(out, ignore_errors=True)
    for sub in ("hook", "baselines", "healthy", "fleet", "slowed", "pairwise"):
        (out / sub).mkdir(parents=True)
    hook = out / "hook"
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    figures = Figures()
    started = time.monotonic()

    healthy_env = environment(hook, None)
    history = out / "history"
    keep = [f"--gb-history={history}", "--gb-compare=last"]
    record_to = f"--gb-record={out / 'baselines' / 'cpu.yaml'}"
    record = run_suites(out / "healthy", "record", [record_to, *keep], healthy_env, args.select)
    print(
        f"recorded: exit {record.exit_status}, {len(record.failed_tests)} failed test(s), {len(record.warns)} WARN(s)"
    )
    against = [f"--gb-baselines={out / 'baselines'}", *keep]
    for i in range(1, args.first_runs + args.runs + 1):
        first = i <= args.first_runs
        name = f"first{i:02d}" if first else f"run{i - args.first_runs:02d}"
        run = run_suites(out / "healthy", name, against, healthy_env, args.select)
        (figures.first_runs if first else figures.healthy_runs).append(run)
        print(
            f"{'first' if first else 'healthy'} run {name}: exit {run.exit_status}, failed {len(run.failed_tests)}, "
            f"WARN {len(run.warns)}, regressed {len(run.regressed)} (and {run.regressed_ungated} ungated sizes), "
            f"within the noise {run.within_noise}"
        )
        for line in [*run.failed_tests, *run.warns, *run.regressed]:
            print(f"    {line}")
    healthy_nodes = [
        as_node(Path(r.report), f"node-{i:02d}", out / "fleet") for i, r in enumerate(figures.healthy_runs, 1)
    ]
    figures.healthy_fleet_drained = drained(healthy_nodes) if len(healthy_nodes) >= 3 else []
    print(f"healthy fleet of {len(healthy_nodes)}: drained {figures.healthy_fleet_drained or 'nobody'}")

    slowed_env = environment(hook, args.speed)
    for i in range(1, args.degraded_runs + 1):
        copied = shutil.copytree(
            history, out / "slowed" / f"history{i}"
        )  # the healthy history, not the last slowed run
        slowed_args = [f"--gb-baselines={out / 'baselines'}", f"--gb-history={copied}", "--gb-compare=last"]
        run = run_suites(out / "slowed", f"slowed{i}", slowed_args, slowed_env, args.select)
        fleet_dir = out / "slowed" / f"fleet{i}"
        fleet_dir.mkdir()
        paths = [shutil.copy(p, fleet_dir / p.name) for p in healthy_nodes]
        named = drained([Path(p) for p in paths] + [as_node(Path(run.report), "node-slowed", fleet_dir)])
        result = {
            "exit_status": run.exit_status,
            "caught": run.exit_status != 0,
            "failed_tests": run.failed_tests,
            "regressed": len(run.regressed),
            "fleet_drained": named,
            "fleet_exact": named == ["node-slowed"],
        }
        figures.slowed_runs.append(result)
        print(f"slowed run {i}: {result}")

    for i in range(args.pairwise_runs):
        for slow in (False, True):
            name = f"round{i + 1}-{'slowed' if slow else 'healthy'}"
            result = pairwise_round(out / "pairwise", hook, args.speed if slow else None, name)
            figures.pairwise.append(result)
            print(f"pairwise round {i + 1} ({'one node slowed' if slow else 'healthy'}): {result}")

    for i in range(args.sibling_trials):
        for device in (None, i % 4):
            result = sibling_trial(device, args.speed)
            figures.siblings.append(result)
            print(f"siblings trial {i + 1} ({'healthy' if device is None else f'gpu{device} slowed'}): {result}")

    summary = summarize(figures, args.speed, time.monotonic() - started)
    print("\n".join(summary))
    (out / "false_alarms.json").write_text(json.dumps(asdict(figures) | {"summary": summary}, indent=2))
    return 0


def summarize(f: Figures, speed: float, elapsed_s: float) -> list[str]:
    first_alarms = sum(1 for r in f.first_runs if r.failed_tests or r.warns or r.regressed)
    n = len(f.healthy_runs)
    failing = sum(1 for r in f.healthy_runs if r.failed_tests)
    warns = sum(len(r.warns) for r in f.healthy_runs)
    regressed = sum(len(r.regressed) for r in f.healthy_runs)
    ungated = sum(r.regressed_ungated for r in f.healthy_runs)
    noisy = sum(r.within_noise for r in f.healthy_runs)
    alarms = sum(1 for r in f.healthy_runs if r.failed_tests or r.warns or r.regressed)
    healthy_pairs = [r for r in f.pairwise if r["slowed"] is None]
    slow_pairs = [r for r in f.pairwise if r["slowed"] is not None]
    healthy_sib = [r for r in f.siblings if r["slowed"] is None]
    slow_sib = [r for r in f.siblings if r["slowed"] is not None]
    slowdown = f"{(1 - speed) * 100:.0f}% slower"
    return [
        "",
        f"== false alarms and detection ({elapsed_s / 60:.1f} min) ==",
        f"a node's first runs (history too short for its run-to-run spread): {len(f.first_runs)}; with a false "
        f"alarm: {first_alarms}",
        f"healthy runs: {n}; with a false alarm (failed test, WARN or compare regression): {alarms}",
        f"  runs with a failed test: {failing}; WARNs: {warns}; compare regressions: {regressed} (and {ungated} "
        f"of sweep sizes no baseline gates, reported, never failing); changes within the noise: {noisy}",
        f"  healthy fleet of {n}: drained {len(f.healthy_fleet_drained)}",
        f"  healthy 4-node pairwise rounds naming a node: {_named(healthy_pairs)}/{len(healthy_pairs)}",
        f"  healthy 4-device trials naming a device: {_named(healthy_sib)}/{len(healthy_sib)}",
        f"degraded ({slowdown}):",
        f"  slowed run caught by the gate: {sum(r['caught'] for r in f.slowed_runs)}/{len(f.slowed_runs)}; "
        f"drained alone by the fleet summary: {sum(r['fleet_exact'] for r in f.slowed_runs)}/{len(f.slowed_runs)}",
        f"  slowed node named alone by the pairwise check: {sum(r['exact'] for r in slow_pairs)}/{len(slow_pairs)} "
        f"(its pairs slower than the others in the first pass by {_shown(slow_pairs)}; missed: "
        f"{_shown([r for r in slow_pairs if not r['exact']]) or 'none'})",
        f"  slowed device named alone by the siblings rule: {sum(r['exact'] for r in slow_sib)}/{len(slow_sib)}",
    ]


def _shown(results: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['shown_pct']:g}%" for r in results if r["shown_pct"] is not None)


def _named(results: list[dict[str, Any]]) -> int:
    return sum(1 for r in results if r["named"])


if __name__ == "__main__":
    sys.exit(main())
