"""GPU health: what a node must show before it goes back into service. Per-GPU checks run once per GPU the SKU
has (`test_ecc_errors[gpu3]`); gates come from the `health` section of the SKU's baseline, and a gate the
baseline does not give is a check that skips saying so. Readings are live: a GPU lost mid-run fails its own
checks from then on. On a SKU without GPUs (`cpu`) only the telemetry check runs."""

from __future__ import annotations

import os
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from pytest_gbvalidate.hooks import GbValidateWarning
from pytest_gbvalidate.node import imex, nccl_stack, nvml, window, xid
from pytest_gbvalidate.node.window import Window
from pytest_gbvalidate.probes import Expected, Gpu, NodeGpus, Telemetry
from pytest_gbvalidate.rules import xids

pytestmark = pytest.mark.gb_level("passive")  # reads the node, measures nothing

TELEMETRY_WINDOW_S = 0.5
LIMITS = "health.ecc_limits"
NVLINK_LIMITS = "health.nvlink_error_limits"


# --- the node ----------------------------------------------------------------------------------------------


@pytest.mark.gb_gpu
def test_gpu_count(gpus: NodeGpus, gb_expected: Expected) -> None:
    expected = gb_expected.require("detect.gpu_count")
    inventory = gpus.require()
    unreadable = "".join(f"; gpu{i} does not answer: {error}" for i, error in inventory.failed.items())
    assert (inventory.count, len(inventory.gpus)) == (expected, expected), (
        f"NVML lists {inventory.count} GPU(s) and reads {len(inventory.gpus)}, the {gpus.target.sku} SKU has "
        f"{expected}{unreadable}"
    )


@pytest.mark.gb_gpu
def test_gpu_model(gpus: NodeGpus, gb_expected: Expected) -> None:
    model = gb_expected.require("detect.gpu_name_contains")
    wrong = [f"gpu{g.index} ({g.pci_bus_id}) is {g.name!r}" for g in gpus.devices if model not in g.name]
    assert not wrong, f"{'; '.join(wrong)}: the {gpus.target.sku} SKU has {model!r} GPUs"


@pytest.mark.gb_gpu
def test_driver_version(gpus: NodeGpus, gb_expected: Expected) -> None:
    minimum = gb_expected.require("health.min_driver_version")
    versions = {g.driver_version for g in gpus.devices}
    old = sorted(v for v in versions if _version(v) < _version(minimum))
    assert not old, f"NVIDIA driver {', '.join(old)} is older than {minimum}, the {gpus.target.sku} minimum"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


@pytest.mark.gb_gpu
def test_nccl_version(gb_expected: Expected) -> None:
    minimum = gb_expected.require("health.min_nccl_version")
    version, where = nccl_stack.loaded_version()
    assert _version(version) >= _version(minimum), f"NCCL {version} ({where}) is older than {minimum}, the minimum"


@pytest.mark.gb_gpu
def test_nccl_topo_file(gb_nccl_env: dict[str, str], request: pytest.FixtureRequest) -> None:
    """The topology file NCCL is told to read (the ranks' environment, else NCCL's configuration files) exists,
    can be read and is an NCCL topology: with a bad one NCCL falls back to detecting the topology itself, or
    fails to start, and says so only in its debug log."""
    env = {**os.environ, **gb_nccl_env}
    files = nccl_stack.conf_files(env)
    named = nccl_stack.setting("NCCL_TOPO_FILE", env, files)
    if named is None:
        pytest.skip(f"no NCCL_TOPO_FILE in the ranks' environment or in {', '.join(map(str, files))}")
    path, problem = nccl_stack.topo_file_problem(*named, Path(request.config.invocation_params.dir))
    assert problem is None, problem
    request.node.user_properties.append(("gb_nccl_topo_file", str(path)))


@pytest.mark.gb_gpu
def test_nccl_net_plugin(gb_expected: Expected, gb_nccl_env: dict[str, str]) -> None:
    """The net plugin NCCL will load (the baseline's, or the one NCCL_NET_PLUGIN names) loads as NCCL loads it."""
    env = {**os.environ, **gb_nccl_env}
    library, chosen = nccl_stack.net_plugin(
        gb_expected.require("health.nccl_net_plugin"), env, nccl_stack.conf_files(env)
    )
    assert library is not None, f"NCCL's net plugin: {chosen} loads none; the SKU's baseline expects one"
    problem = nccl_stack.load_problem(library)
    assert problem is None, f"NCCL's net plugin ({chosen}): {problem}"


