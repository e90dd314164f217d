"""Several ranks on one GPU: the plugin's multi-rank paths under NCCL on a machine with a single GPU, in one command.

    python benchmarks/gpu_ranks.py [--ranks 2,4] [--out DIR] [--device cuda|cpu] [-k CASE[,CASE...]]

Each rank is a "node" of its own: a torchrun agent on this machine with one rank (`--nnodes=N --nproc-per-node=1`,
c10d rendezvous on loopback), every agent with its own NCCL_HOSTID. NCCL decides "same host" by that id, so it
takes every rank for a host of its own: its duplicate-GPU check does not apply, and the ranks talk over its socket
transport on loopback (NCCL_SOCKET_IFNAME=lo, NCCL_IB_DISABLE=1). The figures mean nothing (loopback sockets,
kernels time-sliced on one GPU); the code paths are the real ones: communicators, streams and events, the watchdog
and its error handling, buffers and their release, the data checks, the gang's verdicts, one report from many
ranks. The cases, for each rank count N of --ranks (memory and NVLS at the smallest; pretraining on 2):

- collectives-N: suites/test_collectives.py's sweeps, up to MAX_BYTES, every result checked; must pass.
- pairwise-N: the pairwise all_reduce between nodes and its blame; must pass naming nobody.
- killed-N: the last rank SIGKILLs itself in the middle of an all_reduce; the survivors' test fails saying why,
  the report is written, the run ends within its bound and leaves no process behind.
- memory-N: the all_reduce sweep three times in one world; the device memory each rank holds after each (it
  must come back to what the first left).
- nvls-N: the NVLS and multi-node NVLink checks where neither can exist; each must fail or skip saying why, never
  pass on bandwidth.
- pretrain-tiny-pp2: suites/test_pretrain.py with the tiny Llama 3 in a PP=2 pipeline over 2 ranks; must pass.
- pretrain-8b4-pp2: Llama 3 8B's layer shape with 4 layers, PP=2 over 2 ranks, one training step after a warm-up
  (the GPU only: --device cpu skips it).

It prints a table (case, ranks, expected, seen, seconds, verdict) and writes it to DIR/gpu_ranks.json; exit 0 when
every case met its expectation. `--device cpu` runs the same cases over gloo (what the plugin's tests check).
Everything the harness decides (the environments, host ids, bounds, the verdicts) is a function below.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_gbvalidate.labels import size_label

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # tests.helpers: the kill fault and the search for processes left behind
SKU = "RANKS"
# Sweeps end here (NCCL's socket transport on loopback moves a few GB/s at most): a GPU run stays short. At 64 MiB,
# four ranks' sweeps took 174 s on an H200 (2026-11-27), two ranks' 46 s.
MAX_BYTES = {"cuda": 16 * 2**20, "cpu": 64 * 2**10}
PAIRWISE_BYTES = {"cuda": 16 * 2**20, "cpu": 64 * 2**10}
# A collective that hangs ends the run after this (the gang's timeout; the process group's under a world). In the
# killed case the survivors that were not the dead rank's NCCL peers learn of the death only by this timeout, then
# torch's watchdog waits WATCHDOG_ABORT_WAIT_S: with 60 s there the 4-rank case took 146 s on an H200 (2026-11-28),
# where a healthy call of its sweep (16 MiB at most) takes a fraction of a second.
CALL_TIMEOUT_S = 60
KILLED_CALL_TIMEOUT_S = 20
# How long torch's NCCL watchdog, once it has seen a peer's error or a timeout, waits (for its debug dump) before
# it aborts the communicators and the rank's collective raises: 60 s to the millisecond on an H200 (torch 2.11).
WATCHDOG_ABORT_WAIT_S = 60
# Each case's bound: its ranks start (CUDA and NCCL initialise; torch.compile on the GPU) and run its checks.
BOUND_S = {
    "collectives": 240,
    "pairwise": 120,
    "killed": KILLED_CALL_TIMEOUT_S + WATCHDOG_ABORT_WAIT_S + 60,  # a survivor may see only the timeout, then waits
    "memory": 120,
    "nvls": 120,
    "pretrain-tiny-pp2": 180,
    "pretrain-8b4-pp2": 300,
}
WARMUP, ITERATIONS = 2, 10  # each size's calls: the fewest timed ones a median is taken of (bench/timing.py)
KILLED_IN_CALL = 5  # the all_reduce call (of the dying rank) it dies in: past the sweep's first free-memory check
MEMORY_REPEATS = 3
# How much more a rank may hold after a later sweep than after the first: the allocator rounds, nothing more; a
# CPU process's resident memory moves with the allocator's arenas.
MEMORY_SLACK_BYTES = {"cuda": 2**20, "cpu": 64 * 2**20}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast")


@dataclass(frozen=True)
class Case:
    name: str  # collectives-2, pretrain-tiny-pp2, ...
    kind: str  # a key of BOUND_S
    ranks: int
    expect: str  # what must be seen: "pass", "no pass" (fail or skip, saying why), "lost peer", "memory returns"
    select: tuple[str, ...] = ()  # pytest arguments choosing the checks; empty for a worker case


@dataclass
class Row:
    case: str
    ranks: int
    expect: str
    seen: str
    seconds: float
    ok: bool


# The collective sweeps of suites/test_collectives.py: not the pairwise check, NVLS or multi-node NVLink (cases of
# their own).
SWEEPS = "busbw and not pairwise and not nvls and not mnnvl"


def cases(ranks: Sequence[int], device: str) -> list[Case]:
    """The cases to run, in order: each rank count's collective sweeps, pairwise check and killed rank; the repeated
    sweep and the NVLS checks at the smallest count (more ranks show nothing more of them, and the run stays
    within minutes); then the pretraining ones (two ranks: the layout's PP=2)."""
    suites = "pytest_gbvalidate.suites.test_collectives"
    found = []
    for n in ranks:
        found += [
            Case(f"collectives-{n}", "collectives", n, "pass", ("--pyargs", suites, "-k", SWEEPS)),
            Case(f"pairwise-{n}", "pairwise", n, "pass", ("--pyargs", suites, "-k", "pairwise")),
            Case(f"killed-{n}", "killed", n, "lost peer", ("--pyargs", suites, "-k", "all_reduce_busbw and in_place")),
        ]
    n = min(ranks)
    found += [
        Case(f"memory-{n}", "memory", n, "memory returns"),
        Case(f"nvls-{n}", "nvls", n, "no pass", ("--pyargs", suites, "-k", "nvls or mnnvl")),
    ]
    pretrain = ("--pyargs", "pytest_gbvalidate.suites.test_pretrain")
    found.append(Case("pretrain-tiny-pp2", "pretrain-tiny-pp2", 2, "pass", pretrain))
    if device == "cuda":
        found.append(Case("pretrain-8b4-pp2", "pretrain-8b4-pp2", 2, "pass"))
    return found


def host_id(run_id: str, node: int) -> str:
    """NCCL_HOSTID of one agent: distinct per agent, so NCCL counts each rank as a host of its own."""
    return f"gbvalidate-ranks-{run_id}-node{node}"


def node_environment(base: Mapping[str, str], run_id: str, node: int, marker: str) -> dict[str, str]:
    """One agent's environment: this process's, without the plugin's settings (each case says its own), with its
    own NCCL host id, NCCL and gloo on loopback, and `marker` (every process the case starts inherits it, so one
    left behind is found)."""
    env = {k: v for k, v in base.items() if not k.startswith(("GBVALIDATE_", "PYTEST_", "NODE_FAULT"))}
    env |= {"NCCL_HOSTID": host_id(run_id, node), "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1"}
    env |= {"GLOO_SOCKET_IFNAME": "lo", "GBVALIDATE_RANKS_CASE": marker}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), base.get("PYTHONPATH", "")) if p)
    return env


