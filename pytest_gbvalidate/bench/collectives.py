"""Collective bandwidth over a sweep of message sizes, measured and reported as nccl-tests does:

- S is the bytes of the full buffer (for all_gather, reduce_scatter and alltoall: the total array), float32 elements
  (nccl-tests' default type); algbw = S / t with GB = 1e9 bytes; busbw = algbw x factor: 2(n-1)/n for all_reduce,
  (n-1)/n for all_gather, reduce_scatter and alltoall, 1 for broadcast.
- t is per iteration: each rank times every iteration (device events on GPUs, the host clock on the CPU), the ranks'
  times are averaged per iteration (nccl-tests' default `-a 1`), and the median over iterations is reported
  (nccl-tests: the mean over a timed loop). On an accelerator, below BACK_TO_BACK_BELOW_BYTES an iteration is
  BACK_TO_BACK_CALLS calls back to back between two events, divided, as nccl-tests' loop runs them: a small
  message's kernel is shorter than its launch, whose latency nccl-tests' figures do not have.
- After timing, every size is run once more on known data and each rank counts the wrong elements (nccl-tests'
  #wrong): a fast wrong answer is a failure.
- A size whose buffers and check do not fit in the memory free on the fullest rank is not run, and says so; each
  size's buffers are freed before the next is allocated. A collective needs two ranks at least.

Each collective is described once, in COLLECTIVES, as nccl-tests keeps one `testColl` per collective.
`sweep_on_rank` runs on every rank of a gang (SPMD); `summarize` turns the ranks' results into one row per size.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil
import torch
import torch.distributed as dist

from pytest_gbvalidate.bench.timing import time_op_s
from pytest_gbvalidate.labels import bytes_label, size_label
from pytest_gbvalidate.node import neighbours
from pytest_gbvalidate.ranks.gang import RankContext

BACK_TO_BACK_BELOW_BYTES = 2**20  # below about 1 MiB a GPU collective's kernel lasts no longer than its launch
BACK_TO_BACK_CALLS = 10

IN_PLACE, OUT_OF_PLACE = "in_place", "out_of_place"
DTYPE, DTYPE_NAME, ELEMENT_BYTES = torch.float32, "float", 4
_PERIOD, _RANK_MOD, _SENTINEL = 251, 7, -1.0  # input element j of rank r holds (j % 251) + (r % 7), exact in fp32
_ROOT = 0  # broadcast's root, as nccl-tests' default (-r 0)
MIN_RANKS = 2  # with one, all_reduce's busbw is 0 by definition and broadcast times a no-op
_CHUNK = 2**24  # elements filled and checked at a time, so checking a 16 GiB buffer needs no second 16 GiB
# Temporaries per element of a chunk while filling or checking: the int64 index, up to four int64 intermediates
# of the expected value, its fp32 result and the comparison's bools.
_CHECK_BYTES_PER_ELEMENT = 48


@dataclass(frozen=True)
class Collective:
    """What measuring and checking one collective needs (nccl-tests' `testColl`). `count` is the elements of the full
    buffer (S / 4), `chunk` one rank's part: count / n where `split`, else the whole count."""

    name: str
    busbw_factor: Callable[[int], float]  # busbw / algbw with n ranks (nccl-tests' getBw)
    split: bool  # one part per rank: the count is rounded down to a multiple of the ranks
    placements: tuple[str, ...]  # the forms torch.distributed has (IN_PLACE, OUT_OF_PLACE)
    # (count, chunk) -> elements of the input and the output buffer (nccl-tests' getCollByteCount; in place: _Case).
    buffer_elements: Callable[[int, int], tuple[int, int]]
    call: Callable[[torch.Tensor, torch.Tensor, Any], object]
    # (indices into the output, rank, n, chunk) -> what a correct run leaves there (int64), given _Case.fill's inputs.
    expected: Callable[[torch.Tensor, int, int, int], torch.Tensor]
    root: int | None = None  # the one rank whose input the others receive; None: every rank sends its own

    @property
    def metric(self) -> str:
        return f"{self.name}_busbw_gbps"


def _rank_sum(n: int) -> int:
    """The sum of the (rank % 7) terms over all ranks: what a reduction adds on top of n x (j % 251)."""
    return sum(q % _RANK_MOD for q in range(n))


# torch.distributed's all_reduce and broadcast only work in place, and all_to_all_single has no in-place form. The
# calls (input, output, group; None: the default group) look their functions up when run: the fault tests replace them.
COLLECTIVES: dict[str, Collective] = {
    c.name: c
    for c in (
        Collective(
            "all_reduce",
            busbw_factor=lambda n: 2.0 * (n - 1) / n,
            split=False,
            placements=(IN_PLACE,),
            buffer_elements=lambda count, chunk: (count, count),
            call=lambda inp, out, group: dist.all_reduce(inp, group=group),
            expected=lambda idx, rank, n, chunk: n * (idx % _PERIOD) + _rank_sum(n),
        ),
        Collective(
            "all_gather",
            busbw_factor=lambda n: (n - 1) / n,
            split=True,
            placements=(IN_PLACE, OUT_OF_PLACE),
            buffer_elements=lambda count, chunk: (chunk, count),
            call=lambda inp, out, group: _single("all_gather_single", "all_gather_into_tensor", out, inp, group),
            # part q of the output is rank q's input
            expected=lambda idx, rank, n, chunk: idx % chunk % _PERIOD + idx // chunk % _RANK_MOD,
        ),
        Collective(
            "reduce_scatter",
            busbw_factor=lambda n: (n - 1) / n,
            split=True,
            placements=(IN_PLACE, OUT_OF_PLACE),
            buffer_elements=lambda count, chunk: (count, chunk),
            call=lambda inp, out, group: _single("reduce_scatter_single", "reduce_scatter_tensor", out, inp, group),
            expected=lambda idx, rank, n, chunk: n * ((rank * chunk + idx) % _PERIOD) + _rank_sum(n),
        ),
        Collective(
            "alltoall",
            busbw_factor=lambda n: (n - 1) / n,
            split=True,
            placements=(OUT_OF_PLACE,),
            buffer_elements=lambda count, chunk: (count, count),
            call=lambda inp, out, group: dist.all_to_all_single(out, inp, group=group),
            # part q of the output is part `rank` of rank q's input
            expected=lambda idx, rank, n, chunk: (rank * chunk + idx % chunk) % _PERIOD + idx // chunk % _RANK_MOD,
        ),
        Collective(
            "broadcast",
            busbw_factor=lambda n: 1.0,
            split=False,
            placements=(IN_PLACE,),
            buffer_elements=lambda count, chunk: (count, count),
            call=lambda inp, out, group: dist.broadcast(inp, src=_ROOT, group=group),
            expected=lambda idx, rank, n, chunk: idx % _PERIOD + _ROOT % _RANK_MOD,  # the root's input
            root=_ROOT,
        ),
    )
}


def _collective(name: str) -> Collective:
    try:
        return COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"unknown collective {name!r} (known: {', '.join(COLLECTIVES)})") from None


