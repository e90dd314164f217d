"""Unit tests of files.py (pure module, no pytest run): how outputs are written, that they replace only regular
files of their own and fail in one line, and that the files a run reads are checked before they are believed. The
node assumed: any Linux machine (a FIFO, /dev/null and /proc are there); no GPU."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gbvalidate import files
from pytest_gbvalidate.files import atomic_write_text
from pytest_gbvalidate.fleet.cli import main as fleet_main
from tests.helpers.runs import LAB


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


def test_only_a_regular_file_or_nothing_may_be_replaced(tmp_path: Path) -> None:
    fifo, directory, link, module = tmp_path / "fifo", tmp_path / "dir", tmp_path / "link", tmp_path / "test_x.py"
    os.mkfifo(fifo)
    directory.mkdir()
    (tmp_path / "target.json").write_text("{}")
    link.symlink_to(tmp_path / "target.json")
    module.write_text("")
    assert files.unwritable(tmp_path / "new.json") is None
    assert files.unwritable(tmp_path / "target.json") is None
    assert files.unwritable(fifo) == "is a FIFO, not a regular file: it is not replaced"
    assert files.unwritable(directory) == "is a directory, not a regular file: it is not replaced"
    assert files.unwritable(Path("/dev/null")) == "is a character device, not a regular file: it is not replaced"
    assert files.unwritable(link) == f"is a symbolic link (to {tmp_path / 'target.json'}): name the file itself"
    assert files.unwritable(module) == "is a Python file (the suites' and tests' modules are inputs of a run)"
    # Not there yet, still refused: a conftest.py written where none was breaks every later run that collects there.
    assert files.unwritable(tmp_path / "conftest.py") == files.unwritable(module)
    with pytest.raises(files.OutputError, match=r"fifo: is a FIFO"):
        files.atomic_write_text(fifo, "x")
    assert (tmp_path / "target.json").read_text() == "{}"  # nothing written through the link either


def test_a_failed_write_is_one_line_and_leaves_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "r.json"
    path.write_text("old\n")

    def disk_full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(files.OutputError) as info:
        files.atomic_write_text(path, "new\n")
    assert str(info.value) == f"cannot write {path}: No space left on device"
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_paths_the_kernel_refuses_and_names_at_the_limit(tmp_path: Path) -> None:
    with pytest.raises(files.OutputError, match=r"^cannot write /proc/gbvalidate\.json: "):
        files.atomic_write_text(Path("/proc/gbvalidate.json"), "{}")
    longest = tmp_path / ("r" * 250 + ".json")  # 255 bytes, the usual limit: its temporary twin must be shorter
    files.atomic_write_text(longest, "{}")
    assert longest.read_text() == "{}"


def test_an_output_that_is_an_input_or_another_output_clashes(tmp_path: Path) -> None:
    earlier, report = tmp_path / "before.json", tmp_path / "before.json"
    earlier.write_text("{}")
    found = files.clashes(
        {"--gb-report on the command line": report, "--junitxml on the command line": tmp_path / "x" / ".." / "j.xml"},
        {"--gb-compare on the command line": earlier, "the test path j.xml": tmp_path / "j.xml"},
    )
    assert found == [
        f"--gb-report on the command line: {report} is also --gb-compare on the command line: an output must be a "
        "file of its own",
        f"--junitxml on the command line: {tmp_path / 'x' / '..' / 'j.xml'} is also the test path j.xml: an output "
        "must be a file of its own",
    ]


def test_the_fleet_summary_writes_only_its_own_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "nodes.csv")
    report = out / "summary.md"  # a report given as input where the summary would go
    report.write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        fleet_main(["summary", str(report), "--out", str(out)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert f"{out / 'nodes.csv'}: is a FIFO, not a regular file: it is not replaced" in error
    assert f"--out's summary.md: {report} is also the report {report}: an output must be a file of its own" in error
    assert report.read_text() == "{}" and (out / "nodes.csv").is_fifo()


def test_a_recording_the_loader_would_refuse_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gbvalidate.baselines import recording

    path = tmp_path / "LAB.yaml"
    path.write_text(LAB)
    monkeypatch.setattr(recording, "dump_baseline", lambda _doc: "schema_version: 1\nsku: LAB\nmetrics: 3\n")
    with pytest.raises(files.OutputError, match=r"LAB.yaml: not written, the loader would refuse it: .*metrics"):
        recording.write_recorded_baseline(path, None, [], {"hostname": "n1"}, None)
    assert path.read_text() == LAB
    assert [p.name for p in tmp_path.iterdir()] == ["LAB.yaml"]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"a": NaN}', "not JSON: NaN is no JSON number"),
        ('{"a": -Infinity}', "not JSON: -Infinity is no JSON number"),
        ('{"a": ' + "1" * 5000 + "}", "not JSON: Exceeds the limit"),
        ('{"a": [' + "9" * 400 + "]}", "the document.a[0] is an integer of 1329 bits, beyond any float"),
        ('{"a": "\\ud800"}', "the document.a holds a lone surrogate"),
        ("[" * 100 + "]" * 100, "nested deeper than 64 levels"),
        ("[" * 100_000 + "]" * 100_000, "nested too deep"),
        (b"\xff\xfe{}", "not UTF-8 text (at byte 0)"),
    ],
    ids=["nan", "infinity", "huge-int", "beyond-float", "surrogate", "deep", "deeper-than-the-stack", "not-utf8"],
)
def test_json_no_report_holds_is_one_line_naming_the_file(tmp_path: Path, content: str | bytes, problem: str) -> None:
    path = tmp_path / "r.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(files.InputError) as info:
        files.read_json(path)
    assert str(info.value).startswith(f"{path}: ") and problem in str(info.value)


def test_an_input_is_a_regular_file_of_a_bounded_size(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # reading it would block forever
    with pytest.raises(files.InputError, match=r"fifo: is a FIFO, not a regular file"):
        files.read_input(fifo)
    with pytest.raises(files.InputError, match=r": is a directory, not a regular file"):
        files.read_input(tmp_path)
    with pytest.raises(files.InputError, match=r"/dev/zero: is a character device"):
        files.read_input(Path("/dev/zero"))  # it never ends
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(files.InputError, match=r"big: larger than 100 bytes"):
        files.read_input(tmp_path / "big", max_bytes=100)


def test_a_new_file_is_created_whole_and_never_replaces_one(tmp_path: Path, umask: None) -> None:
    path = tmp_path / "h" / "20261124T101500Z.json"
    files.atomic_create_bytes(path, b"first\n")
    assert path.read_bytes() == b"first\n" and mode(path) == 0o644
    with pytest.raises(FileExistsError):
        files.atomic_create_bytes(path, b"second\n")
    assert path.read_bytes() == b"first\n"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    (tmp_path / "file").write_text("")
    with pytest.raises(files.OutputError, match=r"^cannot write .*file/x\.json: "):  # not taken for a name in use
        files.atomic_create_bytes(tmp_path / "file" / "x.json", b"{}")


def test_a_new_file_is_created_where_the_file_system_has_no_hard_links(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(_src: str, _dst: str) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    path = tmp_path / "r.json"
    files.atomic_create_bytes(path, b"{}\n")
    assert path.read_bytes() == b"{}\n"
    with pytest.raises(FileExistsError):
        files.atomic_create_bytes(path, b"again\n")
    assert path.read_bytes() == b"{}\n" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_who_besides_root_and_this_user_could_change_a_file(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o755)
    path = directory / "f.yaml"
    path.write_text("x")
    path.chmod(0o644)
    assert files.writable_by_others(path) is None
    link = tmp_path / "link.yaml"
    link.symlink_to(path)
    assert files.writable_by_others(link) is None  # the file it names is checked
    path.chmod(0o646)
    assert files.writable_by_others(link) == f"{path} is writable by everyone (mode 0646)"
    path.chmod(0o644)
    directory.chmod(0o775)
    if os.geteuid() == 0:  # a group of others (root's own group is root's private one: writable by root alone)
        os.chown(directory, -1, 4242)
        assert files.writable_by_others(path) == f"{directory} is writable by its group (mode 0775)"
    directory.chmod(0o1777)
    assert files.writable_by_others(path) is None
    if os.geteuid() == 0:  # only root can give a file away
        os.chown(path, 4242, -1)
        assert files.writable_by_others(path) == f"{path} is owned by uid 4242, neither root nor this user (uid 0)"


def test_a_group_is_private_only_while_no_other_account_has_it_as_its_primary_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory its owner's group may write in, that group the owner's own: writable by the owner alone -- until
    another account has that group as its primary group without being listed in it (RHEL's `operator`, gid 0)."""
    import grp
    import pwd

    directory = tmp_path / "d"
    directory.mkdir()
    directory.chmod(0o775)
    path = directory / "f.yaml"
    path.write_text("x")
    st = os.stat(directory)
    owner = pwd.struct_passwd(("owner", "x", st.st_uid, st.st_gid, "", "/", "/bin/sh"))
    operator = pwd.struct_passwd(("operator", "x", st.st_uid + 4242, st.st_gid, "", "/", "/sbin/nologin"))
    accounts = [owner]
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: owner)
    monkeypatch.setattr(pwd, "getpwall", lambda: accounts)
    monkeypatch.setattr(grp, "getgrgid", lambda gid: grp.struct_group(("owner", "x", gid, [])))
    assert files.writable_by_others(path) is None
    accounts.append(operator)
    assert files.writable_by_others(path) == f"{directory} is writable by its group (mode 0775)"
