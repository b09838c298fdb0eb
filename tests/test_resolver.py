"""The resolver: arch ranges, dtypes, predicates, quality tiers, availability, overrides and blocks,
each rejection with its reason; planning for devices this host does not have."""

from __future__ import annotations

import pytest
import torch
from plugin_fixtures import FleetPlugin

import xbackend
from xbackend.testing import fresh_runtime


def reasons(p: xbackend.Plan) -> dict[str, str | None]:
    return {r.impl: r.reason for r in p.rows}


@pytest.fixture
def fleet():
    with fresh_runtime([("fleet", FleetPlugin())]) as rt:
        yield rt


def test_highest_priority_survivor_wins_per_arch(fleet) -> None:
    assert xbackend.plan("gated_residual", "sm90").chosen.impl == "bf16_only"
    assert xbackend.plan("gated_residual", "sm90", dtype=torch.float16).chosen.impl == "hopper"
    assert xbackend.plan("gated_residual", "sm100", dtype=torch.float16).chosen.impl == "blackwell"
    assert xbackend.plan("gated_residual", "b300", dtype=torch.float16).chosen.impl == "blackwell"
    assert xbackend.plan("gated_residual", "mi350x", dtype=torch.float16).chosen.impl == "pointwise"
    assert xbackend.plan("gated_residual", "sm120", dtype=torch.float16).chosen.impl == "reference"


def test_every_rejection_has_a_short_reason(fleet) -> None:
    r = reasons(xbackend.plan("gated_residual", "gfx950", dtype=torch.float16))
    assert r["approx"] == "ulp(1) needs quality 'high'; current is 'lossless'"
    assert r["bf16_only"] == "dtype float16 not in {bfloat16}"
    assert r["hopper"] == "needs sm90; device is gfx950"
    assert r["pointwise"] is None
    assert r["reference"] is None  # eligible but lower priority


def test_supports_predicate_reason(fleet) -> None:
    x = torch.empty(1, 4, 7, dtype=torch.float16, device="meta")
    p = xbackend.plan("gated_residual", "gfx942", args=(x, x, x[:, :1]))
    assert reasons(p)["pointwise"] == "D=7 is odd"
    assert p.chosen.impl == "reference"


def test_quality_tier_admits_ulp_contracts(fleet) -> None:
    with xbackend.quality("high"):
        assert xbackend.plan("gated_residual", "sm90", dtype=torch.float16).chosen.impl == "approx"
    assert xbackend.plan("gated_residual", "sm90", dtype=torch.float16, quality="fast").chosen.impl == "approx"
    with pytest.raises(ValueError, match="quality: expected one of 'lossless', 'high', 'fast', got 'max'"):
        with xbackend.quality("max"):
            pass


def test_unavailable_impl_reads_as_unavailable_not_a_crash(fleet) -> None:
    p = xbackend.plan("rmsnorm", "gfx950")
    assert reasons(p)["vendor_lib"] == "unavailable: RuntimeError: ROCm version file not found"
    assert p.chosen.impl == "reference"
    assert xbackend.plan("rmsnorm", "gfx950", assume_available=True).chosen.impl == "vendor_lib"


def test_use_forces_an_impl_or_raises_with_the_reason(fleet) -> None:
    with xbackend.use(gated_residual="pointwise"):
        p = xbackend.plan("gated_residual", "sm90", dtype=torch.float16)
        assert p.chosen.impl == "pointwise"
        assert reasons(p)["hopper"] == "not the forced impl (use(gated_residual='pointwise'))"
    with xbackend.use(gated_residual="hopper"), pytest.raises(xbackend.ImplUnusableError, match="forced impl 'hopper' cannot run this call: needs sm90; device is gfx950"):
        xbackend.plan("gated_residual", "gfx950")
    with xbackend.use(gated_residual="nope"), pytest.raises(xbackend.ImplUnusableError, match="names no registered impl"):
        xbackend.plan("gated_residual", "sm90")
    with pytest.raises(ValueError, match="use: unknown op 'rms'"):
        with xbackend.use(rms="x"):
            pass


