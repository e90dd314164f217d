"""How each setting's text becomes its value, and why a text is refused (settings.py's table names the parser of
each setting). A parser takes the raw text and the directory a relative path is taken from, and raises
SettingError saying what is wrong; settings.py adds where the value came from. No pytest here."""

from __future__ import annotations

import math
import os
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from pytest_gbvalidate.levels import Level, LevelError
from pytest_gbvalidate.levels import parse_level as _level

if TYPE_CHECKING:
    from pytest_gbvalidate.compare import AllowedRegression

LAST: Literal["last"] = "last"  # --gb-compare=last: the node's latest report in the --gb-history directory
# --gb-world and --gb-compute-domain: settings.py's help texts say what each word means.
World = Literal["auto", "none"]
WORLDS: tuple[World, ...] = ("auto", "none")
ComputeDomain = Literal["auto", "expected", "none"]
COMPUTE_DOMAINS: tuple[ComputeDomain, ...] = ("auto", "expected", "none")
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class SettingError(Exception):
    """A setting has a bad value; the message starts with where it came from."""


_PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_baselines(package_dir: Path = _PACKAGE_DIR) -> Path:
    """The baselines shipped with the plugin, next to the code that is running (the baselines setting's default):
    the installed package's `bundled_baselines/`, else a source checkout's `baselines/` (`python -m pytest` in a
    checkout imports the checkout's package even when the plugin is installed)."""
    installed = package_dir / "bundled_baselines"
    return installed if installed.is_dir() else package_dir.parent / "baselines"


_SKU_NAME = "a SKU name is ASCII letters, digits, '_', '-' and '.'"


def _is_sku_name(name: str) -> bool:
    return bool(name) and name.isascii() and all(c.isalnum() or c in "_-." for c in name)


def parse_sku(raw: str, _base: Path) -> str:
    name = raw.strip()
    if not _is_sku_name(name):
        raise SettingError(f"{_SKU_NAME} (or 'auto')")
    return name


def parse_output_path(raw: str, base: Path) -> Path:
    """A file the run writes (the report, a recorded baseline): checked before any test runs, so a bad path
    fails the run at once rather than after the measurements. A missing directory is fine: it is created."""
    path = base / raw
    if os.path.isdir(path):
        raise SettingError(f"is a directory: {path}")
    _creatable_under(ancestors(path)[0])
    from pytest_gbvalidate.files import unwritable  # only where an output is named: an unrelated run names none

    if (refused := unwritable(path)) is not None:
        raise SettingError(f"{path} {refused}")
    return path


def parse_prometheus_path(raw: str, base: Path) -> Path | None:
    """An output path (as --gb-report's) whose file prometheus-client writes: the optional extra must be installed,
    or the run would measure for an hour and then fail to write it."""
    path = parse_output_path(raw, base)
    import importlib.util

    if importlib.util.find_spec("prometheus_client") is None:
        raise SettingError("needs prometheus-client: pip install 'pytest-gbvalidate[prometheus]'")
    return path


def parse_window(raw: str, base: Path) -> Path | None:
    """The node's window file (node/window.py), or `none`: keep no window, every check judges since boot."""
    if raw.strip().lower() == "none":
        return None
    return parse_output_path(raw, base)


def parse_history_dir(raw: str, base: Path) -> Path:
    """The directory each run's report is kept in (under DIR/<hostname>/): a directory, or one that can be made."""
    path = base / raw
    if os.path.lexists(path) and not path.is_dir():
        raise SettingError(f"is not a directory: {path}")
    _creatable_under(ancestors(path / "-")[0])
    return path


def _creatable_under(existing: Path) -> None:
    if not os.path.isdir(existing):
        raise SettingError(f"is under a file, not a directory: {existing}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SettingError(f"cannot create files in {existing} (no write permission)")


def parse_compare(raw: str, base: Path) -> Path | Literal["last"] | None:
    """An earlier report's path, or `last`: the node's latest in the history directory (a file named `last` is
    `./last`)."""
    return LAST if raw.strip() == LAST else parse_input_file(raw, base)


def ancestors(path: Path) -> tuple[Path, Path | None]:
    """The nearest ancestor of `path` that exists, and the outermost one that does not (None: the parent
    exists). One that cannot be looked at (under a directory we may not read) counts as missing."""
    existing, missing = path.parent, None
    while not os.path.lexists(existing) and existing != existing.parent:
        existing, missing = existing.parent, existing
    return existing, missing


def parse_input_file(raw: str, base: Path) -> Path | None:
    path = base / raw
    if not path.is_file():
        raise SettingError(f"no such file: {path}")
    return path


def parse_allowed_regression(raw: str, _base: Path) -> AllowedRegression | None:
    from pytest_gbvalidate.compare import parse_allowed

    try:
        return parse_allowed(raw)
    except ValueError as exc:
        raise SettingError(str(exc)) from None


def parse_level(raw: str, _base: Path) -> Level:
    try:
        return _level(raw)
    except LevelError as exc:
        raise SettingError(str(exc)) from None


def parse_dir(raw: str, base: Path) -> Path:
    path = base / raw
    if not path.is_dir():
        raise SettingError(f"no such directory: {path}")
    return path


def parse_scratch_dir(raw: str, base: Path) -> Path:
    """A directory the storage checks write their files in: a file is created there and removed. Not os.access:
    root passes it everywhere, yet cannot write in /proc or on a read-only mount."""
    path = parse_dir(raw, base)
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".gbvalidate-scratch-"):
            pass
    except OSError as exc:
        raise SettingError(f"cannot create files in {path} ({exc.strerror or exc})") from None
    return path


def parse_record_path(raw: str, base: Path) -> Path | None:
    """The baseline --gb-record writes: an output path whose file name is a SKU's, as --gb-sku takes SKU names
    (a baseline of another name would be listed, but no --gb-sku could name it)."""
    path = parse_output_path(raw, base)
    # 'auto' too: --gb-sku=auto detects a SKU, it never names this one.
    if path.suffix != ".yaml" or not _is_sku_name(path.stem) or path.stem == "auto":
        raise SettingError(f"a baseline is named <SKU>.yaml, and {_SKU_NAME} (not 'auto')")
    return path


def parse_bool(raw: str, _base: Path) -> bool:
    word = raw.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise SettingError("expected one of 1/0, true/false, yes/no, on/off")


def parse_timeout(raw: str, _base: Path) -> float:
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


Word = TypeVar("Word", bound=str)


def one_of(raw: str, choices: tuple[Word, ...]) -> Word:
    """The choice `raw` names (case and surrounding space aside)."""
    word = raw.strip().lower()
    for choice in choices:
        if word == choice:
            return choice
    raise SettingError(f"expected one of {', '.join(choices)}")
