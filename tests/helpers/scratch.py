"""What the storage check leaves in a scratch directory."""

from __future__ import annotations

from pathlib import Path


def leftovers(directory: Path) -> list[Path]:
    return list(directory.glob("gbvalidate-scratch-*"))