def test_block_list_by_plugin_or_impl_name() -> None:
    with fresh_runtime([("fleet", FleetPlugin())], block={"fleet:bf16_only", "hopper"}):
        r = reasons(xbackend.plan("gated_residual", "sm90"))
        assert r["bf16_only"] == "blocked by XBACKEND_BLOCK (fleet:bf16_only)"
        assert r["hopper"] == "blocked by XBACKEND_BLOCK (hopper)"
    with fresh_runtime([("fleet", FleetPlugin())], block={"fleet"}) as rt:
        assert rt.plugins["fleet"].error == "blocked by XBACKEND_BLOCK"
        assert [r.impl for r in xbackend.plan("gated_residual", "sm90").rows] == ["reference"]


def test_plan_output_is_printable_and_json(fleet) -> None:
    p = xbackend.plan("gated_residual", "sm100", dtype=torch.float16)
    text = str(p)
    assert text.splitlines()[0].startswith("gated_residual on sm100 (NVIDIA B200, simulated)")
    assert "-> fleet:blackwell" in text
    d = p.to_dict()
    assert d["chosen"] == "fleet:blackwell" and (d["op"], d["dtype"], d["quality"]) == ("gated_residual", "float16", "lossless")
    assert {c["impl"]: c["verdict"] for c in d["candidates"]}["fleet:blackwell"] == "chosen"
    assert all(c["reason"] for c in d["candidates"])  # every verdict explained, eligible ones too


def verdicts(p: xbackend.Plan) -> dict[str, str]:
    return {r.qualname: r.verdict for r in p.rows}


def test_every_filter_reports_its_verdict_code(fleet) -> None:
    p = xbackend.plan("gated_residual", "gfx950", dtype=torch.float16)
    assert verdicts(p) == {"fleet:approx": "quality", "fleet:bf16_only": "dtype", "fleet:hopper": "arch",
                           "fleet:blackwell": "arch", "fleet:pointwise": "chosen", "xbackend:reference": "lower_priority"}
    ref = p.rows[-1]
    assert ref.reason is None and ref.why == "lower priority than fleet:pointwise (20 > -1)"
    assert verdicts(xbackend.plan("rmsnorm", "gfx950"))["fleet:vendor_lib"] == "unavailable"
    x = torch.empty(1, 4, 7, dtype=torch.float16, device="meta")
    assert verdicts(xbackend.plan("gated_residual", "gfx942", args=(x, x, x[:, :1])))["fleet:pointwise"] == "unsupported"
    with xbackend.use(gated_residual="pointwise"):
        assert verdicts(xbackend.plan("gated_residual", "sm90", dtype=torch.float16))["fleet:hopper"] == "forced"
    with fresh_runtime([("fleet", FleetPlugin())], block={"hopper"}):
        assert verdicts(xbackend.plan("gated_residual", "sm90"))["fleet:hopper"] == "blocked"


def test_verdict_codes_cover_every_filter() -> None:
    from xbackend._resolver import FILTERS, VERDICTS

    assert [name for name, _ in FILTERS] == list(VERDICTS)
    assert set(VERDICTS.values()) == {"forced", "blocked", "arch", "dtype", "quality", "unavailable", "unsupported", "disabled"}


def _same_priority(name: str):
    class Plugin:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="gated_residual", name="k", fn=lambda *a: None, priority=50, devices="sm90")
            registrar.register(op="gated_residual", name="j", fn=lambda *a: None, priority=50, devices="sm90")

    return (name, Plugin())


def test_equal_priorities_break_by_backend_then_impl_name_whatever_the_load_order() -> None:
    orders = []
    for plugins in ([_same_priority("zeta"), _same_priority("alpha")], [_same_priority("alpha"), _same_priority("zeta")]):
        with fresh_runtime(plugins) as rt:
            orders.append([i.qualname for i in rt.candidates("gated_residual")])
            p = xbackend.plan("gated_residual", "sm90")
    assert orders[0] == orders[1] == ["alpha:j", "alpha:k", "zeta:j", "zeta:k", "xbackend:reference"]
    assert verdicts(p) == {"alpha:j": "chosen", "alpha:k": "tie", "zeta:j": "tie", "zeta:k": "tie",
                           "xbackend:reference": "lower_priority"}
    rows = {r.qualname: r for r in p.rows}
    assert rows["zeta:k"].why == "tie with alpha:j at priority 50: alpha:j sorts first (backend name, then impl name)"
    assert rows["alpha:j"].why == "highest priority eligible; wins the tie with alpha:k on backend, then impl name"
