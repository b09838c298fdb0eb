"""Device probe, arch ranges, simulated targets and the device families plugins declare."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import xbackend
from xbackend._device import (
    BUILTIN_FAMILIES,
    DEVICES_GRAMMAR,
    Device,
    DeviceFamily,
    DeviceSpec,
    arch_key,
    device_families,
    probe,
    simulated,
)
from xbackend.ops import OPS
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


# -- device families a plugin declares -----------------------------------------------------------------
XE = DeviceFamily("xpu", r"xe\d+", spelling="xeN", examples=("xe2", "xe3"))


def _reference_rmsnorm(x, weight, eps, flavour):
    return OPS["rmsnorm"].reference(x, weight, eps, flavour)


class IntelXPU:
    """A toy plugin for a device type xbackend does not know: its family, planning targets and impls."""

    @xbackend.hookimpl
    def xbackend_device_families(self):
        return [XE]

    @xbackend.hookimpl
    def xbackend_simulated_targets(self):
        return {"xe2": Device("xpu", "xe2", "Intel Arc B580", simulated=True),
                "xe3": Device("xpu", "xe3", "Intel Xe3", simulated=True)}

    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="rmsnorm", name="any_xe", fn=_reference_rmsnorm, priority=5, devices="xpu")
        registrar.register(op="rmsnorm", name="xe3_up", fn=_reference_rmsnorm, priority=10, devices="xe3..")


class XeKernels:
    """A second plugin that names the family's arches without declaring it."""

    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="rmsnorm", name="xe2_only", fn=_reference_rmsnorm, priority=20, devices="xe2")


def test_the_builtin_families_are_data() -> None:
    assert [f.vendor for f in BUILTIN_FAMILIES] == ["cuda", "rocm", "cpu"]
    assert DEVICES_GRAMMAR == ('"*" | "cuda" | "rocm" | "cpu" | ARCH | ARCH".."ARCH | ARCH".." (comma-separated; '
                               'ARCH: smNN such as sm90, sm100, sm103, or gfxNNN such as gfx942, gfx950)')
    assert arch_key("sm90a") == arch_key("sm90") == ("cuda", 90) and arch_key("gfx90a") == ("rocm", 0x90A)


def test_a_plugin_family_plans_for_its_targets() -> None:
    # Loaded in either order, "kernels" registers after the family is known.
    with fresh_runtime([("kernels", XeKernels()), ("intel", IntelXPU())]) as rt:
        assert rt.families == (XE,) and rt.problems == []
        assert rt.plugins["kernels"].impls == ["rmsnorm:xe2_only"] and rt.plugins["kernels"].error is None
        on_xe2 = xbackend.plan("rmsnorm", "xe2")
        assert [(r.qualname, r.verdict) for r in on_xe2.rows] == [
            ("kernels:xe2_only", "chosen"), ("intel:xe3_up", "arch"), ("intel:any_xe", "lower_priority"),
            ("xbackend:reference", "lower_priority")]
        assert on_xe2.rows[1].why == "needs xe3..; device is xe2"
        assert xbackend.plan("rmsnorm", "xe3").chosen.qualname == "intel:xe3_up"
        assert xbackend.plan("rmsnorm", "sm100").chosen.qualname == "xbackend:reference"


def test_family_arches_order_and_parse_only_where_the_family_is_known() -> None:
    with pytest.raises(ValueError, match="unknown arch 'xe2'"):
        DeviceSpec.parse("xe2")
    with device_families((XE,)):
        assert arch_key("xe2") < arch_key("xe3") < arch_key("xe10")
        (spec,) = DeviceSpec.parse("xe2..xe3")
        assert spec.matches(Device("xpu", "xe3")) and not spec.matches(Device("xpu", "xe10"))
        assert DeviceSpec.parse("xpu")[0].matches(Device("xpu", "xe10"))
        with pytest.raises(ValueError, match=r"a range is written xe2\.\.xe3; expected .*or xeN such as xe2, xe3\)"):
            DeviceSpec.parse("xe2-xe3")
        with pytest.raises(ValueError, match="mixes vendors"):
            DeviceSpec.parse("xe2..sm100")
    assert spec.matches(Device("xpu", "xe2"))  # a parsed spec keeps its family


def test_impls_for_an_undeclared_family_fail_to_register() -> None:
    with fresh_runtime([("kernels", XeKernels())]) as rt:
        assert "devices: device spec 'xe2': unknown arch 'xe2'" in rt.plugins["kernels"].error
        assert rt.registry.impls("rmsnorm") == []


@pytest.mark.parametrize(("family", "problem"), [
    (DeviceFamily("cuda", r"xe\d+"), "vendor 'cuda' already has a device family"),
    (DeviceFamily("nv", r"sm\d+", examples=("sm90",)), "arch 'sm90' would belong to both 'nv' and 'cuda'"),
    (DeviceFamily("xpu", r"xe(\d+"), "arch_pattern 'xe(\\\\d+' is not a regex"),
    (DeviceFamily("xpu", r"xe\d+", examples=("arc",)), "example 'arc' does not match"),
    ("xpu", "expected an xbackend DeviceFamily, got str"),
])
def test_a_clashing_family_is_a_load_problem(family, problem: str) -> None:
    class Clash:
        @xbackend.hookimpl
        def xbackend_device_families(self):
            return [family]

    with fresh_runtime([("clash", Clash())]) as rt:
        assert rt.families == ()
        assert len(rt.problems) == 1 and rt.problems[0].startswith("plugin 'clash': device family")
        assert problem in rt.problems[0]