@pytest.mark.gb_gpu
def test_nvlink_fabric_clique(gpus: NodeGpus, gb_expected: Expected) -> None:
    """Every GPU whose fabric registration completed is in the same NVLink domain (cluster UUID) and partition of
    it (clique id): a GPU placed elsewhere cannot reach its siblings over NVLink. A GPU whose registration did
    not complete fails test_nvlink_fabric instead."""
    places: dict[int, tuple[str, int]] = {}
    for index, h in gpus.require().handles.items():
        try:
            registration = nvml.fabric(h)
        except nvml.NvmlError:
            continue  # its own per-GPU checks name the error
        if registration is not None and registration.state == "completed" and registration.status == "Success":
            places[index] = (registration.cluster_uuid, registration.clique_id)
    if not places:
        _no_fabric(gb_expected, f"no GPU of {gpus.target.sku} has completed its NVLink fabric registration")
    ((cluster, clique), _), *_ = Counter(places.values()).most_common()
    apart = [f"gpu{i} is in clique {c} of cluster {u}" for i, (u, c) in places.items() if (u, c) != (cluster, clique)]
    assert not apart, f"{'; '.join(apart)}: the node's other GPUs are in clique {clique} of cluster {cluster}"


@pytest.mark.gb_gpu
def test_imex(gb_expected: Expected, record_property: Callable[[str, object], None]) -> None:
    """Multi-node NVLink needs IMEX: a channel device for processes to import memory of other nodes through,
    the node's nvidia-imex daemon READY to broker it, and this node READY and connected in the domain its daemon
    sees (`nvidia-imex-ctl -N`). Another node down or one connection down is the domain's state, not this node's
    fault: it passes, the domain's state in the JUnit property `imex_domain`."""
    if not gb_expected.require("health.multi_node_nvlink"):
        pytest.skip("the baseline says this node is in no multi-node NVLink domain: IMEX is not needed")
    domain_setting = gb_expected.setting("compute_domain")
    if domain_setting.value == "none":
        pytest.skip(f"no compute domain is expected here ({domain_setting.source}): IMEX is not judged")
    channels = imex.read_channels(imex.CHANNELS_DIR)
    daemon = imex.daemon_state()
    if domain_setting.value == "auto" and not imex.set_up(channels, daemon):
        # An idle node outside any compute domain: a Kubernetes ComputeDomain or a Slurm job sets IMEX up on demand.
        pytest.skip(
            f"no compute domain here ({domain_setting.source}: auto): no IMEX channel in {imex.CHANNELS_DIR}, no "
            f"nvidia-imex daemon answering, no {imex.NODES_CONFIG}; --gb-compute-domain=expected judges IMEX anyway"
        )
    domain = imex.judge_domain(imex.domain_state(), imex.own_names()) if daemon.problem is None else None
    problems = [p for p in (channels.problem, daemon.problem, domain and domain.problem) if p]
    if not channels.numbers and channels.problem is None:
        problems.insert(0, f"no IMEX channel device in {imex.CHANNELS_DIR}")
    if domain is not None and domain.others:
        record_property("imex_domain", domain.others)
    assert not problems, f"IMEX: {'; '.join(problems)}"


def _no_fabric(gb_expected: Expected, why: str) -> NoReturn:
    """Fail where the baseline says the node is in a multi-node NVLink domain, else skip saying why."""
    if gb_expected.get("health.multi_node_nvlink"):
        pytest.fail(f"{why}; the baseline says this node is in a multi-node NVLink domain", pytrace=False)
    pytest.skip(f"{why} (a GPU outside an NVLink switch fabric) and the baseline asks for none")


def test_telemetry_reads_every_sensor(gb_telemetry: Telemetry, gb_expected: Expected) -> None:
    """The sampler reads each GPU's sensors (and the host's) at its rate, with no sensor failing. Its summary
    of the idle node lands in the reports: idle power and temperature are worth a look on a suspect node."""
    with gb_telemetry() as sampler:
        time.sleep(TELEMETRY_WINDOW_S)
    assert not sampler.errors, f"telemetry sources failed: {'; '.join(sampler.errors)}"
    expected_samples = TELEMETRY_WINDOW_S / sampler.interval_s
    assert len(sampler.samples) >= expected_samples / 2, (
        f"{len(sampler.samples)} samples in {sampler.duration_s:.2f} s, expected about {expected_samples:.0f}"
    )
    series = sampler.series()
    gpu_count = gb_expected.get("detect.gpu_count") or 0
    wanted = ["cpu.utilization_pct", "cpu.memory_used_gib"]
    wanted += [f"gpu{i}.{name}" for i in range(gpu_count) for name in ("utilization_pct", "power_w", "temperature_c")]
    missing = [name for name in wanted if name not in series]
    assert not missing, f"no telemetry for {', '.join(missing)}"
    out_of_range = [n for n, values in series.items() if n.endswith("_pct") and not all(0 <= v <= 100 for v in values)]
    assert not out_of_range, f"percentages outside 0-100: {out_of_range}"


