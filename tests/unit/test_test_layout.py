"""The tests' own layout (CONTRIBUTING.md, Tests): no module of the tests imports a test module or a conftest (what
tests share lives in tests/helpers/, fixtures in a conftest.py), and each tests/unit/test_X.py is named for the module
it tests: X is a module of the package (a package's own name for its __init__.py), or <package>_<module> (needed
where two packages hold a module of that name), or a script of benchmarks/. A module renamed without its test file,
or a test file named for no module, fails here."""

from __future__ import annotations

import ast
from collections import defaultdict

from tests.helpers.runs import REPO

TESTS = REPO / "tests"

# The unit test files named for no one module, each with what it tests instead. Keep it short: a file that tests one
# module is named for that module.
NAMED_FOR_NO_MODULE = {
    # this file: the layout of tests/
    "test_test_layout.py",
    # the torch_version marker against every module of the package whose behaviour depends on the torch release
    "test_torch_versions.py",
    # the fleet's noise, through rules/outliers.py, fleet/findings.py, fleet/summary.py and the summary's outputs
    "test_fleet_noise.py",
    # the built-in engine's speed levers: workloads/llama/loss.py, fp8.py and grad_accumulation.py
    "test_llama_levers.py",
    # workloads/llama/parallel.py's layout rules and a baseline's pretrain section (test_llama_parallel.py: the
    # parallel layouts' training)
    "test_llama_layout.py",
    # bench/collectives.py's COLLECTIVES table against the metrics catalogue, nccl-tests and the busbw plot
    # (test_collectives.py: the measurements)
    "test_collectives_table.py",
    # every module, file and page the docstrings of the package and the suites name exists
    "test_docstrings.py",
}


def module_names() -> dict[str, list[str]]:
    """A unit test file's possible names (without `test_` and `.py`) -> the modules of that name: each module of the
    package under its own name and as <package>_<module>, a package under its name, and a script of benchmarks/
    whose name no module of the package has (benchmarks/levels.py is not what test_levels.py tests)."""
    names: dict[str, list[str]] = defaultdict(list)
    for path in sorted((REPO / "pytest_gbvalidate").rglob("*.py")):
        module = path.relative_to(REPO).as_posix()
        if path.stem == "__main__":
            continue
        if path.stem == "__init__":
            names[path.parent.name].append(module)
            continue
        names[path.stem].append(module)
        names[f"{path.parent.name}_{path.stem}"].append(module)
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        if path.stem not in names:
            names[path.stem].append(path.relative_to(REPO).as_posix())
    return names


def unit_test_files() -> list[str]:
    return sorted(path.name for path in (TESTS / "unit").glob("test_*.py"))


def misnamed(files: list[str], names: dict[str, list[str]]) -> list[str]:
    """The files of `files` (tests/unit/test_*.py names) named for no module, or for a name two modules share."""
    found = []
    for name in files:
        modules = names.get(name.removeprefix("test_").removesuffix(".py"), [])
        if name in NAMED_FOR_NO_MODULE:
            continue
        if not modules:
            found.append(f"{name}: names no module of pytest_gbvalidate/ or benchmarks/")
        elif len(modules) > 1:
            found.append(f"{name}: names {', '.join(modules)}: add the package, test_<package>_<module>.py")
    return found


def test_each_unit_test_file_is_named_for_the_module_it_tests() -> None:
    found = misnamed(unit_test_files(), module_names())
    assert not found, "\n".join(found)


def test_the_files_named_for_no_module_exist_and_name_none() -> None:
    names, files = module_names(), unit_test_files()
    stale = [name for name in sorted(NAMED_FOR_NO_MODULE) if name not in files]
    assert stale == [], "gone: take them out of NAMED_FOR_NO_MODULE"
    module_named = [name for name in sorted(NAMED_FOR_NO_MODULE) if name.removeprefix("test_")[:-3] in names]
    assert module_named == [], "named for a module: take them out of NAMED_FOR_NO_MODULE"


def test_the_naming_rule_refuses_an_old_name_and_an_ambiguous_one() -> None:
    names = {"level_run": ["healthcheck/level_run.py"], "healthcheck_level_run": ["healthcheck/level_run.py"]}
    names |= {"history": ["report/history.py", "fleet/history.py"], "report_history": ["report/history.py"]}
    files = ["test_healthcheck_run.py", "test_level_run.py", "test_healthcheck_level_run.py"]
    files += ["test_history.py", "test_report_history.py"]
    assert [line.split(":")[0] for line in misnamed(files, names)] == ["test_healthcheck_run.py", "test_history.py"]


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, dotted name) of every module `source` imports, in order, relative imports resolved against `package`
    (the importing module's package); `from a import b` imports a, and a.b too where a is a package of this
    repository (a directory: b may be its module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.append((node.lineno, module))
            if REPO.joinpath(*module.split(".")).is_dir():
                found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return sorted(found)


def is_test_module(dotted: str) -> bool:
    """A module pytest collects or loads itself: a test module or a conftest, of the tests or anywhere."""
    last = dotted.rsplit(".", 1)[-1]
    return last == "conftest" or (dotted.startswith("tests.") and last.startswith("test_"))


def test_imports_of_test_modules_are_found() -> None:
    source = "import tests.e2e.test_a\nfrom tests.unit.test_b import x\nfrom . import test_c\nfrom .conftest import y\n"
    source += "from tests.helpers.runs import REPO, test_like\nimport pytest\n"
    found = [(line, name) for line, name in imported_modules(source, "tests.e2e") if is_test_module(name)]
    assert found == [
        (1, "tests.e2e.test_a"),
        (2, "tests.unit.test_b"),
        (3, "tests.e2e.test_c"),
        (4, "tests.e2e.conftest"),
    ]


def test_no_module_of_the_tests_imports_a_test_module() -> None:
    found = []
    for path in sorted([*TESTS.rglob("*.py"), REPO / "conftest.py"]):
        package = ".".join(path.relative_to(REPO).parent.parts)
        for line, name in imported_modules(path.read_text(), package):
            if is_test_module(name):
                found.append(f"{path.relative_to(REPO)}:{line}: imports {name}: share through tests/helpers/ instead")
    assert not found, "\n".join(found)
