"""Setting precedence (command line > environment > ini > default) and errors that name the source."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_gbvalidate.setting_values import SettingError
from pytest_gbvalidate.settings import TABLE, Sources, bundled_baselines, resolve
from tests.helpers.runs import REPO


def sources(
    tmp_path: Path,
    cli: dict[str, str | bool | None] | None = None,
    env: dict[str, str] | None = None,
    ini: dict[str, str] | None = None,
) -> Sources:
    return Sources(cli=cli or {}, env=env or {}, ini=ini or {}, ini_file=tmp_path / "pytest.ini", cwd=tmp_path)


def test_defaults(tmp_path: Path) -> None:
    s = resolve(sources(tmp_path))
    assert (s.sku.value, s.sku.source) == ("auto", "default")
    assert s.baselines.value == bundled_baselines() and (s.baselines.value / "cpu.yaml").is_file()
    assert s.report.value is None and s.strict.value is False and s.record.value is None
    assert not s.explicit


def test_command_line_beats_environment_beats_ini(tmp_path: Path) -> None:
    ini = {"sku": "FROM_INI"}
    env = {"GBVALIDATE_SKU": "FROM_ENV"}
    assert resolve(sources(tmp_path, ini=ini)).sku.source == f"gb_sku in {tmp_path / 'pytest.ini'}"
    assert resolve(sources(tmp_path, env=env, ini=ini)).sku.value == "FROM_ENV"
    s = resolve(sources(tmp_path, cli={"sku": "FROM_CLI"}, env=env, ini=ini))
    assert (s.sku.value, s.sku.source) == ("FROM_CLI", "--gb-sku on the command line")
    assert s.explicit


def test_unset_values_fall_through(tmp_path: Path) -> None:
    s = resolve(sources(tmp_path, cli={"sku": None}, env={"OTHER": "1"}, ini={"sku": "X"}))
    assert s.sku.value == "X"


def test_an_empty_ini_value_means_unset(tmp_path: Path) -> None:
    # pytest reads a key that is present but empty as "", the same as an absent key: both mean unset.
    s = resolve(sources(tmp_path, ini={"sku": "", "strict": "", "report": ""}))
    assert (s.sku.value, s.sku.source, s.strict.value, s.report.value) == ("auto", "default", False, None)
    assert not s.explicit


@pytest.mark.parametrize("name", ["sku", "baselines", "report", "strict", "timeout", "reference_tools"])
@pytest.mark.parametrize("raw", ["", "  "])
def test_an_empty_environment_value_is_an_error(tmp_path: Path, name: str, raw: str) -> None:
    # GBVALIDATE_SKU= from a CI template whose variable was unset must not quietly mean `auto` (or false).
    variable = f"GBVALIDATE_{name.upper()}"
    with pytest.raises(SettingError) as excinfo:
        resolve(sources(tmp_path, env={variable: raw}, ini={"sku": "X"}))
    assert str(excinfo.value) == (
        f"{variable} in the environment: {raw!r}: set but empty: give a value, or leave it unset for the default"
    )


@pytest.mark.parametrize("name", ["sku", "baselines", "report", "timeout", "record"])
def test_an_empty_command_line_value_is_an_error(tmp_path: Path, name: str) -> None:
    flag = "--gb-" + name.replace("_", "-")
    with pytest.raises(SettingError, match=f"^{flag} on the command line: '': set but empty"):
        resolve(sources(tmp_path, cli={name: ""}, env={f"GBVALIDATE_{name.upper()}": "X"}))


def test_paths_are_relative_to_their_source(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    s = resolve(sources(tmp_path, ini={"baselines": "mine", "report": "out/r.json"}))
    assert s.baselines.value == tmp_path / "mine"
    assert s.report.value == tmp_path / "out" / "r.json"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cli": {"baselines": "nope"}}, "--gb-baselines on the command line: 'nope': no such directory"),
        ({"env": {"GBVALIDATE_BASELINES": "nope"}}, "GBVALIDATE_BASELINES in the environment: 'nope': no such"),
        ({"ini": {"baselines": "nope"}}, "gb_baselines in "),
        ({"env": {"GBVALIDATE_STRICT": "maybe"}}, "GBVALIDATE_STRICT in the environment: 'maybe': expected one of"),
        ({"cli": {"sku": "a b"}}, "--gb-sku on the command line: 'a b': a SKU name is ASCII letters"),
    ],
)
def test_errors_name_where_the_value_came_from(tmp_path: Path, kwargs: dict[str, dict[str, str]], message: str) -> None:
    with pytest.raises(SettingError) as excinfo:
        resolve(sources(tmp_path, **kwargs))  # type: ignore[arg-type]
    assert str(excinfo.value).startswith(message)


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("yes", True), ("ON", True), ("0", False), ("off", False)])
def test_booleans(tmp_path: Path, raw: str, value: bool) -> None:
    s = resolve(sources(tmp_path, env={"GBVALIDATE_STRICT": raw}))
    assert s.strict.value is value and s.explicit


@pytest.mark.parametrize(
    ("kwargs", "value", "source"),
    [
        ({}, None, "default"),
        ({"ini": {"timeout": "45"}}, 45.0, "gb_timeout in "),
        (
            {"env": {"GBVALIDATE_TIMEOUT": "2.5"}, "ini": {"timeout": "45"}},
            2.5,
            "GBVALIDATE_TIMEOUT in the environment",
        ),
        ({"cli": {"timeout": "600"}, "env": {"GBVALIDATE_TIMEOUT": "2.5"}}, 600.0, "--gb-timeout on the command line"),
    ],
)
def test_timeout_precedence(
    tmp_path: Path, kwargs: dict[str, dict[str, str]], value: float | None, source: str
) -> None:
    s = resolve(sources(tmp_path, **kwargs))  # type: ignore[arg-type]
    assert s.timeout.value == value and s.timeout.source.startswith(source)
    assert s.explicit is (value is not None)


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "nan", "inf", "1e999", "0.001", "1e12"])
def test_bad_timeouts_name_their_source(tmp_path: Path, raw: str) -> None:
    with pytest.raises(SettingError) as excinfo:
        resolve(sources(tmp_path, env={"GBVALIDATE_TIMEOUT": raw}))
    assert (
        str(excinfo.value)
        == f"GBVALIDATE_TIMEOUT in the environment: {raw!r}: a timeout is a number of seconds from 1 to 604800 (a week)"
    )


def test_reference_tools_setting(tmp_path: Path) -> None:
    assert resolve(sources(tmp_path)).reference_tools.value is False
    s = resolve(sources(tmp_path, ini={"reference_tools": "yes"}))
    assert s.reference_tools.value is True and s.explicit
    assert resolve(sources(tmp_path, cli={"reference_tools": True})).reference_tools.source == (
        "--gb-reference-tools on the command line"
    )
    with pytest.raises(SettingError, match=r"^gb_reference_tools in .*: 'perhaps': expected one of"):
        resolve(sources(tmp_path, ini={"reference_tools": "perhaps"}))


# --- files the run writes: the JSON report and a recorded baseline ------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cli": {"report": "out"}}, "--gb-report on the command line: 'out': is a directory: {tmp}/out"),
        (
            {"env": {"GBVALIDATE_REPORT": "out"}},
            "GBVALIDATE_REPORT in the environment: 'out': is a directory: {tmp}/out",
        ),
        ({"ini": {"report": "out"}}, "gb_report in {tmp}/pytest.ini: 'out': is a directory: {tmp}/out"),
        (
            {"cli": {"report": "notes.txt/r.json"}},
            "--gb-report on the command line: 'notes.txt/r.json': is under a file, not a directory: {tmp}/notes.txt",
        ),
        (
            {"env": {"GBVALIDATE_REPORT": "notes.txt/deeper/r.json"}},
            "GBVALIDATE_REPORT in the environment: 'notes.txt/deeper/r.json': is under a file, not a directory: "
            "{tmp}/notes.txt",
        ),
        ({"cli": {"record": "out"}}, "--gb-record on the command line: 'out': is a directory: {tmp}/out"),
        (
            {"cli": {"record": "notes.txt/X.yaml"}},
            "--gb-record on the command line: 'notes.txt/X.yaml': is under a file, not a directory: {tmp}/notes.txt",
        ),
        # Not there yet, still a module: JSON written as conftest.py broke every later run there.
        (
            {"env": {"GBVALIDATE_REPORT": "conftest.py"}},
            "GBVALIDATE_REPORT in the environment: 'conftest.py': {tmp}/conftest.py is a Python file (the suites' "
            "and tests' modules are inputs of a run)",
        ),
        # The recorded file's name is its SKU's: one --gb-sku could never name is refused, as --gb-sku refuses it.
        *(
            (
                {"cli": {"record": name}},
                f"--gb-record on the command line: {name!a}: a baseline is named <SKU>.yaml, and a SKU name is ASCII "
                "letters, digits, '_', '-' and '.' (not 'auto')",
            )
            for name in ("x y.yaml", "X.json", "auto.yaml", "n\u00e9.yaml")
        ),
    ],
)
def test_output_paths_are_checked_before_the_run(
    tmp_path: Path, kwargs: dict[str, dict[str, str]], message: str
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "notes.txt").write_text("a regular file\n")
    with pytest.raises(SettingError) as excinfo:
        resolve(sources(tmp_path, **kwargs))  # type: ignore[arg-type]
    assert str(excinfo.value) == message.format(tmp=tmp_path)


def test_a_scratch_directory_is_one_a_file_can_be_created_in(tmp_path: Path) -> None:
    """Tried, not os.access: root passes that everywhere, yet writes nothing in /proc. The storage checks then
    failed the node for it."""
    with pytest.raises(SettingError) as excinfo:
        resolve(sources(tmp_path, env={"GBVALIDATE_SCRATCH": "/proc"}))
    assert str(excinfo.value).startswith(
        "GBVALIDATE_SCRATCH in the environment: '/proc': cannot create files in /proc ("
    )
    s = resolve(sources(tmp_path, cli={"scratch": "."}))
    assert s.scratch.value == tmp_path / "." and list(tmp_path.iterdir()) == []  # the file tried is gone


def test_an_allowed_regression_without_a_comparison_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingError) as excinfo:
        resolve(sources(tmp_path, cli={"compare_fail": "5%"}))
    assert str(excinfo.value) == (
        "--gb-compare-fail on the command line: sets the regression --gb-compare allows, and no earlier report is "
        "named: --gb-compare PATH|last, GBVALIDATE_COMPARE or gb_compare"
    )
    # Standing configuration (the environment, an ini file) serves the runs that compare: the others ignore it.
    assert resolve(sources(tmp_path, env={"GBVALIDATE_COMPARE_FAIL": "5%"})).compare_fail.value is not None
    (tmp_path / "before.json").write_text("{}")
    assert resolve(sources(tmp_path, cli={"compare_fail": "5%", "compare": "before.json"})).compare.value is not None


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write in a read-only directory: nothing to refuse")
def test_an_unwritable_directory_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(SettingError) as excinfo:
            resolve(sources(tmp_path, cli={"report": "locked/sub/r.json"}))
    finally:
        locked.chmod(0o755)
    assert str(excinfo.value) == (
        f"--gb-report on the command line: 'locked/sub/r.json': cannot create files in {locked} (no write permission)"
    )


def test_an_unwritable_directory_is_refused_by_its_permission_bits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same check where it can run as root too: the answer os.access gives a user without write permission.
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != tmp_path)
    with pytest.raises(SettingError, match=r"^--gb-record on the command line: 'X.yaml': cannot create files in "):
        resolve(sources(tmp_path, cli={"record": "X.yaml"}))


def test_missing_directories_are_to_be_created_and_said_so(tmp_path: Path) -> None:
    s = resolve(sources(tmp_path, cli={"report": "runs/nightly/r.json", "record": "golden/X.yaml"}))
    assert s.report.value == tmp_path / "runs" / "nightly" / "r.json"
    assert s.created_dirs == (
        ("--gb-report on the command line", tmp_path / "runs"),
        ("--gb-record on the command line", tmp_path / "golden"),
    )
    assert not (tmp_path / "runs").exists()  # resolving writes nothing: the report creates it when written
    assert resolve(sources(tmp_path, cli={"report": "r.json"})).created_dirs == ()


def test_the_engine_python_is_a_command_whose_program_exists(tmp_path: Path) -> None:
    python = tmp_path / "nemo" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    s = resolve(sources(tmp_path, env={"GBVALIDATE_ENGINE_PYTHON": "nemo/bin/python"}))
    assert (s.engine_python.value, s.engine_python.source) == (
        (str(python),),
        "GBVALIDATE_ENGINE_PYTHON in the environment",
    )
    assert s.explicit
    launcher = 'sh -c \'exec "$0" "$@"\' python3'  # a launcher before the interpreter, quoted words kept whole
    cli = resolve(sources(tmp_path, cli={"engine_python": launcher})).engine_python.value
    assert cli == ("sh", "-c", 'exec "$0" "$@"', "python3")
    assert resolve(sources(tmp_path)).engine_python.value is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("no-such-launcher --container-image=x python", "'no-such-launcher' on PATH"),
        ("nemo/bin/python", "no executable file"),
        ("python 'unbalanced", "cannot split into words: No closing quotation"),
        ("''", "names no program"),
    ],
)
def test_a_bad_engine_python_names_its_source(tmp_path: Path, raw: str, message: str) -> None:
    with pytest.raises(SettingError) as info:
        resolve(sources(tmp_path, cli={"engine_python": raw}))
    assert str(info.value).startswith(f"--gb-engine-python on the command line: {raw!r}: ")
    assert message in str(info.value)


def test_a_sku_name_with_look_alike_or_invisible_characters_is_refused_and_shown_escaped(tmp_path: Path) -> None:
    for raw, shown in (("ND_\u041d100_v5", r"'ND_\u041d100_v5'"), ("ND_H100_v5\u200b", r"'ND_H100_v5\u200b'")):
        with pytest.raises(SettingError) as info:
            resolve(sources(tmp_path, cli={"sku": raw}))
        assert str(info.value) == (
            f"--gb-sku on the command line: {shown}: a SKU name is ASCII letters, digits, '_', '-' and '.' (or 'auto')"
        )


def test_each_option_s_help_gives_the_default_the_code_has() -> None:
    """A setting whose default is a word or a path says it in its help (`Default: auto.`), and the bundled baselines
    are the shipped ones; the defaults said in prose (--gb-timeout's, --gb-compare-fail's) are held by
    test_docstrings' restated."""
    from pytest_gbvalidate.setting_values import bundled_baselines

    said = {spec.name: " ".join(spec.help.split()) for spec in TABLE}
    words = {spec.name: spec.default() for spec in TABLE if isinstance(spec.default(), (str, Path))}
    assert words.pop("baselines") == bundled_baselines() and "Default: the baselines shipped" in said["baselines"]
    del words["window"]  # its help is made from window.DEFAULT_PATH itself, which the tests move
    assert set(words) == {"sku", "level", "world", "compute_domain"}
    for name, value in words.items():
        assert f"Default: {value}" in said[name], name


