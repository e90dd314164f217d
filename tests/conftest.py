"""Fixtures that keep the plugin's tests independent of the machine running them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# torch, PyYAML and the baseline code, loaded once before any test: in-process pytester runs drop the modules they
# import. A run that engages the plugin on a GPU SKU imports torch (the node's software facts), and torch loaded a
# second time in one process fails ("SystemError: bad call flags"), in whichever test file first did that in a
# process without torch; a baseline loader built on one copy of PyYAML must not meet the exceptions of another.
import torch  # noqa: F401
import yaml  # noqa: F401

import pytest_gbvalidate.baselines  # noqa: F401
from pytest_gbvalidate.node import window
from tests.helpers.fakenode import point_detection_at, write_detection_sysfs
from tests.helpers.fakenvml import install

# Variables of the host's environment that change what the plugin does: NCCL_* are reported and passed to the
# ranks; CUDA_* pick and number the GPUs; torchrun's and Slurm's make the plugin join their world instead of
# starting its own ranks; GBVALIDATE_* are our own settings. PYTEST_XDIST_* when these tests run under -n: the
# pytester runs they start are no xdist workers (pytest-benchmark, if installed, would think they were and warn,
# which the warnings-as-errors setting turns into an internal error of the inner run).
_HOST_VARIABLES = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}
_HOST_VARIABLES |= {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"}
_HOST_PREFIXES = ("NCCL_", "SLURM_", "GBVALIDATE_", "PYTEST_XDIST_")


# Every warning is an error in the plugin's own tests. Set here, not in pyproject.toml, whose pytest settings an
# operator's run of the suites from a checkout shares: a library's stray warning (a ResourceWarning for a directory
# iterator a library left open, collected as pytest exits, once made a healthy node's run exit 1) must be reported
# there, not fail the node. A measurement in its warn band is a warning by design; pytest-benchmark, where installed
# (GPU images have it), warns that it is off under -n: so it should be.
WARNING_FILTERS = (
    "error",
    "default::pytest_gbvalidate.expect.GbValidateWarning",
    "ignore:Benchmarks are automatically disabled because xdist plugin is active",
    # Hypothesis writes a failing example as a patch with libcst, which imports a deprecated mypy_extensions name.
    "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "broken_reports: the test writes JSON reports that do not fit the schema on purpose (a reader's input)",
    )
    config.addinivalue_line(
        "markers",
        "outside: the test meets a program outside Python (a real Slurm, Chromium, node_exporter, Prometheus and "
        "promtool, pip's resolver) or checks files for one (Kubernetes): what it tests is that program's side, the "
        "same whatever torch, so CI runs it on the newest torch only",
    )
    config.addinivalue_line(
        "markers",
        "torch_version: the test reaches code whose behaviour depends on the torch release (a version check, a probe "
        "of what torch has, an API that changed since the oldest torch admitted): CI runs the marked tests again on "
        "the oldest torch (tests/unit/test_torch_versions.py keeps the marks honest)",
    )
    for line in WARNING_FILTERS:  # in order: a later filter wins
        config.addinivalue_line("filterwarnings", line)
    share_the_cores_between_workers()


def share_the_cores_between_workers() -> None:
    """Under xdist (-n N) the workers compute side by side: each gets its share of the cores for torch's
    threads and Inductor's compile workers, and so do the processes it starts (pytester subprocesses, scripts,
    torchrun agents inherit the variables; gang ranks set their own share of threads). With every worker's OpenMP
    threads on every core they wait on each other: a training step of the tiny model took 10 to 50 times as long on
    2 busy cores. A value the developer set stays."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    # Inductor's compile workers too: a pool of compiler processes per worker started for a few small kernels (a
    # compiled test took 19 s with the pool on an idle 2-core machine, 14 s without). Read when torch._inductor's
    # config loads, at the first torch.compile.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(threads))
    if "OMP_NUM_THREADS" in os.environ:
        return
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read when torch loads, here and in every child process
    if "torch" in sys.modules:  # loaded already (by another plugin): tell it too
        sys.modules["torch"].set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def environment_of_no_particular_host() -> Iterator[None]:
    """So that a developer on a GPU workstation, inside an NGC container (which sets NCCL_VERSION and other
    NCCL_* and CUDA_* variables) or inside an srun allocation (SLURM_PROCID, SLURM_NTASKS, ...) runs pytest
    green: the tests start from an environment without the variables above, in this process and in every
    process they start (pytester subprocesses, torchrun agents, gang ranks inherit os.environ). A test that
    needs one sets it itself."""
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name in _HOST_VARIABLES or name.startswith(_HOST_PREFIXES):
                mp.delenv(name)
        yield


@pytest.fixture(autouse=True)
def reports_fit_their_schema(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every JSON run report a test makes (in its tmp_path or pytester directory) fits the strict schema of the
    report's records: a field written outside them, or of another type, fails the test that wrote it. A test that
    writes broken reports on purpose, as a reader's input, is marked `broken_reports`."""
    yield
    if request.node.get_closest_marker("broken_reports") is not None:
        return
    made = request.node.funcargs  # every fixture the test used, by name
    directories = [made["tmp_path"]] if "tmp_path" in made else []
    directories += [made["pytester"].path] if "pytester" in made else []
    from tests.helpers.reports import schema_problems  # jsonschema: the test extra's, not the operator's

    problems = [problem for directory in dict.fromkeys(directories) for problem in schema_problems(directory)]
    assert not problems, "reports that do not fit the schema:\n" + "\n".join(problems)


@pytest.fixture(autouse=True)
def a_window_of_its_own(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each test's in-process runs keep the node's window (node/window.py) in a file of their own, never the host's
    /run/gbvalidate: a clean check of one test's fake node must not close the window on the next test's events.
    The default is patched rather than GBVALIDATE_WINDOW set, which would count as the user asking for gbvalidate."""
    monkeypatch.setattr(window, "DEFAULT_PATH", tmp_path_factory.mktemp("window") / "window.json")


@pytest.fixture(autouse=True)
def no_device_order_from_an_earlier_test() -> None:
    """The plugin, once engaged, sets CUDA_DEVICE_ORDER in its own process (ranks/world.py), and an in-process
    pytester run's process is this one: each test starts without it, as on a host that does not set it."""
    os.environ.pop("CUDA_DEVICE_ORDER", None)


@pytest.fixture
def cpu_only_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This test's node has no NVIDIA GPU, whatever the host has: no NVIDIA driver (NVML's library is not
    found), no NVIDIA device on the PCI bus, and not an Azure VM. SKU auto-detection says `cpu` on it."""
    install(monkeypatch, None)
    sysfs = tmp_path / "cpu-only-node-sys"
    write_detection_sysfs(sysfs, [])
    point_detection_at(monkeypatch, sysfs)
