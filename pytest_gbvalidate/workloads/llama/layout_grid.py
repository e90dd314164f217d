"""The layout sweep (`python -m pytest_gbvalidate.layout_sweep`): train every valid layout of a grid of MBS, TP, PP
and CP on the same ranks with the built-in engine, record what each measured (or why not) and name the fastest."""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gbvalidate.labels import number
from pytest_gbvalidate.workloads.llama.config import LlamaConfig
from pytest_gbvalidate.workloads.llama.flops import Peak
from pytest_gbvalidate.workloads.llama.parallel import SIZES, Layout, LayoutError, for_world, problems
from pytest_gbvalidate.workloads.llama.results import PretrainResult

if TYPE_CHECKING:
    from pytest_gbvalidate.ranks.gang import Gang

OK, OOM, INVALID, FAILED = "ok", "oom", "invalid", "failed"
# A point's sizes (its table's first columns): a layout's sizes but GBS, the baseline's at every point.
POINT_SIZES = tuple(k for k in SIZES if k != "gbs")
# The sizes a grid sweeps: those but DP, which is what the others leave of the ranks.
PARAMETERS = tuple(k for k in POINT_SIZES if k != "dp")
DEFAULT_GRID = {p: [1, 2, 4, 8, 16] if p == "mbs" else [1, 2, 4] for p in PARAMETERS}
# A rank's out-of-memory error once across the gang: torch.OutOfMemoryError, or, re-raised, the allocator's message.
OOM_MARKERS = ("OutOfMemoryError", "out of memory")


@dataclass(frozen=True)
class SweepPoint:
    # The point's PARAMETERS, in their order (_point fills them by name); DP is the layout's, below.
    mbs: int
    tp: int
    pp: int
    cp: int
    status: str  # ok | oom | invalid | failed
    reason: str = ""
    layout: Layout | None = None
    result: PretrainResult | None = None
    telemetry: dict[str, dict[str, float]] | None = None  # series -> {mean, p5, p95}

    @property
    def dp(self) -> int | None:
        return None if self.layout is None else self.layout.dp

    def telemetry_mean(self, series: str) -> float | None:
        """Mean over the GPUs (gpu<index>.<series>) of a telemetry series, where it was sampled."""
        summary = self.telemetry or {}
        means = [stats["mean"] for name, stats in summary.items() if name.startswith("gpu") and name.endswith(series)]
        return sum(means) / len(means) if means else None

    @property
    def peak_memory_gib(self) -> float | None:
        return None if self.result is None else max((m.gib for m in self.result.memory), default=None)


def layouts(
    cfg: LlamaConfig, world_size: int, gbs: int, grid: dict[str, list[int]], **fixed: Any
) -> list[tuple[dict[str, int], Layout | str]]:
    """Every point of the grid with the layout that fills `world_size` ranks, or why it cannot run."""
    out: list[tuple[dict[str, int], Layout | str]] = []
    for values in itertools.product(*(grid[p] for p in PARAMETERS)):
        point: dict[str, Any] = dict(zip(PARAMETERS, values, strict=True))  # Any: unpacked into keywords
        try:
            layout = for_world(world_size, gbs=gbs, **point, **fixed)
        except LayoutError as exc:
            out.append((point, str(exc)))
            continue
        broken = problems(cfg, layout)
        out.append((point, "; ".join(message for _, message in broken) if broken else layout))
    return out


def is_oom(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return any(marker in text for marker in OOM_MARKERS)


def sweep(
    cfg: LlamaConfig,
    world_size: int,
    gbs: int,
    grid: dict[str, list[int]],
    train: Callable[[Layout], PretrainResult],
    sample: Callable[[], AbstractContextManager[Any]] = nullcontext,
    **fixed: Any,
) -> list[SweepPoint]:
    """Each point, its valid layout trained with `train` inside `sample()` (a telemetry sampler, or nothing)."""
    points = []
    for point, layout in layouts(cfg, world_size, gbs, grid, **fixed):
        if isinstance(layout, str):
            points.append(_point(point, INVALID, reason=layout))
            continue
        try:
            with sample() as sampler:
                result = train(layout)
        except Exception as exc:  # a point's failure is the sweep's data, not its end
            status = OOM if is_oom(exc) else FAILED
            points.append(_point(point, status, reason=_first_line(exc), layout=layout))
            continue
        summary = sampler.summary() if sampler is not None else None
        points.append(_point(point, OK, layout=layout, result=result, telemetry=summary))
    return points


def _point(at: Mapping[str, Any], status: str, **rest: Any) -> SweepPoint:
    return SweepPoint(**at, status=status, **rest)


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def best(points: Sequence[SweepPoint]) -> SweepPoint | None:
    """The layout with the shortest step time (GBS and ranks are the same for all: also the most tokens/s)."""
    done = [p for p in points if p.result is not None]
    return min(done, key=lambda p: p.result.step_time_s if p.result else math.inf, default=None)


COLUMNS = (
    *POINT_SIZES,
    *("status", "step_time_s", "tokens_per_s_per_gpu", "mfu_pct"),
    *("mfu_peak_tflops", "mfu_peak_source"),  # what the MFU divides by, beside it
    *("peak_memory_gib", "gpu_utilization_pct", "sm_clock_mhz", "reason"),
)


def row(p: SweepPoint) -> dict[str, Any]:
    r = p.result
    return {
        **{k: getattr(p, k) for k in POINT_SIZES},
        "status": p.status,
        "step_time_s": None if r is None else r.step_time_s,
        "tokens_per_s_per_gpu": None if r is None else r.tokens_per_s_per_gpu,
        "mfu_pct": None if r is None else r.mfu_pct,
        "mfu_peak_tflops": None if r is None or r.peak is None else r.peak.tflops_per_gpu,
        "mfu_peak_source": None if r is None or r.peak is None else r.peak.source,
        "peak_memory_gib": p.peak_memory_gib,
        "gpu_utilization_pct": p.telemetry_mean("utilization_pct"),
        "sm_clock_mhz": p.telemetry_mean("sm_clock_mhz"),
        "reason": p.reason,
    }


def markdown_table(points: Sequence[SweepPoint]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(v) for v in row(p).values()) + " |" for p in points]
    winner = best(points)
    if winner is not None and winner.result is not None:
        lines += ["", f"Best layout: {winner.result.scope} ({number(winner.result.step_time_s)} s per step)"]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return number(value)
    return str(value).replace("|", "/")


