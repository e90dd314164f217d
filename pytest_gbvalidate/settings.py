"""Settings with one precedence -- command line, then environment, then ini file, then default -- and errors
that say where a bad value came from. No pytest here: the plugin hands in what each source holds."""

from __future__ import annotations

import math
import os
import shlex
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from pytest_gbvalidate.compare import AllowedRegression

T = TypeVar("T")

AUTO = "auto"
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class SettingError(Exception):
    """A setting has a bad value; the message starts with where it came from."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    value: T
    source: str  # e.g. "--gb-sku on the command line", "GBVALIDATE_SKU in the environment", "default"

    @property
    def is_default(self) -> bool:
        return self.source == "default"


@dataclass(frozen=True)
class Sources:
    """The raw values each source holds, keyed by setting name (`sku`, `baselines`, `report`, `strict`)."""

    cli: Mapping[str, str | bool | None]
    env: Mapping[str, str]
    ini: Mapping[str, str]
    ini_file: Path | None
    cwd: Path


@dataclass(frozen=True)
class Settings:
    sku: Setting[str]
    baselines: Setting[Path]
    report: Setting[Path | None]
    strict: Setting[bool]
    record: Path | None  # command line only: a one-off action, not a standing configuration
    list_skus: bool
    # Seconds one call on the ranks may take before the gang is torn down; None: the SKU's default.
    timeout: Setting[float | None] = Setting(None, "default")
    reference_tools: Setting[bool] = Setting(False, "default")  # also run nccl-tests / nvbandwidth when on PATH
    # Missing directories that writing the report or the recorded baseline will create, as pytest's --junitxml
    # creates its own: (where the path came from, the outermost missing directory).
    created_dirs: tuple[tuple[str, Path], ...] = ()
    compare: Setting[Path | None] = Setting(None, "default")  # an earlier JSON report of this node
    compare_fail: Setting[AllowedRegression | None] = Setting(None, "default")  # None: each metric's warn band
    scratch: Setting[Path | None] = Setting(None, "default")  # the local scratch volume the storage checks write to
    # The command the NeMo engines' driver runs under, in place of this interpreter: the NeMo image's python, or a
    # launcher ending in one (`srun --container-image=... python`). None: the baseline's, else this interpreter.
    engine_python: Setting[tuple[str, ...] | None] = Setting(None, "default")

    @property
    def explicit(self) -> bool:
        """True when the user asked for gbvalidate in any way, so a bad value must fail the run."""
        chosen: list[Setting[Any]] = [self.sku, self.baselines, self.report, self.strict, self.timeout]
        chosen += [self.reference_tools, self.compare, self.scratch, self.engine_python]
        return any(not s.is_default for s in chosen) or self.record is not None or self.list_skus


def env_name(name: str) -> str:
    return f"GBVALIDATE_{name.upper()}"


def ini_name(name: str) -> str:
    return f"gb_{name}"


def cli_flag(name: str) -> str:
    return f"--gb-{name.replace('_', '-')}"


_PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_baselines(package_dir: Path = _PACKAGE_DIR) -> Path:
    """The baselines shipped with the plugin, next to the code that is running: inside the installed package
    (`bundled_baselines/`), or, where the package is a source checkout's, the checkout's `baselines/`. A
    `python -m pytest` started in a checkout imports the checkout's package even when the plugin is installed,
    so the installed layout cannot be assumed."""
    installed = package_dir / "bundled_baselines"
    return installed if installed.is_dir() else package_dir.parent / "baselines"


def resolve(sources: Sources) -> Settings:
    sku = _pick(sources, "sku", AUTO, _parse_sku)
    baselines = _pick(sources, "baselines", bundled_baselines(), _parse_dir)
    report = _pick(sources, "report", None, _parse_output_path)
    record = _pick(sources, "record", None, _parse_output_path, cli_only=True)
    created = tuple(
        (s.source, missing)
        for s in (report, record)
        if s.value is not None and (missing := _ancestors(s.value)[1]) is not None
    )
    return Settings(
        sku=sku,
        baselines=baselines,
        report=report,
        strict=_pick(sources, "strict", False, _parse_bool),
        record=record.value,
        list_skus=bool(sources.cli.get("list_skus")),
        timeout=_pick(sources, "timeout", None, _parse_timeout),
        reference_tools=_pick(sources, "reference_tools", False, _parse_bool),
        created_dirs=created,
        compare=_pick(sources, "compare", None, _parse_input_file),
        compare_fail=_pick(sources, "compare_fail", None, _parse_allowed_regression),
        scratch=_pick(sources, "scratch", None, _parse_dir),
        engine_python=_pick(sources, "engine_python", None, parse_command),
    )


_EMPTY = "set but empty: give a value, or leave it unset for the default"


def _pick(
    sources: Sources, name: str, default: T, parse: Callable[[str, Path], T], *, cli_only: bool = False
) -> Setting[T]:
    candidates: list[tuple[str | bool | None, str, Path]] = [
        (sources.cli.get(name), f"{cli_flag(name)} on the command line", sources.cwd)
    ]
    if not cli_only:
        candidates.append((sources.env.get(env_name(name)), f"{env_name(name)} in the environment", sources.cwd))
    if sources.ini_file is not None and not cli_only:
        ini_dir = sources.ini_file.parent
        # An ini key that is present but empty reads as "", exactly as an absent one does (pytest hands addini's
        # default, "", for both), so in the ini file empty means unset and falls through to the default.
        ini = sources.ini.get(name) or None
        candidates.append((ini, f"{ini_name(name)} in {sources.ini_file}", ini_dir))
    for raw, source, base in candidates:
        if raw is None:
            continue
        if isinstance(raw, bool):
            return Setting(raw, source)  # type: ignore[arg-type]  # store_true flags are already parsed
        if not raw.strip():
            # `GBVALIDATE_SKU=` or `--gb-sku=$SKU` from a CI template whose variable was unset: falling through
            # to the default would turn an explicit SKU into `auto` (on a node whose GPUs vanished, `cpu`).
            raise SettingError(f"{source}: {raw!a}: {_EMPTY}")
        try:
            return Setting(parse(raw, base), source)
        except SettingError as exc:
            # ascii(): a value with look-alike or invisible characters is shown escaped, never as what it mimics.
            raise SettingError(f"{source}: {raw!a}: {exc}") from None
    return Setting(default, "default")


def _parse_sku(raw: str, _base: Path) -> str:
    name = raw.strip()
    if not name or not name.isascii() or not all(c.isalnum() or c in "_-." for c in name):
        raise SettingError("a SKU name is ASCII letters, digits, '_', '-' and '.' (or 'auto')")
    return name


def _parse_output_path(raw: str, base: Path) -> Path | None:
    """A file the run writes (the report, a recorded baseline): checked before any test runs, so a bad path
    fails the run at once rather than after the measurements. A missing directory is fine: it is created."""
    path = base / raw
    if os.path.isdir(path):
        raise SettingError(f"is a directory: {path}")
    parent, _ = _ancestors(path)
    if not os.path.isdir(parent):
        raise SettingError(f"is under a file, not a directory: {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SettingError(f"cannot create files in {parent} (no write permission)")
    from pytest_gbvalidate.files import unwritable  # only where an output is named: an unrelated run names none

    refused = unwritable(path)
    if refused is not None:
        raise SettingError(f"{path} {refused}")
    return path


def _ancestors(path: Path) -> tuple[Path, Path | None]:
    """The nearest ancestor of `path` that exists, and the outermost one that does not (None: the parent
    exists). One that cannot be looked at (under a directory we may not read) counts as missing."""
    existing, missing = path.parent, None
    while not os.path.lexists(existing) and existing != existing.parent:
        existing, missing = existing.parent, existing
    return existing, missing


def _parse_input_file(raw: str, base: Path) -> Path | None:
    path = base / raw
    if not path.is_file():
        raise SettingError(f"no such file: {path}")
    return path


def _parse_allowed_regression(raw: str, _base: Path) -> AllowedRegression | None:
    from pytest_gbvalidate.compare import parse_allowed

    try:
        return parse_allowed(raw)
    except ValueError as exc:
        raise SettingError(str(exc)) from None


def _parse_dir(raw: str, base: Path) -> Path:
    path = base / raw
    if not path.is_dir():
        raise SettingError(f"no such directory: {path}")
    return path


def _parse_bool(raw: str, _base: Path) -> bool:
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise SettingError("expected one of 1/0, true/false, yes/no, on/off")


def _parse_timeout(raw: str, _base: Path) -> float:
    try:
        seconds = float(raw.strip())
    except ValueError:
        seconds = math.nan
    if not MIN_TIMEOUT_S <= seconds <= MAX_TIMEOUT_S:  # NaN too
        raise SettingError(f"a timeout is a number of seconds from {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} (a week)")
    return seconds


# The ranks' process groups get twice the timeout to set up: below a second even gloo on one machine cannot;
# above a week a timer overflows (Python's timedelta, NCCL's watchdog) and a hang is never caught.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 7 * 24 * 3600.0


def parse_command(raw: str, base: Path) -> tuple[str, ...]:
    """A command line split as a POSIX shell would (no expansion); its program must exist here: a path (relative
    to `base`) to an executable file, or a name on PATH."""
    try:
        words = tuple(shlex.split(raw))
    except ValueError as exc:
        raise SettingError(f"cannot split into words: {exc}") from None
    if not words or not words[0]:
        raise SettingError("names no program")
    program = words[0]
    if os.sep in program:
        path = base / program
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise SettingError(f"no executable file {path}")
        return (str(path), *words[1:])
    if shutil.which(program) is None:
        raise SettingError(f"no program {program!r} on PATH")
    return words
