"""Which SKU is this node? Small providers, tried in order by `detect_sku`: Azure instance metadata, then the GPUs NVML
sees, then `cpu` when the node has no NVIDIA GPU at all. No pytest here; the plugin exposes `detect_sku` as the last
implementation of a first-result-wins hook, so a site plugin can answer first. pynvml is imported only when called."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pytest_gbvalidate.baselines import Baseline

CPU_SKU = "cpu"
# Azure stamps this asset tag into every VM's DMI table; cloud-init identifies Azure the same way. Checking it
# first keeps a non-Azure machine from sending anything to the link-local metadata address.
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
IMDS_VM_SIZE_URL = "http://169.254.169.254/metadata/instance/compute/vmSize?api-version=2021-02-01&format=text"
NVIDIA_PCI_VENDOR = "0x10de"
# Where `detect_sku` looks when not told: module-level, read at each call, so a test can point detection at a
# fake node (as topology.SYSFS_ROOT lets it do for the NUMA map).
DMI_DIR = Path("/sys/class/dmi/id")
PCI_DEVICES_DIR = Path("/sys/bus/pci/devices")
_PCI_DISPLAY_CLASS = "0x03"  # 0x0300 VGA, 0x0302 3D controller (data-centre GPUs)


class DetectionError(Exception):
    """The node could not be identified safely; the message says what was seen and what to pass instead."""


@dataclass(frozen=True)
class Detection:
    sku: str
    source: str  # how it was decided, for the session header and the reports


def detect_sku(
    baselines: list[Baseline],
    *,
    dmi_dir: Path | None = None,
    imds_url: str = IMDS_VM_SIZE_URL,
    pci_dir: Path | None = None,
) -> Detection:
    """The node's SKU; `dmi_dir` and `pci_dir` default to DMI_DIR and PCI_DEVICES_DIR."""
    vm_size = azure_vm_size(DMI_DIR if dmi_dir is None else dmi_dir, imds_url)
    if vm_size is not None:
        for b in baselines:
            if vm_size in b.detect.azure_vm_sizes:
                return Detection(b.sku, f"Azure metadata vmSize={vm_size}")
    gpu_names = nvml_gpu_names()
    if gpu_names is None:
        gpus_on_bus = nvidia_pci_devices(PCI_DEVICES_DIR if pci_dir is None else pci_dir)
        if gpus_on_bus:
            raise DetectionError(
                f"{len(gpus_on_bus)} NVIDIA GPU(s) on the PCI bus ({', '.join(gpus_on_bus[:4])}) but no NVIDIA "
                "driver answers through NVML; fix the driver or pass --gb-sku"
            )
        return Detection(CPU_SKU, "no NVIDIA GPU or driver on this node")
    if not gpu_names:
        raise DetectionError("the NVIDIA driver is loaded but NVML sees no GPU; pass --gb-sku to check this node")
    for b in baselines:
        want_name, want_count = b.detect.gpu_name_contains, b.detect.gpu_count
        if want_name and all(want_name in n for n in gpu_names) and want_count in (None, len(gpu_names)):
            return Detection(b.sku, f"NVML: {_describe(gpu_names)}")
    where = f"Azure vmSize {vm_size}, " if vm_size else ""
    raise DetectionError(
        f"{where}NVML sees {_describe(gpu_names)} and no baseline's detect section matches; pass --gb-sku, "
        "or record a baseline for this node with --gb-record"
    )


def azure_vm_size(dmi_dir: Path, url: str, timeout_s: float = 1.0) -> str | None:
    """The Azure vmSize from the instance metadata service, or None off Azure or when it does not answer."""
    import urllib.error
    import urllib.request

    try:
        if (dmi_dir / "chassis_asset_tag").read_text().strip() != AZURE_ASSET_TAG:
            return None
    except OSError:
        return None
    if not url.startswith("http://"):
        return None
    request = urllib.request.Request(url, headers={"Metadata": "true"})  # noqa: S310 -- http only, checked above
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # IMDS must never go through a proxy
    try:
        with opener.open(request, timeout=timeout_s) as response:
            size = response.read(256).decode("ascii", "replace").strip()
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return size or None


def nvml_gpu_names() -> list[str] | None:
    """Names of the GPUs NVML sees; None when there is no NVIDIA driver. Any other NVML error is raised."""
    import pynvml

    from pytest_gbvalidate.node import nvml

    try:
        with nvml.session():
            return [str(nvml.call("nvmlDeviceGetName", nvml.handle(i))) for i in range(nvml.gpu_count())]
    except nvml.NvmlError as exc:
        no_driver = (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if exc.call == "nvmlInit" and exc.code in no_driver:
            return None
        doing = "to start" if exc.call == "nvmlInit" else "while listing GPUs"
        raise DetectionError(f"NVML failed {doing}: {exc.text}; pass --gb-sku to check this node") from None


def nvidia_pci_devices(pci_dir: Path) -> list[str]:
    """PCI addresses of NVIDIA display/3D controllers, read from sysfs (no driver needed)."""
    found = []
    for dev in sorted(pci_dir.glob("*")):
        try:
            vendor = (dev / "vendor").read_text().strip()
            pci_class = (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_PCI_VENDOR and pci_class.startswith(_PCI_DISPLAY_CLASS):
            found.append(dev.name)
    return found


def _describe(names: list[str]) -> str:
    return ", ".join(f"{n}x {name}" for name, n in Counter(names).items())
