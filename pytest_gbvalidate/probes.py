"""The node probes as tests see them: what the `gpus`, `gpu`, `numa_map`, `gb_telemetry` and `gb_expected`
fixtures give (plugin.py registers them; node/ does the probing).

Fail, don't skip: on a GPU SKU, an NVML failure fails the test that needed the GPU, with NVML's words, in the
test itself (a JUnit failure, not a setup error). On a SKU without GPUs (`cpu`) the per-GPU tests skip.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from pytest_gbvalidate.node import nvml, telemetry

if TYPE_CHECKING:
    from pytest_gbvalidate.node.topology import NumaMap
    from pytest_gbvalidate.run.session import GbSession
    from pytest_gbvalidate.settings import Setting
    from pytest_gbvalidate.target import Target

T = TypeVar("T")


class NodeGpus:
    """The GPUs NVML listed when the session started. `devices` fails the test using it when NVML could not
    list them (no driver, NVML error); `failed` holds the GPUs NVML counted but could not read."""

    def __init__(self, target: Target, inventory: nvml.Inventory | None, error: str | None) -> None:
        self.target = target
        self.inventory = inventory
        self.error = error

    def require(self) -> nvml.Inventory:
        if self.inventory is None:
            pytest.fail(f"NVML cannot list this node's GPUs: {self.error}", pytrace=False)
        return self.inventory

    @property
    def devices(self) -> list[nvml.GpuInfo]:
        return list(self.require().gpus.values())

    @property
    def failed(self) -> dict[int, str]:
        return dict(self.require().failed)

    def as_dict(self) -> dict[str, Any]:
        if self.inventory is None:
            return {"count": None, "devices": [], "failed": {}, "nvml_error": self.error}
        return self.inventory.as_dict() | {"nvml_error": None}


@contextlib.contextmanager
def node_gpus(gb: GbSession) -> Iterator[NodeGpus]:
    """The inventory, with NVML kept started until the session ends (the per-GPU tests read through it)."""
    target = gb.target
    if not target.is_gpu:
        yield NodeGpus(target, nvml.Inventory(0, {}, {}, {}), None)
        return
    with contextlib.ExitStack() as started:
        try:
            started.enter_context(nvml.session())
            gpus = NodeGpus(target, nvml.read_inventory(), None)
        except nvml.NvmlError as exc:
            gpus = NodeGpus(target, None, str(exc))
        gb.set_report_section("gpus", gpus.as_dict())
        yield gpus


class Gpu:
    """One GPU of the node, for a test that runs once per GPU (`test_x[gpu3]`). `info` is its inventory;
    `read(probe)` takes a live reading (`gpu.read(nvml.ecc_counts)`). Both fail the test, naming the GPU and
    NVML's error, when the GPU is missing or does not answer."""

    def __init__(self, index: int, gpus: NodeGpus) -> None:
        self.index = index
        self.label = f"gpu{index}"
        self.gpus = gpus

    @property
    def info(self) -> nvml.GpuInfo:
        inventory = self.gpus.require()
        if self.index in inventory.gpus:
            return inventory.gpus[self.index]
        if self.index in inventory.failed:
            pytest.fail(f"{self.label}: NVML cannot read it: {inventory.failed[self.index]}", pytrace=False)
        expected = self.gpus.target.gpu_count
        pytest.fail(
            f"{self.label}: missing: NVML lists {inventory.count} GPU(s), the {self.gpus.target.sku} SKU has "
            f"{expected if expected is not None else 'more'}",
            pytrace=False,
        )

    def __str__(self) -> str:
        """'gpu3 (00000000:1B:00.0)', for messages."""
        return f"{self.label} ({self.info.pci_bus_id})"

    def read(self, probe: Callable[[Any], T]) -> T:
        name = str(self)
        try:
            return probe(self.gpus.require().handles[self.index])
        except nvml.NvmlError as exc:
            pytest.fail(f"{name}: {exc}", pytrace=False)

    def junit_properties(self) -> list[tuple[str, object]]:
        """The GPU's name in reports: its index, and its PCI bus id and UUID where NVML gave them."""
        props: list[tuple[str, object]] = [("gb_gpu", self.label)]
        inventory = self.gpus.inventory
        info = None if inventory is None else inventory.gpus.get(self.index)
        if info is not None:
            props += [("gb_gpu_pci_bus_id", info.pci_bus_id), ("gb_gpu_uuid", info.uuid)]
        return props


def parametrize_gpus(metafunc: pytest.Metafunc, target: Target, *, per_gpu: bool) -> None:
    """One test case per GPU the SKU's baseline promises (`detect.gpu_count`), whatever NVML sees: a GPU that
    vanished shows up as its own failing case, never as a missing one; `gb_gpu_pair` likewise per ordered
    pair. Where the baseline gives no count (a SKU being recorded), NVML's count; one case when NVML cannot
    count, which then fails with its error. On a SKU without GPUs, one skipped case saying why."""
    from pytest_gbvalidate.labels import gpu_label, gpu_pair_label

    count = target.gpu_count
    if count is None:  # one case at least: it fails with NVML's error where NVML cannot count
        seen = nvml.gpus_seen()
        count = max(seen, 1) if isinstance(seen, int) else 1
    if per_gpu:
        ids = [gpu_label(i) for i in range(count)] or None
        metafunc.parametrize("gpu", list(range(count)) or [_none(target, "needs NVIDIA GPUs")], ids=ids, indirect=True)
    if "gb_gpu_pair" in metafunc.fixturenames:
        pairs = [(i, j) for i in range(count) for j in range(count) if i != j]
        ids = [gpu_pair_label(*p) for p in pairs] or None
        metafunc.parametrize("gb_gpu_pair", pairs or [_none(target, "needs two NVIDIA GPUs")], ids=ids)


