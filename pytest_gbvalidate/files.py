"""The files a run reads and writes, and the rules they keep. Pure Python: no pytest.

Inputs (baselines, earlier reports, the fleet's reports) are untrusted: `read_input` takes only a regular file (a
FIFO would block forever, a device never end) of a bounded size; `read_json` also refuses what Python's json module
lets through but no report holds (NaN, Infinity, what _odd_value finds). Each problem is one InputError naming it.

An output (the JSON report, a recorded baseline, plots, the fleet summary's files) replaces only a regular file or
creates one (`unwritable`), is none of the run's inputs and other outputs (`clashes`), and is written to a temporary
file beside it, flushed, renamed over the old one, the directory synced: a reader (or a crash) sees the old file or
the new one, never half of one. A failed write is one OutputError naming the path and the operating system's words,
leaving the old file as it was and no temporary file.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_gbvalidate.labels import text_safe

# The kinds of file os.lstat can report, for messages.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


class OutputError(OSError):
    """An output that cannot be written: the message names the path and what went wrong."""


class InputError(ValueError):
    """An input that cannot be read as what it should be: the message names the path and why."""


# The most a run reads of one input (an 8-GPU node's report with every sweep is about 1 MiB, a baseline 20 KiB).
MAX_INPUT_BYTES = 64 * 2**20
MAX_JSON_DEPTH = 64  # a report nests 5 levels


def read_input(path: Path, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a regular file of at most `max_bytes`, or InputError saying why not."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = next((k for is_kind, k in _KINDS if is_kind(st.st_mode)), "not a regular file")
        raise InputError(f"{path}: is {kind}, not a regular file")
    with os.fdopen(fd, "rb") as f:
        # As much as the file holds, and a byte more: reading max_bytes at once would allocate them all first.
        data = f.read(min(st.st_size, max_bytes) + 1)
        if st.st_size < len(data) <= max_bytes:  # it grew since: the rest, up to the bound
            data += f.read(max_bytes + 1 - len(data))
    if len(data) > max_bytes:
        raise InputError(f"{path}: larger than {max_bytes} bytes, more than any real one")
    return data


def read_json(path: Path, max_bytes: int = MAX_INPUT_BYTES) -> Any:
    """The JSON document in `path` (read_input's rules), or InputError naming the file and what is wrong."""
    data = read_input(path, max_bytes)
    try:
        text = data.decode("utf-8")
        doc = json.loads(text, parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not UTF-8 text (at byte {exc.start})") from None
    except RecursionError:
        raise InputError(f"{path}: not JSON a report can be: nested too deep") from None
    except ValueError as exc:  # not JSON, NaN / Infinity, an integer past Python's digit limit
        raise InputError(f"{path}: not JSON: {exc}") from None
    if _may_be_odd(text) and (problem := _odd_value(doc)) is not None:
        raise InputError(f"{path}: {problem}")
    return doc


# What a document's text must show for _odd_value to find anything (a surrogate's escape, more digits than a float
# holds, brackets nested past MAX_JSON_DEPTH outside strings): ruled out at C speed for a fleet's thousands of reports.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # the unrolled loop: no alternation per character
_LONG_DIGITS = re.compile(r"\d{300,}")
_BRACKET = re.compile(r"[\[\]{}]")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _may_be_odd(text: str) -> bool:
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        return True
    bare = _STRING.sub('""', text)
    depth = max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, _BRACKET.findall(bare))), default=0)
    return depth > MAX_JSON_DEPTH or _LONG_DIGITS.search(bare) is not None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


