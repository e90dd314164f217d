"""fio: one sequential job on the scratch volume, as our own storage check writes and reads it, and its JSON output
as a bandwidth in GB/s. Pure Python."""

from __future__ import annotations

import json

from pytest_gbvalidate.reference_tools.runner import ToolError

FIO = "fio"


def fio_command(binary: str, file: str, *, size_bytes: int, rw: str, direct: bool = True) -> list[str]:
    """One sequential job (`rw`: write or read) on `file`, 16 MiB blocks as our own check writes, direct I/O where
    the file system has it (as ours), the write fsync'd at its end; JSON output."""
    return [
        *(binary, "--name=gbvalidate", f"--filename={file}", f"--size={size_bytes}", "--bs=16M", f"--rw={rw}"),
        *(f"--direct={int(direct)}", "--ioengine=psync", "--end_fsync=1", "--output-format=json"),
    ]


def parse_fio(text: str, rw: str) -> float:
    """The job's `rw` bandwidth in GB/s (fio's `bw_bytes`, bytes per second)."""
    try:
        job = json.loads(text[text.index("{") :])["jobs"][0]
        return float(job[rw]["bw_bytes"]) / 1e9
    except (ValueError, KeyError, IndexError, TypeError, RecursionError) as exc:  # too deep: RecursionError
        raise ToolError(
            f"fio --output-format=json: cannot read the {rw} bandwidth: {type(exc).__name__}: {exc}"
        ) from None
