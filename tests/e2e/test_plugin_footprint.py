"""The plugin is free when unused: importing it imports nothing heavy, an unrelated test run does nothing, and
an operator's run of the suites from the checkout reports a library's warnings instead of failing on them."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch  # noqa: F401 -- in-process pytester runs drop modules they imported, and torch cannot load twice

from tests.helpers.runs import REPO


def test_importing_the_plugin_imports_nothing_heavy() -> None:
    code = (
        "import sys, importlib.metadata as md\n"
        "[ep.load() for ep in md.entry_points(group='pytest11') if ep.name == 'gbvalidate']\n"
        "print(sorted(m for m in ('torch', 'pynvml', 'numpy', 'matplotlib', 'psutil') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_unrelated_test_run_does_nothing(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # Our plugin alone: other plugins installed where the tests run (an NGC container has several) may import
    # numpy or torch themselves, which says nothing about ours.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(
        """
        import sys
        def pytest_unconfigure(config):
            heavy = sorted(m for m in ("torch", "pynvml", "numpy", "psutil", "yaml") if m in sys.modules)
            print("OURS:", config.pluginmanager.has_plugin("pytest_gbvalidate.plugin"), "HEAVY:", heavy)
            print("MODULES:", sorted(m for m in sys.modules if m.startswith("pytest_gbvalidate.")))
        """
    )
    pytester.makepyfile("def test_x():\n    pass\n", "def test_y():\n    assert False\n")
    result = pytester.runpytest_subprocess("-p", "pytest_gbvalidate.plugin", "-s", "--junitxml=r.xml")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["OURS: True HEAVY: []"])
    # Only what deciding to do nothing takes: no target, baselines, report, metrics or Llama configs.
    # node.window: the --gb-window setting's default (standard library only); rules.allowed: --gb-compare-fail's.
    loaded = "'pytest_gbvalidate.hooks', 'pytest_gbvalidate.levels', 'pytest_gbvalidate.node', "
    loaded += "'pytest_gbvalidate.node.window', 'pytest_gbvalidate.plugin', "
    loaded += "'pytest_gbvalidate.ranks', 'pytest_gbvalidate.ranks.world', 'pytest_gbvalidate.rules', "
    loaded += "'pytest_gbvalidate.rules.allowed', 'pytest_gbvalidate.run', "
    loaded += "'pytest_gbvalidate.run.junit_hooks', 'pytest_gbvalidate.run.markers', 'pytest_gbvalidate.run.outcomes', "
    loaded += "'pytest_gbvalidate.run.payload', "
    loaded += "'pytest_gbvalidate.run.session', 'pytest_gbvalidate.setting_values', 'pytest_gbvalidate.settings'"
    result.stdout.fnmatch_lines([f"MODULES: [[]{loaded}[]]"])
    result.stdout.no_fnmatch_line("gbvalidate*")
    assert "gb_sku" not in (pytester.path / "r.xml").read_text()


def test_an_operator_s_run_from_the_checkout_reports_library_warnings_and_passes() -> None:
    """The suites run with the checkout's pytest settings (its pyproject.toml is their rootdir's): a library's
    warning or unclosed resource is reported, not made an error that fails a healthy node. (The plugin's own tests
    treat warnings as errors, in tests/conftest.py.)"""
    plugins = ["-p", "tests.helpers.stray_warnings", "-p", "no:cacheprovider"]
    shown = ["-W", "default::ResourceWarning"]  # Python hides them by default
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--gb-sku=cpu", "suites/test_topology.py", *plugins, *shown],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"rootdir: {REPO}" in run.stdout and "configfile: pyproject.toml" in run.stdout
    assert "a library's deprecation notice" in run.stdout and "unclosed scandir iterator" in run.stdout