# --- each GPU ----------------------------------------------------------------------------------------------


def test_ecc_enabled(gpu: Gpu) -> None:
    mode = gpu.read(nvml.ecc_mode)
    assert mode is not None, f"{gpu}: NVML reports no ECC mode: this GPU cannot protect its memory"
    current, pending = mode
    assert (current, pending) == (True, True), (
        f"{gpu}: ECC is {'on' if current else 'off'} now and {'on' if pending else 'off'} after the next reset"
    )


def test_ecc_errors(gpu: Gpu, gb_expected: Expected) -> None:
    limits = gb_expected.require_any(*(f"{LIMITS}.{counter}" for counter in nvml.ECC_COUNTERS))
    counts = gpu.read(nvml.ecc_counts)
    problems = []
    for field, limit in limits.items():
        counter = field.rsplit(".", 1)[1]
        count = counts[counter]
        if count.volatile is None and count.aggregate is None:
            problems.append(f"{counter}: NVML reports no count")
            continue
        over = [
            f"{n} {kind}"
            for kind, n in (("volatile", count.volatile), ("aggregate", count.aggregate))
            if (n or 0) > limit
        ]
        if over:
            problems.append(f"{counter} {' and '.join(over)}, limit {limit}")
    assert not problems, f"{gpu}: ECC errors: {'; '.join(problems)}"


def test_row_remapping(gpu: Gpu, gb_expected: Expected, request: pytest.FixtureRequest) -> None:
    """A pending or failed row remap against the baseline's limits; the failure flag is NVIDIA's RMA policy's (a
    bank out of spare rows, a remapped row remapped again, or 512 uncorrectable remaps in total). 512 or more
    uncorrectable remaps with no failure flag warns, as DCGM 4.6's health watch does."""
    limits = gb_expected.require_any(f"{LIMITS}.row_remaps_pending", f"{LIMITS}.row_remap_failures")
    remaps = gpu.read(nvml.row_remaps)
    if remaps is None:
        pytest.skip(f"{gpu} does not remap rows (GPUs before A100 retire pages instead)")
    max_pending, max_failures = limits.get(f"{LIMITS}.row_remaps_pending"), limits.get(f"{LIMITS}.row_remap_failures")
    problems = []
    if max_pending is not None and int(remaps.pending) > max_pending:
        problems.append("a row remap is pending: reset the GPU to apply it")
    if max_failures is not None and int(remaps.failed) > max_failures:
        problems.append("a row remap failed: the GPU has no spare rows left")
    assert not problems, (
        f"{gpu}: {'; '.join(problems)} ({remaps.corrected_rows} rows remapped after correctable errors, "
        f"{remaps.uncorrected_rows} after uncorrectable ones)"
    )
    if remaps.uncorrected_rows >= ROW_REMAP_WARN:
        _warn(
            request,
            f"{gpu}: {remaps.uncorrected_rows} rows remapped after uncorrectable errors, {ROW_REMAP_WARN} or more "
            "(NVIDIA's RMA policy sets the remap failure flag at 512): plan to replace the GPU",
        )


def test_retired_pages(gpu: Gpu, gb_expected: Expected) -> None:
    limits = gb_expected.require_any(f"{LIMITS}.retired_pages", f"{LIMITS}.retired_pages_pending")
    pages = gpu.read(nvml.retired_pages)
    if pages is None:
        pytest.skip(f"{gpu} does not retire pages (A100 and later remap rows instead)")
    max_pages, max_pending = limits.get(f"{LIMITS}.retired_pages"), limits.get(f"{LIMITS}.retired_pages_pending")
    problems = []
    total = pages.single_bit + pages.double_bit
    if max_pages is not None and total > max_pages:
        problems.append(
            f"{total} pages retired ({pages.single_bit} single-bit, {pages.double_bit} double-bit), limit {max_pages}"
        )
    if max_pending is not None and int(pages.pending) > max_pending:
        problems.append("a page retirement is pending: reboot to apply it")
    assert not problems, f"{gpu}: {'; '.join(problems)}"


