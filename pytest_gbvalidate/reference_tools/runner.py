"""What every reference tool shares: found on PATH, run with the run's environment and a timeout, a failure (a
nonzero exit, an overrun, a binary that cannot start) a ToolError with the end of what it printed; its JSON read
field by field (ToolJson); its figures as Measurements in our terms. Pure Python.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_gbvalidate.rules import noise


class ToolError(RuntimeError):
    """A reference tool failed to run or printed something we cannot read."""


@dataclass(frozen=True)
class Measurement:
    """One tool figure in our terms: `gb_expect(metric, value, scope=scope, details=details)`."""

    metric: str
    scope: str
    value: float
    details: dict[str, Any] = field(default_factory=dict)


def find(binary: str, path: str | None = None) -> str | None:
    return shutil.which(binary, path=path)


def environment(env: Mapping[str, str]) -> dict[str, str]:
    """A tool's environment: this process's, with the run's settings (NCCL_*, CUDA_VISIBLE_DEVICES, ...) on top."""
    return {**os.environ, **env}


def run(command: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> str:
    """The tool's standard output; ToolError with the end of its error output when it fails or overruns."""
    try:
        done = _completed(command, env=env, timeout_s=timeout_s)
    except subprocess.TimeoutExpired:
        raise ToolError(f"{' '.join(command)} did not finish within {timeout_s:g} s") from None
    except OSError as exc:
        raise ToolError(f"{' '.join(command)}: {exc}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ToolError(f"{' '.join(command)} exited with code {done.returncode}: {tail}")
    return done.stdout


def printed(command: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> str:
    """What the command prints, out and error, whatever its exit code; nothing where it cannot run. For asking a
    tool what it can do (its usage, its version), where a tool that cannot answer simply cannot."""
    try:
        done = _completed(command, env=env, timeout_s=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def _completed(command: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(command), capture_output=True, text=True, timeout=timeout_s, env=environment(env), check=False
    )


def writes_json(binary: str, option: str, *, env: Mapping[str, str], timeout_s: float) -> bool:
    """Whether this build can write JSON: its usage (`-h`) names `option` (each tool's *_JSON_OPTION)."""
    return option in printed([binary, "-h"], env=env, timeout_s=timeout_s)


def read_json_file(binary: str, path: str | Path) -> str:
    """The JSON file a tool was asked to write; ToolError where it wrote none."""
    try:
        return Path(path).read_text(errors="replace")
    except OSError as exc:
        raise ToolError(f"{binary} was asked for JSON but wrote no {path}: {exc.strerror}") from None


@dataclass(frozen=True)
class ToolJson:
    """A value in a tool's JSON document and the path to it: a field of the wrong shape is a ToolError that names
    the tool and the field, never a KeyError or TypeError."""

    tool: str
    value: Any
    path: str = ""

    @classmethod
    def load(cls, tool: str, text: str) -> ToolJson:
        if not text.strip():
            raise ToolError(f"{tool} JSON output is empty")
        try:
            return cls(tool, json.loads(text, parse_constant=_no_constant))
        except (ValueError, RecursionError) as exc:  # not JSON, NaN/Infinity, digits past int's limit, too deep
            raise ToolError(f"{tool} JSON output: not JSON: {exc}; it starts {text[:40]!r}") from None

    def error(self, problem: str) -> ToolError:
        return ToolError(f"{self.tool} JSON output: {self.path or 'the document'} {problem}")

    def get(self, key: str) -> ToolJson | None:
        """The field, or None where it is missing or null."""
        if not isinstance(self.value, dict):
            raise self.error(f"is {reprlib.repr(self.value)}, not an object")
        value = self.value.get(key)
        return None if value is None else ToolJson(self.tool, value, f"{self.path}.{key}".lstrip("."))

    def __getitem__(self, key: str) -> ToolJson:
        if (found := self.get(key)) is None:
            raise ToolJson(self.tool, None, f"{self.path}.{key}".lstrip(".")).error("is missing or null")
        return found

    def items(self) -> list[ToolJson]:
        if not isinstance(self.value, list):
            raise self.error(f"is {reprlib.repr(self.value)}, not a list")
        return [ToolJson(self.tool, v, f"{self.path}[{i}]") for i, v in enumerate(self.value)]

    def number(self) -> float:
        if (value := self.number_or_none()) is None:
            raise self.error(f"is {reprlib.repr(self.value)}, not a finite number")
        return value

    def number_or_none(self) -> float | None:
        """A JSON number as a float; None for anything else, a bool, or a number past a double's range."""
        return noise.finite(self.value)

    def integer(self) -> int:
        """An integer, or a whole double or a string holding one (nccl-tests writes `nwrong` and `root` so)."""
        value = self.value
        whole = isinstance(value, float) and value.is_integer()
        if whole or (isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,20}\s*", value)):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**64:
            raise self.error(f"is {reprlib.repr(self.value)}, not an integer")
        return value

    def string(self) -> str:
        if not isinstance(self.value, str):
            raise self.error(f"is {reprlib.repr(self.value)}, not a string")
        return self.value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")
