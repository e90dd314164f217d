"""The command line of the layout sweep:

    python -m pytest_gbvalidate.layout_sweep --sku ND_GB200_v6 --out sweep/
    python -m pytest_gbvalidate.layout_sweep --sku cpu --mbs 1,2 --tp 1,2 --pp 1,2 --cp 1 --out sweep/

The SKU's baseline `pretrain` section gives the model, sequence length, GBS, precision and step counts; the
grid defaults to MBS 1-16 and TP, PP, CP 1-4 in powers of two. The ranks are local: one per GPU the baseline's
SKU has, else the cpu SKU's."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.ranks import CPU_RANKS
from pytest_gbvalidate.settings import bundled_baselines
from pytest_gbvalidate.workloads.llama.layout_grid import (
    DEFAULT_GRID,
    PARAMETERS,
    markdown_table,
    native_trainer,
    node_samplers,
    sweep,
    write_outputs,
)

PROG = "python -m pytest_gbvalidate.layout_sweep"


def _ints(text: str) -> list[int]:
    """Comma-separated sizes of a layout: each a whole number from 1 to MAX_LAYOUT_SIZE."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or not all(x.isdecimal() and len(x) <= 4 and 1 <= int(x) <= MAX_LAYOUT_SIZE for x in parts):
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: comma-separated whole numbers from 1 to {MAX_LAYOUT_SIZE}")
    return [int(x) for x in parts]


# Far above any layout the sweep can run on one node, and a bound that keeps a typo (10000) from starting one.
MAX_LAYOUT_SIZE = 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sku", required=True, help="SKU whose baseline's pretrain section sets the workload")
    parser.add_argument("--baselines", type=Path, default=None, help="baselines directory (default: bundled)")
    parser.add_argument("--out", type=Path, required=True, help="directory for the table and plots")
    for name in PARAMETERS:
        default = ",".join(map(str, DEFAULT_GRID[name]))
        parser.add_argument(
            f"--{name}",
            type=_ints,
            default=DEFAULT_GRID[name],
            help=f"values, 1 to {MAX_LAYOUT_SIZE} (default {default})",
        )
    args = parser.parse_args(argv)

    from pytest_gbvalidate.ranks.gang import LocalGang  # torch: only once the arguments are good

    baseline = bl.load_baseline(bl.baseline_path(args.baselines or bundled_baselines(), args.sku))
    spec = baseline.pretrain
    if spec is None:
        parser.error(f"the {args.sku} baseline has no pretrain section")
    gpu_count = baseline.detect.gpu_count
    world_size = gpu_count or CPU_RANKS
    gang = LocalGang(world_size, device_type="cpu" if gpu_count == 0 else "cuda")

    peak = spec.peak
    train = native_trainer(
        gang, spec.config, spec.warmup_steps, spec.timed_steps, spec.learning_rate, peak, spec.compile
    )
    grid = {name: getattr(args, name) for name in PARAMETERS}
    fixed = dataclasses.asdict(spec.layout)
    fixed = {k: fixed[k] for k in ("precision", "activation_checkpointing")}
    try:
        with node_samplers(gpu=gpu_count != 0) as sample:
            points = sweep(spec.config, world_size, spec.layout.gbs, grid, train, sample, **fixed)
    finally:
        gang.close()
    for path in write_outputs(points, args.out):
        print(f"wrote {path}")
    print(markdown_table(points), end="")
    return 0
