"""The NeMo engines without NeMo: the launch they would run, their driver scripts executed against stand-in
modules, and their log lines parsed in the formats NeMo 2 and Megatron print."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import statistics
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_gbvalidate.baselines import PretrainSpec, load_baseline
from pytest_gbvalidate.workloads.llama import nemo, nemo_drivers
from pytest_gbvalidate.workloads.llama.parallel import SIZES
from pytest_gbvalidate.workloads.llama.results import MemoryPeak
from tests.helpers.runs import REPO


def gb200_spec(engine: str, **layout: Any) -> PretrainSpec:
    spec = load_baseline(REPO / "baselines" / "ND_GB200_v6.yaml").pretrain
    assert spec is not None
    return dataclasses.replace(spec, layout=dataclasses.replace(spec.layout, engine=engine, **layout))


def plan(tmp_path: Path, engine: str, python: nemo.EnginePython = nemo.THIS_PYTHON, **layout: Any) -> nemo.LaunchPlan:
    """The launch of `engine` on ND GB200 v6's layout, its driver written."""
    launch = nemo.plan_launch(gb200_spec(engine, **layout), gpus=4, workdir=tmp_path, python=python)
    launch.driver_path.write_text(launch.driver_source, encoding="utf-8")
    return launch


def test_engines_that_are_not_installed_say_what_is_missing_before_any_rank_starts(tmp_path: Path) -> None:
    """The driver's check runs under the engine's Python (here: this one, which has neither engine)."""
    where = f"under {sys.executable} (this interpreter)"
    with pytest.raises(nemo.EngineUnavailable) as info:
        nemo.check_recipe(plan(tmp_path, "nemo"))
    assert str(info.value) == (
        f"engine nemo {where}: nemo_toolkit is not installed there (No module named 'nemo'); use an NGC NeMo "
        "container or --gb-engine-python"
    )
    with pytest.raises(nemo.EngineUnavailable, match=rf"engine megatron_bridge {re.escape(where)}: Megatron-Bridge "):
        nemo.check_recipe(plan(tmp_path, "megatron_bridge"))


def test_nemo_3_without_the_llm_collection_is_named_with_its_version(tmp_path: Path) -> None:
    """nemo_toolkit 3.x as it installs: the `nemo` package without `nemo.collections.llm`. The engine's Python is
    a launcher before an interpreter (`env PYTHONPATH=... python`), as `srun ... python` would be."""
    site = tmp_path / "site"
    (site / "nemo" / "collections").mkdir(parents=True)
    (site / "nemo" / "__init__.py").write_text("")
    (site / "nemo" / "collections" / "__init__.py").write_text("")
    dist_info = site / "nemo_toolkit-3.0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: nemo_toolkit\nVersion: 3.0.1\n")
    python = nemo.EnginePython(("env", f"PYTHONPATH={site}", sys.executable), "--gb-engine-python on the command line")
    with pytest.raises(nemo.EngineUnavailable) as info:
        nemo.check_recipe(plan(tmp_path, "nemo", python))
    assert str(info.value) == (
        f"engine nemo under env PYTHONPATH={site} {sys.executable} (--gb-engine-python on the command line): "
        "nemo_toolkit 3.0.1 has no nemo.collections.llm (nemo_toolkit 3.x removed the LLM collection; LLM training "
        "moved to Megatron-Bridge): use nemo_toolkit <= 2.7 or engine megatron_bridge"
    )
    missing = nemo.EnginePython((str(tmp_path / "no-such-python"),), "pretrain.engine_python in ND_GB200_v6.yaml")
    with pytest.raises(nemo.EngineUnavailable, match=r"\(pretrain.engine_python in ND_GB200_v6.yaml\): cannot start"):
        nemo.check_recipe(plan(tmp_path, "nemo", missing))


