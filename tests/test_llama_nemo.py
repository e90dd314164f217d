"""The NeMo engines without NeMo: the launch they would run, their driver scripts executed against stand-in
modules, and their log lines parsed in the formats NeMo 2 and Megatron print."""

from __future__ import annotations

import dataclasses
import statistics
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate.baselines import PretrainSpec, load_baseline
from pytest_gbvalidate.workloads.llama import nemo
from tests.test_plugin import REPO


def gb200_spec(engine: str, **layout: Any) -> PretrainSpec:
    spec = load_baseline(REPO / "baselines" / "ND_GB200_v6.yaml").pretrain
    assert spec is not None
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, engine=engine, **layout))


def test_engines_that_are_not_installed_say_what_is_missing() -> None:
    with pytest.raises(nemo.EngineUnavailable, match="engine nemo: nemo_toolkit is not installed"):
        nemo.require_engine("nemo")
    with pytest.raises(nemo.EngineUnavailable, match=r"Megatron-Bridge is not installed .*Python >= 3\.12"):
        nemo.require_engine("megatron_bridge")

    def nemo3(module: str) -> object | None:  # nemo_toolkit 3.x: the package without the LLM collection
        return object() if module == "nemo" else None

    with pytest.raises(nemo.EngineUnavailable) as info:
        nemo.require_engine("nemo", find_spec=nemo3, version=lambda _: "3.0.1")
    assert str(info.value) == (
        "engine nemo: nemo_toolkit 3.0.1 has no nemo.collections.llm (nemo_toolkit 3.x removed the LLM collection; "
        "LLM training moved to Megatron-Bridge): use nemo_toolkit <= 2.7 or engine megatron_bridge"
    )
    nemo.require_engine("nemo", find_spec=lambda _: object(), version=lambda _: "2.7.0")  # 2.x with llm: fine


def test_the_launch_is_torchrun_on_every_gpu_with_a_driver_for_the_layout(tmp_path: Path) -> None:
    plan = nemo.plan_launch(gb200_spec("nemo", precision="fp8"), gpus=4, workdir=tmp_path)
    driver = str(tmp_path / "gbvalidate_nemo_pretrain.py")
    assert plan.argv == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", driver]
    assert plan.log_path == tmp_path / "nemo_pretrain.log"
    compile(plan.driver_source, driver, "exec")
    with pytest.raises(nemo.EngineUnavailable, match="needs 4 GPUs; this node has 8"):
        nemo.plan_launch(gb200_spec("nemo"), gpus=8, workdir=tmp_path)
    tiny = dataclasses.replace(gb200_spec("nemo"), model="llama3_tiny")
    with pytest.raises(nemo.EngineUnavailable, match="runs the llama3_8b recipe only, not llama3_tiny"):
        nemo.plan_launch(tiny, gpus=4, workdir=tmp_path)


def tree(**fields: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**fields)


def fake_modules(monkeypatch: pytest.MonkeyPatch, modules: dict[str, dict[str, Any]]) -> None:
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)


def run_driver(plan: nemo.LaunchPlan, build: str) -> Any:
    namespace: dict[str, Any] = {"__name__": "driver_under_test"}  # not __main__: build only, train nothing
    exec(compile(plan.driver_source, str(plan.driver_path), "exec"), namespace)
    return namespace[build](namespace["SETTINGS"])


def test_the_nemo_driver_sets_the_recipe_to_the_baselines_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, Any] = {}

    def pretrain_recipe(**kwargs: Any) -> types.SimpleNamespace:
        calls.update(kwargs)
        return tree(
            trainer=tree(strategy=tree(), plugins=None),
            model=tree(config=tree()),
            data=tree(),
            log=tree(ckpt="default"),
            optim=tree(config=tree(lr=None), lr_scheduler=tree(warmup_steps=2000)),
        )

    fake_modules(
        monkeypatch,
        {
            "nemo_run": {},
            "nemo": {},
            "nemo.collections": {"llm": tree(llama3_8b=tree(pretrain_recipe=pretrain_recipe))},
            "nemo.collections.llm": {},
            "nemo.collections.llm.recipes": {},
            "nemo.collections.llm.recipes.precision": {},
            "nemo.collections.llm.recipes.precision.mixed_precision": {
                "bf16_mixed": lambda: "bf16 plugin",
                "bf16_with_fp8_mixed": lambda: "bf16 + fp8 plugin",
            },
        },
    )
    recipe = run_driver(nemo.plan_launch(gb200_spec("nemo", precision="fp8"), 4, tmp_path), "build_recipe")
    assert calls == {"name": "gbvalidate", "dir": str(tmp_path), "num_nodes": 1, "num_gpus_per_node": 4}
    s = recipe.trainer.strategy
    assert (s.tensor_model_parallel_size, s.pipeline_model_parallel_size, s.context_parallel_size) == (1, 2, 1)
    assert (recipe.data.micro_batch_size, recipe.data.global_batch_size, recipe.data.seq_length) == (4, 128, 8192)
    assert recipe.model.config.seq_length == 8192
    assert recipe.model.config.recompute_granularity == "full"  # the baseline asks for activation checkpointing
    assert recipe.trainer.plugins == "bf16 + fp8 plugin"
    assert (recipe.trainer.max_steps, recipe.trainer.log_every_n_steps, recipe.trainer.limit_val_batches) == (13, 1, 0)
    assert (recipe.log.ckpt, recipe.trainer.enable_checkpointing) == (None, False)
    assert (recipe.optim.config.lr, recipe.optim.lr_scheduler.warmup_steps) == (3e-4, 0)


