"""The built-in engine's parallel layouts train exactly as one rank does: same weights, same data, same loss
at every step (so forward, backward, gradient averaging and the optimizer agree), on 2 CPU ranks over gloo."""

from __future__ import annotations

import dataclasses
import gc
import math
import re
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from pytest_gbvalidate.bench.timing import MIN_TIMED_ITERATIONS
from pytest_gbvalidate.files import atomic_write_bytes
from pytest_gbvalidate.ranks.gang import GangError, LocalGang, RankContext
from pytest_gbvalidate.workloads.llama import layout_grid
from pytest_gbvalidate.workloads.llama import train as train_module
from pytest_gbvalidate.workloads.llama.config import LLAMA3_TINY
from pytest_gbvalidate.workloads.llama.flops import Peak
from pytest_gbvalidate.workloads.llama.loss import softmax_grad_one_pass
from pytest_gbvalidate.workloads.llama.model import Transformer, build
from pytest_gbvalidate.workloads.llama.parallel import Layout
from pytest_gbvalidate.workloads.llama.parallelize import context_parallel_positions, keep_stage
from pytest_gbvalidate.workloads.llama.request import EngineOptions, TrainRequest
from pytest_gbvalidate.workloads.llama.results import MemoryPeak, PretrainResult, RankResult, summarize
from pytest_gbvalidate.workloads.llama.train import Trainer, torch_release, train, train_worker
from tests.helpers import llama_functions as f

pytestmark = pytest.mark.torch_version  # pipelining, DTensor, device meshes, compile, torch 2.9's refusals

STEPS = 3  # the third step's loss depends on two optimizer updates made from averaged gradients


def request(options: EngineOptions | None = None, **layout: int | str) -> TrainRequest:
    # fp32: the layouts must agree to rounding, which bf16 would blur.
    shape = Layout(**{"mbs": 2, "gbs": 4, "precision": "fp32", **layout})  # type: ignore[arg-type]
    return TrainRequest(
        LLAMA3_TINY, shape, warmup_steps=0, timed_steps=STEPS, learning_rate=3e-3, options=options or EngineOptions()
    )


def losses_of(trainer: Trainer) -> list[float]:
    return [float(loss) for loss in (trainer.step(i) for i in range(STEPS)) if loss is not None]


@pytest.fixture(scope="module")
def gang() -> Iterator[LocalGang]:
    g = LocalGang(2, start_timeout_s=60)
    yield g
    g.close()


@pytest.fixture(scope="module")
def single_rank_losses() -> list[float]:
    return losses_of(Trainer(request(), torch.device("cpu"), None))


@pytest.mark.parametrize(
    "layout",
    [pytest.param({"pp": 2}, marks=f.needs_pipelining_over_gloo), {"tp": 2}, {"dp": 2}, {"cp": 2}],
    ids=lambda d: "-".join(d),
)
def test_a_parallel_layout_gives_the_single_rank_loss(
    gang: LocalGang, single_rank_losses: list[float], layout: dict[str, int]
) -> None:
    per_rank = gang.run(f.step_losses, request(None, **layout), timeout_s=120)
    losses = [r for r in per_rank if r is not None]
    assert losses, f"no rank computed the loss: {per_rank}"
    for rank_losses in losses:
        assert rank_losses == pytest.approx(single_rank_losses, rel=1e-5, abs=0)
    assert single_rank_losses[-1] < single_rank_losses[0]  # the steps did train


@pytest.mark.skipif(torch_release() >= (2, 10), reason="torch 2.9 only: later releases pipeline over gloo")
def test_pipelining_over_gloo_on_torch_2_9_fails_saying_why(gang: LocalGang) -> None:
    with pytest.raises(
        GangError, match=r"pipeline parallelism \(PP=2\) over gloo needs torch >= 2\.10; this is torch 2\.9"
    ):
        gang.run(f.step_losses, request(None, pp=2), timeout_s=120)


def test_torch_releases_are_read_from_ngc_and_local_versions() -> None:
    assert torch_release("2.9.0a0+50eac811a6.nv25.09") == (2, 9)
    assert torch_release("2.15.0a0+5d3a6b2e71.nv25.11") == (2, 15)
    assert torch_release("2.10.0+cu128") == (2, 10)