def test_contributing_names_every_level_of_the_level_table() -> None:
    from pytest_gbvalidate.levels import LEVELS

    assert f"the check levels ({', '.join(LEVELS)})" in (REPO / "CONTRIBUTING.md").read_text()


def test_the_settings_page_lists_every_setting_of_the_table_as_it_is_given() -> None:
    """docs/settings.md's table, between its markers, has a row per setting of settings.TABLE, in its order, with its
    option, environment variable and ini key (`-` where a command-line-only setting has none)."""
    page = (REPO / "docs" / "settings.md").read_text()
    table = page.split("<!-- settings-table:start -->")[1].split("<!-- settings-table:end -->")[0]
    rows = [[cell.strip().strip("`") for cell in line.strip().strip("|").split("|")] for line in table.splitlines()]
    rows = [row for row in rows if len(row) > 3 and row[0] not in ("name", "---")]
    documented = [(row[0], row[1].split()[0], row[2], row[3]) for row in rows]
    assert documented == [(s.name, s.option, s.env or "-", s.ini or "-") for s in TABLE]


# --- the Prometheus file, the history directory, --gb-compare=last ------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cli": {"prometheus": "out"}}, "--gb-prometheus on the command line: 'out': is a directory: {tmp}/out"),
        (
            {"env": {"GBVALIDATE_PROMETHEUS": "/dev/null"}},
            "GBVALIDATE_PROMETHEUS in the environment: '/dev/null': /dev/null is a character device, not a regular "
            "file: it is not replaced",
        ),
        (
            {"ini": {"prometheus": "link.prom"}},
            "gb_prometheus in {tmp}/pytest.ini: 'link.prom': {tmp}/link.prom is a symbolic link (to {tmp}/node.prom): "
            "name the file itself",
        ),
        (
            {"cli": {"history": "notes.txt"}},
            "--gb-history on the command line: 'notes.txt': is not a directory: {tmp}/notes.txt",
        ),
        (
            {"env": {"GBVALIDATE_HISTORY": "notes.txt/h"}},
            "GBVALIDATE_HISTORY in the environment: 'notes.txt/h': is under a file, not a directory: {tmp}/notes.txt",
        ),
        (
            {"cli": {"compare": "last"}},
            "--gb-compare on the command line: 'last' compares with this node's latest report in the history "
            "directory, and none is named: --gb-history DIR, GBVALIDATE_HISTORY or gb_history",
        ),
    ],
)
def test_the_prometheus_file_and_the_history_are_checked_before_the_run(
    tmp_path: Path, kwargs: dict[str, dict[str, str]], message: str
) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "notes.txt").write_text("a regular file\n")
    (tmp_path / "node.prom").write_text("")
    (tmp_path / "link.prom").symlink_to(tmp_path / "node.prom")
    with pytest.raises(SettingError) as excinfo:
        resolve(sources(tmp_path, **kwargs))  # type: ignore[arg-type]
    assert str(excinfo.value) == message.format(tmp=tmp_path)