def test_the_launch_is_torchrun_on_every_gpu_under_the_engines_python(tmp_path: Path) -> None:
    python = nemo.EnginePython(("srun", "--container-image=nvcr.io/nvidia/nemo:25.04", "python"), "a setting")
    launch = nemo.plan_launch(gb200_spec("nemo", precision="fp8"), gpus=4, workdir=tmp_path, python=python)
    driver = str(tmp_path / "gbvalidate_nemo_pretrain.py")
    srun = ["srun", "--container-image=nvcr.io/nvidia/nemo:25.04", "python"]
    assert launch.check_argv == [*srun, driver, "--check"]
    assert launch.argv == [*srun, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", driver]
    assert launch.env == {"NEMO_LOG_MEMORY_USAGE": "1", "HF_HUB_OFFLINE": "1"}  # NeMo's memory log; no hub
    assert launch.log_path == tmp_path / "nemo_pretrain.log"
    assert (launch.settings["vocab_size"], launch.settings["fp8_recipe"]) == (128256, "current")
    compile(launch.driver_source, driver, "exec")
    assert nemo.plan_launch(gb200_spec("megatron_bridge"), 4, tmp_path).env == {}  # its recipe reads the hub
    with pytest.raises(nemo.EngineUnavailable, match="needs 4 GPUs; this node has 8"):
        nemo.plan_launch(gb200_spec("nemo"), gpus=8, workdir=tmp_path)
    tiny = dataclasses.replace(gb200_spec("nemo"), model="llama3_tiny")
    with pytest.raises(nemo.EngineUnavailable, match="runs the llama3_8b recipe only, not llama3_tiny"):
        nemo.plan_launch(tiny, gpus=4, workdir=tmp_path)


def test_each_recipe_holds_the_layouts_sizes_but_dp_and_the_driver_sets_them(tmp_path: Path) -> None:
    """Our size names -> each recipe's own fields (nemo_drivers.RECIPE_FIELDS); DP is what the GPUs leave."""
    assert nemo_drivers.RECIPE_SIZES == ("tp", "pp", "cp", "mbs", "gbs")  # describe() reads them back in this order
    assert set(nemo_drivers.RECIPE_SIZES) == set(SIZES) - {"dp"}
    assert all(tuple(nemo_drivers.RECIPE_FIELDS[e]) == nemo_drivers.RECIPE_SIZES for e in nemo_drivers.ENGINES)
    launch = plan(tmp_path, "nemo")
    sizes = {k: launch.settings[k] for k in nemo_drivers.RECIPE_SIZES}
    assert sizes == {"tp": 1, "pp": 2, "cp": 1, "mbs": 4, "gbs": 128}
    assert "dp" not in launch.settings
    assert "\nSIZE_FIELDS = {'tp': 'trainer.strategy.tensor_model_parallel_size',\n" in launch.driver_source


def test_a_recipe_that_does_not_hold_the_layout_is_refused() -> None:
    asked = {"tp": 1, "pp": 2, "seq_len": 8192, "vocab_size": 128256, "fp8_recipe": None}
    held = {"tp": 1, "pp": 2, "seq_len": 8192, "data_seq_len": 8192, "tokenizer_vocab_size": 128256}
    assert nemo.recipe_problems(asked, {"values": held, "missing": []}) == []
    wrong = {**held, "pp": 1, "tokenizer_vocab_size": 50257, "fp8_recipe": "delayed", "nemo_toolkit": "2.7.3"}
    assert nemo.recipe_problems(asked, {"values": wrong, "missing": ["log.ckpt"]}) == [
        "log.ckpt: this release has no such field",
        "pp is 1, not 2",
        "tokenizer_vocab_size is 50257, not 128256",
        "fp8_recipe is 'delayed', not None",
    ]
    assert nemo.recipe_problems(asked, ["not", "a", "mapping"])[0].startswith("the driver's description is not")


# --- Megatron-Bridge: it imports Transformer Engine (CUDA), so its two releases are mimicked here ----------------
# The config classes as 0.3.0 and 0.3.1 define them (megatron/bridge/training/config.py; the model is a
# GPTModelProvider): dataclasses, with the fields the driver sets and their defaults.


@dataclasses.dataclass
class ModelProvider:
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 2
    seq_length: int = 8192
    vocab_size: int = 128256  # from the model hub's Llama 3 config
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None


@dataclasses.dataclass
class Section:  # train, dataset, tokenizer, optimizer, scheduler, logger and checkpoint, each with its fields
    micro_batch_size: int = 1
    global_batch_size: int = 512
    train_iters: int = 1000
    eval_iters: int = 100


def bridge_config() -> types.SimpleNamespace:
    @dataclasses.dataclass
    class Dataset:
        sequence_length: int = 8192

    @dataclasses.dataclass
    class Tokenizer:
        tokenizer_type: str = "NullTokenizer"
        vocab_size: int = 32000  # DEFAULT_NULL_TOKENIZER_VOCAB_SIZE

    @dataclasses.dataclass
    class Optimizer:
        lr: float = 3e-4

    @dataclasses.dataclass
    class Scheduler:
        lr_warmup_iters: int = 2000

    @dataclasses.dataclass
    class Logger:
        log_interval: int = 100

    @dataclasses.dataclass
    class Checkpoint:
        save: str | None = "/ckpt"

    # ConfigContainer is a dataclass too; mixed_precision one of its fields.
    return types.SimpleNamespace(
        model=ModelProvider(),
        train=Section(),
        dataset=Dataset(),
        tokenizer=Tokenizer(),
        optimizer=Optimizer(),
        scheduler=Scheduler(),
        logger=Logger(),
        checkpoint=Checkpoint(),
        mixed_precision=None,
    )


def run_bridge_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: Callable[..., Any], **layout: Any
) -> dict[str, Any]:
    """Execute the Megatron-Bridge driver against a stand-in release; what its check would print."""
    modules: dict[str, dict[str, Any]] = {
        "megatron": {},
        "megatron.bridge": {},
        "megatron.bridge.recipes": {},
        "megatron.bridge.recipes.llama": {"llama3_8b_pretrain_config": recipe},
        "megatron.bridge.training": {},
        "megatron.bridge.training.gpt_step": {"forward_step": None},
        "megatron.bridge.training.pretrain": {"pretrain": None},
    }
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    launch = plan(tmp_path, "megatron_bridge", **layout)
    namespace: dict[str, Any] = {"__name__": "driver_under_test"}  # not __main__: build, train nothing
    exec(compile(launch.driver_source, str(launch.driver_path), "exec"), namespace)
    described = {"values": namespace["describe"](namespace["build"](namespace["SETTINGS"])), "missing": []}
    described["missing"] = namespace["MISSING"]
    assert nemo.recipe_problems(launch.settings, described) == []
    return described