def test_no_critical_xid(gpu: Gpu, gb_expected: Expected, gb_window: Window, request: pytest.FixtureRequest) -> None:
    """The GPU's Xid events since its last clean check, judged by NVIDIA's Xid catalog (rules/xid_catalog.yaml): a
    code that calls for a reset, a reboot or support fails with that repair; a job's code (13, 31, 45, 68, 69, 80, 94,
    ...) alone is the job's, reported, and fails only where it repeats on the GPU; an IGNORE or unused code (63: a
    row-remap event) is counted only. Each code's lines, distinct lines, bursts and times go to the JUnit property
    `gb_xid_events`; a clean check closes the window on them, so an event is judged once."""
    catalog = xids.load()
    actions = gb_expected.get("health.xid_actions")
    if actions:
        catalog = catalog.with_actions(actions, f"health.xid_actions of the {gpu.gpus.target.sku} baseline")
    try:
        log = xid.read_kernel_log(xid.KERNEL_LOG)
    except OSError as exc:
        pytest.fail(
            f"{gpu}: cannot read the kernel log {xid.KERNEL_LOG} for Xid events: {exc.strerror or exc} "
            "(run as root, or set kernel.dmesg_restrict=0)",
            pytrace=False,
        )
    where, mark = xid.pci_of(gpu.info.pci_bus_id), xid.clean_mark(gpu.info.uuid)
    since, repaired = gb_window.read(mark), gb_window.read(xid.REPAIRED_MARK)
    events = [e for e in xid.xid_events(log) if e.pci == where]
    findings = xids.judge(
        events,
        catalog,
        after_seq=None if since is None else since.value,
        floor_seq=None if repaired is None else repaired.value,
        now_s=window.uptime_s(),
    )
    if findings:
        request.node.user_properties.append(("gb_xid_events", "; ".join(f.describe() for f in findings)))
    drains = [f for f in findings if f.drains]
    opened = "boot"
    if since is not None or repaired is not None:
        repaired_last = repaired is not None and (since is None or repaired.value > since.value)
        opened = "the repair noted" if repaired_last else "the last clean check"
    if drains:
        shown = " | ".join(f"{f.describe()} ({f.policy.why}); e.g. {f.example}" for f in drains)
        pytest.fail(f"{gpu}: Xid events since {opened}: {shown}", pytrace=False)
    for f in findings:
        if f.policy.action in ("job", "warn"):
            warnings.warn(GbValidateWarning(f"{gpu}: {f.describe()}: {f.policy.why}"), stacklevel=1)
    last = xid.last_seq(log)
    if last is not None:
        _close_window(gb_window, {mark: last}, request)


def test_no_slowdown(gpu: Gpu) -> None:
    mask = gpu.read(nvml.clocks_event_reasons)
    reasons = nvml.slowdown_reasons(mask)
    assert not reasons, f"{gpu}: clocks held down by {', '.join(reasons)} (clocks event reasons {mask:#x})"


def test_no_leftover_gpu_processes(gpu: Gpu, gb_expected: Expected) -> None:
    """On a node no job runs on (--gb-node-idle: the Slurm health check sets it where Slurm says the node is idle),
    no process holds the GPU: one that does is what a finished job left behind (a process stuck in the driver, a
    server a job started), and the next job finds its memory taken. This run's own processes are not counted."""
    idle = gb_expected.setting("node_idle")
    if not idle.value:
        pytest.skip(f"a job may run on this node ({idle.source}): its processes on the GPUs are its own")
    ours = _own_processes()
    left = [p for p in gpu.read(nvml.compute_processes) if p.pid not in ours]
    shown = ", ".join(
        f"pid {p.pid}" + ("" if p.used_bytes is None else f" ({p.used_bytes / 2**30:.1f} GiB)") for p in left[:5]
    )
    assert not left, f"{gpu}: {len(left)} process(es) left on a node no job runs on: {shown}"


def _own_processes() -> set[int]:
    import psutil

    me = psutil.Process()
    return {me.pid} | {child.pid for child in me.children(recursive=True)}


def test_persistence_mode(gpu: Gpu) -> None:
    mode = gpu.read(nvml.persistence_mode)
    assert mode, f"{gpu}: persistence mode is {'not reported' if mode is None else 'off'}: `nvidia-smi -pm 1`"


