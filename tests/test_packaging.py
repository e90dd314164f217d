"""The wheel ships every subpackage (pyproject lists them explicitly, to map suites/ and baselines/ in), and the
default baselines are found from an installed package and from a checkout alike."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the check needs to run on one Python only

REPO = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in (REPO / "pytest_gbvalidate").rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert on_disk - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


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


def test_an_installed_package_finds_the_baselines_it_carries(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    shutil.copytree(REPO / "pytest_gbvalidate", site / "pytest_gbvalidate", ignore=_PYCACHE)
    shutil.copytree(REPO / "baselines", site / "pytest_gbvalidate" / "bundled_baselines")
    package, baselines = where_baselines_are(site)
    assert (package, baselines) == (str(site / "pytest_gbvalidate"), str(site / "pytest_gbvalidate/bundled_baselines"))


_PYCACHE = shutil.ignore_patterns("__pycache__")
