"""The pretraining suite end to end: the cpu SKU's tiny PP=2 run (in the session's run of every suite) lands in
the JUnit XML and the JSON report; a layout that cannot run and an engine that is not installed fail with clear
messages."""

from __future__ import annotations

import json
import math
import re
import shutil
import statistics
import sys

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

# Nor can torch.distributed.tensor (its operators register once per process), which the suite imports.
import pytest_gbvalidate.workloads.llama.train  # noqa: F401
from tests.helpers.cpu_run import CpuRun
from tests.helpers.llama_functions import needs_pipelining_over_gloo
from tests.helpers.runs import REPO, SUITES

SUITE = "test_pretrain.py"
PRETRAIN = str(SUITES / SUITE)
METRICS = [
    "llama3_tiny_step_time_s",
    "llama3_tiny_tokens_per_s_per_gpu",
    "llama3_tiny_model_tflops_per_gpu",
    "llama3_tiny_mfu_pct",
]
SCOPE = "native-bf16-mbs2-gbs16-tp1-pp2-cp1-dp1-seq64"

pytestmark = pytest.mark.torch_version  # the built-in engine: pipelining, DTensor, compile, torch 2.9's refusal


@needs_pipelining_over_gloo
def test_the_cpu_pretrain_check_reports_step_time_throughput_mfu_and_loss(cpu_suites_run: CpuRun) -> None:
    # The pretraining suite's check, read from the session's run of every suite.
    report = cpu_suites_run.report
    (call,) = [t for t in report["tests"] if t["when"] == "call" and t["test_id"].startswith(f"suites/{SUITE}::")]
    # This machine's speed is not under test: one slower than the baseline's (a busy GPU workstation running the
    # tests under -n) misses the gates, and nothing else may fail.
    assert call["outcome"] == "passed" or call["fault"]["category"] == "performance", call["text"]
    props = cpu_suites_run.cases["test_pretrain"]["props"]
    assert [v for k, v in props if k == "gb_metric"] == METRICS
    verdicts = [v for k, v in props if k == "gb_verdict"]
    assert len(verdicts) == 4
    assert set(verdicts) <= {"pass", "warn", "fail"}
    assert {v for k, v in props if k == "gb_scope"} == {SCOPE}
    junit = dict(props)
    curve = json.loads(junit["gb_loss_curve"])
    assert len(curve) == 12
    assert curve[-1] < 0.9 * curve[0]
    assert float(junit["gb_mfu_pct"]) > 0 and junit["gb_mfu_peak"].startswith("0.48 TFLOPS per GPU (")

    measured = {m["metric"]: m for m in cpu_suites_run.measurements(SUITE)}
    assert list(measured) == METRICS
    details = measured["llama3_tiny_step_time_s"]["details"]
    assert (details["model"], details["layout"], details["pp"], details["dp"]) == ("llama3_tiny", SCOPE, 2, 1)
    assert (details["warmup_steps"], details["timed_steps"], len(details["step_times_s"])) == (2, 10, 10)
    assert details["loss_curve"] == pytest.approx(curve, abs=1e-4)
    step_time_s = measured["llama3_tiny_step_time_s"]["value"]
    assert step_time_s == pytest.approx(statistics.median(details["step_times_s"]))
    tokens_per_s = measured["llama3_tiny_tokens_per_s_per_gpu"]["value"]
    assert tokens_per_s == pytest.approx(16 * 64 / step_time_s / 2)  # GBS x seq per step, over 2 ranks
    tflops = measured["llama3_tiny_model_tflops_per_gpu"]["value"]
    assert tflops == pytest.approx(details["flops_per_token"] * tokens_per_s / 1e12)
    assert measured["llama3_tiny_mfu_pct"]["value"] == pytest.approx(100 * tflops / details["peak_tflops_per_gpu"])
    # The MFU says against what: the peak it divides by and that peak's source, beside it.
    mfu_details = measured["llama3_tiny_mfu_pct"]["details"]
    assert mfu_details["peak_tflops_per_gpu"] == details["peak_tflops_per_gpu"] == 0.48
    assert mfu_details["peak_tflops_source"] == details["peak_tflops_source"] != ""
    assert [m["what"] for m in details["peak_memory"]] == ["host RSS peak", "host RSS peak"]
    assert all(0 < m["gib"] < 64 for m in details["peak_memory"])
    # Telemetry sampled through the run: in the step time's details, the report's telemetry list and JUnit.
    assert set(details["telemetry"]["cpu.utilization_pct"]) == {"mean", "p5", "p95"}
    (sampled,) = [t for t in report["telemetry"] if t["test_id"].startswith(f"suites/{SUITE}::")]
    assert sampled["test_id"] == "suites/test_pretrain.py::test_pretrain"
    assert sampled["sample_count"] >= 2
    assert float(junit["gb_telemetry.cpu.utilization_pct.mean"]) > 0
    assert math.log(512) > details["loss_curve"][0] - 0.1  # the tiny model starts near ln(vocab)


