"""GPU smoke run: whatever NVIDIA GPUs this machine has, run everything the plugin does on them, in one command.

    python benchmarks/gpu_smoke.py [--out DIR] [--layers 4] [--mbs 1] [--gbs 4] [--peak-tflops X] [-k EXPR]

1. Writes a seed baseline `SMOKE` for the GPUs torch sees (their count and model; no figures), then runs the
   bundled suites against it with `--gb-record`: every measurement becomes the recorded baseline's expected
   value, so the run exercises every check on this machine whatever its SKU.
2. Runs the suites again, checked against that recording: what fails on the same machine minutes later is a
   defect of ours, or a very noisy node.
3. Prints each collective sweep's peak device memory (the largest size's, and what it was), from the report.
4. Trains the built-in engine at Llama 3 8B's layer shape with fewer layers (one GPU, bf16, seq 8192) and prints
   step time, tokens/s, peak memory and MFU against the GPU's public dense bf16 peak.

Reports, JUnit files and both baselines land in --out (default: a new temporary directory); the storage checks
write and read in its `scratch` folder, so --out on the node's NVMe measures that. Exit status 0 when
both suite runs and the engine run succeeded. `--device cpu` runs the same steps on the CPU with the tiny model
(what the plugin's own tests check); the figures then say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pytest_gbvalidate.baselines import load_baseline
from pytest_gbvalidate.setting_values import bundled_baselines
from pytest_gbvalidate.workloads.llama.flops import Peak

SKU = "SMOKE"
# Public dense bf16 peaks per GPU (TFLOPS), matched on the CUDA device name, and where each is quoted from.
DENSE_BF16_PEAK_TFLOPS = {
    "GB200": (2450.0, "NVIDIA's spec sheet as quoted by dgxc-benchmarking's llama3.1 README"),
    "B200": (2250.0, "NVIDIA's Blackwell architecture whitepaper"),
    "H200": (989.0, "NVIDIA's spec sheet"),
    "H100": (989.0, "NVIDIA's spec sheet as quoted by dgxc-benchmarking's llama3.1 README"),
    "A100": (312.0, "NVIDIA's spec sheet"),
}


def seed_baseline(gpu_names: list[str]) -> str:
    """A baseline with no figures that names this machine's GPUs: what --gb-record records over."""
    resolution = ""  # a GPU's figures: the default resolution (baselines.DEFAULT_NEEDED)
    if not gpu_names:
        detect = "{gpu_count: 0}"
        description = "this machine's CPU (smoke run)"
        # A CPU's figures resolve no finer than the bundled cpu SKU says: recording over the default would refuse them.
        cpu = load_baseline(bundled_baselines() / "cpu.yaml").resolution
        resolution = f"resolution: {{pct: {cpu.pct:g}, provenance: the bundled cpu SKU's}}\n"
    else:
        detect = f"{{gpu_count: {len(gpu_names)}, gpu_name_contains: {json.dumps(gpu_names[0])}}}"
        description = f"{len(gpu_names)}x {gpu_names[0]} (smoke run)"
    head = f"schema_version: 1\nsku: {SKU}\ndescription: {json.dumps(description)}\ndetect: {detect}\n"
    return f"{head}{resolution}metrics: {{}}\n"


def peak_tflops(gpu_name: str) -> Peak | None:
    """The SXM part's peak; None for a PCIe or NVL card ("NVIDIA H100 PCIe", "NVIDIA H200 NVL"), whose clocks and
    power give it a lower dense peak than the table's SXM figure (no public figure for them is at hand here): the
    run asks for --peak-tflops rather than report an MFU against the wrong peak."""
    if "PCIe" in gpu_name or re.search(r"\bNVL\b", gpu_name):
        return None
    found = next((figure for key, figure in DENSE_BF16_PEAK_TFLOPS.items() if key in gpu_name), None)
    return None if found is None else Peak(found[0], f"dense bf16, {found[1]}")


