"""The NeMo engines: NVIDIA's training stacks run the same check, and their logs give the step times.

- `nemo`: `nemo.collections.llm` (nemo_toolkit <= 2.7, as in the NGC NeMo containers), its llama3_8b pretrain
  recipe. nemo_toolkit 3.x has no LLM collection (LLM training moved to Megatron-Bridge): the engine says so.
- `megatron_bridge`: Megatron-Bridge's `llama3_8b_pretrain_config` (Python >= 3.12, CUDA).

Either way the recipe gets the SKU's layout, mock data, warm-up + timed steps and a log line per step. A
driver script built here is launched with torchrun; the step times are read back from the log: NeMo's
TimingCallback value in its progress line (`... | global_step: 7 | reduced_train_loss: 11.2 | train_step_timing
in s: 12.39 | ...`), Megatron's training log line (`iteration 7/ 13 | ... | elapsed time per iteration (ms):
4160.2 | ... | lm loss: 1.120000E+01 |`). Both engines train on uniformly random mock tokens, whose loss cannot
fall below ln(vocab): the loss check is weaker with them than with the built-in engine's learnable data.

This module does not import NeMo: the driver does, in the launched processes.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import pprint
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gbvalidate.workloads.llama.train import GIB, MemoryPeak, PretrainResult, TrainRequest, pretrain_result

if TYPE_CHECKING:
    from pytest_gbvalidate.baselines import PretrainSpec

RECIPE_MODEL = "llama3_8b"
LOG_TAIL_CHARS = 4000


class EngineUnavailable(RuntimeError):
    """The engine the baseline names is not installed here, or cannot run this model."""


class EngineFailed(RuntimeError):
    """The engine ran and failed, or logged no step we could read; the message carries its log's tail."""


def require_engine(
    engine: str,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
    version: Callable[[str], str] = importlib.metadata.version,
) -> None:
    """Raise EngineUnavailable, saying what is missing and what to do, unless `engine` can be imported."""

    def importable(module: str) -> bool:
        try:
            return find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            return False

    if engine == "nemo":
        if not importable("nemo"):
            raise EngineUnavailable("engine nemo: nemo_toolkit is not installed (use an NGC NeMo container)")
        if not importable("nemo.collections.llm"):
            raise EngineUnavailable(
                f"engine nemo: nemo_toolkit {version('nemo_toolkit')} has no nemo.collections.llm (nemo_toolkit "
                "3.x removed the LLM collection; LLM training moved to Megatron-Bridge): use nemo_toolkit <= 2.7 "
                "or engine megatron_bridge"
            )
    elif engine == "megatron_bridge":
        if not importable("megatron.bridge"):
            raise EngineUnavailable(
                "engine megatron_bridge: Megatron-Bridge is not installed (it needs Python >= 3.12 and CUDA)"
            )
    else:
        raise EngineUnavailable(f"{engine!r} is not a NeMo engine")


# --- the launch ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    argv: list[str]
    driver_path: Path
    driver_source: str
    log_path: Path


def settings(spec: PretrainSpec, gpus: int, workdir: Path) -> dict[str, Any]:
    """What the driver script needs: plain values, written into it as a Python literal."""
    layout = spec.layout
    return {
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "mbs": layout.mbs,
        "gbs": layout.gbs,
        "seq_len": spec.seq_len,
        "steps": spec.warmup_steps + spec.timed_steps,
        "learning_rate": spec.learning_rate,
        "precision": layout.precision,
        "activation_checkpointing": layout.activation_checkpointing,
        "gpus": gpus,
        "workdir": str(workdir),
    }


def plan_launch(spec: PretrainSpec, gpus: int, workdir: Path) -> LaunchPlan:
    """The driver script for the baseline's engine and the torchrun command that runs it on `gpus` GPUs."""
    engine = spec.layout.engine
    if spec.model != RECIPE_MODEL:
        raise EngineUnavailable(f"engine {engine} runs the {RECIPE_MODEL} recipe only, not {spec.model}")
    if spec.layout.world_size != gpus:
        raise EngineUnavailable(f"layout {spec.layout.label} needs {spec.layout.world_size} GPUs; this node has {gpus}")
    body = {"nemo": _NEMO_DRIVER, "megatron_bridge": _MEGATRON_BRIDGE_DRIVER}.get(engine)
    if body is None:
        raise EngineUnavailable(f"{engine!r} is not a NeMo engine")
    source = f"SETTINGS = {pprint.pformat(settings(spec, gpus, workdir))}\n{body}"  # a Python literal
    driver_path = workdir / f"gbvalidate_{engine}_pretrain.py"
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}"]
    return LaunchPlan(engine, [*argv, str(driver_path)], driver_path, source, workdir / f"{engine}_pretrain.log")