def baselines_with(pytester: pytest.Pytester, edit: tuple[str, str]) -> None:
    shutil.copytree(REPO / "baselines", pytester.path / "b")
    cpu = pytester.path / "b" / "cpu.yaml"
    text = cpu.read_text()
    assert edit[0] in text
    cpu.write_text(text.replace(*edit))


def test_a_layout_that_does_not_fill_the_gang_fails_before_any_rank_starts(pytester: pytest.Pytester) -> None:
    # DP=2 on top of PP=2 needs 4 ranks; the cpu SKU's gang has 2. (dp is the last size in the section.)
    baselines_with(pytester, ("  dp: 1\n  precision: bf16", "  dp: 2\n  precision: bf16"))
    result = pytester.runpytest(PRETRAIN, "--gb-sku=cpu", "--gb-baselines=b", "--gb-report=r.json")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*pretrain layout from the baseline: layout native-bf16-mbs2-gbs16-tp1-pp2-cp1-dp2 needs "
            "TP*PP*CP*DP = 1*2*1*2 = 4 ranks; this run has 2*"
        ]
    )
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["measurements"] == []
    (call,) = [t for t in report["tests"] if t["when"] == "call"]
    assert call["duration_s"] < 5  # no gang was started


def test_a_layout_that_cannot_fit_fails_before_any_rank_starts_with_the_estimate(pytester: pytest.Pytester) -> None:
    # Llama 3 8B at seq 8192 in microbatches of 512 sequences: tens of TiB per rank, more than any host has.
    baselines_with(
        pytester,
        (
            "  model: llama3_tiny\n  seq_len: 64\n  mbs: 2\n  gbs: 16\n",
            "  model: llama3_8b\n  seq_len: 8192\n  mbs: 512\n  gbs: 1024\n",
        ),
    )
    result = pytester.runpytest(PRETRAIN, "--gb-sku=cpu", "--gb-baselines=b", "--gb-report=r.json")
    result.assert_outcomes(failed=1)
    layout = "native-bf16-mbs512-gbs1024-tp1-pp2-cp1-dp1"
    result.stdout.fnmatch_lines(
        [
            f"gbvalidate: pretrain {layout}, memory per rank (estimate, busiest): stage 0: weights * GiB; "
            "each of 2 ranks has * GiB of the host's available memory",
            f"*pretrain layout {layout} cannot fit: pipeline stage 0: * GiB; stage 1: *logits * GiB (estimates; *). "
            "Recompute more (activation_checkpointing: full), or lower MBS, or raise PP or TP*",
        ]
    )
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["measurements"] == []
    (call,) = [t for t in report["tests"] if t["when"] == "call"]
    assert call["duration_s"] < 5 and call["fault"]["category"] != "performance"  # no rank trained


def test_a_layout_the_model_cannot_split_is_a_usage_error_at_start(pytester: pytest.Pytester) -> None:
    baselines_with(pytester, ("  pp: 2\n", "  pp: 3\n"))
    result = pytester.runpytest(PRETRAIN, "--gb-sku=cpu", "--gb-baselines=b")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert re.search(
        r"bad baseline: .*cpu\.yaml:\d+: pretrain\.pp: invalid layout for llama3_tiny at seq 64: "
        r"4 layers do not split into PP=3 equal pipeline stages",
        result.stderr.str(),
    )


def test_the_nemo_engine_runs_under_the_python_named_and_says_what_is_missing_there(pytester: pytest.Pytester) -> None:
    """This interpreter (no NeMo here), the baseline's `pretrain.engine_python`, then the setting, which wins."""
    baselines_with(
        pytester,
        ("  model: llama3_tiny\n  seq_len: 64\n", "  model: llama3_8b\n  seq_len: 64\n"),
    )
    cpu = pytester.path / "b" / "cpu.yaml"
    cpu.write_text(cpu.read_text().replace("  engine: native\n", "  engine: nemo\n"))
    args = [PRETRAIN, "--gb-sku=cpu", "--gb-baselines=b"]
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*engine nemo under * (this interpreter): nemo_toolkit is not installed there (No module named 'nemo')*"]
    )
    cpu.write_text(cpu.read_text().replace("  engine: nemo\n", "  engine: nemo\n  engine_python: no-such-python\n"))
    result = pytester.runpytest(*args)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*pretrain.engine_python in *cpu.yaml: 'no-such-python': no program*on PATH*"])
    launcher = f"env GBVALIDATE_MARK=1 {sys.executable}"  # a launcher before an interpreter, as srun would be
    result = pytester.runpytest(*args, f"--gb-engine-python={launcher}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [f"*engine nemo under {launcher} (--gb-engine-python on the command line): nemo_toolkit is not installed*"]
    )
