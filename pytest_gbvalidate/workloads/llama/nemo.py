"""The NeMo engines: NVIDIA's training stacks run the same check, and their logs give the step times.

- `nemo`: `nemo.collections.llm` (nemo_toolkit <= 2.7, as in the NGC NeMo containers), its llama3_8b pretrain
  recipe. nemo_toolkit 3.x has no LLM collection (LLM training moved to Megatron-Bridge): the engine says so.
- `megatron_bridge`: Megatron-Bridge's `llama3_8b_pretrain_config` (0.3.0 takes `mock=True`, 0.3.1 no argument;
  it imports Transformer Engine, so CUDA).

A driver script written here gets the SKU's layout, mock data with Llama 3's vocabulary (NeMo: a null tokenizer,
nothing downloaded), warm-up + timed steps and a log line per step. It runs under the engine's own Python: this
interpreter, or the baseline's `pretrain.engine_python` / `--gb-engine-python` (the NeMo image's python, or a
launcher ending in one, e.g. `srun --container-image=... python`): the plugin only reads its output, so NeMo's
environment need not be the plugin's. First `<python> driver --check` builds the recipe in one process and prints
what it holds; a missing engine, an unreachable model hub or a field the release lacks fails there, before any
rank starts. Then torchrun runs it on every GPU and the step times are read back from the log: NeMo's
TimingCallback value in its progress line (`... | global_step: 7 | max_memory_reserved: 7.517e+10 |
max_memory_allocated: 6.84e+10 | reduced_train_loss: 11.2 | train_step_timing in s: 12.39 | ...`; the memory
figures, rank 0's, only with NEMO_LOG_MEMORY_USAGE=1, which the launch sets), Megatron's training log line
(`iteration 7/ 13 | ... | elapsed time per iteration (ms): 4160.2 | ... | lm loss: 1.120000E+01 |`) and its one
memory line per rank after the first iteration. NeMo's mock tokens are uniformly random, whose loss cannot fall
below ln(vocab) (Megatron-Bridge's mock sequences are learnable): the loss check is weaker with them than with the
built-in engine's learnable data.

This module does not import NeMo: the driver does, in the processes it starts.
"""

from __future__ import annotations

import json
import os
import pprint
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gbvalidate.workloads.llama.results import GIB, MemoryPeak, PretrainResult, pretrain_result
from pytest_gbvalidate.workloads.llama.train import TrainRequest

if TYPE_CHECKING:
    from pytest_gbvalidate.baselines import PretrainSpec

RECIPE_MODEL = "llama3_8b"
LOG_TAIL_CHARS = 4000
CHECK_TIMEOUT_S = 600.0  # importing NeMo and building the recipe: ~15 s on a CPU; a container launch adds more
# What the driver prints, one line each, for the plugin to read.
RECIPE_MARK = "GBVALIDATE_RECIPE "
UNAVAILABLE_MARK = "GBVALIDATE_UNAVAILABLE "
UNAVAILABLE_EXIT = 3


class EngineUnavailable(RuntimeError):
    """The engine the baseline names is not installed under the engine's Python, or cannot run this model."""


class EngineFailed(RuntimeError):
    """The engine ran and failed, or logged no step we could read; the message carries its log's tail."""


@dataclass(frozen=True)
class EnginePython:
    """The command the driver runs under (`<command> driver.py`, `<command> -m torch.distributed.run ...`) and
    where it was named: the plugin's `gb_engine_python`."""

    command: tuple[str, ...]
    source: str


THIS_PYTHON = EnginePython((sys.executable,), "this interpreter")


# --- the launch ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchPlan:
    engine: str
    python: EnginePython
    check_argv: list[str]  # builds the recipe in one process and prints what it holds
    argv: list[str]  # trains on every GPU
    env: dict[str, str]  # added to the environment of both
    driver_path: Path
    driver_source: str
    log_path: Path
    settings: dict[str, Any]


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
        "vocab_size": spec.config.vocab_size,
        "steps": spec.warmup_steps + spec.timed_steps,
        "learning_rate": spec.learning_rate,
        "precision": layout.precision,
        "fp8_recipe": layout.fp8_recipe if layout.precision == "fp8" else None,
        "activation_checkpointing": layout.activation_checkpointing,
        "gpus": gpus,
        "workdir": str(workdir),
    }