def fault_environment(case: Case, case_dir: Path) -> dict[str, str]:
    """The killed case's fault (tests/helpers/node_fault.py, loaded into every agent's pytest): the last rank dies
    in its KILLED_IN_CALL-th all_reduce; rank 0, which writes the report, lives."""
    if case.kind != "killed":
        return {}
    return {
        "PYTEST_PLUGINS": "tests.helpers.node_fault",
        "NODE_FAULT": "kill",
        "NODE_FAULT_RANK": str(case.ranks - 1),
        "NODE_FAULT_CALL": str(KILLED_IN_CALL),
        # What NCCL and torch's watchdog say as the peer dies (how the survivors of four ranks came to die by SIGABRT
        # on an H200 was read there, 2026-11-27): torch's in each agent's log, NCCL's in a file of each rank's own
        # (%p: its pid), which outlives the rank where its stdout is pytest's to capture.
        "NCCL_DEBUG": "WARN",
        "NCCL_DEBUG_FILE": str(case_dir / "nccl.%p.log"),
        "TORCH_CPP_LOG_LEVEL": "INFO",
    }


def torchrun_command(nodes: int, port: int, program: Sequence[str]) -> list[str]:
    """One agent of `nodes` on this machine, one rank each, meeting on loopback `port`, at the rendezvous store
    the harness hosts there (rendezvous_store): no agent hosts it."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-conf=is_host=false",
        "--max-restarts=0",
        *program,
    ]


@contextlib.contextmanager
def rendezvous_store(port: int) -> Iterator[None]:
    """The agents' rendezvous store on loopback `port`, hosted by the harness while a case runs. Hosted by an
    agent (the first to bind the port, by chance), it went down with that agent when its rank was the one the
    killed case kills, and the surviving agent, its store gone, stopped its own rank before the report said
    anything (once in CI on torch 2.14: 'no test ran')."""
    from torch._C._distributed_c10d import TCPStore  # torch.distributed.TCPStore, where its type stubs are

    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True)
    try:
        yield
    finally:
        del store


def pytest_program(case: Case, out: Path, node: int) -> list[str]:
    """The pytest an agent runs: the case's checks against the seed baseline, each agent its own files (only the
    rank-0 node writes them)."""
    return [
        "-m",
        "pytest",
        *case.select,
        f"--gb-sku={SKU}",
        f"--gb-baselines={out}",
        f"--gb-timeout={KILLED_CALL_TIMEOUT_S if case.kind == 'killed' else CALL_TIMEOUT_S}",
        f"--gb-report={out / case.name / f'node{node}.json'}",
        f"--junitxml={out / case.name / f'node{node}.xml'}",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfEs",
        "-s",  # what a rank wrote reaches its agent's log as it is written: a rank that dies takes nothing with it
    ]


def worker_program(case: Case, out: Path, device: str) -> list[str]:
    return [str(Path(__file__).resolve()), "--worker", case.kind, "--device", device, "--out", str(out / case.name)]


def seed_baseline(device: str, gpu_name: str | None) -> str:
    """The RANKS baseline: one GPU (or none) per node, sweeps that end at MAX_BYTES, floors any working rank meets
    (the figures over sockets mean nothing: the checks' data, errors and bounds are what is tested), and the tiny
    Llama 3 in a PP=2 pipeline."""
    detect = "{gpu_count: 0}" if gpu_name is None else f"{{gpu_count: 1, gpu_name_contains: {json.dumps(gpu_name)}}}"
    floor = "status: provisional, provenance: 'the multi-rank harness: a floor any working rank meets'"
    lines = [
        "schema_version: 1",
        f"sku: {SKU}",
        "description: several ranks on one device, each its own NCCL host (benchmarks/gpu_ranks.py)",
        f"detect: {detect}",
        "metrics:",
    ]
    sweep = f"min_bytes: 8, max_bytes: {MAX_BYTES[device]}, warmup: {WARMUP}, iterations: {ITERATIONS}"
    gated = f"{{{size_label(MAX_BYTES[device])}: {{}}}}"  # the largest size, gated at the floor
    for name in (
        *(f"{c}_busbw_gbps" for c in COLLECTIVES),
        "all_reduce_nvls_busbw_gbps",
        "mnnvl_all_reduce_busbw_gbps",
    ):
        lines.append(f"  {name}: {{{floor}, fail: 1.0e-6, params: {{{sweep}}}, values: {gated}}}")
    pairwise = f"size_bytes: {PAIRWISE_BYTES[device]}, warmup: {WARMUP}, iterations: {ITERATIONS}"
    lines.append(f"  pairwise_all_reduce_busbw_gbps: {{{floor}, expected: 1.0, fail: 1.0e-6, params: {{{pairwise}}}}}")
    for metric, expected, limit in (("step_time_s", "1.0", "1000.0"), ("tokens_per_s_per_gpu", "1.0", "1.0e-6")):
        lines.append(f"  llama3_tiny_{metric}: {{{floor}, expected: {expected}, fail: {limit}}}")
    lines += [
        "pretrain:",
        "  {model: llama3_tiny, seq_len: 64, mbs: 2, gbs: 8, tp: 1, pp: 2, cp: 1, dp: 1, precision: bf16,",
        "   engine: native, compile: false, warmup_steps: 1, timed_steps: 10, learning_rate: 3.0e-3,",
        "   provenance: 'the multi-rank harness: a 2-stage 1F1B pipeline over 2 ranks'}",
    ]
    return "\n".join(lines) + "\n"


# --- verdicts --------------------------------------------------------------------------------------------------


def judge_pytest(case: Case, codes: Sequence[int | None], report: Mapping[str, Any] | None) -> tuple[str, bool]:
    """(what was seen, whether it is what the case expects) from the agents' exit codes and rank 0's report."""
    if report is None:
        return f"no report written (agents exited {list(codes)})", False
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for t in report.get("tests", []):
        if t["when"] == "call" or t["outcome"] != "passed":
            outcomes[t["test_id"]] = t["outcome"]
            messages[t["test_id"]] = (t.get("message") or "").strip().splitlines()[0:1][0] if t.get("message") else ""
    counts = _counts(outcomes)
    if not outcomes:
        return "no test ran", False
    if case.expect == "pass":
        return counts, set(outcomes.values()) == {"passed"}
    if case.expect == "no pass":
        unexplained = [t for t, o in outcomes.items() if o == "passed" or not messages[t]]
        seen = counts + "; " + "; ".join(f"{t.split('::')[-1]}: {messages[t][:120]}" for t in outcomes)
        return seen, not unexplained
    if case.expect == "lost peer":
        failed = [messages[t] for t, o in outcomes.items() if o == "failed"]
        finished = report.get("status") == "finished"
        seen = f"{counts}; report {report.get('status')}; " + (failed[0][:160] if failed else "no failure")
        return seen, finished and len(failed) == len(outcomes) and all(failed)
    raise ValueError(f"{case.name}: no pytest verdict for {case.expect!r}")


def judge_memory(device: str, held_bytes: Sequence[Sequence[int]]) -> tuple[str, bool]:
    """Each rank's memory after each of the repeated sweeps (rank -> [after the 1st, 2nd, ...]): it returns when
    no later sweep leaves more than the first did, beyond MEMORY_SLACK_BYTES."""
    slack = MEMORY_SLACK_BYTES[device]
    grew = [
        (rank, after[0], later)
        for rank, after in enumerate(held_bytes)
        for later in after[1:]
        if later > after[0] + slack
    ]
    shown = "; ".join(
        f"rank {r}: " + ", ".join(f"{b / 2**20:.1f}" for b in after) for r, after in enumerate(held_bytes)
    )
    return f"MiB held after each sweep: {shown}", bool(held_bytes) and not grew


def judge_bounds(case: Case, seconds: float, timed_out: bool, left: Sequence[int]) -> str | None:
    """Why the case failed whatever its checks said: it ran past its bound, or left processes behind."""
    if timed_out:
        return f"ran past its bound of {BOUND_S[case.kind]} s (killed)"
    if left:
        return f"left {len(left)} process(es) behind: {', '.join(map(str, left[:8]))}"
    return None


def judge_survivors(case: Case, exits: Mapping[int, int]) -> str | None:
    """Why the killed case failed however its report reads: a rank the fault spared died by a signal. Its report
    written, a survivor that then crashed (SIGABRT, SIGSEGV in torch's threads, H200 2026-11-27) still reads to the
    launcher as a crashed node."""
    killed = case.ranks - 1
    crashed = {rank: code for rank, code in exits.items() if rank != killed and code < 0}
    return f"a survivor died by a signal ({exits_line(crashed).removeprefix('ranks ended: ')})" if crashed else None


def rank_exits(log_text: str) -> dict[int, int]:
    """rank -> exit code (negative: the signal's number) from the failure summaries torchrun prints ("rank      :
    2 (local_rank: 0)", then "exitcode  : -11 (pid: 1450)"): how each rank ended when the report cannot say."""
    exits = {}
    for found in re.finditer(r"^\s*rank\s*:\s*(\d+) \(local_rank.*\n\s*exitcode\s*:\s*(-?\d+)", log_text, re.M):
        exits[int(found[1])] = int(found[2])
    return exits


def exits_line(exits: Mapping[int, int]) -> str:
    """'ranks ended: 0 SIGABRT, 3 SIGKILL' (a plain exit status as 'exit 1')."""

    def said(code: int) -> str:
        if code >= 0:
            return f"exit {code}"
        with contextlib.suppress(ValueError):
            return signal.Signals(-code).name
        return f"signal {-code}"

    return "ranks ended: " + ", ".join(f"{rank} {said(code)}" for rank, code in sorted(exits.items()))


def _counts(outcomes: Mapping[str, str]) -> str:
    tally: dict[str, int] = {}
    for outcome in outcomes.values():
        tally[outcome] = tally.get(outcome, 0) + 1
    return ", ".join(f"{n} {o}" for o, n in sorted(tally.items()))


def table(rows: Sequence[Row]) -> str:
    lines = [f"{'case':<20} {'ranks':>5} {'expected':<15} {'s':>6}  verdict  seen"]
    for r in rows:
        lines.append(
            f"{r.case:<20} {r.ranks:>5} {r.expect:<15} {r.seconds:>6.1f}  {'ok' if r.ok else 'DEFECT':<7}  {r.seen}"
        )
    return "\n".join(lines)


# --- running a case --------------------------------------------------------------------------------------------


def run_case(case: Case, out: Path, device: str, run_id: str) -> Row:
    """The case's agents, started together and waited for within its bound; then its verdict."""
    (out / case.name).mkdir(parents=True, exist_ok=True)
    port = _free_port()
    marker = f"{run_id}-{case.name}-{uuid.uuid4().hex[:8]}"
    timed_out = False
    codes: list[int | None] = []
    agents: list[subprocess.Popen[bytes]] = []
    start = time.monotonic()
    try:
        with rendezvous_store(port):
            for node in range(case.ranks):
                program = pytest_program(case, out, node) if case.select else worker_program(case, out, device)
                env = node_environment(os.environ, run_id, node, marker) | fault_environment(case, out / case.name)
                log = (out / case.name / f"agent{node}.log").open("w")
                agents.append(
                    subprocess.Popen(
                        torchrun_command(case.ranks, port, program),
                        cwd=out,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,  # the agent and its rank: one process group to kill at the bound
                    )
                )
                log.close()
            for agent in agents:
                remaining = BOUND_S[case.kind] - (time.monotonic() - start)
                try:
                    codes.append(agent.wait(timeout=max(remaining, 0.1)))
                except subprocess.TimeoutExpired:
                    timed_out = True
                    codes.append(None)
            seconds = time.monotonic() - start
    finally:
        # At the bound, and when the harness itself is stopped (Ctrl-C, SIGTERM from a timeout): the agents live in
        # sessions of their own, which no signal to the harness reaches.
        left = _end_agents(agents, marker)
    if case.select:
        seen, ok = judge_pytest(case, codes, _report(out / case.name, case.ranks))
    else:
        seen, ok = _worker_verdict(case, out / case.name, device, codes)
    logs = "".join(log.read_text(errors="replace") for log in sorted((out / case.name).glob("agent*.log")))
    exits = rank_exits(logs)
    broken = judge_bounds(case, seconds, timed_out, left) or (
        judge_survivors(case, exits) if case.kind == "killed" else None
    )
    if broken:
        seen, ok = f"{broken}; {seen}", False
    if not ok and exits:  # the ranks that died, and how: what a report left "running" cannot say
        seen = f"{seen}; {exits_line(exits)}"
    return Row(case.name, case.ranks, case.expect, seen, round(seconds, 1), ok)


def _end_agents(agents: Sequence[subprocess.Popen[bytes]], marker: str) -> list[int]:
    """Kill what is still running of a case's agents, then the ranks they left behind; the pids of those ranks."""
    for agent in agents:
        if agent.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
    time.sleep(0.5)  # a rank the agent was still reaping
    from tests.helpers.rank_faults import processes_with_marker

    left = processes_with_marker(f"GBVALIDATE_RANKS_CASE={marker}")
    for pid in left:
        _kill(pid)
    return left


def _stopped(signum: int, frame: object) -> None:
    print(f"gpu_ranks: stopped by {signal.Signals(signum).name}; ending the running case's processes", flush=True)
    raise SystemExit(128 + signum)


def _report(case_dir: Path, nodes: int) -> dict[str, Any] | None:
    """The report the rank-0 node wrote (torchrun's rendezvous, not the start order, numbers the nodes)."""
    for node in range(nodes):
        path = case_dir / f"node{node}.json"
        if path.is_file():
            return dict(json.loads(path.read_text()))
    return None


def _worker_verdict(case: Case, case_dir: Path, device: str, codes: Sequence[int | None]) -> tuple[str, bool]:
    path = case_dir / "result.json"
    if not path.is_file():
        tail = _log_tail(case_dir)
        return f"no result (agents exited {list(codes)}){': ' + tail if tail else ''}", False
    result = json.loads(path.read_text())
    if case.kind == "memory":
        return judge_memory(device, result["held_bytes"])
    ok = all(c == 0 for c in codes)
    return str(result["line"]), ok


def _log_tail(case_dir: Path) -> str:
    for log in sorted(case_dir.glob("agent*.log")):
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line]
        if errors:
            return errors[-1][:200]
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# --- the worker cases, one rank of a torchrun world each ---------------------------------------------------------


def worker(kind: str, out: Path, device: str) -> int:
    """One rank of a worker case: the plugin's world gang over this torchrun world (NCCL on a GPU), the case's
    work through gang.run as the suites call it; rank 0 writes out/result.json."""
    from pytest_gbvalidate.ranks.world import world_from_environment
    from pytest_gbvalidate.ranks.world_gang import WorldGang

    world = world_from_environment(os.environ)
    if world is None:
        raise SystemExit("--worker runs under torchrun: RANK and WORLD_SIZE are not set")
    # The process group's timeout bounds a rank waiting on its peer: the 8B case's first step compiles its blocks
    # while the other stage waits, so the case's own bound, not one call's.
    gang = WorldGang(*world, device_type=device, timeout_s=BOUND_S.get(kind, CALL_TIMEOUT_S))
    if kind == "memory":
        results = gang.run(_memory_on_rank, device)
        result: dict[str, Any] = {"held_bytes": results}
    elif kind == "pretrain-8b4-pp2":
        result = {"line": _pretrain_8b4(gang)}
    else:
        raise SystemExit(f"--worker {kind}: memory or pretrain-8b4-pp2")
    gang.close()  # as the plugin's session ends its gang
    if world[0] == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "result.json").write_text(json.dumps(result))
    return 0


def _memory_on_rank(ctx: Any, device: str) -> list[int]:
    """The memory this rank holds after each of MEMORY_REPEATS all_reduce sweeps: allocated device memory on a
    GPU, resident memory on the CPU."""
    import psutil
    import torch

    from pytest_gbvalidate.bench.collectives import sweep_on_rank

    sizes = [2**k for k in range(3, MAX_BYTES[device].bit_length())]
    held = []
    for _ in range(MEMORY_REPEATS):
        sweep_on_rank(ctx, "all_reduce", "in_place", sizes, WARMUP, ITERATIONS)
        if device == "cuda":  # CUDA-only: what the caching allocator still hands out to live tensors
            torch.cuda.synchronize(ctx.device)
            held.append(int(torch.cuda.memory_allocated(ctx.device)))
        else:
            held.append(int(psutil.Process().memory_info().rss))
    return held


def _pretrain_8b4(gang: Any) -> str:
    """Llama 3 8B's layer shape, 4 layers, PP=2 over the world's 2 ranks, as the pretraining check trains it."""
    import dataclasses

    from pytest_gbvalidate.workloads.llama.config import LLAMA3_8B
    from pytest_gbvalidate.workloads.llama.parallel import Layout
    from pytest_gbvalidate.workloads.llama.request import EngineOptions, TrainRequest
    from pytest_gbvalidate.workloads.llama.results import pretrain_result
    from pytest_gbvalidate.workloads.llama.train import train_worker

    cfg = dataclasses.replace(LLAMA3_8B, name="llama3_8b_4layers", n_layers=4)
    layout = Layout(mbs=1, gbs=4, pp=2, precision="bf16")
    request = TrainRequest(cfg, layout, 1, ITERATIONS, 3e-4, options=EngineOptions(compile=True))
    ranks = gang.run(train_worker, request)
    result = pretrain_result(request, ranks[0].step_times_s, ranks[-1].losses or [], [r.memory for r in ranks], None)
    return (
        f"{result.scope}: step {result.step_time_s:.3f} s, loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}, "
        f"peak {max(r.memory.gib for r in ranks):.1f} GiB per rank"
    )


# --- the command ----------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,4", help="rank counts, comma-separated (default %(default)s)")
    parser.add_argument("--out", type=Path, help="where reports and logs go (default: a new temp dir)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("-k", dest="keyword", help="run only the cases whose names contain one of these (a,b)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one rank of a worker case, under torchrun
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="gbvalidate-ranks-"))
    if args.worker:
        return worker(args.worker, out, args.device)
    ranks = [int(x) for x in args.ranks.split(",") if x.strip()]
    if not ranks or any(n < 2 for n in ranks):
        parser.error(f"--ranks {args.ranks}: counts of 2 or more")

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU visible to torch (--device cpu runs the same cases over gloo)")
        return 2
    gpu_name = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{SKU}.yaml").write_text(seed_baseline(args.device, gpu_name))
    run_id = uuid.uuid4().hex[:8]
    wanted = [word for word in (args.keyword or "").split(",") if word]
    chosen = [c for c in cases(ranks, args.device) if not wanted or any(word in c.name for word in wanted)]
    print(f"{len(chosen)} case(s) on {gpu_name or 'the CPU'}, torch {torch.__version__}; output in {out}", flush=True)
    rows = []
    started = time.monotonic()
    # SIGTERM (a timeout's) ends the harness as Ctrl-C does: through run_case's clean-up of the case's processes.
    previous = signal.signal(signal.SIGTERM, _stopped)
    try:
        for case in chosen:
            rows.append(run_case(case, out, args.device, run_id))
            row = rows[-1]
            # As each case ends, and what a defect saw: a run cut short still says what it found.
            print(
                f"{row.case}: {'ok' if row.ok else 'DEFECT'} in {row.seconds} s{'' if row.ok else ': ' + row.seen}",
                flush=True,
            )
            (out / "gpu_ranks.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("\n" + table(rows))
    print(f"{len(rows)} case(s) in {time.monotonic() - started:.0f} s")  # meant to fit 7 minutes on one H100
    return 0 if rows and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
