"""End-to-end runs of the plugin through pytester on its settings: where the SKU comes from, and bad input (an
unknown SKU, a report path that cannot be written, an empty setting, a broken baseline) as a usage error: exit 4,
one line, no traceback."""

from __future__ import annotations

import json
import shutil

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from tests.helpers.runs import REPO, assert_usage_error


@pytest.mark.usefixtures("cpu_only_node")
def test_auto_detects_cpu_without_gpus_and_records_where_it_came_from(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(gb_target):\n    assert gb_target.sku == 'cpu'\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["gbvalidate: SKU cpu (no NVIDIA GPU or driver on this node); level full; baseline *cpu.yaml (bundled *"]
    )


@pytest.mark.usefixtures("cpu_only_node")  # where the built-in detector would say cpu
def test_a_site_hook_answers_before_the_built_in_detector(pytester: pytest.Pytester) -> None:
    """The hook's SKU holds. (Whether this node's GPUs are an H100's is the checks' to say: on a node without them
    the run fails once for that, gbvalidate::node_gpus_usable.)"""
    pytester.makeconftest(
        """
        from pytest_gbvalidate.sku import Detection
        def pytest_gbvalidate_detect_sku(config, baselines):
            assert "ND_GB200_v6" in [b.sku for b in baselines]
            return Detection("ND_H100_v5", "site rack database")
        """
    )
    pytester.makepyfile("def test_x(gb_target):\n    assert gb_target.baseline.sku == 'ND_H100_v5'\n")
    result = pytester.runpytest()
    assert result.parseoutcomes()["passed"] == 1
    result.stdout.fnmatch_lines(["gbvalidate: SKU ND_H100_v5 (site rack database)*"])


def test_unknown_sku(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gb-sku=NOPE")
    assert_usage_error(
        result,
        "ERROR: unknown SKU 'NOPE' (--gb-sku on the command line); known SKUs in *: ND96asr_v4, ND_GB200_v6, "
        "ND_H100_v5, ND_H200_v5, cpu. To bring up a new SKU, record a baseline on a golden node: pytest --gb-sku=NOPE "
        "--gb-record=*NOPE.yaml suites/",
    )


def test_unknown_sku_from_the_environment_says_so(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GBVALIDATE_SKU", "NOPE")
    assert_usage_error(pytester.runpytest(), "ERROR: unknown SKU 'NOPE' (GBVALIDATE_SKU in the environment)*")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--gb-report=out"], "ERROR: --gb-report on the command line: 'out': is a directory: *out"),
        (
            ["--gb-report=notes.txt/r.json"],
            "ERROR: --gb-report on the command line: 'notes.txt/r.json': is under a file, not a directory: *notes.txt",
        ),
        (["--gb-record=out"], "ERROR: --gb-record on the command line: 'out': is a directory: *out"),
    ],
)
def test_a_report_path_that_cannot_be_written_stops_the_run_at_once(
    lab: pytest.Pytester, args: list[str], error: str
) -> None:
    (lab.path / "out").mkdir()
    (lab.path / "notes.txt").write_text("a regular file\n")
    result = lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines", *args)
    assert_usage_error(result, error)
    result.stdout.no_fnmatch_line("*test_checks.py*")  # before any test ran


def test_a_missing_report_directory_is_created_and_said_so(lab: pytest.Pytester) -> None:
    result = lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines", "--gb-report=runs/nightly/r.json", "-k", "pass")
    result.assert_outcomes(passed=1, deselected=5)
    result.stdout.fnmatch_lines(["gbvalidate: --gb-report on the command line: creating missing directory *runs"])
    report = json.loads((lab.path / "runs" / "nightly" / "r.json").read_text())
    assert report["created_directories"] == [{"path": str(lab.path / "runs"), "for": "--gb-report on the command line"}]
    assert report["settings"]["report"] == {
        "value": str(lab.path / "runs" / "nightly" / "r.json"),
        "source": "--gb-report on the command line",
    }


