"""Unit tests of how outputs are written (pure module, no pytest run)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gbvalidate.files import atomic_write_text


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("old_mode", [0o644, 0o640, 0o600], ids=oct)
def test_a_replaced_file_keeps_its_mode(tmp_path: Path, old_mode: int, umask: None) -> None:
    # A committed 0644 baseline re-recorded by root must stay readable to a CI collector running as another user.
    path = tmp_path / "ND_H100_v5.yaml"
    path.write_text("old\n")
    path.chmod(old_mode)
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n" and mode(path) == old_mode
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


@pytest.mark.parametrize(
    ("mask", "expected"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)], ids=("umask022", "umask027", "umask002")
)
def test_a_new_file_gets_the_usual_mode(tmp_path: Path, mask: int, expected: int, umask: None) -> None:
    os.umask(mask)
    path = tmp_path / "out" / "report.json"
    atomic_write_text(path, "{}\n")
    assert path.read_text() == "{}\n" and mode(path) == expected
