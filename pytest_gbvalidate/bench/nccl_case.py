"""One collective's sweep on a communicator of its own, with NCCL settings of its own and NCCL's log captured:
how the collectives suite measures all_reduce pinned to NVLS beside the Ring-pinned sweep, and proves from NCCL's
own words which algorithm ran (bench/nccl_log.py reads the log).

Why a communicator of its own: the gang's ranks run every other collective with the baseline's NCCL environment
(e.g. ``NCCL_ALGO=Ring``), and NCCL reads ``NCCL_ALGO`` when it builds a communicator's tuning tables
(src/graph/tuning.cc, ncclTopoTuneModel): the case sets its variables, builds a new process group, sweeps on it, and
puts the environment back. NCCL sets its logging up once per process; ``ncclResetDebugInit`` (libnccl, src/debug.cc:
"Use this after changing NCCL_DEBUG and related parameters in the environment") makes it read ``NCCL_DEBUG*`` again,
before the case and after it. Where torch's NCCL is not the shared libnccl.so.2 there is no reset and maybe no log:
the check then says NCCL did not confirm the algorithm, unresolved (never a pass on bandwidth alone, nor a fault).

`sweep_with_nccl_log_on_rank` runs on every rank of a gang (SPMD).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch.distributed as dist

from pytest_gbvalidate.bench import nccl_log
from pytest_gbvalidate.bench.collectives import RankSizeResult, sweep_on_rank
from pytest_gbvalidate.ranks.gang import RankContext

# The all_reduce metrics measured this way, beside the collectives' own (collectives.COLLECTIVES): NVLS pinned on
# one node, and multi-node NVLink across the nodes of an NVLink domain.
NVLS_METRIC, MNNVL_METRIC = "all_reduce_nvls_busbw_gbps", "mnnvl_all_reduce_busbw_gbps"

MAX_LOG_BYTES = 64 * 2**20  # of a rank's NCCL log read back; rank 0 writes a TUNING line (~90 bytes) a call


@dataclass(frozen=True)
class RankCase:
    """One rank's sweep and what its NCCL log says."""

    results: list[RankSizeResult]
    log: nccl_log.NcclLog | None  # None: no log file (not NCCL, or NCCL wrote none)
    error: str | None  # the collective raised (e.g. NCCL refused NCCL_ALGO): its last line
    env: dict[str, str]  # the NCCL_* variables the case's communicator was built with on this rank


def read_log(path: str) -> str | None:
    """The text NCCL wrote to `path`, None if it wrote nothing there. Module level: the plugin's tests replace it
    on a rank to hand the check a real NCCL log of a fallback."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_LOG_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None


def sweep_with_nccl_log_on_rank(
    ctx: RankContext,
    collective: str,
    placement: str,
    sizes: Sequence[int],
    warmup: int,
    iterations: int,
    case_env: Mapping[str, str],
) -> RankCase:
    """Sweep `collective` on a new communicator built with `case_env`, NCCL's log in a private file: the results and the
    log. A collective that raises (NCCL refusing the algorithm) is reported: every rank refuses alike at that call."""
    log_dir = tempfile.mkdtemp(prefix="gbvalidate-nccl-")
    path = os.path.join(log_dir, f"nccl-rank{ctx.rank}.log")
    try:
        with _environment({**case_env, **nccl_log.debug_env(path)}):
            env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_") and k != "NCCL_DEBUG_FILE"}
            results: list[RankSizeResult] = []
            error = None
            group = dist.new_group(list(range(ctx.world_size)))
            try:
                results = sweep_on_rank(ctx, collective, placement, sizes, warmup, iterations, group)
            except Exception as e:  # reported to the check, which fails saying so
                error = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            finally:
                with contextlib.suppress(Exception):
                    dist.destroy_process_group(group)
        text = read_log(path)
        return RankCase(results, None if text is None else nccl_log.parse(text), error, env)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


@contextlib.contextmanager
def _environment(overrides: Mapping[str, str]) -> Iterator[None]:
    """`overrides` in this rank's environment, NCCL's logging re-read, then both put back as they were."""
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    _reset_nccl_debug()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        _reset_nccl_debug()


def _reset_nccl_debug() -> None:
    """Make the NCCL torch has loaded re-read NCCL_DEBUG* on its next log line. RTLD_NOLOAD: only a libnccl
    already in this process, never a second one loaded here."""
    try:
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return
    reset = getattr(lib, "ncclResetDebugInit", None)
    if reset is not None:
        reset()
