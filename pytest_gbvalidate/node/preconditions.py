"""Whether a GPU node's GPUs can be used at all, asked once before its checks: the commonest broken node after
maintenance (a driver that did not load, GPUs torch cannot see, a GPU off the bus) is one root failure, not a hundred
checks failing on their own (each starting its ranks again, each start retried). Four preconditions, in the order
they are asked, each with the checks that depend on it:
- NVML loads and lists GPUs: every GPU check (`gb_gpu`; the `gpu`, `gb_gpu_pair` and sampling fixtures; ranks).
- torch sees the GPUs NVML lists: the checks that start ranks (`gb_gang`); those that read NVML alone run and say
  what else is wrong.
- The GPUs are the SKU's model (`detect.gpu_name_contains`): the checks judged against its baseline (`gb_expect`:
  another GPU's figure says nothing of this node) and those that start ranks; the health checks run.
- As many GPUs as the SKU promises (`detect.gpu_count`): the checks that start ranks (one per promised GPU); the GPU
  count check and each present GPU's checks run, and name the missing one.
A check whose precondition failed is not run, its skip naming it; the run fails once, in the test
PRECONDITIONS_TEST_ID, with the cause (faults.yaml classifies it by its message)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PRECONDITIONS_TEST_ID = "gbvalidate::node_gpus_usable"
Precondition = Literal["nvml", "torch_gpus", "gpu_model", "gpu_count"]
# The fixtures (in a test's closure) that start ranks (ranks/gang.py), run per GPU or pair, or sample them (probes.py).
# Not `gpus` alone: a check reading NVML through it is marked `gb_gpu`, and the NUMA map takes it without NVML.
RANK_FIXTURES = frozenset({"gb_gang"})
NVML_FIXTURES = frozenset({"gpu", "gb_gpu_pair", "gb_telemetry"})
BASELINE_FIXTURES = frozenset({"gb_expect"})  # a check that judges its figures against the SKU's baseline


@dataclass(frozen=True)
class Unmet:
    """A precondition the node does not meet, and why (one line)."""

    precondition: Precondition
    why: str

    def skip_reason(self) -> str:
        return f"not run: the node's GPUs cannot be used ({self.why}); {PRECONDITIONS_TEST_ID} failed"

    def blocks(self, gpu_check: bool, fixtures: set[str]) -> bool:
        """Whether a check depends on it: one marked as needing GPUs (`gpu_check`), or by its fixture closure."""
        starts_ranks = bool(RANK_FIXTURES & fixtures)
        if self.precondition == "nvml":
            return gpu_check or starts_ranks or bool(NVML_FIXTURES & fixtures)
        if self.precondition == "gpu_model":
            return starts_ranks or bool(BASELINE_FIXTURES & fixtures)
        return starts_ranks


@dataclass(frozen=True)
class Promised:
    """What the SKU's baseline promises of the node's GPUs (`detect`): how many, a text in each name; None: unsaid."""

    sku: str
    gpu_count: int | None = None
    gpu_name_contains: str | None = None


def unmet(
    nvml_gpus: int | str,
    torch_gpus: int,
    torch_build: str,
    promised: Promised | None = None,
    names: tuple[str, ...] = (),
) -> Unmet | None:
    """The first precondition a GPU node does not meet, else None. `nvml_gpus`: the GPUs NVML lists, or its error;
    `torch_build`: torch's version and CUDA build, for the message; `names`: the GPUs' names, as NVML gives them."""
    if isinstance(nvml_gpus, str):
        return Unmet("nvml", f"NVML does not load: {nvml_gpus}")
    if nvml_gpus == 0:
        return Unmet("nvml", "NVML lists no GPU")
    if torch_gpus == 0 and nvml_gpus > 0:
        return Unmet("torch_gpus", f"torch sees none of the {nvml_gpus} GPUs NVML lists ({torch_build})")
    if promised is None:
        return None
    want = promised.gpu_name_contains
    if others := sorted({n for n in names if want is not None and want not in n}):
        shown = ", ".join(repr(n) for n in others)
        return Unmet("gpu_model", f"they are {shown}, not {promised.sku}'s ({want!r} in the name)")
    have = min(nvml_gpus, torch_gpus)
    if promised.gpu_count is not None and have < promised.gpu_count:
        return Unmet(
            "gpu_count",
            f"only {have} of the {promised.gpu_count} GPUs {promised.sku} promises are there (NVML lists "
            f"{nvml_gpus}, torch sees {torch_gpus}; {torch_build})",
        )
    return None


def probe(promised: Promised | None = None) -> Unmet | None:
    """The node's preconditions, asked of NVML and torch, against what its SKU `promised`."""
    import importlib.metadata
    import os

    import torch

    from pytest_gbvalidate.node import nvml

    def name(index: int) -> str | None:
        try:
            return str(nvml.call("nvmlDeviceGetName", nvml.handle(index)))
        except nvml.NvmlError:  # a GPU that does not answer: its own checks name it
            return None

    listed = nvml.gpus_seen()
    names: tuple[str, ...] = ()
    if isinstance(listed, int):
        try:
            with nvml.session():
                names = tuple(n for n in map(name, range(listed)) if n is not None)
        except nvml.NvmlError:  # NVML gone between the two questions: the count stands, the names are unknown
            pass

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    build = f"torch {importlib.metadata.version('torch')}, CUDA {torch.version.cuda or 'none: a CPU build'}"
    if visible is not None:
        build += f", CUDA_VISIBLE_DEVICES={visible!r}"
    return unmet(listed, torch.cuda.device_count(), build, promised, names)