def test_pcie_link(gpu: Gpu) -> None:
    link = gpu.read(nvml.pcie_link)
    if link is None:
        pytest.skip(f"{gpu}: NVML reports no PCIe link for this GPU")
    note = ""
    if link.gen < link.gen_max:
        loaded = _pcie_link_under_load(gpu)
        note = " with host-to-device copies running" if loaded is not None else " (idle: no CUDA device to load it)"
        link = loaded or link
    assert (link.gen, link.width) == (link.gen_max, link.width_max), (
        f"{gpu}: PCIe link trained at gen {link.gen} x{link.width}{note}, the GPU and slot support "
        f"gen {link.gen_max} x{link.width_max}"
    )


def _pcie_link_under_load(gpu: Gpu) -> nvml.PcieLink | None:
    """CUDA only. An idle GPU lowers its PCIe link generation to save power; the link is trained at its best
    only while data moves. Copy host to device on this GPU and read the link meanwhile. None when torch has no
    CUDA device with this GPU's UUID to copy to."""
    import threading

    import torch

    if not torch.cuda.is_available():
        return None
    uuid = gpu.info.uuid.lower().removeprefix("gpu-")
    indices = [
        i
        for i in range(torch.cuda.device_count())
        if str(torch.cuda.get_device_properties(i).uuid).lower().removeprefix("gpu-") == uuid
    ]
    if not indices:
        return None
    device = torch.device("cuda", indices[0])
    src = torch.empty(64 * 2**20, dtype=torch.uint8).pin_memory()
    dst = torch.empty(src.shape, dtype=src.dtype, device=device)
    done = threading.Event()

    def copy_until_done() -> None:
        while not done.is_set():
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize(device)

    copier = threading.Thread(target=copy_until_done, daemon=True)
    copier.start()
    try:
        readings = []
        for _ in range(10):
            time.sleep(0.05)
            readings.append(gpu.read(nvml.pcie_link))
    finally:
        done.set()
        copier.join()
    return max((r for r in readings if r is not None), key=lambda r: (r.gen, r.width), default=None)


def test_nvlinks(gpu: Gpu, gb_expected: Expected) -> None:
    expected = gb_expected.get("health.nvlinks_per_gpu")
    links = gpu.read(nvml.nvlinks)
    if not links and expected is None:
        pytest.skip(f"{gpu} has no NVLink and the {gpu.gpus.target.sku} baseline expects none")
    down = [link for link, active in links.items() if not active]
    up = len(links) - len(down)
    healthy = not down and (expected is None or up == expected)
    assert healthy, (
        f"{gpu}: {up} NVLink(s) up"
        + (f", expected {expected}" if expected is not None else "")
        + (f"; down: {', '.join(map(str, down))}" if down else "")
    )


def test_nvlink_fabric(gpu: Gpu, gb_expected: Expected) -> None:
    """The GPU registered with the NVLink fabric (the fabric manager of the NVLink switch trays), successfully,
    and the fabric's health mask reports nothing wrong: NVLink bandwidth degraded, a route recovering or
    unhealthy, an access timeout recovery, an incorrect configuration, the global fabric manager disconnected
    (NCCL has crashed at scale on a fabric whose mask showed half its paths down)."""
    registration = gpu.read(nvml.fabric)
    if registration is None:
        _no_fabric(gb_expected, f"{gpu}: NVML reports no NVLink fabric for this GPU")
    problems = []
    if registration.state != "completed":
        problems.append(f"fabric registration is {registration.state}, not completed")
    elif registration.status != "Success":
        problems.append(f"fabric registration completed with {registration.status!r}")
    problems += [f"the fabric reports {fault}" for fault in registration.health_faults]
    assert not problems, f"{gpu}: {'; '.join(problems)}"


def test_c2c_enabled(gpu: Gpu, gb_expected: Expected) -> None:
    """On Grace systems each GPU reaches its CPU and the CPU's memory over NVLink-C2C."""
    if not gb_expected.require("health.c2c"):
        pytest.skip(f"the {gpu.gpus.target.sku} baseline says its GPUs have no NVLink-C2C")
    enabled = gpu.read(nvml.c2c_enabled)
    assert enabled, f"{gpu}: NVLink-C2C to the Grace CPU is {'not reported' if enabled is None else 'disabled'}"