def busbw_factor(collective: str, world_size: int) -> float:
    return _collective(collective).busbw_factor(world_size)


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / 1e9


def bytes_needed(collective: str, placement: str, count: int, world_size: int) -> int:
    """Memory one rank needs for a size: its buffers (`_Case`) and the data check's temporaries."""
    spec = _collective(collective)
    sides = spec.buffer_elements(count, _chunk(spec, count, world_size))
    elements = max(sides) if placement == IN_PLACE else sum(sides)  # in place, the smaller is part of the larger
    return elements * ELEMENT_BYTES + min(count, _CHUNK) * _CHECK_BYTES_PER_ELEMENT


def element_count(collective: str, size_bytes: int, world_size: int) -> int:
    """Elements of the full buffer for a nominal size; split collectives round down to a multiple of the ranks,
    as nccl-tests does. 0 means the size is too small to measure with this many ranks."""
    count = size_bytes // ELEMENT_BYTES
    return count - count % world_size if _collective(collective).split else count


def _chunk(spec: Collective, count: int, world_size: int) -> int:
    """One rank's part of the full buffer."""
    return count // world_size if spec.split else count


@dataclass(frozen=True)
class RankSizeResult:
    """One rank's measurement of one size."""

    size_bytes: int  # nominal (the label)
    count: int  # elements of the full buffer
    seconds: list[float]  # per timed iteration (empty when not run)
    wrong: int  # elements of this rank's output that differ from the expected result
    not_run: str | None = None  # why the size was not run (the same on every rank), e.g. too little memory
    peak_memory_bytes: int | None = None  # the caching allocator's high-water mark (accelerators): not NCCL's own
    cpu_wait_share: float | None = None  # on the CPU, the share of the timed window it waited for a CPU (neighbours)


