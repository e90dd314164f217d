"""Parallel layouts: one test per rule an invalid layout breaks, and the pretrain section of a baseline."""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

import pytest

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.settings import bundled_baselines
from pytest_gbvalidate.workloads.llama.config import LLAMA3_8B, LLAMA3_TINY
from pytest_gbvalidate.workloads.llama.parallel import (
    SIZES,
    Layout,
    LayoutError,
    check_world,
    engine_mismatch,
    engine_of,
    for_world,
    problems,
    validate,
)


def test_the_nd_gb200_v6_layout_fills_four_gpus_with_two_data_parallel_pipelines() -> None:
    layout = validate(LLAMA3_8B, for_world(4, mbs=4, gbs=512, tp=1, pp=2, cp=1))
    assert (layout.dp, layout.microbatches, layout.world_size) == (2, 64, 4)
    assert layout.label == "native-bf16-mbs4-gbs512-tp1-pp2-cp1-dp2"
    assert engine_of(dataclasses.replace(layout, engine="megatron_bridge").label) == "megatron_bridge"


def test_the_sizes_are_the_layouts_integer_fields_in_the_labels_order() -> None:
    assert SIZES == ("mbs", "gbs", "tp", "pp", "cp", "dp")
    layout = for_world(4, mbs=4, gbs=512, pp=2)
    assert layout.sizes() == {"mbs": 4, "gbs": 512, "tp": 1, "pp": 2, "cp": 1, "dp": 2}
    assert list(layout.sizes()) == list(SIZES)


def test_tp_pp_cp_must_divide_the_world() -> None:
    with pytest.raises(LayoutError, match=r"TP\*PP\*CP = 1\*4\*1 = 4 does not divide the world of 6 ranks"):
        for_world(6, mbs=1, gbs=8, tp=1, pp=4, cp=1)
    with pytest.raises(LayoutError, match=r"needs TP\*PP\*CP\*DP = 1\*2\*1\*2 = 4 ranks; this run has 8"):
        check_world(Layout(mbs=4, gbs=512, pp=2, dp=2), 8)


def test_layers_must_split_evenly_into_pipeline_stages() -> None:
    assert problems(LLAMA3_TINY, Layout(mbs=1, gbs=6, pp=3)) == [
        ("pp", "4 layers do not split into PP=3 equal pipeline stages")
    ]


def test_heads_and_kv_heads_must_split_over_tensor_parallel_ranks() -> None:
    assert problems(LLAMA3_8B, Layout(mbs=1, gbs=8, tp=3)) == [
        ("tp", "32 attention heads are not divisible by TP=3"),
        ("tp", "8 KV heads are not divisible by TP=3"),
    ]
    assert problems(LLAMA3_8B, Layout(mbs=1, gbs=8, tp=16)) == [("tp", "8 KV heads are not divisible by TP=16")]


def test_sequence_must_split_into_two_chunks_per_context_parallel_rank() -> None:
    assert problems(LLAMA3_8B, Layout(mbs=1, gbs=8, cp=3)) == [
        ("cp", "sequence length 8192 is not divisible by 2*CP = 6")
    ]


def test_global_batch_must_split_into_microbatches_per_data_parallel_rank() -> None:
    assert problems(LLAMA3_8B, Layout(mbs=3, gbs=512, dp=2)) == [("gbs", "GBS 512 is not divisible by MBS*DP = 3*2")]
    assert problems(LLAMA3_8B, Layout(mbs=4, gbs=8, pp=4)) == [
        ("gbs", "2 microbatches per step (GBS/(MBS*DP)) cannot fill PP=4 stages; 1F1B needs at least one per stage")
    ]