def test_the_batches_fed_to_a_step_are_contiguous() -> None:
    # torch.distributed.pipelining up to 2.11 checks each first-stage input's strides against a contiguous copy
    # it recorded: a slice of the token batch failed PP=2 there with a PipeliningShapeError.
    trainer = Trainer(request(), torch.device("cpu"), None)
    assert all(t.is_contiguous() for batch in trainer.batches for t in batch)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_recomputes_the_same_loss(single_rank_losses: list[float], mode: str) -> None:
    trainer = Trainer(request(activation_checkpointing=mode), torch.device("cpu"), None)
    assert {block.checkpointing for block in trainer.model.layers.values()} == {mode}
    assert losses_of(trainer) == pytest.approx(single_rank_losses, rel=1e-6)


@pytest.mark.parametrize(
    "lever",
    [
        {"chunked_loss": False},
        {"fused_adamw": False},
        {"grad_accumulation_fusion": True},
        {"grad_accumulation_fusion": True, "chunked_loss": False},
    ],
    ids=["whole logits", "foreach AdamW", "fused gradient accumulation", "fused gradient accumulation, whole logits"],
)
def test_each_speed_lever_turned_from_its_default_trains_to_the_same_loss(
    single_rank_losses: list[float], lever: dict[str, Any]
) -> None:
    """The engine's defaults (head and loss chunk by chunk, fused AdamW, autograd adding the gradients) against each
    turned the other way."""
    trainer = Trainer(request(EngineOptions(**lever)), torch.device("cpu"), None)
    assert trainer.model.head_in_loss is lever.get("chunked_loss", True)
    assert losses_of(trainer) == pytest.approx(single_rank_losses, rel=1e-5)


FUSED = EngineOptions(grad_accumulation_fusion=True)


@pytest.mark.parametrize("layout", [{"dp": 2}, {"cp": 2}], ids=lambda d: "-".join(d))
def test_fused_gradient_accumulation_gives_the_single_rank_loss_in_a_parallel_layout(
    gang: LocalGang, single_rank_losses: list[float], layout: dict[str, int]
) -> None:
    """DP and CP average the gradients and the optimizer zeroes them, in place, in the buffers the backward pass
    adds into."""
    per_rank = gang.run(f.step_losses, request(FUSED, **layout), timeout_s=120)
    losses = [r for r in per_rank if r is not None]
    assert losses, f"no rank computed the loss: {per_rank}"
    for rank_losses in losses:
        assert rank_losses == pytest.approx(single_rank_losses, rel=1e-5, abs=0)


@pytest.mark.parametrize(
    ("layout", "refusal"),
    [
        ({"tp": 2}, "gradient-accumulation fusion takes plain weights, not TP=2's shards"),
        # torch 2.13's schedule runs a backward pass of its own before the first microbatch, to learn shapes: the
        # fused layers added its gradients into theirs (seen: the last stage's weights off after one step).
        ({"pp": 2}, "gradient-accumulation fusion runs without pipeline stages, not PP=2"),
    ],
    ids=["tp", "pp"],
)
def test_fused_gradient_accumulation_refuses_layouts_it_cannot_run(
    gang: LocalGang, layout: dict[str, int], refusal: str
) -> None:
    with pytest.raises(GangError, match=re.escape(refusal)):
        gang.run(f.step_losses, request(FUSED, **layout), timeout_s=120)


# torch's own warnings while compiling: importing Inductor touches torch.jit.script_method, which torch has
# deprecated, and Dynamo reads .grad of the non-leaf tensors it traces.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_compiled_blocks_train_to_the_eager_loss(single_rank_losses: list[float]) -> None:
    """torch.compile of each block (Inductor's C++ backend on the CPU) reorders floating-point reductions: the
    same loss to 1e-4, step by step, with each block's recomputation compiled in too."""
    compiled = request(EngineOptions(compile=True), activation_checkpointing="selective")
    trainer = Trainer(compiled, torch.device("cpu"), None)
    assert losses_of(trainer) == pytest.approx(single_rank_losses, rel=1e-4)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
