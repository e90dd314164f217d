"""pytest-gbvalidate's pytest entry point: options, markers, fixtures. The work is in session.py.

This module loads in every pytest run of the environment, so it imports nothing heavy (no torch, NVML, numpy).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gbvalidate import settings as st
from pytest_gbvalidate.setting_values import SettingError, parse_command

if TYPE_CHECKING:
    from pytest_gbvalidate.baselines import Baseline
    from pytest_gbvalidate.expect import Expect
    from pytest_gbvalidate.node.topology import NumaMap
    from pytest_gbvalidate.node.window import Window
    from pytest_gbvalidate.probes import Expected, Gpu, NodeGpus, Telemetry
    from pytest_gbvalidate.ranks.gang import Gang
    from pytest_gbvalidate.run.session import GbSession
    from pytest_gbvalidate.sku import Detection
    from pytest_gbvalidate.target import ReferenceTools, Target
    from pytest_gbvalidate.workloads.llama.nemo import EnginePython

SESSION: pytest.StashKey[GbSession] = pytest.StashKey()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_gbvalidate import hooks

    pluginmanager.add_hookspecs(hooks)


def pytest_addoption(parser: pytest.Parser) -> None:
    """An option per setting of the settings table, and an ini key where it has one."""
    group = parser.getgroup("gbvalidate", "GPU node validation (pytest-gbvalidate)")
    for spec in st.TABLE:
        given = {"action": "store_true"} if spec.metavar is None else {"metavar": spec.metavar}
        where = "" if spec.env is None else f" Env {spec.env}, ini {spec.ini}."
        help_text = f"{spec.help}{where}".replace("%", "%%")
        group.addoption(spec.option, dest=f"gb_{spec.name}", default=None, help=help_text, **given)
        if spec.ini is not None:
            parser.addini(spec.ini, spec.help, default="")


def _settings(config: pytest.Config) -> st.Settings:
    sources = st.Sources(
        cli={spec.name: config.getoption(f"gb_{spec.name}") for spec in st.TABLE},
        env=os.environ,
        ini={spec.name: str(config.getini(spec.ini)) for spec in st.TABLE if spec.ini is not None},
        ini_file=config.inipath,
        cwd=Path(config.invocation_params.dir),
    )
    try:
        return st.resolve(sources)
    except SettingError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> int | None:
    if not config.getoption("gb_list_skus"):
        return None
    from pytest_gbvalidate import baselines as bl

    directory = _settings(config).baselines.value
    try:
        for b in bl.load_all(directory):
            statuses = sorted({ref.status for m in b.metrics.values() for ref in (m.default, *m.values.values())})
            print(f"{b.sku:<14} {b.description}  [{len(b.metrics)} metrics: {', '.join(statuses) or 'none'}]")
    except bl.BaselineError as exc:
        raise pytest.UsageError(f"bad baseline: {exc}") from None
    print(f"(baselines in {directory})")
    return 0


def pytest_configure(config: pytest.Config) -> None:
    from pytest_gbvalidate.run import markers
    from pytest_gbvalidate.run.session import GbSession

    markers.register(config)
    markers.leave_warns_to_the_reports(config)
    gb = GbSession(config, _settings(config))
    gb.check_outputs()
    config.stash[SESSION] = gb
    config.pluginmanager.register(gb, "gbvalidate-session")
    if config.getoption("htmlpath", None):  # pytest-html writes a page
        from pytest_gbvalidate.run import html_page

        html_page.register(config, gb)
    if gb.settings.explicit:
        gb.engage()  # asked for explicitly: a bad SKU or baseline stops the run before collection


@pytest.hookimpl(trylast=True)
def pytest_gbvalidate_detect_sku(config: pytest.Config, baselines: list[Baseline]) -> Detection | None:
    from pytest_gbvalidate.sku import detect_sku

    return detect_sku(baselines)


@pytest.fixture(scope="session")
def gb_target(request: pytest.FixtureRequest) -> Target:
    """The SKU this run checks, where that came from, and its baseline."""
    return request.config.stash[SESSION].engage()


@pytest.fixture
def gb_expect(request: pytest.FixtureRequest, gb_target: Target) -> Expect:
    """Compare a measurement with the SKU's baseline: ``gb_expect("h2d_bandwidth_gbps", 49.2, scope="gpu3")``."""
    from pytest_gbvalidate.expect import Expect

    return Expect(request.config.stash[SESSION], request.node)


@pytest.fixture(scope="session")
def gb_gang(request: pytest.FixtureRequest, gb_target: Target) -> Iterator[Gang]:
    """Ranks that run a function SPMD (`gb_gang.run(fn, *args)`): one per GPU, started here and reused across
    tests, or this process's torchrun / srun world when pytest runs inside one. Each call is bounded by
    --gb-timeout; the ranks get the NCCL environment of the SKU's baseline."""
    gang = request.config.stash[SESSION].make_gang()
    yield gang
    gang.close()


@pytest.fixture(scope="session")
def gb_reference_tools(request: pytest.FixtureRequest, gb_target: Target) -> ReferenceTools:
    """Whether to run nccl-tests / nvbandwidth beside our measurements (--gb-reference-tools), with the SKU's
    NCCL environment and the run's timeout."""
    return request.config.stash[SESSION].reference_tools()


