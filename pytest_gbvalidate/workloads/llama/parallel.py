"""Parallel layouts of a pretraining run and the rules that make one valid. Pure Python: the baseline loader and
the suite reject an invalid layout before any process starts. World = TP x PP x CP x DP ranks; each step trains on
GBS sequences, GBS / DP per DP rank fed through its pipeline in microbatches of MBS; CP splits every sequence."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import get_type_hints

from pytest_gbvalidate.workloads.llama.config import LlamaConfig

ENGINES = ("native", "nemo", "megatron_bridge")
# fp32: no autocast (the cpu SKU's equality tests); bf16: bf16 autocast; fp8: bf16 autocast with the transformer
# blocks' matmuls in fp8 (the head stays bf16, as NeMo and torchao keep it).
PRECISIONS = ("fp32", "bf16", "fp8")
# How fp8 scales are chosen: from each tensor as it is cast ("current", per-tensor: the native engine's, Megatron's
# "tensorwise") or from earlier steps' amax history ("delayed": NeMo 2's bf16_with_fp8_mixed); a label names it.
FP8_RECIPES = ("current", "delayed")
_FP8_LABELS = {"current": "fp8cs", "delayed": "fp8ds"}
FP8_MULTIPLE = 16
# What the backward pass recomputes instead of keeping: nothing; every block from its input (about a third more
# compute for the least memory); or a block's cheap elementwise work, its matmul and attention outputs kept.
CHECKPOINTING = ("none", "full", "selective")
_CHECKPOINTING_LABELS = {"none": "", "full": "-ac", "selective": "-sac"}


class LayoutError(ValueError):
    """A layout that cannot run; the message lists every rule it breaks."""


@dataclass(frozen=True)
class Layout:
    mbs: int  # micro-batch size: sequences per pipeline microbatch
    gbs: int  # global batch size: sequences per optimizer step, all DP ranks together
    tp: int = 1  # tensor parallel: each layer's heads and FFN split over TP ranks
    pp: int = 1  # pipeline parallel: layers split into PP stages (1F1B schedule)
    cp: int = 1  # context parallel: each sequence split over CP ranks
    dp: int = 1  # data parallel: replicas, each on GBS / DP sequences
    precision: str = "bf16"
    engine: str = "native"
    activation_checkpointing: str = "none"  # one of CHECKPOINTING
    fp8_recipe: str = "current"  # one of FP8_RECIPES; only fp8 layouts use it

    def sizes(self) -> dict[str, int]:
        """The layout's sizes by name, in SIZES' order: {"mbs": 4, "gbs": 512, "tp": 1, "pp": 2, "cp": 1, "dp": 2}."""
        return {k: getattr(self, k) for k in SIZES}

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def microbatches(self) -> int:
        """Microbatches each pipeline runs per step."""
        return self.gbs // (self.mbs * self.dp)

    @property
    def label(self) -> str:
        """What a step time measured with this layout is valid for, e.g. native-bf16-mbs4-gbs128-tp1-pp2-cp1-dp2-ac
        (-ac full, -sac selective checkpointing; fp8cs / fp8ds). The engine comes first: `engine_of` reads it."""
        sizes = "-".join(f"{k}{v}" for k, v in self.sizes().items())
        precision = _FP8_LABELS.get(self.fp8_recipe, "fp8") if self.precision == "fp8" else self.precision
        return f"{self.engine}-{precision}-{sizes}{_CHECKPOINTING_LABELS.get(self.activation_checkpointing, '')}"


# Layout's integer fields, in the order its label, a baseline's `pretrain` section, a report and the sweep name them.
SIZES = tuple(name for name, kind in get_type_hints(Layout).items() if kind is int)


def engine_of(label: str) -> str:
    return label.split("-", 1)[0]


def engine_mismatch(metric: str, recorded_labels: list[str], label: str) -> str | None:
    """Why a measurement with layout `label` must not be compared with a baseline whose values for `metric` were
    recorded under `recorded_labels` (all from other engines), else None."""
    engines = sorted({engine_of(x) for x in recorded_labels})
    if label in recorded_labels or not engines or engine_of(label) in engines:
        return None
    return (
        f"{metric}: the baseline's values were recorded with the {' and '.join(engines)} engine "
        f"({', '.join(recorded_labels)}); this run used the {engine_of(label)} engine ({label}): "
        "refusing to compare step times across engines"
    )


def for_world(
    world_size: int,
    *,
    mbs: int,
    gbs: int,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    precision: str = "bf16",
    engine: str = "native",
    activation_checkpointing: str = "none",
) -> Layout:
    """The layout filling `world_size` ranks: DP is what TP x PP x CP leaves."""
    model_parallel = tp * pp * cp
    if min(mbs, gbs, tp, pp, cp, world_size) < 1:
        raise LayoutError(
            f"sizes must be positive: world {world_size}, MBS {mbs}, GBS {gbs}, TP {tp}, PP {pp}, CP {cp}"
        )
    if world_size % model_parallel:
        raise LayoutError(
            f"TP*PP*CP = {tp}*{pp}*{cp} = {model_parallel} does not divide the world of {world_size} ranks"
        )
    return Layout(mbs, gbs, tp, pp, cp, world_size // model_parallel, precision, engine, activation_checkpointing)


def problems(cfg: LlamaConfig, layout: Layout) -> list[tuple[str, str]]:
    """Every rule `layout` breaks for model `cfg` (at cfg.seq_len), as (field, message); empty when it can run."""
    bad_sizes = [k for k in SIZES if not isinstance(getattr(layout, k), int) or getattr(layout, k) < 1]
    if bad_sizes:
        return [(k, f"{k.upper()} must be a positive integer, got {getattr(layout, k)!r}") for k in bad_sizes]
    found = []
    if cfg.n_layers % layout.pp:
        found.append(("pp", f"{cfg.n_layers} layers do not split into PP={layout.pp} equal pipeline stages"))
    if cfg.n_heads % layout.tp:
        found.append(("tp", f"{cfg.n_heads} attention heads are not divisible by TP={layout.tp}"))
    if cfg.n_kv_heads % layout.tp:
        found.append(("tp", f"{cfg.n_kv_heads} KV heads are not divisible by TP={layout.tp}"))
    if cfg.seq_len % (2 * layout.cp):
        # Each CP rank holds two of 2*CP chunks (one early, one late), so causal attention costs every rank the same.
        found.append(("cp", f"sequence length {cfg.seq_len} is not divisible by 2*CP = {2 * layout.cp}"))
    if layout.gbs % (layout.mbs * layout.dp):
        found.append(("gbs", f"GBS {layout.gbs} is not divisible by MBS*DP = {layout.mbs}*{layout.dp}"))
    elif layout.pp > 1 and layout.microbatches < layout.pp:
        needs = f"cannot fill PP={layout.pp} stages; 1F1B needs at least one per stage"
        found.append(("gbs", f"{layout.microbatches} microbatches per step (GBS/(MBS*DP)) {needs}"))
    if layout.engine not in ENGINES:
        found.append(("engine", f"engine {layout.engine!r} is not one of {', '.join(ENGINES)}"))
    if layout.precision not in PRECISIONS:
        found.append(("precision", f"precision {layout.precision!r} is not one of {', '.join(PRECISIONS)}"))
    elif layout.engine == "native" and layout.precision == "fp8" and layout.tp > 1:
        # Its fp8 matmuls take plain tensors; tensor-parallel weights are DTensors.
        found.append(("precision", f"the native engine trains in fp8 without tensor parallelism, not TP={layout.tp}"))
    if layout.engine == "native" and layout.precision == "fp8":
        # cuBLASLt's fp8 rule for torch._scaled_mm: the inner dimension and both of the second operand's are
        # multiples of 16, a rank's tokens too (the weight gradient's inner one). The CPU's kernel does not check.
        sizes = {
            "dim": cfg.dim,
            "KV dim": cfg.n_kv_heads * cfg.head_dim,
            "FFN dim": cfg.ffn_dim,
            "tokens per microbatch on a rank (MBS*seq/CP)": layout.mbs * cfg.seq_len // layout.cp,
        }
        odd = [f"{name} {value}" for name, value in sizes.items() if value % FP8_MULTIPLE]
        if odd:
            found.append(("precision", f"fp8 matmuls need multiples of {FP8_MULTIPLE}: {', '.join(odd)}"))
    if layout.fp8_recipe not in FP8_RECIPES:
        found.append(("fp8_recipe", f"fp8 recipe {layout.fp8_recipe!r} is not one of {', '.join(FP8_RECIPES)}"))
    elif layout.engine == "native" and layout.fp8_recipe != "current":
        found.append(("fp8_recipe", "the native engine scales fp8 tensors as they are cast: fp8_recipe current only"))
    if layout.activation_checkpointing not in CHECKPOINTING:
        said = f"activation checkpointing {layout.activation_checkpointing!r} is not one of {', '.join(CHECKPOINTING)}"
        found.append(("activation_checkpointing", said))
    return found


def validate(cfg: LlamaConfig, layout: Layout) -> Layout:
    """`layout`, or LayoutError naming every rule it breaks."""
    found = problems(cfg, layout)
    if found:
        reasons = "; ".join(message for _, message in found)
        raise LayoutError(f"invalid layout {layout.label} for {cfg.name} at seq {cfg.seq_len}: {reasons}")
    return layout


def weak_scaled(layout: Layout, world_size: int) -> Layout:
    """The layout for a world that is a whole multiple of its ranks: more DP replicas, each node training what it
    would alone (weak scaling); else the layout itself."""
    if world_size <= layout.world_size or world_size % layout.world_size:
        return layout
    replicas = world_size // layout.world_size
    return replace(layout, dp=layout.dp * replicas, gbs=layout.gbs * replicas)


def check_world(layout: Layout, world_size: int) -> None:
    """The ranks at hand must be exactly the ranks the layout needs."""
    if layout.world_size != world_size:
        raise LayoutError(
            f"layout {layout.label} needs TP*PP*CP*DP = {layout.tp}*{layout.pp}*{layout.cp}*{layout.dp} = "
            f"{layout.world_size} ranks; this run has {world_size}"
        )