def plan_launch(spec: PretrainSpec, gpus: int, workdir: Path, python: EnginePython = THIS_PYTHON) -> LaunchPlan:
    """The driver script for the baseline's engine, the command that checks it and the torchrun command that
    runs it on `gpus` GPUs, both under `python`."""
    engine = spec.layout.engine
    if spec.model != RECIPE_MODEL:
        raise EngineUnavailable(f"engine {engine} runs the {RECIPE_MODEL} recipe only, not {spec.model}")
    if spec.layout.world_size != gpus:
        raise EngineUnavailable(f"layout {spec.layout.label} needs {spec.layout.world_size} GPUs; this node has {gpus}")
    body = {"nemo": _NEMO_DRIVER, "megatron_bridge": _MEGATRON_BRIDGE_DRIVER}.get(engine)
    if body is None:
        raise EngineUnavailable(f"{engine!r} is not a NeMo engine")
    values = settings(spec, gpus, workdir)
    source = f"SETTINGS = {pprint.pformat(values)}\n{_DRIVER_HEAD}{body}{_DRIVER_MAIN}"  # a Python literal
    driver_path = workdir / f"gbvalidate_{engine}_pretrain.py"
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", str(driver_path)]
    # NeMo logs its memory peaks only when asked; its recipe needs nothing from the model hub, so an air-gapped
    # node fails fast instead of waiting on the network. Megatron-Bridge reads Llama's config from the hub.
    env = {"NEMO_LOG_MEMORY_USAGE": "1", "HF_HUB_OFFLINE": "1"} if engine == "nemo" else {}
    return LaunchPlan(
        engine=engine,
        python=python,
        check_argv=[*python.command, str(driver_path), "--check"],
        argv=[*python.command, *torchrun],
        env=env,
        driver_path=driver_path,
        driver_source=source,
        log_path=workdir / f"{engine}_pretrain.log",
        settings=values,
    )


