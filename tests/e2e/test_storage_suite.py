"""The storage checks on the cpu SKU end to end: real writes to a temporary scratch directory pass the cpu floors;
a device that fills up mid-write and a directory that refuses new files are clear failures; nothing is left
behind; fio runs beside ours when asked. (The measurement called directly: unit/test_storage.py.)"""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest

from pytest_gbvalidate.bench import storage
from tests.helpers.fakenode import nd96asr_v4
from tests.helpers.runs import SUITES, XUNIT1, assert_usage_error, junit_cases
from tests.helpers.scratch import leftovers

STORAGE = str(SUITES / "test_storage.py")
METRICS = ["scratch_write_gbps", "scratch_read_gbps", "checkpoint_write_s", "checkpoint_read_s"]


def test_the_scratch_directory_is_measured_and_left_clean(pytester: pytest.Pytester, tmp_path: Path) -> None:
    scratch = tmp_path / "nvme"
    scratch.mkdir()
    result = pytester.runpytest(STORAGE, "--gb-sku=cpu", f"--gb-scratch={scratch}", "--gb-report=r.json", *XUNIT1)
    result.assert_outcomes(passed=2, skipped=1)  # fio runs only with --gb-reference-tools
    report = json.loads((pytester.path / "r.json").read_text())
    measured = {m["metric"]: m for m in report["measurements"]}
    assert list(measured) == METRICS
    assert all(m["value"] > 0 and m["verdict"] == "pass" for m in measured.values())
    assert measured["scratch_write_gbps"]["details"]["size_bytes"] == 64 * 2**20  # the cpu baseline's params
    assert measured["checkpoint_read_s"]["details"]["directory"] == str(scratch)
    # Each figure the best of three passes, every pass in the details: the highest rate, the shortest time.
    for metric, key, best in (
        ("scratch_write_gbps", "write_gbps_passes", max),
        ("scratch_read_gbps", "read_gbps_passes", max),
        ("checkpoint_write_s", "write_s_passes", min),
        ("checkpoint_read_s", "read_s_passes", min),
    ):
        passes = measured[metric]["details"][key]
        assert len(passes) == 3 and measured[metric]["value"] == best(passes), measured[metric]["details"]
        assert measured[metric]["details"]["rule"] == "best of 3 passes"
    assert report["settings"]["sku"]["value"] == "cpu" and leftovers(scratch) == []


# A plugin for a pytest subprocess: files may grow to 8 MiB at most, as on a device with that much room left
# (the kernel then refuses the write; SIGXFSZ, which would kill the process first, is ignored).
FULL_DEVICE = """\
import resource, signal

def pytest_configure(config):
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 2**20, resource.RLIM_INFINITY))
"""


def test_a_device_that_fills_up_is_a_clear_failure_with_nothing_left(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(full_device=FULL_DEVICE)
    scratch = tmp_path / "nvme"
    scratch.mkdir()
    result = pytester.runpytest_subprocess(
        STORAGE, "--gb-sku=cpu", f"--gb-scratch={scratch}", "-p", "full_device", "--junitxml=r.xml"
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    cases = junit_cases(pytester.path / "r.xml")
    sequential = cases["test_scratch_throughput"]["message"] or ""
    assert sequential.startswith(f"Failed: scratch {scratch}: writing {scratch}/gbvalidate-scratch-"), sequential
    assert "sequential.bin" in sequential and ("File too large" in sequential or "short write" in sequential)
    checkpoint = cases["test_checkpoint_write_and_read"]["message"] or ""
    assert checkpoint.startswith(f"Failed: scratch {scratch}: writing the checkpoint {scratch}/"), checkpoint
    assert "failed after 8 of 32 MiB (" in checkpoint, checkpoint
    assert leftovers(scratch) == []


@pytest.mark.parametrize("scratch", ["/sys", "/proc"])
def test_a_directory_that_refuses_new_files_is_a_usage_error_not_the_node_s_fault(
    pytester: pytest.Pytester, scratch: str
) -> None:
    # No one, root included, may create a file there (as on a volume mounted read-only): the setting is wrong, the
    # node is not, so no check runs to blame it.
    result = pytester.runpytest(STORAGE, "--gb-sku=cpu", f"--gb-scratch={scratch}", *XUNIT1)
    assert_usage_error(
        result, f"ERROR: --gb-scratch on the command line: '{scratch}': cannot create files in {scratch} (*)"
    )
    assert not (pytester.path / "r.xml").exists()


def test_a_gpu_sku_without_a_scratch_directory_skips_saying_how_to_name_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:

    nd96asr_v4().install(monkeypatch, tmp_path)
    result = pytester.runpytest(STORAGE, "--gb-sku=ND96asr_v4", "-rs")
    result.assert_outcomes(skipped=3)
    result.stdout.fnmatch_lines(["*no scratch directory named: --gb-scratch DIR, GBVALIDATE_SCRATCH or gb_scratch*"])


def stand_in_fio(bin_dir: Path) -> None:
    """A fio that notes its arguments and reports 2.5 GB/s writing and 3.25 GB/s reading, as fio's JSON does."""
    echo = shutil.which("echo")
    script = bin_dir / "fio"
    write = json.dumps({"fio version": "fio-3.36", "jobs": [{"jobname": "gbvalidate", "write": {"bw_bytes": 2.5e9}}]})
    read = json.dumps({"fio version": "fio-3.36", "jobs": [{"jobname": "gbvalidate", "read": {"bw_bytes": 3.25e9}}]})
    script.write_text(
        f'#!/bin/sh\n{echo} "$@" >> {bin_dir}/args\n'
        f"case \"$*\" in *--rw=write*) {echo} '{write}';; *) {echo} '{read}';; esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_fio_runs_beside_ours_when_asked(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bin_dir, scratch = tmp_path / "bin", tmp_path / "nvme"
    bin_dir.mkdir()
    scratch.mkdir()
    stand_in_fio(bin_dir)
    monkeypatch.setenv("PATH", str(bin_dir))
    args = [STORAGE, "--gb-sku=cpu", f"--gb-scratch={scratch}", "--gb-report=r.json", "--gb-reference-tools"]
    pytester.runpytest(*args, "-k", "fio").assert_outcomes(passed=1)
    report = json.loads((pytester.path / "r.json").read_text())
    direct = storage.direct_io_supported(scratch)  # not on tmpfs: fio is asked for what our own check could do
    assert [
        (m["metric"], m["value"], m["details"]["tool"], m["details"]["direct_io"]) for m in report["measurements"]
    ] == [
        ("scratch_write_gbps", 2.5, "fio", direct),
        ("scratch_read_gbps", 3.25, "fio", direct),
    ]
    write, read = (bin_dir / "args").read_text().splitlines()
    assert "--rw=write" in write and f"--direct={int(direct)}" in write and "--size=67108864" in write
    assert "--rw=read" in read
    assert f"--filename={scratch}/gbvalidate-scratch-" in write and leftovers(scratch) == []
