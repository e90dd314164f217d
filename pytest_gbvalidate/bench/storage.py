"""Local scratch storage: sequential write and read throughput of a directory (the ND SKUs' RAID 0 of local NVMe),
with direct I/O where the file system allows it, and the time to write a checkpoint-sized tensor file with
torch.save and read it back. Every file lives in a directory of its own under the scratch directory, removed
afterwards whatever happened (a failure, Ctrl-C). No pytest here."""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import pickle
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

BLOCK_BYTES = 16 * 2**20  # per write and read call: large and sequential, as a checkpoint writer issues them
# Passes per measurement, the best counting (STREAM's rule): a shared disk varies by tens of percent between runs (a
# VM's virtual disk wrote 8 GiB at 2.5 then 1.7 GB/s, minutes apart); a degraded one is slow in every pass.
PASSES = 3
_DIRECT = getattr(os, "O_DIRECT", 0)


class StorageError(Exception):
    """The scratch directory cannot be used: the message says what failed, where, and after how much."""


@contextlib.contextmanager
def work_dir(scratch: Path) -> Iterator[Path]:
    """A new directory under `scratch`, removed with everything in it on the way out."""
    path = scratch / f"gbvalidate-scratch-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        path.mkdir()
    except OSError as exc:
        raise StorageError(f"cannot create a directory in {scratch}: {exc.strerror or exc}") from None
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Throughput:
    write_gbps: float
    read_gbps: float
    size_bytes: int
    direct_io: bool  # False where the file system refuses O_DIRECT (tmpfs): page cache dropped before the read
    # Each block's throughput (the fsync and the read that finds the end in the last one's): the pass's samples.
    write_block_gbps: tuple[float, ...] = ()
    read_block_gbps: tuple[float, ...] = ()


