"""The NeMo engines' driver scripts, which nemo.py writes next to the run and starts under the engine's own Python,
so that they, never this package, import the engine. What they print for the plugin (the recipe line, the
unavailable line and its exit code) is spelled as nemo.py's RECIPE_MARK, UNAVAILABLE_MARK and UNAVAILABLE_EXIT."""

from __future__ import annotations

import pprint
from typing import Any

ENGINES = ("nemo", "megatron_bridge")
# Where each engine's recipe keeps the layout's sizes: our name (parallel.SIZES) -> the recipe's attribute path,
# which build() sets and describe() reads back. DP has none: the recipe makes it of the GPUs the others leave.
RECIPE_FIELDS = {
    "nemo": {
        "tp": "trainer.strategy.tensor_model_parallel_size",
        "pp": "trainer.strategy.pipeline_model_parallel_size",
        "cp": "trainer.strategy.context_parallel_size",
        "mbs": "data.micro_batch_size",
        "gbs": "data.global_batch_size",
    },
    "megatron_bridge": {
        "tp": "model.tensor_model_parallel_size",
        "pp": "model.pipeline_model_parallel_size",
        "cp": "model.context_parallel_size",
        "mbs": "train.micro_batch_size",
        "gbs": "train.global_batch_size",
    },
}
RECIPE_SIZES = tuple(RECIPE_FIELDS["nemo"])  # the sizes SETTINGS carry, by our name: every engine's the same


def driver_source(engine: str, settings: dict[str, Any]) -> str:
    """The driver script for `engine`, its settings and RECIPE_FIELDS written in as Python literals."""
    body = {"nemo": _NEMO_DRIVER, "megatron_bridge": _MEGATRON_BRIDGE_DRIVER}[engine]
    fields = pprint.pformat(RECIPE_FIELDS[engine], sort_dicts=False)
    return f"SETTINGS = {pprint.pformat(settings)}\nSIZE_FIELDS = {fields}\n{_DRIVER_HEAD}{body}{_DRIVER_MAIN}"


# Below: the head, each engine's build() and describe(), and the main (`--check` prints what the recipe holds, else
# it trains). Imports that fail, and what cannot be had (the model hub), are one line the plugin reads.

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


def assign_sizes(cfg, s):
    \"\"\"The layout's sizes into the recipe's fields (SIZE_FIELDS: our name -> the recipe's).\"\"\"
    for size, path in SIZE_FIELDS.items():
        assign(cfg, path, s[size])


def sizes(cfg):
    \"\"\"The layout's sizes as the recipe holds them, by our name.\"\"\"
    return {size: read(cfg, path) for size, path in SIZE_FIELDS.items()}


def read(cfg, path):
    for name in path.split("."):
        cfg = getattr(cfg, name)
    return cfg
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
    assign_sizes(recipe, s)
    assign(recipe, "model.config.seq_length", s["seq_len"])
    # Mock data with Llama 3's vocabulary, nothing downloaded: a null tokenizer (it adds an end-of-document
    # token to the size it is given), and the model's vocabulary set rather than padded up from the tokenizer's.
    assign(recipe, "data.tokenizer", run.Config(NullTokenizer, vocab_size=s["vocab_size"] - 1))
    assign(recipe, "model.config.vocab_size", s["vocab_size"])
    assign(recipe, "data.seq_length", s["seq_len"])  # the recipe's data is its MockDataModule
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

    data, plugins = recipe.data, recipe.trainer.plugins
    fp8 = getattr(plugins, "fp8_recipe", None) if getattr(plugins, "fp8", None) else None
    return {
        **sizes(recipe),
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
    assign_sizes(cfg, s)
    assign(cfg, "model.seq_length", s["seq_len"])
    # Field names that moved between releases: the one this release has.
    dataset_seq = "sequence_length" if "sequence_length" in fields(cfg.dataset) else "seq_length"
    assign(cfg, f"dataset.{dataset_seq}", s["seq_len"])
    # Mock tokens over Llama 3's vocabulary (the recipes' null tokenizer defaults to 32000; its size counts EOD).
    assign(cfg, "tokenizer.vocab_size", s["vocab_size"])
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
        **sizes(cfg),
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