def _none(target: Target, needs: str) -> Any:
    """The one case of a per-GPU test where the SKU has no GPU (or one, for pairs): skipped, saying why."""
    reason = f"{needs}; this run checks the {target.sku} SKU, which has {target.gpu_count or 'none'}"
    return pytest.param(None, id="nogpu", marks=pytest.mark.skip(reason=reason))


def numa_map(gb: GbSession, gpus: NodeGpus) -> NumaMap:
    """The node's NUMA map from sysfs, with the GPUs NVML could read placed on it."""
    from pytest_gbvalidate.node import topology

    devices = () if gpus.inventory is None else gpus.inventory.gpus.values()
    result = topology.read_numa_map(topology.SYSFS_ROOT, devices)
    gb.set_report_section("numa_map", result.as_dict())
    return result


class Telemetry:
    """`gb_telemetry()` makes a sampler of this node's telemetry, to wrap around a workload::

        def test_train(gb_telemetry):
            with gb_telemetry() as sampler:  # starts sampling here, about 10 times a second
                train()
            sampler.summary()["gpu0.power_w"]  # {"mean": ..., "p5": ..., "p95": ...}

    It samples every GPU through NVML (utilization, memory used, SM clock, power, temperature, slowdown and
    power-cap flags) and the host through psutil (CPU utilization, memory used, CPU clock); on a SKU without
    GPUs, the host only. When the test ends, each sampler's summary becomes JUnit properties of the test
    (`gb_telemetry[.<label>].<series>.<mean|p5|p95>`) and its summary and raw series a record in the JSON
    report's `telemetry` list. On a GPU SKU whose NVML does not answer, the call fails the test."""

    def __init__(self, gb: GbSession, item: pytest.Item, gpus: NodeGpus) -> None:
        self.gb = gb
        self.item = item
        self.gpus = gpus
        self._samplers: list[tuple[str, telemetry.Sampler]] = []

    def __call__(self, interval_s: float = telemetry.DEFAULT_INTERVAL_S, *, label: str = "") -> telemetry.Sampler:
        sources: list[telemetry.Source] = []
        if self.gb.target.is_gpu:
            sources += [telemetry.NvmlSource(i, h) for i, h in self.gpus.require().handles.items()]
        sources.append(telemetry.CpuSource())
        sampler = telemetry.Sampler(sources, interval_s)
        self._samplers.append((label, sampler))
        return sampler

    def finish(self) -> None:
        for label, sampler in self._samplers:
            if not sampler.started:
                continue
            sampler.stop()
            prefix = "gb_telemetry" + (f".{label}" if label else "")
            for series, stats in sampler.summary().items():
                self.item.user_properties.extend((f"{prefix}.{series}.{stat}", v) for stat, v in stats.items())
            record = {"test_id": self.item.nodeid, "label": label, **sampler.as_dict()}
            self.gb.add_report_record(self.item, "telemetry", record)


class Expected:
    """`gb_expected.require("health.nvlinks_per_gpu")`: an expectation from the SKU's baseline (its `detect`,
    `health` or `topology` section; `health.ecc_limits.<counter>` reaches into the limits). Where the baseline
    has none, the check does not apply: `require` skips the test saying so (fails it under --gb-strict); `get`
    returns None, for a check that does part of its work without it."""

    SECTIONS = ("detect", "health", "topology")

    def __init__(self, gb: GbSession) -> None:
        self.gb = gb

    def get(self, field: str) -> Any:
        section_name, name, *key = field.split(".", 2)
        if section_name not in self.SECTIONS or not name:
            raise KeyError(f"{field!r}: expected '<section>.<field>' with a section among {self.SECTIONS}")
        baseline = self.gb.target.baseline
        section = None if baseline is None else getattr(baseline, section_name)
        if section is None:
            return None
        if not hasattr(section, name):
            raise KeyError(f"{field!r}: the baseline schema has no such field")
        value = getattr(section, name)
        if key:
            value = value.get(key[0])
        return None if value in (None, {}) else value

    def require(self, field: str) -> Any:
        return self.require_any(field)[field]

    def setting(self, name: str) -> Setting[Any]:
        """A setting of the run that says what the node is expected to be now (`node_idle`, `compute_domain`),
        with where its value came from."""
        return self.gb.settings.get(name)

    def require_any(self, *fields: str) -> dict[str, Any]:
        """The expectations among `fields` the baseline gives; skips (or fails) when it gives none of them."""
        found = {f: v for f in fields if (v := self.get(f)) is not None}
        if not found:
            reason = f"{self.gb.target.sku} baseline has no {' or '.join(fields)} expectation"
            if self.gb.settings.strict.value:
                pytest.fail(f"{reason} (--gb-strict)", pytrace=False)
            raise pytest.skip.Exception(reason, _use_item_location=True)
        return found