# The files write_outputs may write in its directory (the plots only with matplotlib).
OUTPUT_NAMES = ("sweep.md", "sweep.csv", "sweep.json", *(f"sweep_{name}.png" for name in PARAMETERS))


def write_outputs(points: Sequence[SweepPoint], out: Path, write: Callable[[Path, bytes], None]) -> list[Path]:
    """The paths written in `out`: sweep.md, sweep.csv, sweep.json and, with matplotlib, sweep_<parameter>.png, by
    `write` (the command line's files.atomic_write_bytes, a module this one may not import)."""
    out.mkdir(parents=True, exist_ok=True)
    write(out / "sweep.md", markdown_table(points).encode("utf-8"))
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(row(p) for p in points)
    write(out / "sweep.csv", table.getvalue().encode("utf-8"))
    records = [
        {**row(p), "layout": None if p.result is None else p.result.details(), "telemetry": p.telemetry} for p in points
    ]
    winner = best(points)
    doc = {"best": None if winner is None or winner.result is None else winner.result.scope, "points": records}
    write(out / "sweep.json", (json.dumps(doc, indent=1, default=str) + "\n").encode("utf-8"))
    written = [out / "sweep.md", out / "sweep.csv", out / "sweep.json"]
    return written + plot(points, out, write)


PANELS = (
    ("step_time_s", "step time (s)"),
    ("peak_memory_gib", "peak memory (GiB)"),
    ("gpu_utilization_pct", "GPU utilization (%)"),
    ("sm_clock_mhz", "SM clock (MHz)"),
)


def plot(points: Sequence[SweepPoint], out: Path, write: Callable[[Path, bytes], None]) -> list[Path]:
    """The PNGs written, one per parameter with a panel per figure; none (and no error) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = [row(p) for p in points]
    memory_kinds = {m.what for p in points if p.result is not None for m in p.result.memory}
    titles = dict(PANELS)
    if memory_kinds:
        titles["peak_memory_gib"] = f"peak memory (GiB, {', '.join(sorted(memory_kinds))})"
    paths = []
    for parameter in PARAMETERS:
        fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4), layout="constrained")
        for ax, (key, title) in zip(axes, titles.items(), strict=True):
            ran = [r for r in rows if r[key] is not None]
            ax.scatter([r[parameter] for r in ran], [r[key] for r in ran], color="tab:blue", label="ran")
            oom = [r[parameter] for r in rows if r["status"] == OOM]
            if oom:
                ax.scatter(oom, [0] * len(oom), marker="x", color="tab:red", label="out of memory")
            if not ran:
                ax.text(0.5, 0.5, "not sampled", ha="center", va="center", transform=ax.transAxes)
            ax.set_xscale("log", base=2)
            ax.set(xlabel=parameter.upper(), title=title)
        axes[0].legend(fontsize="small")
        path = out / f"sweep_{parameter}.png"
        image = io.BytesIO()
        fig.savefig(image, format="png", dpi=100)
        plt.close(fig)
        write(path, image.getvalue())
        paths.append(path)
    return paths


def native_trainer(
    gang: Gang,
    cfg: LlamaConfig,
    warmup_steps: int,
    timed_steps: int,
    learning_rate: float,
    peak: Peak | None,
    compile_blocks: bool = False,
) -> Callable[[Layout], PretrainResult]:
    """Trains one sweep point with the built-in engine on `gang`; `compile_blocks`: `pretrain.compile`."""
    from pytest_gbvalidate.workloads.llama.request import EngineOptions, TrainRequest
    from pytest_gbvalidate.workloads.llama.results import summarize
    from pytest_gbvalidate.workloads.llama.train import train_worker

    def train(layout: Layout) -> PretrainResult:
        options = EngineOptions(compile=compile_blocks)
        request = TrainRequest(cfg, layout, warmup_steps, timed_steps, learning_rate, options=options)
        results = gang.run(train_worker, request, timeout_s=600 + 600 * request.steps)
        return summarize(request, results, peak)

    return train


@contextlib.contextmanager
def node_samplers(gpu: bool) -> Iterator[Callable[[], AbstractContextManager[Any]]]:
    """Makes a telemetry sampler of this node (its GPUs through NVML, and the host) for each sweep point."""
    from pytest_gbvalidate.node import nvml, telemetry

    if not gpu:
        yield lambda: telemetry.Sampler([telemetry.CpuSource()])
        return
    with nvml.session():
        gpus: list[telemetry.Source] = [telemetry.NvmlSource(i, nvml.handle(i)) for i in range(nvml.gpu_count())]
        yield lambda: telemetry.Sampler([*gpus, telemetry.CpuSource()])