def _odd_value(doc: Any) -> str | None:
    """What no report holds: nesting past MAX_JSON_DEPTH, a lone surrogate (which no file can be written with), or
    an integer beyond float range (which passes every "is a number" check and then breaks the arithmetic)."""
    stack = [(doc, "the document", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"nested deeper than {MAX_JSON_DEPTH} levels at {where}"
        if isinstance(value, dict):
            stack += [(v, f"{where}.{k}", depth + 1) for k, v in value.items()]
            stack += [(k, f"{where} (a key)", depth + 1) for k in value]
        elif isinstance(value, list):
            stack += [(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
        elif isinstance(value, str) and text_safe(value) != value:
            return f"{where} holds a lone surrogate ({ascii(value)[:60]}), which is no text"
        elif isinstance(value, int) and not isinstance(value, bool):
            try:  # JSON integers have no bound; every reader does float arithmetic on a report's numbers
                float(value)
            except OverflowError:
                return f"{where} is an integer of {value.bit_length()} bits, beyond any float"
    return None


def unwritable(path: Path) -> str | None:
    """Why `path` cannot be an output, or None where it may be: absent, or a regular file that is no symlink (writing
    through one would put the file where the operator did not name it, replacing it would lose the link); never a
    Python file, present or not (a conftest.py written where none was is imported by every later run)."""
    if path.suffix == ".py":
        return "is a Python file (the suites' and tests' modules are inputs of a run)"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot look at it: {exc.strerror}"
    if stat.S_ISLNK(mode):
        return f"is a symbolic link (to {os.readlink(path)}): name the file itself"
    if stat.S_ISREG(mode):
        return None
    kind = next((k for is_kind, k in _KINDS if is_kind(mode)), None)
    return f"is {kind}, not a regular file: it is not replaced" if kind else "is not a regular file: it is not replaced"


def writable_by_others(path: Path) -> str | None:
    """Who besides root and the running user could change what `path` holds, one line naming the file or directory; None
    where nobody can. As sudo and ssh check: the file and each directory above it (links followed) owned by root or this
    user, writable by none else but others of a sticky directory (/tmp) and the owner's private group."""
    me = os.geteuid()
    real = Path(os.path.realpath(path))
    for part in [real, *real.parents]:
        try:
            st = os.stat(part)
        except OSError as exc:
            return f"{part}: cannot look at it: {exc.strerror or exc}"
        if st.st_uid not in (0, me):
            return f"{part} is owned by uid {st.st_uid}, neither root nor this user (uid {me})"
        mode = st.st_mode & ~0o020 if _private_group(st) else st.st_mode
        if mode & 0o022 and not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and part != real):  # sticky
            who = {0o022: "its group and everyone", 0o020: "its group", 0o002: "everyone"}[mode & 0o022]
            return f"{part} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _private_group(st: os.stat_result) -> bool:
    """Whether a file's group is its owner's private group (the owner's primary group, no other members, no other
    account's primary group: RHEL's `operator` has root's gid 0 unlisted), as where users' umask is 002: writable by
    it is writable by the owner alone (Debian's OpenSSH accepts it, user-group-modes)."""
    import grp
    import pwd

    try:
        owner, group = pwd.getpwuid(st.st_uid), grp.getgrgid(st.st_gid)
    except KeyError:
        return False
    private = owner.pw_gid == st.st_gid and set(group.gr_mem) <= {owner.pw_name} and group.gr_name == owner.pw_name
    return private and not any(a.pw_gid == st.st_gid and a.pw_uid != st.st_uid for a in pwd.getpwall())


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same inode where both exist, the same resolved path otherwise."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def clashes(outputs: Mapping[str, Path], inputs: Mapping[str, Path]) -> list[str]:
    """One line for each output that is one of `inputs` or another output; each mapping is where the path came
    from (`--gb-report on the command line`) -> the path."""
    found = []
    named = list(outputs.items())
    for i, (source, path) in enumerate(named):
        for other_source, other in [*named[i + 1 :], *inputs.items()]:
            if same_file(path, other):
                found.append(f"{source}: {path} is also {other_source}: an output must be a file of its own")
    return found


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path`, keeping the mode of the file it replaces; a new one gets open()'s 0666 less the umask,
    not mkstemp's 0600 (which would hide a committed baseline or a report from a collector run as another user)."""
    atomic_write_bytes(path, text_safe(text).encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write_by(path, lambda name: Path(name).write_bytes(data))


def atomic_write_by(path: Path, write: Callable[[str], object]) -> None:
    """Write `path` by `write(name)`, which writes the whole file at `name` (pytest's JUnit writer opens its own):
    the temporary file beside `path`, renamed over it once `write` returned; its OSError is an OutputError too."""
    if (problem := unwritable(path)) is not None:
        raise OutputError(f"{path}: {problem}")
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            mode: int | None = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = None
        fd, tmp = _new_temp_file(path.parent)
        os.close(fd)
        write(tmp)
        with open(tmp, "rb") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _sync_directory(path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def atomic_create_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a new file `path`, never replacing one: FileExistsError where the name is taken (the caller
    picks another), OutputError for anything else. The name appears whole, as a hard link to the finished temporary
    file, which fails where the name exists (without hard links: checked, then renamed onto)."""
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _new_temp_file(path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:  # FileExistsError too
                raise
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, "File exists", str(path)) from None
            os.replace(tmp, path)
        _sync_directory(path.parent)
    except OSError as exc:
        if isinstance(exc, FileExistsError) and str(path) in (exc.filename, exc.filename2):
            raise
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


# What os.link raises where the file system has no hard links (vfat, some FUSE and network file systems).
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK})


def _new_temp_file(directory: Path) -> tuple[int, str]:
    """A new, empty file in `directory`, opened for writing with mode 0666 (the kernel applies the umask). Its
    name is short whatever the output's is, so a name at the file system's limit still gets its twin."""
    while True:
        tmp = str(directory / f".gbvalidate-{secrets.token_hex(6)}.tmp")
        with contextlib.suppress(FileExistsError):
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp


def _sync_directory(directory: Path) -> None:
    """Make the rename durable: a crash after it must not bring the old file back. A file system that cannot sync
    a directory (some network ones refuse) has made the rename all the same: that is no failed write."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
