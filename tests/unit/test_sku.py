"""SKU auto-detection providers: Azure metadata (against a loopback server), NVML (fake library), PCI sysfs
(fake trees)."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from pytest_gbvalidate import baselines as bl
from pytest_gbvalidate import sku
from pytest_gbvalidate.settings import bundled_baselines
from tests.helpers.fakenode import nd_gb200_v6, point_detection_at, write_detection_sysfs
from tests.helpers.fakenvml import FakeGpu, FakeNvmlLib, install

BASELINES = bl.load_all(bundled_baselines())


@pytest.fixture
def azure_dmi(tmp_path: Path) -> Path:
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    (dmi / "chassis_asset_tag").write_text(sku.AZURE_ASSET_TAG + "\n")
    return dmi


@pytest.fixture
def imds() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A loopback stand-in for the instance metadata service answering vmSize; records each request."""
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append({"path": self.path, **dict(self.headers)})
            body = b"Standard_ND128isr_NDR_GB200_v6"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/metadata/instance/compute/vmSize?format=text", seen
    server.shutdown()
    server.server_close()


def test_azure_vm_size_is_asked_with_the_metadata_header(
    azure_dmi: Path, imds: tuple[str, list[dict[str, str]]]
) -> None:
    url, seen = imds
    assert sku.azure_vm_size(azure_dmi, url) == "Standard_ND128isr_NDR_GB200_v6"
    assert seen[0]["Metadata"] == "true"


def test_off_azure_the_metadata_service_is_never_contacted(
    tmp_path: Path, imds: tuple[str, list[dict[str, str]]]
) -> None:
    url, seen = imds
    assert sku.azure_vm_size(tmp_path / "no-dmi", url) is None
    (tmp_path / "chassis_asset_tag").write_text("Default string\n")
    assert sku.azure_vm_size(tmp_path, url) is None
    assert seen == []


def test_unreachable_metadata_service_is_skipped_quickly(azure_dmi: Path) -> None:
    with socket_that_never_answers() as url:
        start = time.monotonic()
        assert sku.azure_vm_size(azure_dmi, url, timeout_s=0.3) is None
        assert time.monotonic() - start < 5


class socket_that_never_answers:
    """A listening loopback socket that accepts and never replies: the client must time out."""

    def __enter__(self) -> str:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/"

    def __exit__(self, *exc: object) -> None:
        self.sock.close()


def test_azure_vm_size_selects_the_sku(
    azure_dmi: Path, imds: tuple[str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    install(monkeypatch, None)  # even with the GPUs gone, the VM size says what the node should be
    detection = sku.detect_sku(BASELINES, dmi_dir=azure_dmi, imds_url=imds[0])
    assert detection == sku.Detection("ND_GB200_v6", "Azure metadata vmSize=Standard_ND128isr_NDR_GB200_v6")


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        (["NVIDIA GB200"] * 4, "ND_GB200_v6"),
        (["NVIDIA H100 80GB HBM3"] * 8, "ND_H100_v5"),
        (["NVIDIA H200"] * 8, "ND_H200_v5"),
        (["NVIDIA A100-SXM4-40GB"] * 8, "ND96asr_v4"),
    ],
)
def test_nvml_model_and_count_select_the_sku(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: list[str], expected: str
) -> None:
    install(monkeypatch, FakeNvmlLib([FakeGpu(name) for name in gpus]))
    detection = sku.detect_sku(BASELINES, dmi_dir=tmp_path)
    assert detection.sku == expected
    assert detection.source == f"NVML: {len(gpus)}x {gpus[0]}"


def test_no_driver_and_no_gpu_is_the_cpu_sku(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None)
    assert sku.detect_sku(BASELINES, dmi_dir=tmp_path, pci_dir=tmp_path).sku == "cpu"


def test_gpus_on_the_bus_without_a_driver_are_an_error_not_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, None)
    for bdf, vendor, cls in (("0000:01:00.0", "0x10de", "0x030200"), ("0000:02:00.0", "0x8086", "0x030000")):
        (tmp_path / bdf).mkdir()
        (tmp_path / bdf / "vendor").write_text(vendor + "\n")
        (tmp_path / bdf / "class").write_text(cls + "\n")
    with pytest.raises(sku.DetectionError, match=r"1 NVIDIA GPU\(s\) on the PCI bus \(0000:01:00.0\)"):
        sku.detect_sku(BASELINES, dmi_dir=tmp_path, pci_dir=tmp_path)


@pytest.mark.parametrize(
    ("lib", "message"),
    [
        (FakeNvmlLib([FakeGpu("NVIDIA GB200")] * 3), r"NVML sees 3x NVIDIA GB200 and no baseline's detect section"),
        (FakeNvmlLib([FakeGpu("NVIDIA L4")]), r"NVML sees 1x NVIDIA L4"),
        (FakeNvmlLib([]), "the NVIDIA driver is loaded but NVML sees no GPU"),
        (FakeNvmlLib(init_error=pynvml.NVML_ERROR_UNKNOWN), "NVML failed to start: Unknown Error"),
    ],
)
def test_a_gpu_node_that_matches_nothing_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lib: FakeNvmlLib, message: str
) -> None:
    install(monkeypatch, lib)
    with pytest.raises(sku.DetectionError, match=message):
        sku.detect_sku(BASELINES, dmi_dir=tmp_path)


def test_without_arguments_detection_reads_the_pci_bus_and_dmi_at_the_module_level_locations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # As on a GPU host: an NVIDIA GPU on the PCI bus, whose driver does not answer.
    write_detection_sysfs(tmp_path, ["0000:01:00.0"])
    point_detection_at(monkeypatch, tmp_path)
    install(monkeypatch, None)
    with pytest.raises(sku.DetectionError, match=r"1 NVIDIA GPU\(s\) on the PCI bus \(0000:01:00.0\)"):
        sku.detect_sku(BASELINES)
    # A test that states a CPU-only node gets cpu there, whatever the host shows.
    request.getfixturevalue("cpu_only_node")
    assert sku.detect_sku(BASELINES) == sku.Detection("cpu", "no NVIDIA GPU or driver on this node")


def test_a_fake_node_is_detected_as_its_sku(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nd_gb200_v6().install(monkeypatch, tmp_path)
    assert sku.detect_sku(BASELINES) == sku.Detection("ND_GB200_v6", "NVML: 4x NVIDIA GB200")
    install(monkeypatch, None)  # the same node with its driver gone: the GPUs are still on the bus
    with pytest.raises(sku.DetectionError, match=r"4 NVIDIA GPU\(s\) on the PCI bus \(0008:01:00.0, "):
        sku.detect_sku(BASELINES)