def test_engine_precision_and_checkpointing_must_be_known_and_native_fp8_has_no_tp() -> None:
    assert problems(LLAMA3_8B, Layout(mbs=1, gbs=8, precision="fp8")) == []
    assert problems(LLAMA3_8B, Layout(mbs=1, gbs=8, tp=2, precision="fp8")) == [
        ("precision", "the native engine trains in fp8 without tensor parallelism, not TP=2")
    ]
    assert problems(LLAMA3_8B, Layout(mbs=1, gbs=8, tp=2, precision="fp8", engine="nemo")) == []
    assert problems(LLAMA3_8B, Layout(mbs=1, gbs=8, activation_checkpointing="some")) == [
        ("activation_checkpointing", "activation checkpointing 'some' is not one of none, full, selective")
    ]
    assert Layout(mbs=1, gbs=8, activation_checkpointing="selective").label.endswith("-dp1-sac")
    assert [field for field, _ in problems(LLAMA3_8B, Layout(mbs=1, gbs=8, precision="fp4", engine="x"))] == [
        "engine",
        "precision",
    ]


def test_native_fp8_layouts_keep_every_matmul_dimension_a_multiple_of_16() -> None:
    """torch._scaled_mm's CUDA rule, which its CPU kernel does not check: the weight gradient's inner dimension is
    a microbatch's tokens on a rank."""
    odd_tokens = dataclasses.replace(LLAMA3_8B, seq_len=100)  # MBS 1: 100 tokens per microbatch
    assert problems(odd_tokens, Layout(mbs=1, gbs=8, precision="fp8")) == [
        ("precision", "fp8 matmuls need multiples of 16: tokens per microbatch on a rank (MBS*seq/CP) 100")
    ]
    assert problems(odd_tokens, Layout(mbs=4, gbs=8, precision="fp8")) == []  # 400 tokens
    assert problems(odd_tokens, Layout(mbs=1, gbs=8, precision="bf16")) == []  # bf16 has no such rule
    assert problems(odd_tokens, Layout(mbs=1, gbs=8, precision="fp8", engine="nemo")) == []  # NeMo pads its own
    odd_ffn = dataclasses.replace(LLAMA3_8B, ffn_dim=14344)
    assert problems(odd_ffn, Layout(mbs=1, gbs=8, precision="fp8")) == [
        ("precision", "fp8 matmuls need multiples of 16: FFN dim 14344")
    ]


def test_validate_names_every_broken_rule_at_once() -> None:
    with pytest.raises(LayoutError) as info:
        validate(LLAMA3_TINY, Layout(mbs=0, gbs=8, tp=2))
    assert "MBS must be a positive integer, got 0" in str(info.value)
    with pytest.raises(LayoutError) as info:
        validate(dataclasses.replace(LLAMA3_TINY, seq_len=30), Layout(mbs=3, gbs=8, tp=8, cp=4))
    message = str(info.value)
    assert message.startswith("invalid layout native-bf16-mbs3-gbs8-tp8-pp1-cp4-dp1 for llama3_tiny at seq 30: ")
    for part in ("heads are not divisible by TP=8", "not divisible by 2*CP = 8", "GBS 8 is not divisible"):
        assert part in message


# --- the pretrain section of a baseline ------------------------------------------------------------------------

