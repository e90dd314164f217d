"""The command line of the layout sweep:

    python -m pytest_gbvalidate.layout_sweep --sku ND_GB200_v6 --out sweep/
    python -m pytest_gbvalidate.layout_sweep --sku cpu --mbs 1,2 --tp 1,2 --pp 1,2 --cp 1 --out sweep/

The SKU's baseline `pretrain` section gives the model, sequence length, GBS, precision and step counts; the
grid defaults to layout_grid.DEFAULT_GRID (`--help` lists it). The ranks are local: one per GPU the baseline's
SKU has, else the cpu SKU's."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate.files import OutputError, atomic_write_bytes, unwritable
from pytest_gbvalidate.ranks import CPU_RANKS
from pytest_gbvalidate.setting_values import SettingError, bundled_baselines, parse_dir, parse_sku
from pytest_gbvalidate.workloads.llama import layout_grid
from pytest_gbvalidate.workloads.llama.layout_grid import DEFAULT_GRID, PARAMETERS, native_trainer, sweep

PROG = "python -m pytest_gbvalidate.layout_sweep"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A usage error in one line naming the option (argparse's usage block would bury it), exit 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def _ints(text: str) -> list[int]:
    """Comma-separated sizes of a layout: each a whole number from 1 to MAX_LAYOUT_SIZE."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or not all(x.isdecimal() and len(x) <= 4 and 1 <= int(x) <= MAX_LAYOUT_SIZE for x in parts):
        raise argparse.ArgumentTypeError(f"{text[:40]!a}: comma-separated whole numbers from 1 to {MAX_LAYOUT_SIZE}")
    return [int(x) for x in parts]


def _setting(parse: Callable[[str, Path], object]) -> Callable[[str], object]:
    """A settings parser (setting_values.py: the SKU's name, a directory) as an argparse type, an empty text
    refused (`--baselines ''` would be the current directory)."""

    def convert(text: str) -> object:
        if not text.strip():
            raise argparse.ArgumentTypeError("is empty")
        try:
            return parse(text, Path())
        except SettingError as exc:
            raise argparse.ArgumentTypeError(f"{text!a}: {exc}") from None

    return convert


def _path(text: str) -> Path:
    if not text.strip():  # Path("") is the current directory
        raise argparse.ArgumentTypeError("is empty")
    return Path(text)


# Far above any layout the sweep can run on one node, and a bound that keeps a typo (10000) from starting one.
MAX_LAYOUT_SIZE = 1024


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--sku", type=_setting(parse_sku), required=True, help="SKU whose baseline's pretrain section sets the workload"
    )
    parser.add_argument("--baselines", type=_setting(parse_dir), help="baselines directory (default: bundled)")
    parser.add_argument("--out", type=_path, required=True, help="directory for the table and plots")
    for name in PARAMETERS:
        about = f"values, 1 to {MAX_LAYOUT_SIZE} (default {','.join(map(str, DEFAULT_GRID[name]))})"
        parser.add_argument(f"--{name}", type=_ints, default=DEFAULT_GRID[name], help=about)
    args = parser.parse_args(argv)

    # Everything the sweep needs is checked before it starts: it runs for hours, and its results would be lost.
    baseline = _baseline(parser, args.baselines or bundled_baselines(), args.sku)
    spec = baseline.pretrain
    if spec is None:
        parser.error(f"argument --sku: the {args.sku} baseline has no pretrain section ({baseline.path})")
    if (refused := out_problem(args.out)) is not None:
        parser.error(f"argument --out: {args.out}: {refused}")

    from pytest_gbvalidate.ranks.gang import LocalGang  # torch: only once the arguments are good

    gpu_count = baseline.detect.gpu_count
    world_size = gpu_count or CPU_RANKS
    gang = LocalGang(world_size, device_type="cpu" if gpu_count == 0 else "cuda")

    train = native_trainer(
        gang, spec.config, spec.warmup_steps, spec.timed_steps, spec.learning_rate, spec.peak, spec.compile
    )
    grid = {name: getattr(args, name) for name in PARAMETERS}
    fixed = {k: getattr(spec.layout, k) for k in ("precision", "activation_checkpointing")}
    try:
        with layout_grid.node_samplers(gpu=gpu_count != 0) as sample:
            points = sweep(spec.config, world_size, spec.layout.gbs, grid, train, sample, **fixed)
    finally:
        gang.close()
    print(layout_grid.markdown_table(points), end="")  # first: a file that cannot be written loses none of the results
    try:
        written = layout_grid.write_outputs(points, args.out, atomic_write_bytes)
    except OutputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


def _baseline(parser: argparse.ArgumentParser, directory: Path, sku: str) -> bl.Baseline:
    """The SKU's baseline, or a usage error naming --sku and the file."""
    path = bl.baseline_path(directory, sku)
    if not os.path.lexists(path):
        known = ", ".join(bl.known_skus(directory)) or "none"
        parser.error(f"argument --sku: no baseline for {sku} in {directory} (known SKUs: {known})")
    try:
        return bl.load_baseline(path)
    except bl.BaselineError as exc:
        parser.error(f"argument --sku: bad baseline: {exc}")


def out_problem(out: Path) -> str | None:
    """Why the sweep's files cannot be written in the directory `out` (made here where missing), or None."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "is not a directory"
    except OSError as exc:
        return f"cannot make the directory: {exc.strerror or exc}"
    if not os.access(out, os.W_OK | os.X_OK):
        return "cannot create files in it (no write permission)"
    for name in layout_grid.OUTPUT_NAMES:
        if (why := unwritable(out / name)) is not None:
            return f"{name} {why}"
    return None
