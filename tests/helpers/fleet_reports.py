"""Node reports written for the fleet summary to read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write(directory: Path, name: str, report: dict[str, Any] | str) -> Path:
    path = directory / name
    path.write_text(report if isinstance(report, str) else json.dumps(report))
    return path