def test_megatron_bridge_0_3_0_gets_mock_data_by_keyword_and_the_layout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def llama3_8b_pretrain_config(**user_kwargs: Any) -> types.SimpleNamespace:  # 0.3.0's signature
        calls.append(user_kwargs)
        return bridge_config()

    described = run_bridge_driver(tmp_path, monkeypatch, llama3_8b_pretrain_config, precision="fp8")
    assert calls == [{"mock": True}]
    values = described["values"]
    assert (values["tp"], values["pp"], values["cp"], values["mbs"], values["gbs"], values["steps"]) == (
        1, 2, 1, 4, 128, 13,
    )  # fmt: skip
    assert values["vocab_size"] == values["tokenizer_vocab_size"] == 128256  # not the null tokenizer's 32000
    assert (values["precision"], values["fp8_recipe"], values["activation_checkpointing"]) == ("fp8", "current", "full")


def test_megatron_bridge_0_3_1_takes_no_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def llama3_8b_pretrain_config() -> types.SimpleNamespace:  # 0.3.1: mock data unless a blend is set
        return bridge_config()

    described = run_bridge_driver(
        tmp_path, monkeypatch, llama3_8b_pretrain_config, precision="fp8", fp8_recipe="delayed"
    )
    assert described["values"]["fp8_recipe"] == "delayed"


def test_megatron_bridge_without_the_model_hub_says_what_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def llama3_8b_pretrain_config() -> types.SimpleNamespace:
        # What AutoBridge.from_hf_pretrained raises for a gated repository without a token.
        raise OSError(
            "You are trying to access a gated repo.\nMake sure to have access to it at "
            "https://huggingface.co/meta-llama/Meta-Llama-3-8B.\n401 Client Error."
        )

    with pytest.raises(SystemExit) as exit_:
        run_bridge_driver(tmp_path, monkeypatch, llama3_8b_pretrain_config)
    assert exit_.value.code == nemo.UNAVAILABLE_EXIT
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith(
        nemo.UNAVAILABLE_MARK + "Megatron-Bridge (unknown version) builds Llama 3 8B from the model "
    )
    assert "HF_TOKEN" in line and "HF_HUB_OFFLINE=1" in line and "OSError: You are trying to access a gated" in line


# --- the real NeMo: nemo_toolkit 2.7 with nemo_run, under this interpreter or the one CI installs it in -----------
# Importing NeMo and building the recipe takes ~15 s on a CPU; no GPU is needed to build it.
REAL_NEMO_PYTHON = os.environ.get("GBVALIDATE_TEST_NEMO_PYTHON") or (
    sys.executable if importlib.util.find_spec("nemo") is not None else None
)
needs_real_nemo = pytest.mark.skipif(
    REAL_NEMO_PYTHON is None,
    reason="nemo_toolkit is not installed here: set GBVALIDATE_TEST_NEMO_PYTHON to a Python that has "
    "nemo_toolkit[llm] 2.7 and nemo_run (CI does; see .ci/run)",
)