@pytest.mark.parametrize("name", ["SKU", "STRICT"])
def test_an_empty_environment_variable_is_a_usage_error(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(f"GBVALIDATE_{name}", "")
    pytester.makepyfile("def test_x(gb_target):\n    pass\n")
    assert_usage_error(
        pytester.runpytest(),
        f"ERROR: GBVALIDATE_{name} in the environment: '': set but empty: give a value, or leave it unset for the "
        "default",
    )


@pytest.mark.usefixtures("cpu_only_node")
def test_an_empty_ini_value_means_unset(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngb_sku =\ngb_strict =\n")  # pytest reads these as it reads absent keys
    pytester.makepyfile("def test_x(gb_target):\n    assert gb_target.sku == 'cpu'\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["gbvalidate: SKU cpu (no NVIDIA GPU or driver on this node); *"])


def test_bad_ini_value_names_the_ini_file(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngb_baselines = missing_dir\n")
    assert_usage_error(pytester.runpytest(), "ERROR: gb_baselines in *tox.ini: 'missing_dir': no such directory: *")


def test_missing_baselines_directory(pytester: pytest.Pytester) -> None:
    assert_usage_error(
        pytester.runpytest("--gb-baselines=nowhere"),
        "ERROR: --gb-baselines on the command line: 'nowhere': no such directory: *nowhere",
    )


# Nested aliases: six levels of nine, half a million strings once expanded (nine levels took 54 s and 5.9 GB).
ALIAS_BOMB = (
    "[&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol], "
    + ", ".join(f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 7))
    + "]"
)


@pytest.mark.parametrize(
    ("corruption", "error"),
    [
        (("    unit: GB/s\n", "    unit: [GB/s\n"), "ERROR: bad baseline: *LAB.yaml:*:*: YAML syntax error: *"),
        (
            ("    direction: lower\n", "    direction: sideways\n"),
            "ERROR: bad baseline: *LAB.yaml:25: metrics.step_time_s.direction: 'sideways' is not one of higher, lower",
        ),
        (
            ("    unit: s\n", "    unit: fortnights\n"),
            "ERROR: bad baseline: *LAB.yaml:24: metrics.step_time_s.unit: unknown unit 'fortnights' (known: *)",
        ),
        (
            ("description: a lab SKU", "description: " + ALIAS_BOMB),
            "ERROR: bad baseline: *LAB.yaml:3: alias 'a2': aliases stand for more than 1000 nodes (a baseline needs *)",
        ),
        (
            ("    expected: 100\n", "    expected: -10.9\n"),
            "ERROR: bad baseline: *LAB.yaml:10: metrics.host_copy_bandwidth_gbps.expected: -10.9: must be above 0 *",
        ),
    ],
)
def test_corrupted_baseline(lab: pytest.Pytester, corruption: tuple[str, str], error: str) -> None:
    path = lab.path / "baselines" / "LAB.yaml"
    path.write_text(path.read_text().replace(*corruption))
    assert_usage_error(lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines"), error)


def test_a_baseline_that_is_not_utf8_is_a_usage_error(lab: pytest.Pytester) -> None:
    path = lab.path / "baselines" / "LAB.yaml"
    path.write_bytes(path.read_bytes().replace(b"a lab SKU", b"a lab SKU \xff"))
    assert_usage_error(
        lab.runpytest("--gb-sku=LAB", "--gb-baselines=baselines"),
        "ERROR: bad baseline: *LAB.yaml:3: not UTF-8 text (byte 0xff at offset 50)",
    )


@pytest.mark.usefixtures("cpu_only_node")
def test_corrupted_baseline_stops_auto_detection_too(pytester: pytest.Pytester) -> None:
    shutil.copytree(REPO / "baselines", pytester.path / "b")
    (pytester.path / "b" / "ND_H100_v5.yaml").write_text("schema_version: 1\nsku: ND_H100_v5\nmetrics:\n  - oops\n")
    pytester.makepyfile("def test_x(gb_target):\n    pass\n")
    assert_usage_error(
        pytester.runpytest("--gb-baselines=b"), "ERROR: bad baseline: *ND_H100_v5.yaml:3: metrics: must be a mapping*"
    )


def test_list_skus(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gb-list-skus")
    assert result.ret == 0
    result.stdout.fnmatch_lines(
        [
            "ND_GB200_v6 *Azure ND GB200 v6 (4x NVIDIA GB200, 2x Grace)*provisional*",
            "cpu *measured*",
            "(baselines in *)",
        ]
    )


def test_a_run_from_the_checkout_reads_the_checkout_s_baselines_and_the_header_says_why(
    pytester: pytest.Pytester,
) -> None:
    """Whichever copy of the plugin is imported (plain `pytest` after `pip install .` imports the installed one),
    the checkout's ini file names its own baselines; a project with none gets the bundled copy, said so too."""
    result = pytester.runpytest_subprocess(str(REPO / "suites"), "--gb-sku=cpu", "--collect-only", "-q")
    ini = REPO / "pyproject.toml"
    result.stdout.fnmatch_lines(
        [f"gbvalidate: SKU cpu (*); level full; baseline {REPO}/baselines/cpu.yaml (gb_baselines in {ini});*"]
    )
    pytester.makepyfile("def test_x(gb_target):\n    pass\n")
    pytester.runpytest("--gb-sku=cpu").stdout.fnmatch_lines(["*; baseline *cpu.yaml (bundled with the plugin);*"])