def test_the_megatron_bridge_driver_sets_what_its_release_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def llama3_8b_pretrain_config(mock: bool) -> types.SimpleNamespace:
        assert mock
        return tree(
            model=tree(
                tensor_model_parallel_size=2, pipeline_model_parallel_size=1, context_parallel_size=2, seq_length=4096
            ),
            dataset=tree(sequence_length=4096),  # an older release: no dataset.seq_length
            train=tree(micro_batch_size=1, global_batch_size=128, train_iters=1000, eval_iters=32),
            optimizer=tree(lr=1e-4),
            scheduler=tree(lr_warmup_iters=2000),
            logger=tree(log_interval=10),
            checkpoint=tree(save="/ckpt"),
            mixed_precision=None,
        )

    fake_modules(
        monkeypatch,
        {
            "megatron": {},
            "megatron.bridge": {},
            "megatron.bridge.recipes": {},
            "megatron.bridge.recipes.llama": {"llama3_8b_pretrain_config": llama3_8b_pretrain_config},
            "megatron.bridge.training": {},
            "megatron.bridge.training.gpt_step": {"forward_step": None},
            "megatron.bridge.training.pretrain": {"pretrain": None},
        },
    )
    cfg = run_driver(nemo.plan_launch(gb200_spec("megatron_bridge"), 4, tmp_path), "build_config")
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.context_parallel_size) == (1, 2, 1)
    assert (cfg.dataset.sequence_length, cfg.model.seq_length) == (8192, 8192)
    assert (cfg.train.micro_batch_size, cfg.train.global_batch_size, cfg.train.train_iters) == (4, 128, 13)
    assert (cfg.train.eval_iters, cfg.logger.log_interval, cfg.checkpoint.save) == (0, 1, None)
    assert (cfg.mixed_precision, cfg.optimizer.lr, cfg.scheduler.lr_warmup_iters) == ("bf16_mixed", 3e-4, 0)
    out = capsys.readouterr().out
    assert "no dataset.seq_length; left as the recipe sets it" in out
    assert "no validation.eval_iters" in out


def nemo_line(step: int, loss: float, time_s: float, prefix: str = "") -> str:
    return (
        f"{prefix}Training epoch 0, iteration {step}/12 | lr: 0.0003 | global_batch_size: 128 | global_step: {step} | "
        f"peak_memory_usage: {70e9 + step} | reduced_train_loss: {loss} | train_step_timing in s: {time_s} | "
        f"consumed_samples: {128 * (step + 1)}"
    )


def megatron_line(step: int, loss: float, time_ms: float) -> str:
    return (
        f" [2026-11-21 10:00:{step:02d}] iteration {step:8d}/{13:8d} | consumed samples: {128 * step:12d} | "
        f"elapsed time per iteration (ms): {time_ms:.1f} | throughput per GPU (TFLOP/s/GPU): 600.0 | learning rate: "
        f"3.000000E-04 | global batch size:   128 | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 2.345 |"
    )


def test_nemo_log_lines_give_each_steps_time_loss_and_memory() -> None:
    text = "\n".join(
        [
            "[NeMo I 2026-11-21 10:00:00 nemo_logging:393] Experiments will be logged at /tmp/x",
            nemo_line(0, 12.61, 61.2, prefix="0: "),
            nemo_line(0, 12.61, 61.2, prefix="1: "),  # the same step printed by another rank
            nemo_line(1, 1.196e01, 58.0),
            "Validation: iteration 1/1 | val_loss: 11.9",
        ]
    )
    steps = nemo.parse_log("nemo", text)
    assert steps == [
        nemo.LoggedStep(1, 61.2, 12.61, 70e9 + 0),
        nemo.LoggedStep(2, 58.0, 11.96, 70e9 + 1),
    ]


def test_megatron_log_lines_give_each_steps_time_and_loss() -> None:
    text = "\n".join([megatron_line(1, 12.5, 4160.2), "  iteration 2 skipped", megatron_line(2, 11.0, 4100.0)])
    assert nemo.parse_log("megatron_bridge", text) == [
        nemo.LoggedStep(1, 4.1602, 12.5),
        nemo.LoggedStep(2, 4.1, 11.0),
    ]


def test_a_nemo_log_becomes_the_runs_figures_without_its_warm_up_steps() -> None:
    spec = gb200_spec("nemo")  # 3 warm-up + 10 timed steps
    times = [90.0, 70.0, 65.0, *[60.0 + i for i in range(10)]]
    losses = [12.6 - 0.3 * i for i in range(13)]
    text = "\n".join(nemo_line(i, losses[i], times[i]) for i in range(13))
    result = nemo.result_from_log(spec, text)
    assert result.step_times_s == times[3:]
    assert result.step_time_s == statistics.median(times[3:]) == 64.5
    assert result.tokens_per_s_per_gpu == pytest.approx(128 * 8192 / 64.5 / 4)
    assert result.mfu_pct == pytest.approx(100 * result.model_tflops_per_gpu / 2450)
    assert result.losses == pytest.approx(losses)
    assert (result.min_loss_drop_pct, result.loss_decreased) == (0.0, True)  # random mock tokens: any fall
    assert result.scope == "nemo-bf16-mbs4-gbs128-tp1-pp2-cp1-dp2-ac-seq8192"
    assert [m.what for m in result.memory] == ["device peak (engine log, rank 0)"]
    with pytest.raises(nemo.EngineFailed, match=r"expected a log line for each of steps 1..13, found steps 1, 2"):
        nemo.result_from_log(spec, "\n".join(nemo_line(i, 12.0, 60.0) for i in range(2)))
