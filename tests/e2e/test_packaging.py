"""The wheel ships every subpackage (pyproject lists them explicitly, to map suites/ and baselines/ in), and the
default baselines are found from an installed package and from a checkout alike."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the check needs to run on one Python only

REPO = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "pytest_gbvalidate").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_every_data_file_of_the_package_is_shipped() -> None:
    """A file the package reads beside its modules (the fault table, NVIDIA's Xid catalog, the report's schema) is in
    pyproject's package-data: else an installed package lacks it, and only a checkout works."""
    shipped = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    missing = []
    for path in (REPO / "pytest_gbvalidate").rglob("*"):
        if path.is_dir() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(REPO).parts)
        if not any(fnmatch.fnmatch(path.name, pattern) for pattern in shipped.get(package, [])):
            missing.append(str(path.relative_to(REPO)))
    assert missing == [], "add these to [tool.setuptools.package-data] in pyproject.toml"


def where_baselines_are(sys_path_first: Path) -> tuple[str, str]:
    """(the package's directory, the default baselines directory) as a fresh Python with `sys_path_first` at
    the front of sys.path sees them: as `python -m pytest` started in a checkout does."""
    code = (
        f"import sys; sys.path.insert(0, {str(sys_path_first)!r})\n"
        "import pytest_gbvalidate, pytest_gbvalidate.settings as st\n"
        "print(pytest_gbvalidate.__path__[0]); print(st.bundled_baselines())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    package, baselines = out.split()
    return package, baselines


def test_a_checkout_first_on_sys_path_finds_its_own_baselines(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "pytest_gbvalidate", checkout / "pytest_gbvalidate", ignore=_PYCACHE)
    shutil.copytree(REPO / "baselines", checkout / "baselines")
    assert where_baselines_are(checkout) == (str(checkout / "pytest_gbvalidate"), str(checkout / "baselines"))


def test_the_readme_s_list_of_skus_works_from_a_checkout_without_the_test_extra(tmp_path: Path) -> None:
    """`pytest --gb-list-skus` in the checkout, as the README gives it, loads the checkout's test setup (its
    testpaths): nothing the test extra alone installs may be imported there."""
    for module in ("jsonschema", "hypothesis", "xmlschema", "junitparser"):
        (tmp_path / f"{module}.py").write_text(f"raise ImportError('{module} is the test extra\\'s')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--gb-list-skus", "-p", "no:cacheprovider"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(line.startswith("cpu ") for line in done.stdout.splitlines()), done.stdout


def test_an_installed_package_finds_the_baselines_it_carries(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "pytest_gbvalidate", site / "pytest_gbvalidate", ignore=_PYCACHE)
    shutil.copytree(REPO / "baselines", site / "pytest_gbvalidate" / "bundled_baselines")
    package, baselines = where_baselines_are(site)
    assert (package, baselines) == (str(site / "pytest_gbvalidate"), str(site / "pytest_gbvalidate/bundled_baselines"))


_PYCACHE = shutil.ignore_patterns("__pycache__")


# --- installing into an image that already has its torch ---------------------------------------------------------
# NGC PyTorch and NeMo images ship torch as a local pre-release build of the next release. pip keeps an installed
# distribution that satisfies a requirement and replaces one that does not, silently and with exit 0: so the
# requirement must admit these builds. Asked of pip's own resolver, offline: a stand-in torch distribution (its
# metadata only) carries the image's version, and a dry run of `pip install <checkout>` must propose nothing but
# this project.
NGC_TORCH_VERSIONS = (
    "2.9.0a0+50eac811a6.nv25.09",  # NGC PyTorch 25.09
    "2.15.0a0+5d3a6b2e71.nv25.11",  # the form of later images
    "2.15.0",  # a released torch, as a pip-managed environment has it
)


def pip(args: list[str], torch_version: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`python -m pip ARGS` in this environment, with a torch distribution of `torch_version` first on sys.path
    and pip's configuration (files, PIP_* variables: a mirror, find-links) out of the way."""
    stand_in = tmp_path / f"torch-{torch_version}"
    dist_info = stand_in / f"torch-{torch_version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {torch_version}\n")
    (dist_info / "RECORD").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PYTHONPATH=str(stand_in), PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what pip builds the project from: setuptools writes its build files into the source tree, which
    tests running side by side (and the checkout) must not share."""
    copy = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, copy / name)
    for name in ("pytest_gbvalidate", "suites", "baselines"):
        shutil.copytree(REPO / name, copy / name, ignore=_PYCACHE)
    return copy


def dry_run_install(project: Path, torch_version: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # No index and no build isolation: whatever pip would want beyond what is installed, it cannot find, and says so.
    report = tmp_path / f"report-{torch_version}.json"
    args = ["install", "--dry-run", "--no-index", "--no-build-isolation", "--report", str(report), str(project)]
    return pip(args, torch_version, tmp_path)


@pytest.mark.outside
@pytest.mark.parametrize("torch_version", NGC_TORCH_VERSIONS)
def test_installing_keeps_the_torch_the_image_has(project: Path, torch_version: str, tmp_path: Path) -> None:
    done = dry_run_install(project, torch_version, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Requirement already satisfied: torch" in done.stdout
    # The stand-in, not this environment's own torch (pip prints the version normalised: nv25.09 -> nv25.9).
    assert f"({Version(torch_version)})" in done.stdout, done.stdout
    proposed = json.loads((tmp_path / f"report-{torch_version}.json").read_text())["install"]
    assert [item["metadata"]["name"] for item in proposed] == ["pytest-gbvalidate"]


@pytest.mark.outside
def test_a_torch_older_than_the_floor_is_one_pip_would_replace(project: Path, tmp_path: Path) -> None:
    """The control: the same dry run notices when the requirement refuses the installed torch."""
    done = dry_run_install(project, "2.8.0a0+5228986c39.nv25.06", tmp_path)
    assert done.returncode != 0
    assert "No matching distribution found for torch" in done.stderr, done.stderr


@pytest.mark.outside
def test_pip_check_is_clean_beside_an_ngc_torch(project: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    install = ["install", "--no-deps", "--no-index", "--no-build-isolation", "--target", str(target), str(project)]
    done = pip(install, "2.15.0a0+5d3a6b2e71.nv25.11", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    stand_in = tmp_path / "torch-2.15.0a0+5d3a6b2e71.nv25.11"
    check = subprocess.run(
        [sys.executable, "-m", "pip", "check"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{target}{os.pathsep}{stand_in}", "PIP_CONFIG_FILE": os.devnull},
        timeout=120,
    )
    # This environment's other packages are not ours to judge: only lines about this project count.
    ours = [line for line in check.stdout.splitlines() if line.startswith("pytest-gbvalidate ")]
    assert ours == [], check.stdout
