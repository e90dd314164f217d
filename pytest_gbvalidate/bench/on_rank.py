"""Per-GPU and per-node measurements as functions of a gang rank (`fn(ctx, ...)`), for `run_on_local_rank`: the
rank whose GPU is measured runs alone on its node, inside the gang's time bound.

Host<->device copies run with the rank's thread and new memory bound to the GPU's NUMA node (as `numactl` does in the
public procedures); a measurement of the host itself uses every CPU the rank may run on, the node to itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import torch

from pytest_gbvalidate.bench.copy import CopyResult, copy_bandwidth
from pytest_gbvalidate.bench.gemm import GemmResult, fp8_supported, gemm_tflops
from pytest_gbvalidate.node.affinity import bound_to, pci_locality
from pytest_gbvalidate.ranks.gang import RankContext

COPY_KINDS = ("host", "h2d", "d2h", "d2d")
HOST = torch.device("cpu")


def copy_on_rank(ctx: RankContext, kind: str, size_bytes: int, warmup: int, iterations: int) -> CopyResult:
    """`host`: host memory to host memory (any SKU); `h2d`, `d2h`, `d2d`: to, from or within the rank's device."""
    device = ctx.device
    if kind == "host":
        with all_host_cpus():
            return copy_bandwidth(HOST, HOST, size_bytes, warmup=warmup, iterations=iterations)
    if kind == "d2d":
        return copy_bandwidth(device, device, size_bytes, warmup=warmup, iterations=iterations)
    if kind not in COPY_KINDS:
        raise ValueError(f"unknown copy kind {kind!r} (known: {', '.join(COPY_KINDS)})")
    src, dst = (HOST, device) if kind == "h2d" else (device, HOST)
    with near_device(device) as binding:
        result = copy_bandwidth(src, dst, size_bytes, warmup=warmup, iterations=iterations)
    return dataclasses.replace(result, host_binding=binding)


def p2p_on_rank(ctx: RankContext, dst_index: int, size_bytes: int, warmup: int, iterations: int) -> CopyResult:
    """From this rank's GPU to GPU `dst_index` of the same node (torch issues the copy on the source GPU). The cached
    block this process allocated on the peer goes back at once (the CUDA context it made there, a few hundred MiB,
    stays until the process ends: the pretraining check's headroom counts them)."""
    dst = torch.device(ctx.device.type, dst_index)
    try:
        return copy_bandwidth(ctx.device, dst, size_bytes, warmup=warmup, iterations=iterations)
    finally:
        torch.accelerator.empty_cache()  # every device's cache, the peer's included


def gemm_on_rank(ctx: RankContext, dtype: str, m: int, n: int, k: int, warmup: int, iterations: int) -> GemmResult:
    return gemm_tflops(ctx.device, dtype, m, n, k, warmup=warmup, iterations=iterations)


def host_gemm_on_rank(ctx: RankContext, dtype: str, m: int, n: int, k: int, warmup: int, iterations: int) -> GemmResult:
    with all_host_cpus():
        return gemm_tflops(HOST, dtype, m, n, k, warmup=warmup, iterations=iterations)


def has_fp8_on_rank(ctx: RankContext) -> bool:
    return fp8_supported(ctx.device)


@contextlib.contextmanager
def all_host_cpus() -> Iterator[None]:
    """torch's intra-op threads on every CPU this process may use (a gang rank normally gets its share)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def near_device(device: torch.device) -> Iterator[dict[str, str]]:
    """The calling thread and its new host memory on the NUMA node of `device` (CUDA-only: a CPU device has no
    PCI locality, and the copy is left where it is)."""
    if device.type != "cuda":
        yield {}
        return
    locality = pci_locality(_cuda_pci_address(device))
    if not locality.cpus:
        # A device whose NUMA node has no CPUs (GPU memory shows up as such nodes on Grace systems), or one
        # sysfs places nowhere: binding host memory there would be wrong, so the copy runs unbound and says so.
        yield {"cpus": "not bound (sysfs gives the device no local CPUs)"}
        return
    with bound_to(locality.cpus, locality.numa_node) as applied:
        yield applied


def _cuda_pci_address(device: torch.device) -> str:
    """CUDA-only: the GPU's PCI address as sysfs names it, e.g. 0000:1b:00.0."""
    props = torch.cuda.get_device_properties(device)
    domain, bus, dev = (int(getattr(props, f"pci_{name}_id")) for name in ("domain", "bus", "device"))
    return f"{domain:04x}:{bus:02x}:{dev:02x}.0"
