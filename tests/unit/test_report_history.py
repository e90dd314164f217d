"""Unit tests of report/history.py: where a node's reports are kept, under which names, in which order, and which
hostnames may name a directory. (Runs that keep them, and --gb-compare=last: e2e/test_history_runs.py.)"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any, cast

import pytest

from pytest_gbvalidate.report import history
from pytest_gbvalidate.report.records import RunReportRecord
from pytest_gbvalidate.report.writer import as_json
from tests.helpers.reports import minimal_report


@pytest.mark.parametrize("hostname", ["node7", "gpu-a100-017.cluster.example.com", "NODE_7", "7", "a" * 253])
def test_a_hostname_names_one_directory(tmp_path: Path, hostname: str) -> None:
    assert history.node_directory(tmp_path, hostname) == tmp_path / hostname


@pytest.mark.parametrize(
    ("hostname", "shown"),
    [
        ("", "''"),
        (".", "'.'"),
        ("..", "'..'"),
        (".hidden", "'.hidden'"),
        ("a/b", "'a/b'"),
        ("../../etc", "'../../etc'"),
        ("a\x00b", r"'a\x00b'"),
        ("-rf", "'-rf'"),
        ("node 7", "'node 7'"),
        ("n\u043ede7", r"'n\u043ede7'"),  # a Cyrillic o: looks like node7, is not
        ("a" * 254, "'" + "a" * 254 + "'"),
    ],
)
def test_a_hostname_that_is_not_one_safe_name_is_refused_in_one_line(tmp_path: Path, hostname: str, shown: str) -> None:
    with pytest.raises(history.HistoryError) as info:
        history.node_directory(tmp_path, hostname)
    message = str(info.value)
    assert message.startswith(f"this node's hostname {shown} cannot name its history directory: ")
    assert "\n" not in message and "\x00" not in message
    assert list(tmp_path.iterdir()) == []  # nothing made


def test_a_file_where_the_node_s_directory_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "node7").write_text("not a directory")
    with pytest.raises(history.HistoryError, match=r"node7 is not a directory"):
        history.node_directory(tmp_path, "node7")


def test_a_node_s_directory_it_may_not_write_in_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "node7").mkdir()
    # What os.access answers a user without write permission there (root may write anywhere).
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path / "node7")
    with pytest.raises(history.HistoryError, match=r"cannot create files in .*node7 \(no write permission\)$"):
        history.node_directory(tmp_path, "node7")


def test_a_node_s_directory_that_is_a_dangling_link_or_cannot_be_made_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "node7").symlink_to(tmp_path / "gone")
    with pytest.raises(history.HistoryError, match=r"node7 is a symbolic link to .*gone, which does not exist$"):
        history.node_directory(tmp_path, "node7")
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(history.HistoryError, match=r"cannot create .*node8 \(no write permission in .*\)$"):
        history.node_directory(tmp_path, "node8")


def report_starting(start: str) -> RunReportRecord:
    report: Any = minimal_report()
    report["start_time"] = start
    return cast(RunReportRecord, report)


def test_each_run_is_kept_under_its_start_time_and_none_replaces_another(tmp_path: Path) -> None:
    directory = tmp_path / "h" / "node7"  # made when first needed
    first = report_starting("2026-11-24T10:15:00+00:00")
    path = history.keep(directory, first)
    assert path == directory / "20261124T101500Z.json"
    assert path.read_text() == as_json(first)  # what --gb-report writes
    # Two more runs starting in the same second, and one the next second: none replaces another's file.
    again = report_starting("2026-11-24T10:15:00.400+00:00")
    assert history.keep(directory, again).name == "20261124T101500Z_2.json"
    assert history.keep(directory, again).name == "20261124T101500Z_3.json"
    later = report_starting("2026-11-24T11:15:01+01:00")  # another offset: the name is UTC
    assert history.keep(directory, later).name == "20261124T101501Z.json"
    assert json.loads(path.read_text())["start_time"] == "2026-11-24T10:15:00+00:00"  # the first is untouched
    assert sorted(p.name for p in directory.iterdir()) == [
        "20261124T101500Z.json",
        "20261124T101500Z_2.json",
        "20261124T101500Z_3.json",
        "20261124T101501Z.json",
    ]  # no temporary file left behind


def test_entries_are_in_run_order_and_other_files_are_not_the_history_s(tmp_path: Path) -> None:
    names = [
        "20261124T101500Z_10.json",
        "20261124T101500Z_9.json",
        "20261124T101500Z.json",
        "20251231T235959Z.json",
        "20261124T101501Z.json",
    ]
    for name in [*names, "notes.txt", "latest.json", "20261345T000000Z.json", ".gbvalidate-1.tmp", "x.prom"]:
        (tmp_path / name).write_text("{}")
    order = [e.path.name for e in history.entries(tmp_path)]
    assert order == [
        "20251231T235959Z.json",
        "20261124T101500Z.json",
        "20261124T101500Z_9.json",
        "20261124T101500Z_10.json",
        "20261124T101501Z.json",
    ]
    assert history.entries(tmp_path / "absent") == []  # a node's first run: nothing yet
    entry = history.entry(tmp_path / "20261124T101500Z_9.json")
    assert entry is not None and (entry.start, entry.seq) == (
        dt.datetime(2026, 11, 24, 10, 15, tzinfo=dt.timezone.utc),
        9,
    )


def test_a_history_that_cannot_be_written_is_one_line_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "node7").write_text("a file, not the node's directory")
    with pytest.raises(OSError, match=r"^cannot write .*node7/20261124T101500Z\.json: ") as info:
        history.keep(tmp_path / "node7", report_starting("2026-11-24T10:15:00+00:00"))
    assert "\n" not in str(info.value)
