"""Kernel log lines of Xid events as the NVIDIA driver wrote them on real nodes, quoted from public sources (each
cites where), for the tests of the Xid check. `on(gpu, line)` moves a quoted line to a fake GPU's PCI address, the
rest of the line as it was. Test-only.
"""

from __future__ import annotations

import re

from tests.helpers.fakenvml import FakeGpu

# Blackwell NVLink5, on a GB200 (PCI domain 0018/0019, as the fake GB200's gpu2 and gpu3): leptonai/gpud PR #1174.
XID_145_NVLINK5 = (
    "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
    "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"
)
XID_149_NVLINK5 = (
    "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 "
    "(0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
# An application's fault, newer drivers' unknown process: vllm-project/vllm issue #5901 (A800, driver 535).
XID_13_APP = (
    "NVRM: Xid (PCI:0000:43:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: "
    "ESR 0x52e7b0=0x101000e 0x52e7b4=0x4 0x52e7a8=0xc81eb60 0x52e7ac=0x1174"
)
# App teardown after an NVLink5 error: NVIDIA/open-gpu-kernel-modules issue #1150 (driver 590.48.01).
XID_45_TEARDOWN = "NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"
# The recovery action changed: NVIDIA developer forums, "Xid 62 GSP watchdog timeout on RTX 5080" (driver 595.71.05).
XID_154_RECOVERY = (
    "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
)
# Fallen off the bus, without pid and name: NVIDIA/NVSentinel issue #155.
XID_79_OFF_THE_BUS = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
# A row-remapping event (the memory repairing itself), as a vendor's guide shows its signature (no captured log was
# found): plexus.company/guides/gpu-xid-errors/63.
XID_63_REMAP_EVENT = "NVRM: Xid (PCI:0000:65:00): 63, pid='N/A', Row Remapper: New row marked for remapping"

_PCI = re.compile(r"\(PCI:[0-9a-fA-F]+:[0-9a-fA-F]+:[0-9a-fA-F]+\)")


def on(gpu: FakeGpu, line: str) -> str:
    """`line` as the driver would log it for `gpu` (its PCI domain, bus and device in place of the quoted one)."""
    domain, bus, device_function = gpu.pci_bus_id.split(":")
    return _PCI.sub(f"(PCI:{domain[-4:]}:{bus}:{device_function.split('.')[0]})", line, count=1)