# Dynamo itself makes an autograd.Function object to trace one's ctx, which torch has deprecated.
@pytest.mark.filterwarnings("ignore:<class 'torch.autograd.function.Function'> should not be:DeprecationWarning")
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_compiled_blocks_add_their_gradients_in_place_in_every_recomputation_mode(
    single_rank_losses: list[float], mode: str
) -> None:
    """A compiled block's backward graph holds the in-place additions into the weights' .grad (dynamo and
    AOTAutograd trace them; "aot_eager" stops short of Inductor's code, which compiles the same graph), with its
    recomputation inside: no graph break, and the eager loss."""
    options = dataclasses.replace(FUSED, compile=True, compile_backend="aot_eager")
    breaks = sum(counters["graph_break"].values())
    trainer = Trainer(request(options, activation_checkpointing=mode), torch.device("cpu"), None)
    assert losses_of(trainer) == pytest.approx(single_rank_losses, rel=1e-4)
    assert sum(counters["graph_break"].values()) == breaks, dict(counters["graph_break"])


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_a_compiled_run_with_the_one_pass_loss_gradient_trains_to_the_eager_loss(
    single_rank_losses: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    traced: list[int] = []

    def one_pass(logits: torch.Tensor, labels: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        traced.append(tokens)  # once for each graph dynamo makes of it
        return softmax_grad_one_pass(logits, labels, tokens)

    monkeypatch.setattr(train_module, "softmax_grad_one_pass", one_pass)
    options = EngineOptions(compile=True, compile_backend="aot_eager", loss_grad_one_pass=True)
    trainer = Trainer(request(options), torch.device("cpu"), None)
    assert losses_of(trainer) == pytest.approx(single_rank_losses, rel=1e-4)
    assert traced


# Seen on torch 2.9.0 only: a compiled context-parallel run's weights stay referenced after the trainer is gone,
# through a gc.collect() and a torch._dynamo.reset() too (a reference held inside torch, not a cycle of ours; an
# eager run frees them). A long-lived rank on such a torch holds them until it exits. 2.13 and 2.15 free them.
TORCH_2_9_KEEPS_A_COMPILED_CP_RUN = pytest.mark.xfail(
    torch_release() < (2, 10), reason="torch 2.9 keeps a compiled CP run's weights", strict=True
)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
@pytest.mark.parametrize(
    "layout",
    [
        {},
        pytest.param({"pp": 2}, marks=f.needs_pipelining_over_gloo),
        {"tp": 2},
        {"dp": 2},
        pytest.param({"cp": 2}, marks=TORCH_2_9_KEEPS_A_COMPILED_CP_RUN),
    ],
    ids=lambda d: "-".join(d) or "one-rank",
)
def test_a_compiled_run_leaves_no_weight_for_the_cyclic_collector(gang: LocalGang, layout: dict[str, int]) -> None:
    """A compiled method kept on its block (nn.Module.compile) referenced the block: a reference cycle that kept
    every run's weights until Python's cyclic collector ran, which a long-lived rank (a layout sweep) may not do
    for many runs. On a GPU, tens of GiB held: later runs' peaks inflated, or a layout that fits run out of
    memory. With the collector off, nothing of a dropped trainer may stay, whatever the layout. ("eager": the
    cycle was in what torch.compile keeps, not in the backend.)"""
    options = EngineOptions(compile=True, compile_backend="eager")
    if layout:
        per_rank = gang.run(f.weights_outlive_the_trainer, request(options, **layout), timeout_s=120)
    else:
        cpu = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
        per_rank = [f.weights_outlive_the_trainer(cpu, request(options))]
    assert per_rank == [[]] * len(per_rank)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_every_compiled_run_compiles_past_dynamo_s_recompile_limit() -> None:
    """Every block runs through one code object, whose dynamo cache grows by an entry per guard set (here a
    head width, a module attribute dynamo specialises on). Past config.recompile_limit entries dynamo would run
    the blocks eager with only a warning: a long-lived rank's later sweep points would time an uncompiled engine.
    Each compiled run (train, as every sweep rank runs it) must compile its blocks, and its chunked loss's softmax,
    itself."""
    limit = torch._dynamo.config.recompile_limit
    compiled_graphs = []
    for head_dim in range(2, 2 * (limit + 2) + 1, 2):  # limit + 2 runs, each a head width of its own
        cfg = dataclasses.replace(LLAMA3_TINY, n_layers=2, dim=4 * head_dim, ffn_dim=32, vocab_size=64, seq_len=16)
        options = EngineOptions(compile=True, compile_backend="eager")  # the same guards, without Inductor
        shape = Layout(mbs=2, gbs=2, precision="fp32")
        before = counters["stats"]["unique_graphs"]
        run = TrainRequest(cfg, shape, 0, MIN_TIMED_ITERATIONS, learning_rate=1e-3, options=options)
        train(run, torch.device("cpu"))
        compiled_graphs.append(counters["stats"]["unique_graphs"] - before)
    assert compiled_graphs == [2] * (limit + 2)  # the blocks' graph and the loss's


def test_fp8_matmuls_train_close_to_bf16() -> None:
    """fp8 (e4m3 forward, e5m2 gradients, a scale per tensor) rounds each matmul's operands to 3 or 2 mantissa
    bits: the loss stays within 2% of bf16's, step by step, and falls as fast."""
    bf16, fp8 = (losses_of(Trainer(request(precision=p), torch.device("cpu"), None)) for p in ("bf16", "fp8"))
    assert fp8 == pytest.approx(bf16, rel=0.02)
    assert fp8[-1] < fp8[0]


def test_a_pipeline_stage_holds_the_whole_models_weights_for_its_layers() -> None:
    cfg = LLAMA3_TINY
    whole = dict(build(cfg, torch.device("cpu"), seed=7).named_parameters())
    with torch.device("meta"):
        stage = Transformer(cfg)
    keep_stage(stage, pp=2, stage=1)
    stage.materialize(torch.device("cpu"), seed=7)
    names = [name for name, _ in stage.named_parameters()]
    assert names[0].startswith("layers.2.")
    assert "output.weight" in names
    assert "tok_embeddings.weight" not in names
    for name, param in stage.named_parameters():
        assert torch.equal(param, whole[name]), name


def test_context_parallel_ranks_hold_an_early_and_a_late_chunk() -> None:
    # 16 tokens, CP=2: 4 chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
    assert context_parallel_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert context_parallel_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def rank_result(
    rank: int, step_times_s: list[float], losses: list[float] | None, stage: int | None = None, **more: Any
) -> RankResult:
    """A rank's result; by default each rank its own pipeline stage."""
    stage = rank if stage is None else stage
    return RankResult(rank, stage, step_times_s, losses, MemoryPeak("host RSS peak", 0.5 + rank), **more)


def test_the_straggler_shows_in_the_work_before_the_gradient_sync() -> None:
    """Two nodes of one rank: node1 computes slower, node0 waits for it at the sync; their step times agree."""
    req = TrainRequest(LLAMA3_TINY, Layout(mbs=2, gbs=16, dp=2), warmup_steps=1, timed_steps=3, learning_rate=1e-3)
    results = [
        rank_result(0, [2.0, 2.1, 2.0], [5.0] * 4, 0, node="node0 (a)", compute_times_s=[1.0, 1.1, 1.0]),
        rank_result(1, [2.0, 2.1, 2.0], [5.0] * 4, 0, node="node1 (b)", compute_times_s=[1.9, 2.0, 1.9]),
    ]
    summary = summarize(req, results, peak=None)
    assert summary.per_node_step_time_s == {"node0 (a)": 2.0, "node1 (b)": 2.0}
    assert summary.per_node_compute_s == {"node0 (a)": 1.0, "node1 (b)": 1.9}
    assert summary.rank_spread_pct == pytest.approx(90.0)
    assert summary.details()["per_rank_compute_s"] == [1.0, 1.9]


def test_summary_takes_the_slowest_rank_per_step_and_the_median_step() -> None:
    req = TrainRequest(LLAMA3_TINY, Layout(mbs=2, gbs=16, pp=2), warmup_steps=1, timed_steps=3, learning_rate=1e-3)
    results = [
        rank_result(0, [1.0, 4.0, 2.0], None),
        rank_result(1, [3.0, 1.0, 2.5], [6.0, 5.0, 4.0, 3.0]),
    ]
    summary = summarize(req, results, peak=Peak(2.0, "a test's peak"))
    assert summary.step_times_s == [3.0, 4.0, 2.5]
    assert summary.step_time_s == 3.0
    # 16 sequences of 64 tokens per step, over 3 s, on 2 ranks
    assert summary.tokens_per_s_per_gpu == pytest.approx(16 * 64 / 3.0 / 2)
    assert summary.model_tflops_per_gpu == pytest.approx(summary.flops_per_token * 16 * 64 / 6.0 / 1e12)
    assert summary.mfu_pct == pytest.approx(100 * summary.model_tflops_per_gpu / 2.0)
    assert summary.losses == [6.0, 5.0, 4.0, 3.0]
    assert summary.loss_drop_pct == pytest.approx(100 * (6.0 - 4.0) / 6.0)  # mean of the last 3 is 4.0
    assert summary.loss_decreased
    details = summary.details()
    assert details["peak_memory"] == [
        {"rank": 0, "what": "host RSS peak", "gib": 0.5},
        {"rank": 1, "what": "host RSS peak", "gib": 1.5},
    ]
    assert summarize(req, results, peak=None).mfu_pct is None


@pytest.mark.parametrize(
    "losses",
    [
        [6.24, 6.23, 6.22, 6.2, 6.19],  # flat: learned nothing (under 10%)
        [10.0, 9.5, 9.0, 9.0, 9.0],  # exactly 10%: not more
        [6.24, 3.0, float("nan"), 2.0, 2.0],  # a NaN anywhere
        [6.24, 7.0, 8.0, 9.0, 10.0],  # diverging
    ],
)
def test_a_loss_that_does_not_go_down_fails_the_loss_check(losses: list[float]) -> None:
    req = TrainRequest(LLAMA3_TINY, Layout(mbs=2, gbs=16), warmup_steps=0, timed_steps=5, learning_rate=1e-3)
    summary: PretrainResult = summarize(req, [rank_result(0, [1.0] * 5, losses)], None)
    assert not summary.loss_decreased
    message = summary.loss_message()
    assert message.startswith("llama3_tiny native-bf16-mbs2-gbs16-tp1-pp1-cp1-dp1: loss fell ")
    assert f"ln(vocab) = {math.log(512):.3f}" in message
    assert f"loss per step: {losses[0]:.4g}, " in message
    assert "(needs more than 10%)" in message


@f.needs_pipelining_over_gloo
def test_a_reduced_sweep_on_cpu_trains_each_layout_and_plots_it(gang: LocalGang, tmp_path: Path) -> None:
    train = layout_grid.native_trainer(
        gang, LLAMA3_TINY, warmup_steps=1, timed_steps=10, learning_rate=3e-3, peak=Peak(0.5, "a test's peak")
    )
    grid = {"mbs": [2], "tp": [1], "pp": [1, 2, 4], "cp": [1]}
    with layout_grid.node_samplers(gpu=False) as sample:
        points = layout_grid.sweep(LLAMA3_TINY, 2, 8, grid, train, sample, precision="fp32")
    assert [(p.pp, p.dp, p.status) for p in points] == [(1, 2, "ok"), (2, 1, "ok"), (4, None, "invalid")]
    for p in points[:2]:
        assert p.result is not None
        assert p.result.loss_decreased, p.result.loss_message()
        assert p.telemetry is not None
        assert "cpu.utilization_pct" in p.telemetry  # the host is sampled; a CPU node has no GPU series
        assert p.telemetry_mean("utilization_pct") is None
    written = layout_grid.write_outputs(points, tmp_path, atomic_write_bytes)
    assert {p.name for p in written} >= {"sweep.md", "sweep_pp.png", "sweep_mbs.png"}
    assert "Best layout: native-fp32-mbs2-gbs8-" in (tmp_path / "sweep.md").read_text()


def test_each_run_of_a_long_lived_rank_starts_with_the_earlier_runs_cycles_collected() -> None:
    """Whatever of an earlier run only the cyclic collector frees (seen: an eager CP run's weights on torch 2.13)
    goes before the next run allocates, however long the collector stays off."""

    class Cycle:
        pass

    held = Cycle()
    held.self = held  # type: ignore[attr-defined]
    held.weights = torch.ones(4)  # type: ignore[attr-defined]
    weights = weakref.ref(held.weights)  # type: ignore[attr-defined]
    del held
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    gc.disable()
    try:
        assert weights() is not None  # only the collector frees it
        train_worker(ctx, TrainRequest(LLAMA3_TINY, Layout(mbs=1, gbs=1, precision="fp32"), 0, 10, 1e-3))
        assert weights() is None
    finally:
        gc.enable()