def test_without_prometheus_client_the_prometheus_file_names_the_extra_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as where the package is not installed
    with pytest.raises(SettingError) as excinfo:
        resolve(sources(tmp_path, cli={"prometheus": "node.prom"}))
    assert str(excinfo.value) == (
        "--gb-prometheus on the command line: 'node.prom': needs prometheus-client: "
        "pip install 'pytest-gbvalidate[prometheus]'"
    )
    assert resolve(sources(tmp_path)).prometheus.value is None  # not asked for: nothing needed


def test_compare_last_reads_the_history_and_missing_directories_are_to_be_created(tmp_path: Path) -> None:
    (tmp_path / "last").write_text("{}")  # a file named `last` is ./last; `last` is the keyword
    s = resolve(sources(tmp_path, cli={"compare": "last", "history": "runs/h", "prometheus": "metrics/node.prom"}))
    assert (s.compare.value, s.history.value) == ("last", tmp_path / "runs" / "h")
    assert resolve(sources(tmp_path, cli={"compare": "./last"})).compare.value == tmp_path / "last"
    assert s.created_dirs == (
        ("--gb-prometheus on the command line", tmp_path / "metrics"),
        ("--gb-history on the command line", tmp_path / "runs"),
    )
    assert s.report_section()["compare"] == {"value": "last", "source": "--gb-compare on the command line"}
    assert resolve(sources(tmp_path, env={"GBVALIDATE_HISTORY": "runs"})).created_dirs == (
        ("GBVALIDATE_HISTORY in the environment", tmp_path / "runs"),
    )
    (tmp_path / "runs").mkdir()
    assert resolve(sources(tmp_path, env={"GBVALIDATE_HISTORY": "runs"})).created_dirs == ()