def run_pretrain(
    spec: PretrainSpec, gpus: int, workdir: Path, timeout_s: float, python: EnginePython = THIS_PYTHON
) -> PretrainResult:
    """Train with the baseline's NeMo engine and read its figures from the log."""
    plan = plan_launch(spec, gpus, workdir, python)
    plan.driver_path.write_text(plan.driver_source, encoding="utf-8")
    check_recipe(plan)
    env = {**os.environ, **plan.env}
    with plan.log_path.open("w", encoding="utf-8") as log:
        try:
            done = subprocess.run(
                plan.argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            raise EngineFailed(f"{plan.engine} did not finish within {timeout_s:g} s: {_tail(plan.log_path)}") from None
    if done.returncode != 0:
        raise EngineFailed(f"{plan.engine} exited with code {done.returncode}: {_tail(plan.log_path)}")
    return result_from_log(spec, plan.log_path.read_text(encoding="utf-8", errors="replace"))


def check_recipe(plan: LaunchPlan, timeout_s: float = CHECK_TIMEOUT_S) -> dict[str, Any]:
    """Build the recipe under the engine's Python without training, and make sure it holds the layout: what the
    driver read back from the built recipe, or EngineUnavailable / EngineFailed saying what is wrong."""
    where = f"engine {plan.engine} under {' '.join(plan.python.command)} ({plan.python.source})"
    try:
        done = subprocess.run(
            plan.check_argv,
            cwd=plan.driver_path.parent,
            env={**os.environ, **plan.env},
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
        )
    except OSError as exc:
        raise EngineUnavailable(f"{where}: cannot start it: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise EngineFailed(f"{where}: building the recipe took over {timeout_s:g} s") from None
    lines = done.stdout.splitlines()
    unavailable = [line[len(UNAVAILABLE_MARK) :] for line in lines if line.startswith(UNAVAILABLE_MARK)]
    if unavailable:
        raise EngineUnavailable(f"{where}: {unavailable[-1]}")
    described = [line[len(RECIPE_MARK) :] for line in lines if line.startswith(RECIPE_MARK)]
    if done.returncode != 0 or not described:
        output = (done.stdout + done.stderr)[-LOG_TAIL_CHARS:]
        raise EngineFailed(f"{where}: building the recipe failed (exit code {done.returncode}): {output}")
    try:
        recipe = json.loads(described[-1])
    except ValueError:
        raise EngineFailed(f"{where}: the driver printed a recipe that is not JSON: {described[-1][:200]!r}") from None
    problems = recipe_problems(plan.settings, recipe)
    if problems:
        raise EngineFailed(f"{where}: the recipe does not hold the layout: {'; '.join(problems)}")
    return recipe  # type: ignore[no-any-return]


def recipe_problems(asked: Mapping[str, Any], recipe: Any) -> list[str]:
    """What the built recipe lacks or holds differently from what the driver set: `recipe` is the driver's
    description, {"values": {setting: value read back}, "missing": [fields the release does not have]}."""
    if not isinstance(recipe, dict) or not isinstance(recipe.get("values"), dict):
        return [f"the driver's description is not {{'values': {{...}}, 'missing': [...]}}: {str(recipe)[:200]}"]
    found = [f"{field}: this release has no such field" for field in recipe.get("missing") or []]
    for name, value in recipe["values"].items():
        setting = _READ_BACK_AS.get(name, name)
        if setting in asked and value != asked[setting]:
            found.append(f"{name} is {value!r}, not {asked[setting]!r}")
    return found


# Values the driver reads back under their own name that must equal a setting.
_READ_BACK_AS = {"data_seq_len": "seq_len", "tokenizer_vocab_size": "vocab_size"}


def _tail(path: Path) -> str:
    text = path.read_text(encoding="utf-8", errors="replace")
    return f"...{text[-LOG_TAIL_CHARS:]}" if len(text) > LOG_TAIL_CHARS else text


# --- the log ------------------------------------------------------------------------------------------------

_NUMBER = r"([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)"
_NEMO_STEP = re.compile(r"global_step: (\d+)")
_NEMO_TIME = re.compile(r"train_step_timing in s: " + _NUMBER)
_NEMO_LOSS = re.compile(r"reduced_train_loss: " + _NUMBER)
# torch.cuda.max_memory_allocated() / max_memory_reserved() in bytes, as NeMo's MegatronStrategy logs them under
# NEMO_LOG_MEMORY_USAGE=1 (printed `{value:.4}`, or as an integer when whole).
_NEMO_ALLOCATED = re.compile(r"max_memory_allocated: " + _NUMBER)
_NEMO_RESERVED = re.compile(r"max_memory_reserved: " + _NUMBER)
# Megatron-Bridge's one memory line per rank of DP rank 0, after its first iteration (`[Rank 3] (after 1 iterations)
# memory (GB) | ... | mem-max-allocated-gigabytes: 52.345 | ... | mem-max-reserved-gigabytes: 60.123 | ...`), in
# decimal GB (torch.cuda.memory_stats() / 1e9).
_BRIDGE_ALLOCATED = re.compile(r"mem-max-allocated-gigabytes: " + _NUMBER)
_BRIDGE_RESERVED = re.compile(r"mem-max-reserved-gigabytes: " + _NUMBER)
_MEGATRON_STEP = re.compile(r"iteration\s+(\d+)/\s*\d+ \|")
_MEGATRON_TIME = re.compile(r"elapsed time per iteration \(ms\): " + _NUMBER)
_MEGATRON_LOSS = re.compile(r"lm loss: " + _NUMBER)


@dataclass(frozen=True)
class LoggedStep:
    step: int  # 1-based, in the order the steps ran
    step_time_s: float
    loss: float | None
    allocated_bytes: float | None = None  # the device's peak so far, as the engine logs it
    reserved_bytes: float | None = None


def parse_log(engine: str, text: str) -> list[LoggedStep]:
    """Every training step the log reports, once each (several ranks may print the same line)."""
    steps: dict[int, LoggedStep] = {}
    for line in text.splitlines():
        if engine == "nemo":
            step, time_s, loss = _NEMO_STEP.search(line), _NEMO_TIME.search(line), _NEMO_LOSS.search(line)
            if step is None or time_s is None:
                continue
            allocated, reserved = _NEMO_ALLOCATED.search(line), _NEMO_RESERVED.search(line)
            index = int(step.group(1)) + 1  # NeMo counts global_step from 0
            logged = LoggedStep(
                index,
                float(time_s.group(1)),
                float(loss.group(1)) if loss else None,
                float(allocated.group(1)) if allocated else None,
                float(reserved.group(1)) if reserved else None,
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
    request = TrainRequest(spec.config, spec.layout, spec.warmup_steps, spec.timed_steps, spec.learning_rate)
    return pretrain_result(
        request,
        [s.step_time_s for s in logged[spec.warmup_steps :]],
        [x for x in losses if x is not None],
        logged_memory(engine, text, logged),
        spec.peak_tflops_per_gpu,
    )


def logged_memory(engine: str, text: str, logged: list[LoggedStep]) -> list[MemoryPeak]:
    """The device memory peaks the engine's log gives: NeMo's rank 0 on every step line (the peak so far);
    Megatron-Bridge's after its first iteration, on each rank that prints one (the busiest taken)."""
    if engine == "nemo":
        where = "engine log, rank 0"
        peaks = {
            "allocated": [s.allocated_bytes for s in logged if s.allocated_bytes is not None],
            "reserved": [s.reserved_bytes for s in logged if s.reserved_bytes is not None],
        }
    else:
        where = "engine log after the first iteration, busiest rank"
        peaks = {
            "allocated": [float(m.group(1)) * 1e9 for m in _BRIDGE_ALLOCATED.finditer(text)],
            "reserved": [float(m.group(1)) * 1e9 for m in _BRIDGE_RESERVED.finditer(text)],
        }
    return [MemoryPeak(f"device max {kind} ({where})", max(b) / GIB) for kind, b in peaks.items() if b]


# --- the driver scripts (run under the engine's Python; they import the engine) --------------------------------
# One script: SETTINGS, the head, an engine's build() and describe(), and the main. `--check` builds and prints
# what the recipe holds; otherwise it trains. Imports that fail, and what cannot be had (the model hub), are one
# line the plugin reads, not a traceback.

_DRIVER_HEAD = """
import importlib.metadata
import json
import sys

REPORT, MISSING = {}, []


def unavailable(message):
    print("GBVALIDATE_UNAVAILABLE " + " ".join(message.split()), flush=True)  # one line, whatever it quotes
    sys.exit(3)


def version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


def assign(cfg, path, value):
    \"\"\"Set cfg.<path>; a field this release does not have is noted as missing (recipe configs accept any
    attribute, so a misspelled or removed one would otherwise do nothing). `fields` is the engine's.\"\"\"
    *parents, name = path.split(".")
    for parent in parents:
        cfg = getattr(cfg, parent, None)
    if cfg is None or name not in fields(cfg):
        MISSING.append(path)
        return
    setattr(cfg, name, value)
"""

_DRIVER_MAIN = """

if __name__ == "__main__":
    built = build(SETTINGS)
    if sys.argv[1:] == ["--check"]:
        print("GBVALIDATE_RECIPE " + json.dumps({"values": describe(built), "missing": MISSING}), flush=True)
    else:
        train(built)
"""

_NEMO_DRIVER = """
import inspect

try:
    import nemo  # noqa: F401
except ImportError as exc:
    unavailable(f"nemo_toolkit is not installed there ({exc}); use an NGC NeMo container or --gb-engine-python")
try:
    from nemo.collections import llm
except ImportError:
    unavailable(
        f"nemo_toolkit {version('nemo_toolkit')} has no nemo.collections.llm (nemo_toolkit 3.x removed the LLM "
        "collection; LLM training moved to Megatron-Bridge): use nemo_toolkit <= 2.7 or engine megatron_bridge"
    )
import nemo_run as run
from nemo.collections.common.tokenizers.null_tokenizer import NullTokenizer
from nemo.collections.llm.recipes.precision import mixed_precision

# NeMo 2's fp8 plugins: delayed scaling (amax history) and per-tensor current scaling ("tensorwise").
FP8_PLUGINS = {"delayed": "bf16_with_fp8_mixed", "current": "bf16_with_fp8_current_scaling_mixed"}


def fields(config):
    \"\"\"The parameters a nemo_run Config's target takes (its **kwargs, if any, do not count).\"\"\"
    parameters = inspect.signature(config.__fn_or_cls__).parameters.values()
    return {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD}


def build(s):
    recipe = llm.llama3_8b.pretrain_recipe(
        name="gbvalidate", dir=s["workdir"], num_nodes=1, num_gpus_per_node=s["gpus"]
    )
    assign(recipe, "trainer.strategy.tensor_model_parallel_size", s["tp"])
    assign(recipe, "trainer.strategy.pipeline_model_parallel_size", s["pp"])
    assign(recipe, "trainer.strategy.context_parallel_size", s["cp"])
    assign(recipe, "model.config.seq_length", s["seq_len"])
    # Mock data with Llama 3's vocabulary, nothing downloaded: a null tokenizer (it adds an end-of-document
    # token to the size it is given), and the model's vocabulary set rather than padded up from the tokenizer's.
    assign(recipe, "data.tokenizer", run.Config(NullTokenizer, vocab_size=s["vocab_size"] - 1))
    assign(recipe, "model.config.vocab_size", s["vocab_size"])
    assign(recipe, "data.seq_length", s["seq_len"])  # the recipe's data is its MockDataModule
    assign(recipe, "data.micro_batch_size", s["mbs"])
    assign(recipe, "data.global_batch_size", s["gbs"])
    if s["activation_checkpointing"] == "selective":  # Megatron's selective: core attention only
        assign(recipe, "model.config.recompute_granularity", "selective")
    elif s["activation_checkpointing"] == "full":
        assign(recipe, "model.config.recompute_granularity", "full")
        assign(recipe, "model.config.recompute_method", "uniform")
        assign(recipe, "model.config.recompute_num_layers", 1)
    plugin = FP8_PLUGINS[s["fp8_recipe"]] if s["precision"] == "fp8" else "bf16_mixed"
    assign(recipe, "trainer.plugins", getattr(mixed_precision, plugin)())
    assign(recipe, "trainer.max_steps", s["steps"])
    assign(recipe, "trainer.log_every_n_steps", 1)
    assign(recipe, "trainer.limit_val_batches", 0)
    assign(recipe, "trainer.val_check_interval", s["steps"])
    assign(recipe, "trainer.enable_checkpointing", False)
    assign(recipe, "log.ckpt", None)
    assign(recipe, "optim.config.lr", s["learning_rate"])
    assign(recipe, "optim.lr_scheduler.warmup_steps", 0)
    return recipe


def describe(recipe):
    \"\"\"The recipe's values in the driver's terms, read back from the recipe (the tokenizer built, offline).\"\"\"
    import fiddle

    strategy, data, plugins = recipe.trainer.strategy, recipe.data, recipe.trainer.plugins
    fp8 = getattr(plugins, "fp8_recipe", None) if getattr(plugins, "fp8", None) else None
    return {
        "tp": strategy.tensor_model_parallel_size,
        "pp": strategy.pipeline_model_parallel_size,
        "cp": strategy.context_parallel_size,
        "mbs": data.micro_batch_size,
        "gbs": data.global_batch_size,
        "seq_len": recipe.model.config.seq_length,
        "data_seq_len": data.seq_length,
        "vocab_size": recipe.model.config.vocab_size,
        "tokenizer_vocab_size": fiddle.build(data.tokenizer).vocab_size,
        "steps": recipe.trainer.max_steps,
        "precision": "fp8" if fp8 else "bf16",
        "fp8_recipe": {"delayed": "delayed", "tensorwise": "current"}.get(fp8, fp8) if fp8 else None,
        "activation_checkpointing": getattr(recipe.model.config, "recompute_granularity", None) or "none",
        "nemo_toolkit": version("nemo_toolkit"),
    }


def train(recipe):
    run.run(recipe, direct=True)
"""

_MEGATRON_BRIDGE_DRIVER = """
import inspect

try:
    from megatron.bridge.recipes.llama import llama3_8b_pretrain_config
    from megatron.bridge.training.gpt_step import forward_step
    from megatron.bridge.training.pretrain import pretrain
except ImportError as exc:
    unavailable(f"Megatron-Bridge cannot be imported there ({exc}); it needs CUDA and Transformer Engine")

FP8_RECIPES = {"delayed": "bf16_with_fp8_delayed_scaling_mixed", "current": "bf16_with_fp8_current_scaling_mixed"}
HUB_MODEL = "meta-llama/Meta-Llama-3-8B"


def fields(config):
    return set(getattr(config, "__dataclass_fields__", None) or vars(config))


def build(s):
    # 0.3.0 takes keywords (**user_kwargs, mock among them); 0.3.1 takes none, and its data is mock data (no
    # blend) unless set otherwise.
    takes_keywords = any(p.kind is inspect.Parameter.VAR_KEYWORD or p.name == "mock" for p in
                         inspect.signature(llama3_8b_pretrain_config).parameters.values())
    try:
        cfg = llama3_8b_pretrain_config(**({"mock": True} if takes_keywords else {}))
    except Exception as exc:  # the recipe reads Llama's config from the model hub (a gated repository)
        if any(word in f"{type(exc).__name__} {exc}" for word in ("huggingface", "Hub", "hub", HUB_MODEL, "gated")):
            unavailable(
                f"Megatron-Bridge {version('megatron-bridge')} builds Llama 3 8B from the model hub's {HUB_MODEL} "
                "config, which it could not read: give the node access (HF_TOKEN of an account with access to "
                "the gated repository) or a local copy (the config in HF_HOME's cache, and HF_HUB_OFFLINE=1); "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            )
        raise
    assign(cfg, "model.tensor_model_parallel_size", s["tp"])
    assign(cfg, "model.pipeline_model_parallel_size", s["pp"])
    assign(cfg, "model.context_parallel_size", s["cp"])
    assign(cfg, "model.seq_length", s["seq_len"])
    # Field names that moved between releases: the one this release has.
    dataset_seq = "sequence_length" if "sequence_length" in fields(cfg.dataset) else "seq_length"
    assign(cfg, f"dataset.{dataset_seq}", s["seq_len"])
    # Mock tokens over Llama 3's vocabulary (the recipes' null tokenizer defaults to 32000; its size counts EOD).
    assign(cfg, "tokenizer.vocab_size", s["vocab_size"])
    assign(cfg, "train.micro_batch_size", s["mbs"])
    assign(cfg, "train.global_batch_size", s["gbs"])
    assign(cfg, "train.train_iters", s["steps"])
    assign(cfg, "train.eval_iters" if "eval_iters" in fields(cfg.train) else "validation.eval_iters", 0)
    if s["activation_checkpointing"] == "selective":
        assign(cfg, "model.recompute_granularity", "selective")
    elif s["activation_checkpointing"] == "full":
        assign(cfg, "model.recompute_granularity", "full")
        assign(cfg, "model.recompute_method", "uniform")
        assign(cfg, "model.recompute_num_layers", 1)
    assign(cfg, "mixed_precision", FP8_RECIPES[s["fp8_recipe"]] if s["precision"] == "fp8" else "bf16_mixed")
    assign(cfg, "optimizer.lr", s["learning_rate"])
    assign(cfg, "scheduler.lr_warmup_iters", 0)
    assign(cfg, "logger.log_interval", 1)
    assign(cfg, "checkpoint.save", None)
    return cfg


def describe(cfg):
    m, t = cfg.model, cfg.train
    dataset_seq = getattr(cfg.dataset, "sequence_length", getattr(cfg.dataset, "seq_length", None))
    fp8 = {v: k for k, v in FP8_RECIPES.items()}.get(cfg.mixed_precision)
    return {
        "tp": m.tensor_model_parallel_size,
        "pp": m.pipeline_model_parallel_size,
        "cp": m.context_parallel_size,
        "mbs": t.micro_batch_size,
        "gbs": t.global_batch_size,
        "seq_len": m.seq_length,
        "data_seq_len": dataset_seq,
        "steps": t.train_iters,
        "vocab_size": getattr(m, "vocab_size", None),
        "tokenizer_vocab_size": cfg.tokenizer.vocab_size,
        "precision": "fp8" if fp8 else "bf16",
        "fp8_recipe": fp8,
        "activation_checkpointing": getattr(m, "recompute_granularity", None) or "none",
        "megatron_bridge": version("megatron-bridge"),
    }


def train(cfg):
    pretrain(cfg, forward_step)
"""