@pytest.fixture(scope="session")
def gb_scratch(request: pytest.FixtureRequest, gb_target: Target) -> Path:
    """The scratch directory the storage checks write to: --gb-scratch and friends; on a SKU without GPUs a
    temporary directory; on a GPU SKU without one, the test skips saying how to name it."""
    setting = request.config.stash[SESSION].settings.scratch
    if setting.value is not None:
        return setting.value
    if not gb_target.is_gpu:
        return Path(tempfile.gettempdir())
    pytest.skip("no scratch directory named: --gb-scratch DIR, GBVALIDATE_SCRATCH or gb_scratch (the node's NVMe)")


@pytest.fixture(scope="session")
def gb_engine_python(request: pytest.FixtureRequest, gb_target: Target) -> EnginePython:
    """The command the NeMo engines' driver runs under, and where it was named: --gb-engine-python and friends,
    else the baseline's `pretrain.engine_python`, else this interpreter."""
    from pytest_gbvalidate.workloads.llama.nemo import THIS_PYTHON, EnginePython

    setting = request.config.stash[SESSION].settings.engine_python
    if setting.value is not None:
        return EnginePython(setting.value, setting.source)
    spec = gb_target.baseline.pretrain if gb_target.baseline is not None else None
    if spec is None or spec.engine_python is None:
        return THIS_PYTHON
    source = f"pretrain.engine_python in {gb_target.baseline_file}"
    try:
        return EnginePython(parse_command(spec.engine_python, Path.cwd()), source)
    except SettingError as exc:
        pytest.fail(f"{source}: {spec.engine_python!a}: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def gb_nccl_env(request: pytest.FixtureRequest, gb_target: Target) -> dict[str, str]:
    """The NCCL environment the ranks run with: the baseline's `params.nccl_env` and this process's NCCL_*
    variables (those win), variable -> value."""
    return {name: v["value"] for name, v in request.config.stash[SESSION].nccl_env.items()}


# The node probes (probes.py) each depend on gb_target, so a test that uses one engages gbvalidate like gb_expect does.


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test case per GPU (`gpu`: `[gpu3]`) or ordered GPU pair (`gb_gpu_pair`: `[gpu0->gpu1]`), as many as
    the SKU promises, so a GPU that vanished fails its own case rather than going missing."""
    # Only this plugin's `gpu` fixture, not a project's own. pytest has no public way to ask which one a name
    # resolves to, so this reads the fixture definitions the Metafunc holds.
    definitions: Any = getattr(metafunc, "_arg2fixturedefs", {}).get("gpu")
    ours = bool(definitions) and getattr(definitions[-1].func, "__module__", None) == __name__
    per_gpu = "gpu" in metafunc.fixturenames and ours
    if per_gpu or "gb_gpu_pair" in metafunc.fixturenames:
        from pytest_gbvalidate.probes import parametrize_gpus

        parametrize_gpus(metafunc, metafunc.config.stash[SESSION].engage(), per_gpu=per_gpu)


@pytest.fixture(scope="session")
def gpus(gb_target: Target, request: pytest.FixtureRequest) -> Iterator[NodeGpus]:
    """The node's GPUs as NVML lists them at the start of the session: `gpus.devices` (index, UUID, name, PCI
    bus id, serial, memory, driver/CUDA/VBIOS versions, ECC, persistence and compute modes, power limit,
    clocks, PCIe link, NVLink states, C2C and fabric state, MIG mode, NUMA affinity). On a GPU SKU where NVML
    cannot list them, `gpus.devices` fails the test with NVML's error."""
    from pytest_gbvalidate.probes import node_gpus

    with node_gpus(request.config.stash[SESSION]) as node:
        yield node


@pytest.fixture
def gpu(request: pytest.FixtureRequest, gpus: NodeGpus) -> Gpu:
    """One GPU: a test using it runs once per GPU the SKU has (`test_x[gpu3]`), and its JUnit testcase names
    the GPU's index, PCI bus id and UUID as properties."""
    from pytest_gbvalidate.probes import Gpu

    device = Gpu(request.param, gpus)
    request.node.user_properties.extend(device.junit_properties())
    return device


@pytest.fixture(scope="session")
def numa_map(gpus: NodeGpus, request: pytest.FixtureRequest) -> NumaMap:
    """The node's NUMA map: NUMA nodes and their CPUs (memory-only nodes included), each GPU's placement by
    NVML and by sysfs, and the NICs/HCAs with their NUMA node. Also written to the JSON report."""
    from pytest_gbvalidate.probes import numa_map as read

    return read(request.config.stash[SESSION], gpus)


@pytest.fixture
def gb_telemetry(request: pytest.FixtureRequest, gpus: NodeGpus) -> Iterator[Telemetry]:
    """A telemetry sampler around any workload: ``with gb_telemetry() as sampler: work()``, then
    ``sampler.summary()``. Its summaries land in the test's JUnit properties and the JSON report."""
    from pytest_gbvalidate.probes import Telemetry

    samplers = Telemetry(request.config.stash[SESSION], request.node, gpus)
    yield samplers
    samplers.finish()


@pytest.fixture(scope="session")
def gb_window(request: pytest.FixtureRequest) -> Window:
    """The node's window (--gb-window): where the kernel log and each error counter stood at a check's last clean
    run. ``gb_window.read(name)`` gives that mark of this boot or None; ``gb_window.write({name: value})`` moves it."""
    from pytest_gbvalidate.node.window import Window

    return Window(request.config.stash[SESSION].settings.window.value)


@pytest.fixture
def gb_expected(request: pytest.FixtureRequest, gb_target: Target) -> Expected:
    """Expectations from the baseline's `health` and `topology` sections: ``gb_expected.require("health.
    nvlinks_per_gpu")`` skips the test, saying so, when the SKU's baseline has none."""
    from pytest_gbvalidate.probes import Expected

    return Expected(request.config.stash[SESSION])
