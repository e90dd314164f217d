"""Sweep mode with a stand-in trainer: invalid layouts, out-of-memory and failed points are recorded and the
sweep moves on; the table names the best layout; CSV, JSON and plots are written."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from pytest_gbvalidate.files import atomic_write_bytes
from pytest_gbvalidate.ranks.gang import GangError
from pytest_gbvalidate.workloads.llama import layout_grid
from pytest_gbvalidate.workloads.llama.config import LLAMA3_TINY
from pytest_gbvalidate.workloads.llama.flops import Peak
from pytest_gbvalidate.workloads.llama.parallel import Layout
from pytest_gbvalidate.workloads.llama.request import TrainRequest
from pytest_gbvalidate.workloads.llama.results import MemoryPeak, PretrainResult, pretrain_result

GRID = {"mbs": [1, 2, 4], "tp": [1, 2], "pp": [1], "cp": [1]}


def fake_train(layout: Layout) -> PretrainResult:
    """Step time 1 s / MBS; MBS 4 runs out of memory on a GPU; TP=2 at MBS 2 fails otherwise."""
    if layout.mbs == 4:
        raise GangError(1, "raised", "train_worker: torch.OutOfMemoryError: CUDA out of memory. Tried to ...")
    if layout.tp == 2 and layout.mbs == 2:
        raise GangError(0, "timed out", "train_worker did not finish within 60 s")
    request = TrainRequest(LLAMA3_TINY, layout, warmup_steps=1, timed_steps=10, learning_rate=1e-3)
    memory = [MemoryPeak("device max allocated", 10.0 * layout.mbs)]
    return pretrain_result(request, [1.0 / layout.mbs] * 10, [6.0, 5.0], memory, peak=Peak(1.0, "a test's peak"))


class FakeSampler:
    def __enter__(self) -> FakeSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def summary(self) -> dict[str, dict[str, float]]:
        return {
            "gpu0.utilization_pct": {"mean": 90.0, "p5": 80.0, "p95": 99.0},
            "gpu1.utilization_pct": {"mean": 70.0, "p5": 60.0, "p95": 79.0},
            "cpu.utilization_pct": {"mean": 5.0, "p5": 1.0, "p95": 9.0},
            "gpu0.sm_clock_mhz": {"mean": 1900.0, "p5": 1800.0, "p95": 1980.0},
        }


def test_a_sweep_records_every_point_and_names_the_fastest(tmp_path: Path) -> None:
    points = layout_grid.sweep(LLAMA3_TINY, 4, 16, GRID, fake_train, sample=FakeSampler)
    status = {(p.mbs, p.tp): p.status for p in points}
    assert status == {
        (1, 1): "ok",
        (1, 2): "ok",
        (2, 1): "ok",
        (2, 2): "failed",
        (4, 1): "oom",
        (4, 2): "oom",
    }
    oom = next(p for p in points if p.status == "oom")
    assert (
        oom.reason == "GangError: rank 1 raised: train_worker: torch.OutOfMemoryError: CUDA out of memory. Tried to ..."
    )
    winner = layout_grid.best(points)
    assert winner is not None and (winner.mbs, winner.tp, winner.dp) == (2, 1, 4)
    assert winner.telemetry_mean("utilization_pct") == 80.0  # GPUs only, not the host
    assert winner.telemetry_mean("sm_clock_mhz") == 1900.0

    written = layout_grid.write_outputs(points, tmp_path, atomic_write_bytes)
    assert [p.name for p in written] == [
        "sweep.md",
        "sweep.csv",
        "sweep.json",
        "sweep_mbs.png",
        "sweep_tp.png",
        "sweep_pp.png",
        "sweep_cp.png",
    ]
    table = (tmp_path / "sweep.md").read_text()
    assert "| 2 | 1 | 1 | 1 | 4 | ok | 0.5 | 512 |" in table
    assert table.endswith("Best layout: native-bf16-mbs2-gbs16-tp1-pp1-cp1-dp4-seq64 (0.5 s per step)\n")
    with (tmp_path / "sweep.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "failed", "oom", "oom"]
    assert rows[2]["peak_memory_gib"] == "20.0"
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert doc["best"] == "native-bf16-mbs2-gbs16-tp1-pp1-cp1-dp4-seq64"
    for png in written[3:]:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_grid_and_the_table_name_the_layouts_sizes_in_their_order() -> None:
    """Read from the layout's sizes (parallel.SIZES), as the sweep's files have always named them."""
    assert layout_grid.PARAMETERS == ("mbs", "tp", "pp", "cp")
    assert layout_grid.DEFAULT_GRID == {"mbs": [1, 2, 4, 8, 16], "tp": [1, 2, 4], "pp": [1, 2, 4], "cp": [1, 2, 4]}
    columns = (
        *("mbs", "tp", "pp", "cp", "dp", "status", "step_time_s", "tokens_per_s_per_gpu", "mfu_pct"),
        *("mfu_peak_tflops", "mfu_peak_source", "peak_memory_gib", "gpu_utilization_pct", "sm_clock_mhz", "reason"),
    )
    assert columns == layout_grid.COLUMNS
    fields = [f.name for f in dataclasses.fields(layout_grid.SweepPoint)]
    assert tuple(fields[: len(layout_grid.PARAMETERS)]) == layout_grid.PARAMETERS


def test_invalid_layouts_say_why_without_training() -> None:
    def never(layout: Layout) -> PretrainResult:
        raise AssertionError(f"trained {layout}")

    grid = {"mbs": [3], "tp": [4], "pp": [3], "cp": [1]}
    (point,) = layout_grid.sweep(LLAMA3_TINY, 6, 16, grid, never)
    assert point.status == "invalid"
    assert point.reason == "TP*PP*CP = 4*3*1 = 12 does not divide the world of 6 ranks"
    (point,) = layout_grid.sweep(LLAMA3_TINY, 3, 16, {"mbs": [3], "tp": [1], "pp": [3], "cp": [1]}, never)
    assert point.reason == (
        "4 layers do not split into PP=3 equal pipeline stages; GBS 16 is not divisible by MBS*DP = 3*1"
    )


@pytest.mark.parametrize(
    ("error", "oom"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (GangError(0, "raised", "torch.OutOfMemoryError: ..."), True),
        (GangError(0, "crashed", "process exited with code -9"), False),
    ],
)
def test_out_of_memory_is_told_apart_from_other_failures(error: Exception, oom: bool) -> None:
    assert layout_grid.is_oom(error) is oom


def test_the_command_line_is_an_application_of_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m pytest_gbvalidate.layout_sweep`: a baseline without a pretrain section is refused before any rank
    starts (what the sweep trains comes from the SKU's baseline)."""
    from pytest_gbvalidate.layout_sweep.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--sku", "ND_H100_v5", "--out", str(tmp_path)])
    assert info.value.code == 2
    assert "the ND_H100_v5 baseline has no pretrain section" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    for sizes in ("0", "1,-2", "x", "9" * 5000):  # no layout of any node: refused before the baseline is read
        with pytest.raises(SystemExit) as info:
            main(["--sku", "cpu", "--out", str(tmp_path), "--tp", sizes])
        assert info.value.code == 2
        assert "argument --tp: " in (err := capsys.readouterr().err) and "whole numbers from 1 to 1024" in err


