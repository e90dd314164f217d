"""The storage measurement (pytest_gbvalidate/bench/storage.py) called directly: nothing is left behind after
Ctrl-C or a device error, and a file system without direct I/O is measured through the page cache."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_gbvalidate.bench import storage
from tests.helpers.scratch import leftovers


def interrupted_while_writing(scratch: Path) -> None:
    with storage.work_dir(scratch) as directory:
        (directory / "sequential.bin").write_bytes(b"x" * 4096)
        raise KeyboardInterrupt


def test_ctrl_c_mid_write_still_removes_the_files(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        interrupted_while_writing(tmp_path)
    assert leftovers(tmp_path) == []


def test_a_device_error_on_flush_or_read_back_is_a_storage_error_with_nothing_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def eio(*args: object) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def in_work_dir(measure: Callable[[Path], object]) -> None:
        with storage.work_dir(tmp_path) as directory:
            measure(directory)

    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(storage.StorageError, match=r"flushing .*sequential.bin to its device: Input/output error"):
        in_work_dir(lambda d: storage.sequential(d, storage.BLOCK_BYTES))
    monkeypatch.undo()
    monkeypatch.setattr(torch, "load", lambda *a, **k: eio())
    with pytest.raises(
        storage.StorageError, match=r"reading the checkpoint .*checkpoint.pt back failed: .*Input/output error"
    ):
        in_work_dir(lambda d: storage.checkpoint(d, storage.checkpoint_state(2**20)))
    assert leftovers(tmp_path) == []


def test_a_file_system_without_direct_io_is_measured_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tmpfs on kernels before 6.6: the file is created, then O_DIRECT refused with EINVAL."""
    real_open = os.open

    def no_direct(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            os.close(real_open(path, flags & ~os.O_DIRECT, mode, **kwargs))
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", no_direct)
    assert not storage.direct_io_supported(tmp_path)
    with storage.work_dir(tmp_path) as directory:
        result = storage.sequential(directory, storage.BLOCK_BYTES)
    assert not result.direct_io and result.write_gbps > 0 and result.read_gbps > 0
    assert leftovers(tmp_path) == []


def test_each_block_is_a_sample_of_its_pass(tmp_path: Path) -> None:
    """A pass's blocks are its samples (their spread its figure's own error, rules/noise.py): one per block each
    way, all positive, the figure within their range (the blocks' time is the pass's)."""
    with storage.work_dir(tmp_path) as directory:
        result = storage.sequential(directory, 3 * storage.BLOCK_BYTES)
    for figure, blocks in ((result.write_gbps, result.write_block_gbps), (result.read_gbps, result.read_block_gbps)):
        assert len(blocks) == 3 and all(b > 0 for b in blocks)
        assert min(blocks) * 0.999 <= figure <= max(blocks) * 1.001  # rounding only
