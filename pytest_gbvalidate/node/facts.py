"""Facts about the node and its software stack, for the session header and the reports."""

from __future__ import annotations

import importlib.metadata
import platform

import pytest_gbvalidate
from pytest_gbvalidate import labels


def software_facts(*, gpu: bool) -> dict[str, str]:
    """Versions that explain a measurement. The GPU stack (driver, CUDA, NCCL) is asked for only on a GPU SKU:
    it imports torch and NVML, which a `cpu` run does not need for its header."""
    facts = {
        "hostname": labels.hostname(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "pytest_gbvalidate": pytest_gbvalidate.__version__,
        "torch": _dist_version("torch"),
    }
    if gpu:
        facts.update(_gpu_stack())
    return {k: v for k, v in facts.items() if v}


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _gpu_stack() -> dict[str, str]:
    import torch

    from pytest_gbvalidate.node import nvml

    facts = {"cuda_runtime": str(torch.version.cuda or "")}
    if torch.cuda.is_available():
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # type: ignore[no-untyped-call]
    try:
        with nvml.session():
            facts["driver"] = str(nvml.call("nvmlSystemGetDriverVersion"))
            cuda = int(nvml.call("nvmlSystemGetCudaDriverVersion"))
            facts["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    except nvml.NvmlError as exc:
        facts["driver"] = f"unknown (NVML: {exc.text})"
    return facts