def test_nvlink_errors(gpu: Gpu, gb_expected: Expected) -> None:
    """NVLink data-link errors since the driver loaded, per link, against the baseline's limits. A counter NVML
    does not keep on this GPU is left out, as DCGM-based checks do."""
    limits = gb_expected.require_any(*(f"{NVLINK_LIMITS}.{c}" for c in nvml.NVLINK_ERROR_COUNTERS))
    counts = gpu.read(nvml.nvlink_errors)
    if not any(n is not None for counters in counts.values() for n in counters.values()):
        pytest.skip(f"{gpu}: NVML reports no NVLink error counters for this GPU")
    over = [
        f"link {link} {counter} {n}, limit {limit}"
        for link, counters in counts.items()
        for field, limit in limits.items()
        if (n := counters[(counter := field.rsplit(".", 1)[1])]) is not None and n > limit
    ]
    assert not over, f"{gpu}: NVLink errors: {'; '.join(over)}"


def test_application_clocks(gpu: Gpu) -> None:
    """Operators set application clocks to their maximum before benchmarks (`nvidia-smi -ac <mem>,<sm>`)."""
    c = gpu.read(nvml.clocks)
    if None in (c.graphics_app_mhz, c.graphics_max_mhz, c.mem_app_mhz, c.mem_max_mhz):
        pytest.skip(f"{gpu}: NVML reports no application clocks for this GPU")
    assert (c.graphics_app_mhz, c.mem_app_mhz) == (c.graphics_max_mhz, c.mem_max_mhz), (
        f"{gpu}: application clocks graphics {c.graphics_app_mhz} of {c.graphics_max_mhz} MHz, memory "
        f"{c.mem_app_mhz} of {c.mem_max_mhz} MHz: `nvidia-smi -i {gpu.index} -ac {c.mem_max_mhz},{c.graphics_max_mhz}`"
    )


# --- the driver's own verdicts -----------------------------------------------------------------------------
# What NVML itself says of a GPU: the repair it asks for, memory it cannot repair, SRAM past its threshold, the
# thermal margin, and two counters DCGM judges as rates. Thresholds and actions: DCGM 4.6's health watch
# (modules/health/DcgmHealthWatch.cpp, common/DcgmGPUHardwareLimits.h), NVIDIA's RMA policy for row remapping, and
# NVSentinel ADR-042 for the thermal offsets. A reading this GPU or driver does not give skips naming the driver.

# nvml.RECOVERY_ACTIONS code -> the repair it asks for. DCGM fails on GPU_RESET, NODE_REBOOT and DRAIN_AND_RESET
# and warns on DRAIN_P2P (RECOVERY_WARNINGS); the codes newer drivers add fail as their names say.
RECOVERY_REPAIRS = {
    1: "reset the GPU (nvidia-smi -r with no process on it, or reboot the node)",
    2: "reboot the node",
    4: "drain the node's jobs, then reset the GPU (nvidia-smi -r, or reboot)",
    5: "recover the node's IMEX domain (restart nvidia-imex on the domain's nodes), then run the checks again",
    6: "reset the GPU's PCIe bus (nvidia-smi -r, or reboot the node)",
    7: "reboot the node",
}
RECOVERY_WARNINGS = {3: "drain peer-to-peer traffic from the GPU (DCGM warns on it; not yet a fault)"}
ROW_REMAP_WARN = 512  # uncorrectable remaps: DCGM warns at this many; NVIDIA's RMA policy sets the failure flag
# PCIe replays: DCGM warns above the replay rate a bit-error rate of 1e-12 gives at the link's transfer rate, per
# lane: Gen3 0.48, Gen4 0.96, Gen5 1.92 per minute (Gen5 x16: 30.7; DCGM rounds it to 31).
PCIE_BER = 1e-12
PCIE_GT_PER_S = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}  # transfers per second per lane, by generation
NVLINK_CRC_FAIL_PER_S = 100  # DCGM: 100 or more NVLink CRC errors (flit or data) a second on a link


def _unavailable(gpu: Gpu, what: str) -> NoReturn:
    pytest.skip(f"{gpu}: {what} unavailable on driver {gpu.info.driver_version}")


def _warn(request: pytest.FixtureRequest, text: str) -> None:
    """A WARN of a check that measures nothing: the test passes, the JUnit property `gb_health_warning` says
    why (xunit1), and a GbValidateWarning is raised as gb_expect raises one (ignored unless the operator's filters
    name it: `-W error::pytest_gbvalidate.expect.GbValidateWarning` fails the test on it)."""
    request.node.user_properties.append(("gb_health_warning", text))
    warnings.warn(GbValidateWarning(text), stacklevel=2)