def sweep_memory_lines(report: dict[str, Any]) -> list[str]:
    """One line per collective sweep: its largest device-memory high-water mark, and sizes not run."""
    sweeps: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for m in report.get("measurements", []):
        details = m.get("details") or {}
        if m.get("scope_kind") == "message_size" and "placement" in details and "tool" not in details:
            sweeps.setdefault((m["metric"], details["placement"]), []).append(m)
    lines = []
    for (metric, placement), records in sorted(sweeps.items()):
        peaks = [
            (r["details"]["peak_memory_bytes"], r["scope"]) for r in records if "peak_memory_bytes" in r["details"]
        ]
        not_run = [r["scope"] for r in records if "not_run" in r["details"]]
        line = f"{metric} {placement}: "
        if peaks:
            peak, scope = max(peaks)
            line += f"peak device memory {peak / 2**30:.2f} GiB (at {scope})"
        else:
            line += "no device memory figures (CPU run)"
        if not_run:
            line += f"; not run (memory): {', '.join(not_run)}"
        lines.append(line)
    return lines or ["no collective sweeps in the report"]


def run_suites(out: Path, name: str, extra: list[str], select: list[str]) -> tuple[int, dict[str, Any]]:
    """The bundled suites against the SMOKE baseline in `out`, the storage checks in `out/scratch` (the disk `out`
    is on); (pytest's exit status, the JSON report)."""
    report = out / f"{name}.json"
    (out / "scratch").mkdir(exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "pytest_gbvalidate.suites",
        f"--gb-sku={SKU}",
        f"--gb-baselines={out}",
        f"--gb-report={report}",
        f"--gb-scratch={out / 'scratch'}",
        f"--junitxml={out / f'{name}.xml'}",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        *select,
        *extra,
    ]
    print(f"\n$ {' '.join(command)}", flush=True)
    status = subprocess.run(command, cwd=out, check=False).returncode
    return status, json.loads(report.read_text()) if report.is_file() else {}


def outcome_counts(report: dict[str, Any]) -> str:
    counts: dict[str, int] = {}
    for t in report.get("tests", []):
        if t["when"] == "call" or t["outcome"] != "passed":
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no tests"