@needs_real_nemo
@pytest.mark.parametrize(
    "layout",
    [{"precision": "bf16"}, {"precision": "fp8", "fp8_recipe": "delayed", "activation_checkpointing": "selective"}],
    ids=["bf16-ac", "fp8ds-sac"],
)
def test_the_real_nemo_recipe_holds_the_baselines_layout_offline(tmp_path: Path, layout: dict[str, str]) -> None:
    assert REAL_NEMO_PYTHON is not None
    python = nemo.EnginePython((REAL_NEMO_PYTHON,), "the test's NeMo")
    recipe = nemo.check_recipe(plan(tmp_path, "nemo", python, **layout))  # raises on any field not taken
    values = recipe["values"]
    assert (values["tp"], values["pp"], values["cp"], values["mbs"], values["gbs"]) == (1, 2, 1, 4, 128)
    assert values["seq_len"] == values["data_seq_len"] == 8192
    # Llama 3's vocabulary in the model and the mock data, from a null tokenizer built with HF_HUB_OFFLINE=1.
    assert values["vocab_size"] == values["tokenizer_vocab_size"] == 128256
    assert values["precision"] == layout["precision"]
    assert values["fp8_recipe"] == layout.get("fp8_recipe")
    assert values["activation_checkpointing"] == layout.get("activation_checkpointing", "full")
    assert values["nemo_toolkit"].startswith("2.7.")
    assert recipe["missing"] == []


def nemo_line(step: int, loss: float, time_s: float, prefix: str = "") -> str:
    """NeMo 2.7's ProgressPrinter line (nemo/lightning/pytorch/callbacks/progress_printer.py: ` | {metric}: {val:.4}`,
    whole numbers as integers), with the memory peaks MegatronStrategy logs under NEMO_LOG_MEMORY_USAGE=1."""
    reserved, allocated = 7.5e10 + step * 1e8, 6.84e10 + step * 1e8
    return (
        f"{prefix}Training epoch 0, iteration {step}/12 | lr: 0.0003 | global_batch_size: 128 | global_step: {step} | "
        f"max_memory_reserved: {reserved:.4} | max_memory_allocated: {allocated:.4} | reduced_train_loss: {loss:.4} | "
        f"train_step_timing in s: {time_s:.4} | consumed_samples: {128 * (step + 1)}"
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
        nemo.LoggedStep(1, 61.2, 12.61, allocated_bytes=6.84e10, reserved_bytes=7.5e10),
        nemo.LoggedStep(2, 58.0, 11.96, allocated_bytes=6.85e10, reserved_bytes=7.51e10),
    ]
    # Without NEMO_LOG_MEMORY_USAGE the line has no memory figures: the step still counts, its memory unknown.
    plain = (
        "Training epoch 0, iteration 0/12 | global_step: 0 | reduced_train_loss: 12.61 | train_step_timing in s: 61.2"
    )
    assert nemo.parse_log("nemo", plain) == [nemo.LoggedStep(1, 61.2, 12.61)]


def megatron_memory_line(rank: int, max_allocated_gb: float) -> str:
    """Megatron-Bridge 0.3's memory report (training/utils/train_utils.py report_memory: decimal GB)."""
    return (
        f"[Rank {rank}] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 17.2 | mem-max-allocated-gigabytes:"
        f" {max_allocated_gb} | mem-max-reserved-gigabytes: {max_allocated_gb + 8} | mem-alloc-retires: 0 |"
    )


def test_megatron_log_lines_give_each_steps_time_loss_and_memory() -> None:
    text = "\n".join(
        [
            megatron_line(1, 12.5, 4160.2),
            megatron_memory_line(0, 52.345),
            megatron_memory_line(2, 61.5),  # the last pipeline stage holds more
            "  iteration 2 skipped",
            megatron_line(2, 11.0, 4100.0),
        ]
    )
    logged = nemo.parse_log("megatron_bridge", text)
    assert logged == [nemo.LoggedStep(1, 4.1602, 12.5), nemo.LoggedStep(2, 4.1, 11.0)]
    assert nemo.logged_memory("megatron_bridge", text, logged) == [
        MemoryPeak("device max allocated (engine log after the first iteration, busiest rank)", 61.5e9 / 2**30),
        MemoryPeak("device max reserved (engine log after the first iteration, busiest rank)", 69.5e9 / 2**30),
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
    assert [(m.what, round(m.gib, 2)) for m in result.memory] == [
        ("device max allocated (engine log, rank 0)", round((6.84e10 + 12e8) / 2**30, 2)),
        ("device max reserved (engine log, rank 0)", round((7.5e10 + 12e8) / 2**30, 2)),
    ]
    with pytest.raises(nemo.EngineFailed, match=r"expected a log line for each of steps 1..13, found steps 1, 2"):
        nemo.result_from_log(spec, "\n".join(nemo_line(i, 12.0, 60.0) for i in range(2)))