def _rates(gpu: Gpu, gb_window: Window, counts: dict[str, int]) -> dict[str, window.Rate]:
    """Mark name -> the counter's rate since the check's last clean run (node/window.py), else since boot (NVML
    counts since the driver loaded)."""
    now_s = time.time()
    rates = {name: window.rate(gb_window, name, count, now_s) for name, count in counts.items()}
    unread = [name for name, r in rates.items() if r is None]
    if unread:
        pytest.skip(f"{gpu}: no mark this boot for {', '.join(unread)} and {window.UPTIME} unreadable: not judged")
    return {name: r for name, r in rates.items() if r is not None}


def _close_window(gb_window: Window, counts: dict[str, int], request: pytest.FixtureRequest) -> None:
    """A clean check moves its marks to these readings; a failed one leaves them, so its re-run (confirm before
    drain) sees the same errors, and they keep failing it until a clean run, a reboot or a repair says otherwise."""
    problem = gb_window.write(counts)
    if problem is not None:
        request.node.user_properties.append(("gb_window_problem", problem))


def test_gpu_recovery_action(gpu: Gpu, request: pytest.FixtureRequest) -> None:
    """The recovery action the driver sets for the GPU (NVML field 230, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; Xid
    154 says it changed). As DCGM 4.6's health watch: a GPU reset, a node reboot or a drain and reset fails, naming
    the action and its repair; drain P2P warns. The actions newer drivers add (RECOVER_IMEX_DOMAIN, BUS_RESET,
    SYSTEM_REBOOT) fail with the repair their names say."""
    action = gpu.read(nvml.recovery_action)
    if action is None:
        _unavailable(gpu, "the GPU recovery action (NVML field 230)")
    name = nvml.RECOVERY_ACTIONS.get(action, f"unknown ({action})")
    said = f"{gpu}: the driver's recovery action is {name}"
    if action in RECOVERY_WARNINGS:
        _warn(request, f"{said}: {RECOVERY_WARNINGS[action]}")
    elif action != 0:
        repair = RECOVERY_REPAIRS.get(action, "read nvidia-smi -q (GPU Recovery Action), then reboot the node")
        pytest.fail(f"{said}: {repair}", pytrace=False)


def test_memory_unrepairable(gpu: Gpu) -> None:
    """The driver's flag that the GPU's memory has a fault its repairs (row remapping, channel repair) cannot
    mend (nvmlDeviceGetUnrepairableMemoryFlag_v1, DCGM field 1507): DCGM fails on any; the GPU is an RMA."""
    flag = gpu.read(nvml.unrepairable_memory)
    if flag is None:
        _unavailable(gpu, "the unrepairable-memory flag (nvmlDeviceGetUnrepairableMemoryFlag_v1)")
    assert not flag, f"{gpu}: the driver flags its memory unrepairable: replace the GPU (RMA)"


def test_memory_repair_pending(gpu: Gpu) -> None:
    """A repair the GPU made that waits for its next reset (nvmlDeviceGetRepairStatus: an HBM channel repair,
    Blackwell's step after row remapping in a bank, or a TPC repair): until the reset the GPU runs unrepaired."""
    status = gpu.read(nvml.repair_status)
    if status is None:
        _unavailable(gpu, "the repair status (nvmlDeviceGetRepairStatus)")
    repairs = (("channel", status.channel_repair_pending), ("TPC", status.tpc_repair_pending))
    pending = [what for what, on in repairs if on]
    assert not pending, f"{gpu}: a {' and a '.join(pending)} repair is pending: reset the GPU to apply it"


def test_sram_threshold(gpu: Gpu) -> None:
    """The driver's verdict on the GPU's SRAM ECC errors (nvmlDeviceGetSramEccErrorStatus, DCGM field 346): past
    its threshold the GPU is an RMA (DCGM SRAM_THRESHOLD; NVIDIA's RMA policy: above 4 unique uncorrectable errors
    per bank of parity SRAM, above 2 of SECDED SRAM)."""
    status = gpu.read(nvml.sram_ecc_status)
    if status is None:
        _unavailable(gpu, "the SRAM ECC error status (nvmlDeviceGetSramEccErrorStatus)")
    assert not status.threshold_exceeded, (
        f"{gpu}: SRAM ECC errors passed the driver's threshold ({status.uncorrectable_parity} uncorrectable parity, "
        f"{status.uncorrectable_secded} uncorrectable SECDED, {status.correctable} correctable over its life): "
        "replace the GPU (RMA)"
    )


