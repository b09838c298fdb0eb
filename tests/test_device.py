"""Device probe, arch ranges and simulated targets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import xbackend
from xbackend._device import Device, DeviceSpec, arch_key, probe, simulated
from xbackend.testing import fresh_runtime


def test_arch_order() -> None:
    assert arch_key("sm90") < arch_key("sm100") < arch_key("sm103") < arch_key("sm120")
    assert arch_key("gfx90a") < arch_key("gfx942") < arch_key("gfx950")


@pytest.mark.parametrize(
    ("spec", "arch", "vendor", "ok"),
    [
        ("sm90..sm103", "sm90", "cuda", True),
        ("sm90..sm103", "sm100", "cuda", True),
        ("sm90..sm103", "sm120", "cuda", False),
        ("sm90..sm103", "sm80", "cuda", False),
        ("sm100..", "sm120", "cuda", True),
        ("gfx942,gfx950", "gfx950", "rocm", True),
        ("gfx942,gfx950", "gfx90a", "rocm", False),
        ("sm90", "gfx942", "rocm", False),
        ("cuda", "sm75", "cuda", True),
        ("rocm", "sm90", "cuda", False),
        ("*", "cpu", "cpu", True),
    ],
)
def test_device_spec_matching(spec: str, arch: str, vendor: str, ok: bool) -> None:
    device = Device(vendor, arch)
    assert any(s.matches(device) for s in DeviceSpec.parse(spec)) is ok


def test_device_spec_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="unknown arch 'volta'"):
        DeviceSpec.parse("volta")
    with pytest.raises(ValueError, match="mixes vendors"):
        DeviceSpec.parse("sm90..gfx950")


def test_simulated_targets_and_aliases() -> None:
    for name in ("sm80", "sm90", "sm100", "sm103", "sm120", "gfx942", "gfx950", "cpu"):
        assert simulated(name).arch == name and simulated(name).simulated
    assert simulated("h200").arch == "sm90"
    assert simulated("B300").arch == "sm103"
    assert simulated("mi350x").vendor == "rocm"
    with pytest.raises(ValueError, match="unknown device target 'tpu'"):
        simulated("tpu")


def test_cpu_probe() -> None:
    assert probe(torch.device("cpu")).vendor == "cpu"


def test_mixed_gpus_in_one_host_each_get_their_own_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """An H200 on cuda:0 and a B200 on cuda:1: each index is probed and cached separately."""
    props = {0: SimpleNamespace(major=9, minor=0, name="NVIDIA H200"), 1: SimpleNamespace(major=10, minor=0, name="NVIDIA B200")}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.version, "hip", None)
    probe.cache_clear()
    with fresh_runtime() as rt:
        assert rt.device(torch.device("cuda", 0)).arch == "sm90"
        assert rt.device(torch.device("cuda", 1)).arch == "sm100"
        assert rt.device("cuda:1").name == "NVIDIA B200"
    probe.cache_clear()


def test_rocm_probe_reads_gcn_arch_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(major=9, minor=4, name="AMD Instinct MI350X", gcnArchName="gfx950:sramecc+:xnack-"))
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    probe.cache_clear()
    assert probe(torch.device("cuda", 0)) == Device("rocm", "gfx950", "AMD Instinct MI350X", 0)
    probe.cache_clear()


def test_plugin_can_add_targets_and_probe() -> None:
    class NewVendor:
        @xbackend.hookimpl
        def xbackend_simulated_targets(self):
            return {"gfx1201": Device("rocm", "gfx1201", "Radeon AI PRO R9700", simulated=True)}

    with fresh_runtime([("newvendor", NewVendor())]):
        assert xbackend.plan("rmsnorm", "gfx1201").device.arch == "gfx1201"