def train_engine(device_type: str, layers: int, mbs: int, gbs: int, peak: Peak | None) -> list[str]:
    """The built-in engine on one device at Llama 3 8B's layer shape (tiny model on the CPU)."""
    import dataclasses

    import torch

    from pytest_gbvalidate.workloads.llama import memory
    from pytest_gbvalidate.workloads.llama.config import LLAMA3_8B, LLAMA3_TINY
    from pytest_gbvalidate.workloads.llama.parallel import Layout
    from pytest_gbvalidate.workloads.llama.request import EngineOptions, TrainRequest
    from pytest_gbvalidate.workloads.llama.results import pretrain_result
    from pytest_gbvalidate.workloads.llama.train import train

    base = LLAMA3_8B if device_type == "cuda" else LLAMA3_TINY
    cfg = dataclasses.replace(base, name=f"{base.name}_{layers}layers", n_layers=layers)
    # As a GPU SKU's check runs it: compiled blocks (the first warm-up step compiles), every other lever on.
    options = EngineOptions(compile=device_type == "cuda")
    layout = Layout(mbs=mbs, gbs=gbs, precision="bf16")
    request = TrainRequest(cfg, layout, 3, 10, 3e-4, options=options)
    estimate = memory.busiest(memory.estimate(cfg, layout, chunked_loss=options.chunked_loss, compiled=options.compile))
    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    rank = train(request, device)
    result = pretrain_result(request, rank.step_times_s, rank.losses or [], [rank.memory], peak)
    mfu = "no public peak known for this GPU (pass --peak-tflops)" if result.mfu_pct is None else None
    return [
        f"engine: {cfg.name} (dim {cfg.dim}, seq {cfg.seq_len}, vocab {cfg.vocab_size}), {result.scope}",
        f"step time {result.step_time_s:.4f} s (median of {len(rank.step_times_s)}), "
        f"{result.tokens_per_s_per_gpu:,.0f} tokens/s, {result.model_tflops_per_gpu:.4g} model TFLOPS",
        f"MFU: {mfu or f'{result.mfu_pct:.1f}% of {peak.describe() if peak else None}'}",
        f"peak memory: {rank.memory.gib:.1f} GiB ({rank.memory.what}); the engine's estimate: {estimate.line()}",
        f"loss: {result.losses[0]:.4f} -> {result.losses[-1]:.4f}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="where reports and baselines go (default: a new temp dir)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--layers", type=int, default=4, help="transformer layers of the engine run (default %(default)s)"
    )
    parser.add_argument("--mbs", type=int, default=1)
    parser.add_argument("--gbs", type=int, default=4)
    parser.add_argument("--peak-tflops", type=float, help="dense bf16 peak per GPU for MFU (default: by name)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression: run only these checks in both suite runs")
    args = parser.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU visible to torch: nothing to smoke-test (--device cpu runs the CPU path)")
        return 2
    gpu_names = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if args.device == "cuda" else []
    )
    out = args.out or Path(tempfile.mkdtemp(prefix="gbvalidate-smoke-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{SKU}.yaml").write_text(seed_baseline(gpu_names))
    print(f"smoke run on {', '.join(gpu_names) or 'the CPU'}; torch {torch.__version__}; output in {out}")

    select = ["-k", args.keyword] if args.keyword else []
    record_status, _ = run_suites(out, "record", [f"--gb-record={out / f'{SKU}.yaml'}"], select)
    check_status, report = run_suites(out, "check", [], select)
    print("\n== suites ==")
    print(f"record run: exit {record_status}; check run: exit {check_status} ({outcome_counts(report)})")
    for t in report.get("tests", []):
        if t["outcome"] == "failed":
            print(f"FAILED {t['test_id']}: {t['message']}")
    print("\n== collective sweeps: peak device memory ==")
    print("\n".join(sweep_memory_lines(report)))

    print("\n== built-in engine ==")
    given = None if args.peak_tflops is None else Peak(args.peak_tflops, "--peak-tflops")
    peak = given or (peak_tflops(gpu_names[0]) if gpu_names else None)
    try:
        print("\n".join(train_engine(args.device, args.layers, args.mbs, args.gbs, peak)))
        engine_ok = True
    except Exception as exc:  # reported, and the run fails; the suites' results above still stand
        print(f"engine run failed: {type(exc).__name__}: {exc}")
        engine_ok = False
    print("\n== what only a GPU shows: look at these ==")
    print("\n".join(f"- {line}" for line in GPU_CHECKLIST))
    return 0 if record_status == check_status == 0 and engine_ok else 1


# What the CPU tests cannot show (the code paths are tested there with fakes; the hardware's answer is not).
GPU_CHECKLIST = (
    "the multi-rank paths under this image's torch and NCCL (all passed on an H200, torch 2.11, NCCL 2.28.9), a "
    "peer killed mid-collective among them (the survivors end with 'lost a peer', a written report and exit "
    "status 1, no signal): python benchmarks/gpu_ranks.py --ranks 2,4, several ranks on this GPU",
    "srun --gpus-per-task=1: every rank on cuda:0 of its own GPU; CUDA_DEVICE_ORDER=PCI_BUS_ID seen by the first "
    "CUDA call, so gpuN in test ids is nvidia-smi's GPU N",
    "fp8: a layout whose tokens per microbatch are no multiple of 16 refused before any rank starts (fast "
    "accumulation's worth: benchmarks/pretrain_engine.py's all-fp8 against all-fp8-exact)",
    "the engine's levers off by default: benchmarks/pretrain_engine.py --cases all,all-grad-fusion,"
    "all-one-pass-loss,all-fp8,all-fp8-grad-fusion --profile all,all-grad-fusion,all-one-pass-loss (fusion's line "
    "says 'by the GEMM', and its profile has no fp32 copy over the weights; the loss's kernels shorter)",
    "the memory-fit headroom (2 GiB + 10%): what the CUDA context, NCCL and the P2P checks' peer contexts hold on "
    "a node of several GPUs (nvidia-smi during the suites); the engine's estimate against its peak is printed above",
    "collective sweeps below 1 MiB (10 back-to-back calls per sample) against nccl-tests' all_reduce_perf rows of "
    "the same sizes (--gb-reference-tools)",
    "a hang under NCCL (a rank stopped in a kernel): the ranks in torch.cuda.synchronize counted as waiting, the "
    "stopped one named; a rank waiting in .item() cannot be told apart",
    "after the P2P checks: no 512 MiB cached block left on a peer (torch.accelerator.empty_cache frees every "
    "device's); the peer contexts stay",
    "test_gpus_keep_up_with_their_siblings on a node of 3 or more GPUs: every GPU within its siblings' noise on a "
    "healthy node (the copies' and GEMMs' spread is in each measurement's noise), and a GPU held down "
    "(nvidia-smi -lgc on one GPU) named",
)


if __name__ == "__main__":
    sys.exit(main())