def test_thermal_margin(gpu: Gpu, gb_expected: Expected) -> None:
    """The GPU's thermal margin now (its T.Limit temperature, degrees C below the T.Limit: nvidia-smi's "GPU T.Limit
    Temp", nvmlDeviceGetMarginTemperature) against the SKU's offset (`health.thermal_margin_offset_c`): below it the
    GPU runs past its limit by more than the SKU allows (NVSentinel ADR-042: -2 C on H100 and GB200, where the
    driver's own slowdown margin lies; A100 has no T.Limit). The driver's slowdown and shutdown margins (NVML fields
    194, 193) are named beside it."""
    offset = gb_expected.require("health.thermal_margin_offset_c")
    reading = gpu.read(nvml.thermal_margin)
    if reading.margin_c is None:
        _unavailable(gpu, "the thermal margin (nvmlDeviceGetMarginTemperature)")
    limits = [f"{name} at {c} C" for name, c in (("slows", reading.slowdown_c), ("shuts down", reading.shutdown_c))]
    known = [text for text, c in zip(limits, (reading.slowdown_c, reading.shutdown_c), strict=True) if c is not None]
    assert reading.margin_c >= offset, (
        f"{gpu}: thermal margin {reading.margin_c} C (T.Limit), below the {gpu.gpus.target.sku} offset of {offset} C"
        + (f" (the driver's: {', '.join(known)})" if known else "")
        + ": check its cooling (fans, inlet temperature, heat sink)"
    )


def test_pcie_replay_rate(gpu: Gpu, gb_window: Window, request: pytest.FixtureRequest) -> None:
    """PCIe replays (NVML field 94) as a rate since the last check (the node's window), else since boot: above the
    rate a bit-error rate of 1e-12 gives on the GPU's link (per lane per minute Gen3 0.48, Gen4 0.96, Gen5 1.92:
    30.7 on Gen5 x16, which DCGM rounds to 31) it warns, as DCGM 4.6's health watch does."""
    count = gpu.read(nvml.pcie_replays)
    if count is None:
        _unavailable(gpu, "the PCIe replay counter (NVML field 94)")
    link = gpu.info.pcie
    if link is None or link.gen_max not in PCIE_GT_PER_S:
        pytest.skip(f"{gpu}: NVML reports no PCIe link generation to judge its replays by")
    limit_per_min = PCIE_BER * PCIE_GT_PER_S[link.gen_max] * 1e9 * 60 * link.width_max
    counts = {f"pcie_replays/{gpu.info.uuid}": count}
    (replays,) = _rates(gpu, gb_window, counts).values()
    if replays.per_s * 60 > limit_per_min:
        _warn(
            request,
            f"{gpu}: {replays.per_s * 60:.1f} PCIe replays a minute ({replays.counted}), above the "
            f"{limit_per_min:.1f} a bit-error rate of 1e-12 gives on gen {link.gen_max} x{link.width_max}: check the "
            "GPU's PCIe link (riser, slot)",
        )
    _close_window(gb_window, counts, request)  # a warning passes: it is not judged again


def test_nvlink_crc_error_rate(gpu: Gpu, gb_window: Window, request: pytest.FixtureRequest) -> None:
    """NVLink CRC errors (flit and data) of each link as a rate since the check's last clean run (the node's
    window), else since boot: 100 or more a second on a link fails, as DCGM 4.6's health watch judges each link. Each
    link has its mark: a link that does not answer in one run cannot make another's count look cleared."""
    counts = gpu.read(nvml.nvlink_errors)
    if not counts:
        pytest.skip(f"{gpu} has no NVLink")
    per_link = {
        f"nvlink_{kind}/{gpu.info.uuid}/{link}": n
        for link, counters in counts.items()
        for kind in ("crc_flit", "crc_data")
        if (n := counters[kind]) is not None
    }
    if not per_link:
        _unavailable(gpu, "the NVLink CRC error counters (nvmlDeviceGetNvLinkErrorCounter)")
    over = [
        f"link {name.rsplit('/', 1)[1]} {name.split('/')[0].removeprefix('nvlink_')} {r.per_s:.1f}/s ({r.counted})"
        for name, r in _rates(gpu, gb_window, per_link).items()
        if r.per_s >= NVLINK_CRC_FAIL_PER_S
    ]
    assert not over, f"{gpu}: NVLink CRC errors {'; '.join(over)}, {NVLINK_CRC_FAIL_PER_S}/s or more: check its links"
    _close_window(gb_window, per_link, request)