def sequential(directory: Path, size_bytes: int) -> Throughput:
    """Write `size_bytes` to a new file in BLOCK_BYTES blocks and fsync, then read it back, GB = 1e9 bytes."""
    path = directory / "sequential.bin"
    block = mmap.mmap(-1, BLOCK_BYTES)  # page-aligned, as O_DIRECT needs
    block.write(os.urandom(BLOCK_BYTES))
    blocks = max(1, size_bytes // BLOCK_BYTES)
    fd, direct = _open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        at = [time.perf_counter()]
        for done in range(blocks):
            _write_all(fd, block, path, done, blocks)
            at.append(time.perf_counter())
        with _failing_as(f"flushing {path} to its device"):
            os.fsync(fd)
        at[-1] = time.perf_counter()
    finally:
        os.close(fd)
    fd, direct_read = _open(path, os.O_RDONLY)
    try:
        if not direct_read:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from the device, not the page cache
        read_at = [time.perf_counter()]
        with _failing_as(f"reading {path} back"):
            while os.readv(fd, [block]) > 0:
                read_at.append(time.perf_counter())
        read_at[-1] = time.perf_counter()  # the read that found the end: the last block's
    finally:
        os.close(fd)
        block.close()
    total = blocks * BLOCK_BYTES
    writes, reads = _per_block_gbps(at), _per_block_gbps(read_at)
    write_s, read_s = at[-1] - at[0], read_at[-1] - read_at[0]
    return Throughput(total / write_s / 1e9, total / read_s / 1e9, total, direct and direct_read, writes, reads)


def _per_block_gbps(at: list[float]) -> tuple[float, ...]:
    """Each block's throughput from the moments its call began and ended (one after the other)."""
    return tuple(BLOCK_BYTES / (end - start) / 1e9 for start, end in itertools.pairwise(at) if end > start)


@contextlib.contextmanager
def _failing_as(doing: str) -> Iterator[None]:
    """An OSError inside becomes a StorageError that says what was being done."""
    try:
        yield
    except OSError as exc:
        raise StorageError(f"{doing}: {exc.strerror or exc}") from None


def direct_io_supported(directory: Path) -> bool:
    """Whether the file system under `directory` accepts O_DIRECT (tmpfs does not)."""
    probe = directory / "direct-io-probe"
    try:
        fd, direct = _open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.close(fd)
        return direct
    finally:
        probe.unlink(missing_ok=True)


def _open(path: Path, flags: int) -> tuple[int, bool]:
    try:
        return os.open(path, flags | _DIRECT), bool(_DIRECT)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise StorageError(f"cannot open {path}: {exc.strerror or exc}") from None
    if flags & os.O_CREAT:
        path.unlink(missing_ok=True)  # some kernels create the file before they refuse O_DIRECT on it
    try:
        return os.open(path, flags), False
    except OSError as exc:
        raise StorageError(f"cannot open {path}: {exc.strerror or exc}") from None


def _write_all(fd: int, block: mmap.mmap, path: Path, done: int, blocks: int) -> None:
    try:
        written = os.write(fd, block)
    except OSError as exc:
        of = f"{done * BLOCK_BYTES / 2**20:.0f} of {blocks * BLOCK_BYTES / 2**20:.0f} MiB"
        raise StorageError(f"writing {path} failed after {of}: {exc.strerror or exc}") from None
    if written != BLOCK_BYTES:
        raise StorageError(f"writing {path}: a short write of {written} of {BLOCK_BYTES} bytes (the device is full?)")


@dataclass(frozen=True)
class CheckpointTimes:
    write_s: float
    read_s: float
    size_bytes: int


def sequential_passes(scratch: Path, size_bytes: int, passes: int = PASSES) -> list[Throughput]:
    """`sequential` `passes` times, each in a work directory of its own under `scratch`."""
    results = []
    for _ in range(passes):
        with work_dir(scratch) as directory:
            results.append(sequential(directory, size_bytes))
    return results


def checkpoint_state(size_bytes: int) -> dict[str, torch.Tensor]:
    """A state dict of seeded bf16 tensors of 64 MiB each, `size_bytes` in all: what `checkpoint` writes."""
    per_tensor = 64 * 2**20
    generator = torch.Generator().manual_seed(0)
    sizes = [min(per_tensor, size_bytes - i * per_tensor) // 2 for i in range(max(1, -(-size_bytes // per_tensor)))]
    return {f"layer{i}.weight": torch.randn(n, generator=generator).bfloat16() for i, n in enumerate(sizes)}


def checkpoint_passes(scratch: Path, size_bytes: int, passes: int = PASSES) -> list[CheckpointTimes]:
    """`checkpoint` of one state dict `passes` times, each in a work directory of its own under `scratch`."""
    state = checkpoint_state(size_bytes)  # made once: seconds of random numbers for a GPU node's 4 GiB
    results = []
    for _ in range(passes):
        with work_dir(scratch) as directory:
            results.append(checkpoint(directory, state))
    return results


def checkpoint(directory: Path, state: dict[str, torch.Tensor]) -> CheckpointTimes:
    """torch.save of `state`, fsync'd, then torch.load of it, checked equal to what was saved."""
    path = directory / "checkpoint.pt"
    total = sum(t.numel() * t.element_size() for t in state.values())
    start = time.perf_counter()
    try:
        with path.open("wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as exc:  # torch's zip writer reports a refused write as a RuntimeError
        written = path.stat().st_size if path.exists() else 0
        raise StorageError(
            f"writing the checkpoint {path} failed after {written / 2**20:.0f} of {total / 2**20:.0f} MiB "
            f"({shutil.disk_usage(directory).free / 2**20:.0f} MiB free on its device): {exc}"
        ) from None
    write_s = time.perf_counter() - start
    with path.open("rb") as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    start = time.perf_counter()
    try:
        loaded = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, pickle.UnpicklingError) as exc:
        raise StorageError(f"reading the checkpoint {path} back failed: {exc}") from None
    read_s = time.perf_counter() - start
    wrong = [name for name, t in state.items() if name not in loaded or not torch.equal(loaded[name], t)]
    if wrong:
        raise StorageError(f"the checkpoint {path} read back differs from what was written: {', '.join(wrong[:3])}")
    return CheckpointTimes(write_s, read_s, total)
