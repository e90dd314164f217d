"""The NeMo engines: NVIDIA's training stacks run the same check, and their logs give the step times.

- `nemo`: `nemo.collections.llm`'s llama3_8b pretrain recipe (nemo_toolkit <= 2.7, as in the NGC NeMo containers;
  3.x has no LLM collection, LLM training moved to Megatron-Bridge: the engine says so).
- `megatron_bridge`: Megatron-Bridge's `llama3_8b_pretrain_config` (0.3.0 takes `mock=True`, 0.3.1 no argument;
  it imports Transformer Engine, so CUDA).
A driver script (nemo_drivers.py; this module does not import NeMo) runs under the engine's own Python: this
interpreter, or `pretrain.engine_python` / `--gb-engine-python` (e.g. `srun --container-image=... python`). Its
`--check` builds the recipe in one process, so a missing engine or model hub or a field the release lacks fails
before any rank starts; then torchrun runs it on every GPU and the step times are read back from the log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gbvalidate.workloads.llama.nemo_drivers import ENGINES, RECIPE_SIZES, driver_source
from pytest_gbvalidate.workloads.llama.request import TrainRequest
from pytest_gbvalidate.workloads.llama.results import GIB, MemoryPeak, PretrainResult, pretrain_result

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
    """The command the driver runs under, and where it was named (the plugin's `gb_engine_python`)."""

    command: tuple[str, ...]
    source: str


THIS_PYTHON = EnginePython((sys.executable,), "this interpreter")


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
        **{size: value for size, value in layout.sizes().items() if size in RECIPE_SIZES},
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
    """The driver script for the baseline's engine, and the commands under `python` that check it and run it."""
    engine = spec.layout.engine
    if spec.model != RECIPE_MODEL:
        raise EngineUnavailable(f"engine {engine} runs the {RECIPE_MODEL} recipe only, not {spec.model}")
    if spec.layout.world_size != gpus:
        raise EngineUnavailable(f"layout {spec.layout.label} needs {spec.layout.world_size} GPUs; this node has {gpus}")
    if engine not in ENGINES:
        raise EngineUnavailable(f"{engine!r} is not a NeMo engine")
    values = settings(spec, gpus, workdir)
    source = driver_source(engine, values)
    driver_path = workdir / f"gbvalidate_{engine}_pretrain.py"
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}", str(driver_path)]
    # NeMo logs its memory peaks only when asked; its recipe needs nothing from the model hub (Megatron-Bridge's
    # does), so an air-gapped node fails fast instead of waiting on the network.
    env = {"NEMO_LOG_MEMORY_USAGE": "1", "HF_HUB_OFFLINE": "1"} if engine == "nemo" else {}
    check_argv, argv = [*python.command, str(driver_path), "--check"], [*python.command, *torchrun]
    log_path = workdir / f"{engine}_pretrain.log"
    return LaunchPlan(engine, python, check_argv, argv, env, driver_path, source, log_path, values)


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
    """The recipe the driver built under the engine's Python, as read back, checked to hold the layout (else raises)."""
    where = f"engine {plan.engine} under {' '.join(plan.python.command)} ({plan.python.source})"
    env, cwd = {**os.environ, **plan.env}, plan.driver_path.parent
    try:
        done = subprocess.run(
            plan.check_argv, cwd=cwd, env=env, capture_output=True, text=True, errors="replace", timeout=timeout_s
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
    """What the built recipe, as the driver describes it, lacks or holds differently from what the driver set."""
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


_NUMBER = r"([-+]?\d*\.?\d+(?:[eE][-+]?\d+)?)"
# NeMo's progress line (`... | global_step: 7 | max_memory_reserved: 7.517e+10 | max_memory_allocated: 6.84e+10 |
# reduced_train_loss: 11.2 | train_step_timing in s: 12.39 | ...`), its memory peaks rank 0's, in bytes, printed
# `{value:.4}` or as an integer when whole, under NEMO_LOG_MEMORY_USAGE=1 only.
_NEMO_STEP = re.compile(r"global_step: (\d+)")
_NEMO_TIME = re.compile(r"train_step_timing in s: " + _NUMBER)
_NEMO_LOSS = re.compile(r"reduced_train_loss: " + _NUMBER)
_NEMO_ALLOCATED = re.compile(r"max_memory_allocated: " + _NUMBER)
_NEMO_RESERVED = re.compile(r"max_memory_reserved: " + _NUMBER)
# Megatron-Bridge's memory line per rank of DP rank 0 after its first iteration (`[Rank 3] (after 1 iterations)
# memory (GB) | ... | mem-max-allocated-gigabytes: 52.345 | ...`), in decimal GB (torch.cuda.memory_stats() / 1e9).
_BRIDGE_ALLOCATED = re.compile(r"mem-max-allocated-gigabytes: " + _NUMBER)
_BRIDGE_RESERVED = re.compile(r"mem-max-reserved-gigabytes: " + _NUMBER)
# Megatron's training log line: `iteration 7/ 13 | ... | elapsed time per iteration (ms): 4160.2 | ... | lm loss: ...`
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
            logged = LoggedStep(index, float(time_s.group(1)), _number(loss), _number(allocated), _number(reserved))
        else:
            step, time_ms, loss = _MEGATRON_STEP.search(line), _MEGATRON_TIME.search(line), _MEGATRON_LOSS.search(line)
            if step is None or time_ms is None:
                continue
            logged = LoggedStep(int(step.group(1)), float(time_ms.group(1)) / 1e3, _number(loss))
        steps.setdefault(logged.step, logged)
    return [steps[i] for i in sorted(steps)]


def _number(found: re.Match[str] | None) -> float | None:
    return None if found is None else float(found.group(1))


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
    times, known = [s.step_time_s for s in logged[spec.warmup_steps :]], [x for x in losses if x is not None]
    return pretrain_result(request, times, known, logged_memory(engine, text, logged), spec.peak)


def logged_memory(engine: str, text: str, logged: list[LoggedStep]) -> list[MemoryPeak]:
    """The device memory peaks the engine's log gives: NeMo's rank 0's, Megatron-Bridge's busiest rank's."""
    if engine == "nemo":
        where = "engine log, rank 0"
        peaks = {
            "allocated": [s.allocated_bytes for s in logged if s.allocated_bytes is not None],
            "reserved": [s.reserved_bytes for s in logged if s.reserved_bytes is not None],
        }
    else:
        where = "engine log after the first iteration, busiest rank"
        lines = {"allocated": _BRIDGE_ALLOCATED, "reserved": _BRIDGE_RESERVED}
        peaks = {kind: [float(m.group(1)) * 1e9 for m in pattern.finditer(text)] for kind, pattern in lines.items()}
    return [MemoryPeak(f"device max {kind} ({where})", max(b) / GIB) for kind, b in peaks.items() if b]
