"""A new device kind is one entry in gdn.matrix.devices.KINDS (and its Dockerfile): the probe resolves
every op on it, the cell's benchmark times it and the accuracy command measures on it once torch sees
one, with nothing else naming the kind. Torch is made to see an Intel XPU here (torch.xpu answers that
one is available); no kernel is launched on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gdn.matrix import accuracy, bench, devices, probe, report_build

pytestmark = pytest.mark.tooling

XPU = devices.DeviceKind(
    name="xpu",
    torch_type="xpu",
    host_marker=Path("/dev/dri/renderD128"),
    container=lambda root: devices.ContainerAccess(devices=(f"{root}/dev/dri:/dev/dri:rwm",)),
    runner_labels=("self-hosted", "xpu"),
    lock_platform="x86_64-manylinux_2_28",
    needs="an Intel GPU (/dev/dri/renderD128)",
)


@pytest.fixture
def with_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    if devices.visible_accelerator() is not None:
        pytest.skip("an accelerator is visible: it comes before the XPU in the table")
    monkeypatch.setitem(devices.KINDS, "xpu", XPU)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)


def test_a_new_kind_torch_sees_is_resolved_benchmarked_and_measured_on(with_xpu) -> None:
    assert devices.visible_torch_types() == ["cpu", "xpu"]
    assert {record["device"] for record in probe.resolution_section()} == {"cpu", "xpu"}
    assert bench.accelerator() == "xpu"
    assert accuracy._device(None) == torch.device("xpu")


def test_a_kind_torch_does_not_see_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(devices.KINDS, "xpu", XPU)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    assert "xpu" not in devices.visible_torch_types()
    assert devices.visible_accelerator() != "xpu"


def test_a_kind_whose_torch_extension_does_not_import_sees_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    without = devices.DeviceKind(**{**XPU.__dict__, "torch_extension": "gdn_no_such_torch_extension"})
    assert XPU.visible() and not without.visible()


def test_the_shipped_kinds_see_what_torch_sees() -> None:
    cpu, cuda = devices.KINDS["cpu"], devices.KINDS["cuda"]
    assert cpu.visible() and cuda.visible() == torch.cuda.is_available()
    assert devices.visible_torch_types()[0] == "cpu"


def test_the_probe_lists_a_new_kinds_cards_where_the_report_finds_them(
    with_xpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)
    monkeypatch.setattr(torch.xpu, "get_device_name", lambda i: f"Intel Data Center GPU Max 1550 #{i}")
    section = probe.devices_section({})
    assert section["xpu"] == {
        "available": True,
        "count": 2,
        "devices": [{"name": "Intel Data Center GPU Max 1550 #0"}, {"name": "Intel Data Center GPU Max 1550 #1"}],
    }
    assert set(section) == {"cpu_count", "cuda", "npu", "xpu"}
    assert report_build.cards("xpu", {"devices": section}) == [
        "Intel Data Center GPU Max 1550 #0",
        "Intel Data Center GPU Max 1550 #1",
    ]