@dataclass(frozen=True)
class SizeRow:
    """One row of the results table: one size, all ranks combined."""

    collective: str
    placement: str
    size_bytes: int
    label: str
    bytes: int  # S of the nccl-tests formulas: count x element size
    count: int
    dtype: str
    iterations: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int
    wrong_by_rank: dict[int, int]
    not_run: str | None = None  # why this size was not measured; its times and bandwidths are then NaN
    peak_memory_bytes: int | None = None  # the largest of the ranks' device-memory high-water marks
    samples_busbw_gbps: tuple[float, ...] = ()  # each timed iteration's busbw: the figure is their median
    # The share of the timed window some rank waited for a CPU (neighbours.combined: a collective waits for its
    # slowest rank); None where no rank could tell.
    cpu_wait_share: float | None = None

    def details(self) -> dict[str, object]:
        """What a report keeps of this row besides busbw itself."""
        details: dict[str, object] = {"collective": self.collective, "placement": self.placement}
        details |= {"size_bytes": self.bytes, "count": self.count, "dtype": self.dtype}
        if self.not_run is not None:
            return details | {"not_run": self.not_run}
        details |= dict(iterations=self.iterations, time_us=round(self.time_s * 1e6, 3), algbw_gbps=self.algbw_gbps)
        details |= {"wrong": self.wrong, "samples_busbw_gbps": [float(f"{b:.6g}") for b in self.samples_busbw_gbps]}
        if self.peak_memory_bytes is not None:
            details["peak_memory_bytes"] = self.peak_memory_bytes
        if self.cpu_wait_share is not None:
            details["cpu_wait_pct"] = neighbours.as_pct(self.cpu_wait_share)
        return details


def sweep_on_rank(
    ctx: RankContext,
    collective: str,
    placement: str,
    sizes: Sequence[int],
    warmup: int,
    iterations: int,
    group: Any = None,
) -> list[RankSizeResult]:
    """Time `collective` at each size on every rank of `group` (None: the default), then check a run on known data; a
    size that does not fit in the memory free on every rank is not run (`not_run` says why)."""
    placements = _collective(collective).placements
    if placement not in placements:
        raise ValueError(f"{collective} has no {placement} form here (has: {', '.join(placements)})")
    if ctx.world_size < MIN_RANKS:
        raise ValueError(f"a collective needs at least {MIN_RANKS} ranks, this gang has {ctx.world_size}")
    results = []
    for size in sizes:
        count = element_count(collective, size, ctx.world_size)
        if count == 0:  # said, never dropped: a size the baseline gates fails where it is not run
            reason = f"size: {size} B is less than one {DTYPE_NAME} element per rank ({ctx.world_size} ranks)"
            results.append(RankSizeResult(size, count, [], 0, not_run=reason))
            continue
        needed = bytes_needed(collective, placement, count, ctx.world_size)
        free = _free_bytes_on_every_rank(ctx)
        if needed > free:
            reason = f"memory: needs {bytes_label(needed)} per rank, {bytes_label(free)} free"
            results.append(RankSizeResult(size, count, [], 0, not_run=reason))
            continue
        results.append(_measure(ctx, collective, placement, size, count, warmup, iterations, group))
        if ctx.device.type != "cpu":  # the size's freed buffers back to the device, for the next size's memory check
            torch.accelerator.empty_cache()
    return results


def calls_per_sample(size_bytes: int, device: torch.device) -> int:
    """Back-to-back calls per timed sample: BACK_TO_BACK_CALLS for a small message on an accelerator; one on the CPU,
    where a call runs synchronously and there is no launch to hide."""
    return BACK_TO_BACK_CALLS if device.type != "cpu" and size_bytes < BACK_TO_BACK_BELOW_BYTES else 1


def _measure(
    ctx: RankContext,
    collective: str,
    placement: str,
    size: int,
    count: int,
    warmup: int,
    iterations: int,
    group: Any = None,
) -> RankSizeResult:
    """One size on this rank. Its buffers are this frame's: freed when it returns."""
    on_host = ctx.device.type == "cpu"  # a neighbour holding the host's CPUs slows it as a slow link would
    if not on_host:
        torch.accelerator.reset_peak_memory_stats(ctx.device)
    case = _Case(ctx, collective, placement, count, group)
    case.fill()
    calls = calls_per_sample(size, ctx.device)
    family = os.getppid()  # the launcher (pytest, torchrun, slurmstepd) and its children, the ranks: no neighbours
    before = neighbours.read(family=family) if on_host else None
    seconds = time_op_s(ctx.device, case.run, warmup=warmup, iterations=iterations, calls_per_sample=calls)
    waited = neighbours.waited_share(before, neighbours.read(family=family) if on_host else None)
    case.fill()
    case.run()
    peak = None if on_host else int(torch.accelerator.max_memory_allocated(ctx.device))
    return RankSizeResult(size, count, seconds, case.count_wrong(), peak_memory_bytes=peak, cpu_wait_share=waited)