BASELINE = """\
schema_version: 1
sku: TEST
description: a test SKU
metrics: {}
pretrain:
  model: llama3_8b
  mbs: 4
  gbs: 512
  tp: 1
  pp: 2
  cp: 1
  dp: 2
  precision: bf16
  engine: native
  activation_checkpointing: true
  warmup_steps: 3
  timed_steps: 10
  peak_tflops_per_gpu: 2450
  peak_tflops_source: a spec sheet
  provenance: the tests
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "TEST.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_a_baseline_carries_its_pretrain_layout(tmp_path: Path) -> None:
    spec = bl.load_baseline(write(tmp_path, BASELINE)).pretrain
    assert spec is not None
    assert spec.layout == Layout(mbs=4, gbs=512, tp=1, pp=2, cp=1, dp=2, activation_checkpointing="full")
    assert (spec.seq_len, spec.config, spec.learning_rate) == (8192, LLAMA3_8B, bl.DEFAULT_LEARNING_RATE)
    assert (spec.peak_tflops_per_gpu, spec.warmup_steps, spec.timed_steps) == (2450.0, 3, 10)
    again = bl.load_baseline(write(tmp_path, bl.dump_baseline({"schema_version": 1, "sku": "TEST", "metrics": {}})))
    assert again.pretrain is None


@pytest.mark.parametrize(
    ("edit", "where", "message"),
    [
        (("pp: 2", "pp: 3"), ":10: pretrain.pp:", "32 layers do not split into PP=3 equal pipeline stages"),
        (("tp: 1", "tp: 3"), ":9: pretrain.tp:", "32 attention heads are not divisible by TP=3"),
        (("cp: 1", "cp: 3"), ":11: pretrain.cp:", "sequence length 8192 is not divisible by 2*CP = 6"),
        (("gbs: 512", "gbs: 510"), ":8: pretrain.gbs:", "GBS 510 is not divisible by MBS*DP = 4*2"),
        (("precision: bf16", "precision: fp4"), ":13: pretrain.precision:", "'fp4' is not one of fp32, bf16, fp8"),
        (("model: llama3_8b", "model: llama2"), ":6: pretrain.model:", "unknown model 'llama2' (known: llama3_8b"),
        (("mbs: 4", "mbs: four"), ":7: pretrain.mbs:", "must be an integer >= 1, got 'four'"),
        (("  dp: 2\n", ""), ":6: pretrain.dp:", "missing"),
        (("timed_steps: 10", "timed_steps: 10\n  flops: 3"), ":18: pretrain.flops:", "unknown field"),
        (("peak_tflops_source: a spec sheet", "peak_tflops_source: ''"), ":19: pretrain.peak_tflops_source:", "name"),
        (
            ("activation_checkpointing: true", "activation_checkpointing: 1"),
            ":15: pretrain.activation_checkpointing:",
            "must be one of none, full, selective (or true for full, false for none), got 1",
        ),
        (("activation_checkpointing: true", "compile: 'yes'"), ":15: pretrain.compile:", "must be true or false"),
        (
            ("precision: bf16", "precision: fp8\n  fp8_recipe: mxfp8"),
            ":14: pretrain.fp8_recipe:",
            "'mxfp8' is not one of current, delayed",
        ),
        (
            ("precision: bf16", "precision: fp8\n  fp8_recipe: delayed"),  # the native engine scales as it casts
            ":14: pretrain.fp8_recipe:",
            "invalid layout for llama3_8b at seq 8192: the native engine scales fp8 tensors as they are cast",
        ),
        (
            ("engine: native", "engine: native\n  engine_python: /opt/nemo/bin/python"),
            ":15: pretrain.engine_python:",
            "for engine nemo or megatron_bridge only; got '/opt/nemo/bin/python' with engine native",
        ),
        (
            ("engine: native", "engine: nemo\n  engine_python: [python]"),
            ":15: pretrain.engine_python:",
            "got ['python'] with engine nemo",
        ),
    ],
)
def test_a_bad_pretrain_section_names_file_line_and_field(
    tmp_path: Path, edit: tuple[str, str], where: str, message: str
) -> None:
    path = write(tmp_path, BASELINE.replace(*edit))
    with pytest.raises(bl.BaselineError) as info:
        bl.load_baseline(path)
    assert str(info.value).startswith(str(path) + where)
    assert message in str(info.value)


def test_bundled_pretrain_sections_are_valid_and_gb200_uses_the_azure_layout() -> None:
    by_sku = {b.sku: b for b in bl.load_all(bundled_baselines())}
    gb200 = by_sku["ND_GB200_v6"].pretrain
    assert gb200 is not None
    assert (gb200.model, gb200.seq_len, gb200.peak_tflops_per_gpu) == ("llama3_8b", 8192, 2450.0)
    layout = gb200.layout
    assert (layout.mbs, layout.gbs, layout.tp, layout.pp, layout.cp, layout.dp) == (4, 128, 1, 2, 1, 2)
    assert (layout.activation_checkpointing, gb200.compile) == ("full", True)
    cpu = by_sku["cpu"].pretrain
    assert cpu is not None
    assert (cpu.model, cpu.layout.pp, cpu.layout.world_size, cpu.compile) == ("llama3_tiny", 2, 2, False)


def test_an_fp8_layout_names_its_scaling_and_a_nemo_one_its_python(tmp_path: Path) -> None:
    text = BASELINE.replace("precision: bf16", "precision: fp8\n  fp8_recipe: delayed").replace(
        "engine: native", "engine: nemo\n  engine_python: srun --container-image=nemo.sqsh python"
    )
    spec = bl.load_baseline(write(tmp_path, text)).pretrain
    assert spec is not None
    assert spec.layout.label == "nemo-fp8ds-mbs4-gbs512-tp1-pp2-cp1-dp2-ac"
    assert spec.engine_python == "srun --container-image=nemo.sqsh python"
    assert dataclasses.replace(spec.layout, fp8_recipe="current").label == "nemo-fp8cs-mbs4-gbs512-tp1-pp2-cp1-dp2-ac"
    assert dataclasses.replace(spec.layout, precision="bf16").label == "nemo-bf16-mbs4-gbs512-tp1-pp2-cp1-dp2-ac"
    # Recorded and loaded again, the section keeps both.
    again = bl.load_baseline(
        write(
            tmp_path, bl.dump_baseline(bl.recorded_baseline("TEST", bl.load_baseline(write(tmp_path, text)), [], "x"))
        )
    )
    assert again.pretrain == spec


def test_a_recorded_baseline_keeps_the_pretrain_section(tmp_path: Path) -> None:
    previous = bl.load_baseline(write(tmp_path, BASELINE))
    doc = bl.recorded_baseline("TEST", previous, [], "a golden node")
    assert bl.load_baseline(write(tmp_path, bl.dump_baseline(doc))).pretrain == previous.pretrain


def test_step_times_recorded_with_another_engine_are_not_compared() -> None:
    native = "native-bf16-mbs4-gbs512-tp1-pp2-cp1-dp2-seq8192"
    nemo = "nemo-fp8-mbs4-gbs512-tp1-pp2-cp1-dp2-seq8192"
    assert engine_mismatch("llama3_8b_step_time_s", [nemo], native) == (
        "llama3_8b_step_time_s: the baseline's values were recorded with the nemo engine "
        f"({nemo}); this run used the native engine ({native}): refusing to compare step times across engines"
    )
    assert engine_mismatch("m", [nemo, native], native) is None
    assert engine_mismatch("m", [], native) is None  # nothing recorded: the usual no-reference skip
    assert engine_mismatch("m", ["native-fp32-mbs1-gbs8-tp1-pp1-cp1-dp4-seq64"], native) is None  # ditto


def test_a_baseline_that_says_what_runs_must_be_one_only_root_or_this_user_can_write(tmp_path: Path) -> None:
    """As a Slurm Prolog the run is root on every node: whoever can write the baseline would choose what root runs.
    Refused in one line naming the file and what others can write; loaded once the permissions are fixed."""
    text = BASELINE.replace("engine: native", "engine: nemo\n  engine_python: /bin/sh -c 'touch /pwned'")
    shared = tmp_path / "shared"
    shared.mkdir()
    path = write(shared, text)
    shared.chmod(0o777)  # a shared baselines directory anyone can write in
    with pytest.raises(bl.BaselineError) as info:
        bl.load_baseline(path)
    message = str(info.value)
    assert message.startswith(f"{path}: pretrain.engine_python says what the run executes or loads")
    assert re.search(f"{shared} is writable by (its group and )?everyone \\(mode 0777\\)", message)
    assert "\n" not in message
    shared.chmod(0o755)
    assert bl.load_baseline(path).pretrain is not None
    shared.chmod(0o1777)  # /tmp's mode: others may add names, not replace ours
    assert bl.load_baseline(path).pretrain is not None