def run_pretrain(spec: PretrainSpec, gpus: int, workdir: Path, timeout_s: float) -> PretrainResult:
    """Train with the baseline's NeMo engine and read its figures from the log."""
    require_engine(spec.layout.engine)
    plan = plan_launch(spec, gpus, workdir)
    plan.driver_path.write_text(plan.driver_source, encoding="utf-8")
    with plan.log_path.open("w", encoding="utf-8") as log:
        try:
            done = subprocess.run(plan.argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise EngineFailed(f"{plan.engine} did not finish within {timeout_s:g} s: {_tail(plan.log_path)}") from None
    if done.returncode != 0:
        raise EngineFailed(f"{plan.engine} exited with code {done.returncode}: {_tail(plan.log_path)}")
    return result_from_log(spec, plan.log_path.read_text(encoding="utf-8", errors="replace"))


def _tail(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    return f"...{text[-LOG_TAIL_CHARS:]}" if len(text) > LOG_TAIL_CHARS else text


# --- the log ------------------------------------------------------------------------------------------------

_NUMBER = r"([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)"
_NEMO_STEP = re.compile(r"global_step: (\d+)")
_NEMO_TIME = re.compile(r"train_step_timing in s: " + _NUMBER)
_NEMO_LOSS = re.compile(r"reduced_train_loss: " + _NUMBER)
_NEMO_MEMORY = re.compile(r"peak_memory_usage: " + _NUMBER)
_MEGATRON_STEP = re.compile(r"iteration\s+(\d+)/\s*\d+ \|")
_MEGATRON_TIME = re.compile(r"elapsed time per iteration \(ms\): " + _NUMBER)
_MEGATRON_LOSS = re.compile(r"lm loss: " + _NUMBER)


@dataclass(frozen=True)
class LoggedStep:
    step: int  # 1-based, in the order the steps ran
    step_time_s: float
    loss: float | None
    peak_memory_bytes: float | None = None


def parse_log(engine: str, text: str) -> list[LoggedStep]:
    """Every training step the log reports, once each (several ranks may print the same line)."""
    steps: dict[int, LoggedStep] = {}
    for line in text.splitlines():
        if engine == "nemo":
            step, time_s, loss = _NEMO_STEP.search(line), _NEMO_TIME.search(line), _NEMO_LOSS.search(line)
            if step is None or time_s is None:
                continue
            memory = _NEMO_MEMORY.search(line)
            index = int(step.group(1)) + 1  # NeMo counts global_step from 0
            logged = LoggedStep(
                index,
                float(time_s.group(1)),
                float(loss.group(1)) if loss else None,
                float(memory.group(1)) if memory else None,
            )
        else:
            step, time_ms, loss = _MEGATRON_STEP.search(line), _MEGATRON_TIME.search(line), _MEGATRON_LOSS.search(line)
            if step is None or time_ms is None:
                continue
            logged = LoggedStep(
                int(step.group(1)), float(time_ms.group(1)) / 1e3, float(loss.group(1)) if loss else None
            )
        steps.setdefault(logged.step, logged)
    return [steps[i] for i in sorted(steps)]


def result_from_log(spec: PretrainSpec, text: str) -> PretrainResult:
    """The run's figures from its log: the warm-up steps dropped, the median of the timed ones."""
    engine = spec.layout.engine
    logged = parse_log(engine, text)
    expected = spec.warmup_steps + spec.timed_steps
    if [s.step for s in logged] != list(range(1, expected + 1)):
        seen = ", ".join(str(s.step) for s in logged) or "none"
        raise EngineFailed(f"{engine}: expected a log line for each of steps 1..{expected}, found steps {seen}")
    losses = [s.loss for s in logged]
    if None in losses:
        raise EngineFailed(f"{engine}: a step's log line has no loss")
    memory = [s.peak_memory_bytes for s in logged if s.peak_memory_bytes is not None]
    request = TrainRequest(spec.config, spec.layout, spec.warmup_steps, spec.timed_steps, spec.learning_rate)
    return pretrain_result(
        request,
        [s.step_time_s for s in logged[spec.warmup_steps :]],
        [x for x in losses if x is not None],
        [MemoryPeak("device peak (engine log, rank 0)", max(memory) / GIB)] if memory else [],
        spec.peak_tflops_per_gpu,
    )


# --- the driver scripts (run by torchrun on every rank; they import the engine) ----------------------------------

_NEMO_DRIVER = """
import nemo_run as run
from nemo.collections import llm
from nemo.collections.llm.recipes.precision.mixed_precision import bf16_mixed, bf16_with_fp8_mixed


def build_recipe(s):
    recipe = llm.llama3_8b.pretrain_recipe(
        name="gbvalidate", dir=s["workdir"], num_nodes=1, num_gpus_per_node=s["gpus"]
    )
    strategy = recipe.trainer.strategy
    strategy.tensor_model_parallel_size = s["tp"]
    strategy.pipeline_model_parallel_size = s["pp"]
    strategy.context_parallel_size = s["cp"]
    recipe.model.config.seq_length = s["seq_len"]
    recipe.data.seq_length = s["seq_len"]  # the recipe's data is its MockDataModule
    recipe.data.micro_batch_size = s["mbs"]
    recipe.data.global_batch_size = s["gbs"]
    if s["activation_checkpointing"] == "selective":  # Megatron's selective: core attention only
        recipe.model.config.recompute_granularity = "selective"
    elif s["activation_checkpointing"] == "full":
        recipe.model.config.recompute_granularity = "full"
        recipe.model.config.recompute_method = "uniform"
        recipe.model.config.recompute_num_layers = 1
    recipe.trainer.plugins = bf16_with_fp8_mixed() if s["precision"] == "fp8" else bf16_mixed()
    recipe.trainer.max_steps = s["steps"]
    recipe.trainer.log_every_n_steps = 1
    recipe.trainer.limit_val_batches = 0
    recipe.trainer.val_check_interval = s["steps"]
    recipe.trainer.enable_checkpointing = False
    recipe.log.ckpt = None
    recipe.optim.config.lr = s["learning_rate"]
    recipe.optim.lr_scheduler.warmup_steps = 0
    return recipe


if __name__ == "__main__":
    run.run(build_recipe(SETTINGS), direct=True)
"""

_MEGATRON_BRIDGE_DRIVER = '''
from megatron.bridge.recipes.llama import llama3_8b_pretrain_config
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.pretrain import pretrain


def assign(cfg, path, value):
    """Set cfg.<path>; the field names moved between Megatron-Bridge releases, so absent ones are reported."""
    *parents, name = path.split(".")
    for parent in parents:
        cfg = getattr(cfg, parent, None)
    if cfg is None or not hasattr(cfg, name):
        print(f"gbvalidate: this Megatron-Bridge has no {path}; left as the recipe sets it")
        return
    setattr(cfg, name, value)


def build_config(s):
    cfg = llama3_8b_pretrain_config(mock=True)
    assign(cfg, "model.tensor_model_parallel_size", s["tp"])
    assign(cfg, "model.pipeline_model_parallel_size", s["pp"])
    assign(cfg, "model.context_parallel_size", s["cp"])
    assign(cfg, "model.seq_length", s["seq_len"])
    assign(cfg, "dataset.sequence_length", s["seq_len"])
    assign(cfg, "dataset.seq_length", s["seq_len"])
    assign(cfg, "train.micro_batch_size", s["mbs"])
    assign(cfg, "train.global_batch_size", s["gbs"])
    assign(cfg, "train.train_iters", s["steps"])
    assign(cfg, "train.eval_iters", 0)
    assign(cfg, "validation.eval_iters", 0)
    if s["activation_checkpointing"] == "selective":
        assign(cfg, "model.recompute_granularity", "selective")
    elif s["activation_checkpointing"] == "full":
        assign(cfg, "model.recompute_granularity", "full")
        assign(cfg, "model.recompute_method", "uniform")
        assign(cfg, "model.recompute_num_layers", 1)
    cfg.mixed_precision = "bf16_with_fp8_current_scaling_mixed" if s["precision"] == "fp8" else "bf16_mixed"
    assign(cfg, "optimizer.lr", s["learning_rate"])
    assign(cfg, "scheduler.lr_warmup_iters", 0)
    assign(cfg, "logger.log_interval", 1)
    assign(cfg, "checkpoint.save", None)
    return cfg


if __name__ == "__main__":
    pretrain(build_config(SETTINGS), forward_step)
'''