def summarize(collective: str, placement: str, per_rank: Sequence[Sequence[RankSizeResult]]) -> list[SizeRow]:
    """One row per size from every rank's results (rank order)."""
    factor = busbw_factor(collective, len(per_rank))
    rows = []
    for by_rank in zip(*per_rank, strict=True):
        first = by_rank[0]
        per_iteration = [statistics.fmean(times) for times in zip(*(r.seconds for r in by_rank), strict=True)]
        t = statistics.median(per_iteration) if per_iteration else math.nan
        size = first.count * ELEMENT_BYTES
        algbw = algbw_gbps(size, t)
        peaks = [r.peak_memory_bytes for r in by_rank if r.peak_memory_bytes is not None]
        rows.append(
            SizeRow(
                collective=collective,
                placement=placement,
                size_bytes=first.size_bytes,
                label=size_label(first.size_bytes),
                bytes=size,
                count=first.count,
                dtype=DTYPE_NAME,
                iterations=len(per_iteration),
                time_s=t,
                algbw_gbps=algbw,
                busbw_gbps=algbw * factor,
                wrong=sum(r.wrong for r in by_rank),
                wrong_by_rank={rank: r.wrong for rank, r in enumerate(by_rank) if r.wrong},
                not_run=first.not_run,
                peak_memory_bytes=max(peaks) if peaks else None,
                samples_busbw_gbps=tuple(algbw_gbps(size, s) * factor for s in per_iteration if s > 0),
                cpu_wait_share=neighbours.combined(r.cpu_wait_share for r in by_rank),
            )
        )
    return rows


class _Case:
    """The buffers, the operation and the expected result of one collective at one size on one rank."""

    def __init__(self, ctx: RankContext, collective: str, placement: str, count: int, group: Any = None) -> None:
        self.rank, self.n, self.group = ctx.rank, ctx.world_size, group
        self.spec = _collective(collective)  # the table's entry: no reference back to this case
        self.chunk = _chunk(self.spec, count, self.n)
        input_elements, output_elements = self.spec.buffer_elements(count, self.chunk)
        device = ctx.device
        if placement == IN_PLACE:
            # One buffer: the smaller side is this rank's part of the larger (all_gather sends its own part of
            # what it receives, reduce_scatter receives into its own part of what it sends), or all of it.
            whole = torch.empty(max(input_elements, output_elements), dtype=DTYPE, device=device)
            part = min(input_elements, output_elements)
            own = whole if part == whole.numel() else whole[self.rank * part : (self.rank + 1) * part]
            self.input, self.output = (own, whole) if input_elements < output_elements else (whole, own)
        else:
            self.input = torch.empty(input_elements, dtype=DTYPE, device=device)
            self.output = torch.empty(output_elements, dtype=DTYPE, device=device)

    def run(self) -> object:
        """The collective, once (a method: a closure over `self` kept on `self` would be a reference cycle)."""
        return self.spec.call(self.input, self.output, self.group)

    def fill(self) -> None:
        """Known inputs: element j of a sending rank's input is (j % 251) + (rank % 7). The output is first set to a
        value no correct result has, so what the collective should write and does not is counted wrong."""
        self.output.fill_(_SENTINEL)
        if self.spec.root is None or self.spec.root == self.rank:
            for lo in range(0, self.input.numel(), _CHUNK):
                idx = torch.arange(lo, min(lo + _CHUNK, self.input.numel()), device=self.input.device)
                self.input[lo : lo + idx.numel()] = (idx % _PERIOD + self.rank % _RANK_MOD).to(DTYPE)

    def expected(self, idx: torch.Tensor) -> torch.Tensor:
        """The correct value of output elements `idx` on this rank."""
        return self.spec.expected(idx, self.rank, self.n, self.chunk).to(DTYPE)

    def count_wrong(self) -> int:
        wrong = 0
        for lo in range(0, self.output.numel(), _CHUNK):
            hi = min(lo + _CHUNK, self.output.numel())
            idx = torch.arange(lo, hi, device=self.output.device)
            wrong += int((self.output[lo:hi] != self.expected(idx)).sum())
        return wrong


def _single(name: str, old: str, output: torch.Tensor, input: torch.Tensor, group: Any) -> object:
    """torch.distributed's `name`, else its `old` name (torch 2.13 renamed it; the old one is a deprecated alias)."""
    return (getattr(dist, name, None) or getattr(dist, old))(output, input, group=group)


def _free_bytes_on_every_rank(ctx: RankContext) -> int:
    """The least memory free on any rank, so every rank makes the same run-or-not decision for a size (a rank
    that stayed out of a collective would leave the others hanging in it)."""
    free = torch.tensor([_free_bytes(ctx)], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(free, op=dist.ReduceOp.MIN)
    return int(free.item())


def _free_bytes(ctx: RankContext) -> int:
    """This rank's share of the memory free where its buffers live (the ranks sharing it allocate at once)."""
    if ctx.device.type == "cpu":
        free = int(psutil.virtual_memory().available)
    else:  # CUDA-only: torch 2.9 has no torch.accelerator.get_memory_info.
        free, _total = torch.cuda.mem_get_info(ctx.device)
    return int(free) // ctx.device_sharers
