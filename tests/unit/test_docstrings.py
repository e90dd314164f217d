"""Words tied to code: every module, file and page a docstring of the package or the suites names exists, and the
figures the help texts and the documentation restate are the constants they state."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "pytest_gbvalidate"
SOURCES = sorted([*PACKAGE.rglob("*.py"), *(REPO / "suites").rglob("*.py")])
# The packages shipped under another name than their directory's.
SHIPPED_AS = {"suites": REPO / "suites", "bundled_baselines": REPO / "baselines"}
# The Slurm health check: its script, the settings file beside it, their README.
HC_SCRIPT = REPO / "contrib" / "slurm" / "gbvalidate-healthcheck.sh"
HC_CONF = REPO / "contrib" / "slurm" / "gbvalidate-healthcheck.conf"
HC_README = REPO / "contrib" / "slurm" / "README.md"

# `records.py`, `rules/resolution.py`, `tests/unit/test_settings.py`; `docs/fleet.md`; `pytest_gbvalidate.fleet.cli`.
FILE = re.compile(r"(?<![\w./<>-])((?:[\w.-]+/)*[\w-]+\.py|docs/[\w-]+\.md)\b")
DOTTED = re.compile(r"\bpytest_gbvalidate(?:\.\w+)+")


def docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of the module's, every class's and every function's docstring."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield node.body[0].lineno, text


def references(path: Path) -> Iterator[tuple[int, str]]:
    """(line, name) of every file, page and dotted module a docstring of `path` names."""
    for line, text in docstrings(path):
        for pattern in (FILE, DOTTED):
            for found in pattern.finditer(text):
                yield line + text.count("\n", 0, found.start()), found.group(0)


def _bare_names() -> set[str]:
    everywhere = [*PACKAGE.rglob("*.py"), *(REPO / "suites").rglob("*.py"), *REPO.glob("*.py")]
    return {p.name for p in everywhere}


BARE_NAMES = _bare_names()


def file_exists(name: str, source: Path) -> bool:
    """A path with a directory: from the repository's root, the package's, or the naming module's directory. A bare
    name: in the naming module's directory, else anywhere in the package, the suites or the repository's root --
    except in a package's own docstring (its `__init__.py`), which names that package's modules."""
    if "/" in name:
        return any((base / name).exists() for base in (REPO, PACKAGE, source.parent))
    if source.name == "__init__.py":
        return (source.parent / name).exists()
    return (source.parent / name).exists() or name in BARE_NAMES


def _module_file(parts: list[str]) -> Path | None:
    """The file of the module `pytest_gbvalidate.<parts>` (a package's `__init__.py`), or None."""
    base = SHIPPED_AS.get(parts[0], PACKAGE / parts[0]) if parts else PACKAGE
    path = base.joinpath(*parts[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return path if parts and path.is_dir() else None  # a data package (the bundled baselines)


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def module_exists(dotted: str) -> bool:
    """`pytest_gbvalidate.a.b`: a module or package, or a name one of them defines at its top level."""
    parts = dotted.split(".")[1:]
    for cut in range(len(parts), -1, -1):
        found = _module_file(parts[:cut])
        if found is not None:
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and found.suffix == ".py" and rest[0] in _top_level_names(found))
    return False


def stale_references() -> list[str]:
    stale = []
    for path in SOURCES:
        for line, name in references(path):
            exists = module_exists(name) if name.startswith("pytest_gbvalidate.") else file_exists(name, path)
            if not exists:
                stale.append(f"{path.relative_to(REPO)}:{line}: {name}")
    return stale


def test_every_module_file_and_page_a_docstring_names_exists() -> None:
    assert len(SOURCES) > 100  # the package and the suites were found
    assert stale_references() == []


def test_the_reference_check_finds_a_name_that_does_not_exist(tmp_path: Path) -> None:
    """The check itself: each form of name is read, and one that names nothing is found."""
    source = PACKAGE / "report" / "terminal.py"
    assert file_exists("records.py", source) and file_exists("rules/resolution.py", source)
    assert file_exists("fleet/summary.py", source) and file_exists("suites/test_health.py", source)
    assert file_exists("tests/unit/test_settings.py", source) and file_exists("docs/noise.md", source)
    assert file_exists("contrib/slurm/gbvalidate-healthcheck.sh", source)
    assert file_exists("conftest.py", source)
    assert not file_exists("html.py", source) and not file_exists("docs/nowhere.md", source)
    assert not file_exists("workloads/llama/sweep.py", source)
    assert not file_exists("junit.py", PACKAGE / "report" / "__init__.py")  # fleet/'s, not the report package's
    assert module_exists("pytest_gbvalidate.fleet") and module_exists("pytest_gbvalidate.suites")
    assert module_exists("pytest_gbvalidate.report.schema") and module_exists(
        "pytest_gbvalidate.hooks.GbValidateWarning"
    )
    assert not module_exists("pytest_gbvalidate.report.html") and not module_exists("pytest_gbvalidate.hooks.Nothing")
    written = tmp_path / "module.py"
    written.write_text('"""Made by html.py and run.py, see pytest_gbvalidate.nowhere and docs/fleet.md."""\n')
    assert [name for _, name in references(written)] == [
        "html.py",
        "run.py",
        "docs/fleet.md",
        "pytest_gbvalidate.nowhere",
    ]


# --- the figures the help texts and the pages restate --------------------------------------------------------


def flat(text: str) -> str:
    """`text` with every run of whitespace one space: a phrase is found across a page's line breaks."""
    return " ".join(text.split())


def page(name: str) -> str:
    return flat((REPO / name).read_text(encoding="utf-8"))


def setting_help(name: str) -> str:
    from pytest_gbvalidate.settings import TABLE

    return flat(next(spec.help for spec in TABLE if spec.name == name))


def restated() -> list[tuple[str, str, str]]:
    """(where, its text, the phrase it must hold, made from the constants it states): texts that cannot be made
    from the constant themselves (a page; a help text whose module may not import the constant's; a docstring)."""
    from pytest_gbvalidate.fleet import drain
    from pytest_gbvalidate.fleet.history import DEFAULT_FAILED, DEFAULT_OF
    from pytest_gbvalidate.healthcheck import cli, npd, slurm
    from pytest_gbvalidate.healthcheck.level_run import KILL_GRACE_S
    from pytest_gbvalidate.rules import breaker, noise, outliers
    from pytest_gbvalidate.rules.allowed import compare_fail_default
    from pytest_gbvalidate.run.gangs import DEFAULT_TIMEOUT_S
    from pytest_gbvalidate.workloads.llama.layout_grid import DEFAULT_GRID

    gpu_s, cpu_s = DEFAULT_TIMEOUT_S["gpu"], DEFAULT_TIMEOUT_S["cpu"]
    passive_s, quick_s = cli.default_deadline_s("passive"), cli.default_deadline_s("quick")
    room_s = slurm.HEALTH_CHECK_KILL_S - slurm.RESERVE_S
    half_again = {1.5: "half again"}[cli.DEADLINE_FACTOR]
    mbs, tp, pp, cp = (DEFAULT_GRID[name] for name in ("mbs", "tp", "pp", "cp"))
    assert tp == pp == cp, "docs/pretraining.md gives TP, PP and CP one range"
    integrations, fleet = page("docs/integrations.md"), page("docs/fleet.md")
    return [
        ("--gb-timeout's help", setting_help("timeout"), f"Default: {gpu_s:g} on GPU SKUs, {cpu_s:g} on cpu."),
        ("--gb-compare-fail's help", setting_help("compare_fail"), f"Default: {compare_fail_default()}."),
        ("docs/settings.md", page("docs/settings.md"), f"| {gpu_s:g} on GPU SKUs, {cpu_s:g} on `cpu` |"),
        ("docs/settings.md", page("docs/settings.md"), f"| {compare_fail_default()} |"),
        ("docs/history.md", page("docs/history.md"), f"`--gb-compare-fail` {compare_fail_default()}"),
        (
            "docs/levels.md",
            page("docs/levels.md"),
            f"({half_again} the budget, {passive_s:g} s; {room_s:g} s within slurmd's "
            f"{slurm.HEALTH_CHECK_KILL_S:g} s HealthCheckProgram limit)",
        ),
        (
            "docs/integrations.md",
            integrations,
            f"(default {half_again} the level's budget on a 4-GPU node: {passive_s:g} s passive, {quick_s:g} s quick; "
            f"{cli.MIN_DEADLINE_S:g} s at least",
        ),
        ("docs/integrations.md", integrations, f"and SIGKILL {KILL_GRACE_S:g} s later"),
        (
            "docs/integrations.md",
            integrations,
            f"the limit less {slurm.RESERVE_S:g} s (Python's start-up, the interrupted run's report, two `scontrol` "
            f"calls of {slurm.SCONTROL_TIMEOUT_S:g} s at most): {room_s:g} s by default",
        ),
        ("docs/integrations.md", integrations, f"| {slurm.EXIT_TIMEOUT} | TIMEOUT (NHC's watchdog"),
        ("docs/integrations.md", integrations, f"| {slurm.EXIT_NOT_RUN} | UNKNOWN, or a usage error"),
        ("docs/integrations.md", integrations, f"at most {drain.REASON_MAX_CHARS} characters of printable ASCII"),
        ("docs/integrations.md", integrations, f"the {slurm.LINE_MAX_CHARS}-character line"),
        (
            "docs/integrations.md",
            integrations,
            f"exit {npd.EXIT_OK} OK, {npd.EXIT_NONOK} NonOK, {npd.EXIT_UNKNOWN} Unknown, and one line on stdout",
        ),
        ("docs/integrations.md", integrations, f"(default {npd.DEFAULT_MAX_OUTPUT_LENGTH}; `--max-output-length`"),
        ("docs/integrations.md", integrations, f"(`--max-drain-pct`, default {breaker.DEFAULT_MAX_PCT:g};"),
        ("docs/fleet.md", fleet, f"(`--max-drain-pct`, default {breaker.DEFAULT_MAX_PCT:g}, "),
        ("docs/fleet.md", fleet, f"{outliers.DEFAULT_PCT:g}% where the reports say nothing"),
        ("docs/fleet.md", fleet, f"Fewer than {outliers.MIN_NODES} nodes: medians and spreads only"),
        ("docs/fleet.md", fleet, f"Iglewicz and Hoaglin's {noise.OUTLIER_Z:g} (for one figure)"),
        (
            "docs/fleet.md",
            fleet,
            f"within in {1 - noise.FAMILY_LEVEL:.0%} of fleets of as many nodes and gated figures (a seeded "
            f"simulation of {noise.SIMULATED_FAMILIES:,} fleets",
        ),
        ("docs/fleet.md", fleet, f"allows ({noise.NOISE_K:g} times the fleet's typical spread"),
        ("docs/history.md", page("docs/history.md"), f"(`--of`, default {DEFAULT_OF})"),
        ("docs/history.md", page("docs/history.md"), f"(`--failed`, default {DEFAULT_FAILED}:"),
        (
            "docs/pretraining.md",
            page("docs/pretraining.md"),
            f"(MBS {min(mbs)}-{max(mbs)}, TP, PP, CP {min(tp)}-{max(tp)} by default)",
        ),
        ("rules/breaker.py", flat(breaker.__doc__ or ""), f"{breaker.DEFAULT_MAX_PCT:g}% by default"),
        ("healthcheck/npd.py", flat(npd.__doc__ or ""), f"{npd.DEFAULT_MAX_OUTPUT_LENGTH} by default"),
        ("healthcheck/slurm.py", flat(slurm.__doc__ or ""), f"the watchdog's timeout exits {slurm.EXIT_TIMEOUT}"),
        ("healthcheck/slurm.py", flat(slurm.__doc__ or ""), f"exits {slurm.EXIT_NOT_RUN} before any check runs"),
    ]


def health_check_restated() -> list[tuple[str, str, str]]:
    """The same of the Slurm health check's script, its settings file and its README."""
    from pytest_gbvalidate.healthcheck import cli, slurm

    passive_s, quick_s = cli.default_deadline_s("passive"), cli.default_deadline_s("quick")
    room_s = slurm.HEALTH_CHECK_KILL_S - slurm.RESERVE_S
    script, conf = (flat(re.sub(r"^# ?", "", p.read_text(encoding="utf-8"), flags=re.M)) for p in (HC_SCRIPT, HC_CONF))
    readme = flat(HC_README.read_text(encoding="utf-8"))
    return [
        (
            "the health check's script",
            script,
            f"(none: {passive_s:g} passive, {quick_s:g} quick; within slurmd's limit less {slurm.RESERVE_S:g} s: "
            f"HealthCheckTimeout, {slurm.HEALTH_CHECK_KILL_S:g} before Slurm 26.05",
        ),
        (
            "the health check's script",
            script,
            f"exits with its status: {slurm.EXIT_OK} healthy, {slurm.EXIT_FAILED} a check failed, "
            f"{slurm.EXIT_TIMEOUT} past the deadline, {slurm.EXIT_NOT_RUN} no verdict",
        ),
        ("the health check's script", script, f"cut -c1-{slurm.LINE_MAX_CHARS})"),
        ("the health check's settings file", conf, f"Seconds the checks may take ({cli.MIN_DEADLINE_S:g} at least)"),
        (
            "the health check's settings file",
            conf,
            f"Default {passive_s:g} for passive, {quick_s:g} for quick; as HealthCheckProgram, slurmd's limit less "
            f"{slurm.RESERVE_S:g} s ({room_s:g} s before Slurm 26.05, HealthCheckTimeout less {slurm.RESERVE_S:g}",
        ),
        ("the health check's README", readme, f"that limit less {slurm.RESERVE_S:g} s (start-up,"),
        ("the health check's README", readme, f"as its default deadline, {room_s:g} s,"),
    ]


def test_every_figure_a_help_text_docstring_or_page_restates_is_its_constant() -> None:
    wrong = [
        f"{where}: no {phrase!r}"
        for where, text, phrase in [*restated(), *health_check_restated()]
        if phrase not in text
    ]
    assert wrong == []


def test_the_levels_page_gives_each_level_its_budget() -> None:
    from pytest_gbvalidate.levels import BUDGET_S

    table = (REPO / "docs" / "levels.md").read_text(encoding="utf-8").split("| level | for | budget")[1]
    table = table.split("\n\n")[0]  # the table's rows, to the blank line after it
    rows = [line.strip().strip("|").split("|") for line in table.splitlines()[2:]]
    seconds = {"s": 1, "min": 60}
    documented: dict[str, float] = {}
    for row in rows:
        level = row[0].split("`")[1]
        amount, unit = row[-1].split()[:2]
        documented[level] = float(amount) * seconds[unit]
    assert documented == BUDGET_S


# --- the Slurm health check's settings: one table in its script ------------------------------------------------


def script_settings() -> dict[str, str]:
    """Name -> default of each row (NAME|default|meaning) of the health check script's SETTINGS table."""
    table = HC_SCRIPT.read_text(encoding="utf-8").split("\nSETTINGS=(\n", 1)[1].split("\n)\n", 1)[0]
    return dict(re.findall(r'^    "(GBVALIDATE_[A-Z_]+)\|([^|]*)\|', table, re.MULTILINE))


def test_the_health_check_s_settings_file_and_readme_name_the_settings_of_its_script_s_table() -> None:
    """The settings file shows each setting of the script's table once, commented out, with its default where the
    table gives one (an example where not); the README names each."""
    settings = script_settings()
    assert len(settings) == 12 and settings["GBVALIDATE_LEVEL"] == "passive"
    shown = re.findall(r"^#(GBVALIDATE_[A-Z_]+)=(.*)$", HC_CONF.read_text(encoding="utf-8"), re.MULTILINE)
    assert sorted(name for name, _ in shown) == sorted(settings)
    assert {name: value for name, value in shown if settings[name]} == {n: d for n, d in settings.items() if d}
    readme = HC_README.read_text(encoding="utf-8").split("are the script's `SETTINGS` table")[1].split("\n\n")[0]
    assert sorted(set(re.findall(r"`(GBVALIDATE_[A-Z_]+)`", readme))) == sorted(settings)