@pytest.fixture
def no_rank_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gbvalidate.ranks import gang

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a rank started")

    monkeypatch.setattr(gang, "LocalGang", refuse)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--sku", "bogus"], "argument --sku: no baseline for bogus in {bundled} (known SKUs: ND96asr_v4, "),
        (["--sku", ""], "argument --sku: is empty"),
        (["--sku", "../../etc/passwd"], "argument --sku: '../../etc/passwd': a SKU name is ASCII letters, "),
        (["--sku", "cpu", "--baselines", "/nonexistent"], "argument --baselines: '/nonexistent': no such directory"),
        (["--sku", "cpu", "--baselines", "{tmp}/a-file"], "argument --baselines: '{tmp}/a-file': no such directory"),
        (
            ["--sku", "cpu", "--baselines", "{tmp}/broken"],
            "argument --sku: bad baseline: {tmp}/broken/cpu.yaml:2:1: YAML syntax error",
        ),
        (["--sku", "cpu", "--out", "{tmp}/a-file"], "argument --out: {tmp}/a-file: is not a directory"),
        (["--sku", "cpu", "--out", "{tmp}/a-file/x"], "argument --out: {tmp}/a-file/x: cannot make the directory: "),
        (["--sku", "cpu", "--out", "/proc/x"], "argument --out: /proc/x: cannot make the directory: "),
        (["--sku", "cpu", "--out", ""], "argument --out: is empty"),
        (["--sku", "cpu", "--out", "{tmp}/linked"], "argument --out: {tmp}/linked: sweep.md is a symbolic link (to "),
    ],
)
@pytest.mark.usefixtures("no_rank_starts")
def test_the_command_line_refuses_what_it_cannot_use_before_the_sweep(
    args: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each is one line naming the option, exit 2, before any rank starts: the sweep runs for hours and its results
    would be lost. A sweep.md that is a link is refused (the file it points to is not overwritten)."""
    from pytest_gbvalidate.layout_sweep.cli import main
    from pytest_gbvalidate.setting_values import bundled_baselines

    (tmp_path / "a-file").write_text("precious\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "cpu.yaml").write_text("schema_version: [\n")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "sweep.md").symlink_to(tmp_path / "a-file")
    given = [a.format(tmp=tmp_path) for a in args]
    if "--out" not in given:
        given += ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as info:
        main(given)
    assert info.value.code == 2
    err = capsys.readouterr().err
    expected = said.format(tmp=tmp_path, bundled=bundled_baselines())
    assert err.startswith(f"python -m pytest_gbvalidate.layout_sweep: error: {expected}") and err.count("\n") == 1, err
    assert (tmp_path / "a-file").read_text() == "precious\n" and not (tmp_path / "out").exists()


def test_the_table_outlives_a_file_that_cannot_be_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Something takes sweep.json's name while the sweep runs: the table is printed all the same, the failed file
    named in one line, exit 1; the files are written whole (sweep.md is there, no temporary file stays)."""
    from pytest_gbvalidate.layout_sweep import cli
    from pytest_gbvalidate.ranks import gang

    class NoGang:
        def __init__(self, *_args: object, **_kwargs: object) -> None:
            pass

        def close(self) -> None:
            pass

    def sweep_then_obstacle(*_args: object, **_kwargs: object) -> list[layout_grid.SweepPoint]:
        (tmp_path / "out" / "sweep.json").mkdir()
        return layout_grid.sweep(LLAMA3_TINY, 4, 16, GRID, fake_train, sample=FakeSampler)

    monkeypatch.setattr(gang, "LocalGang", NoGang)
    monkeypatch.setattr(cli, "native_trainer", lambda *_args: fake_train)
    monkeypatch.setattr(cli, "sweep", sweep_then_obstacle)
    assert cli.main(["--sku", "cpu", "--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert "Best layout: " in captured.out
    assert captured.err == (
        f"python -m pytest_gbvalidate.layout_sweep: error: {tmp_path / 'out' / 'sweep.json'}: is a directory, not a "
        "regular file: it is not replaced\n"
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sweep.csv", "sweep.json", "sweep.md"]
