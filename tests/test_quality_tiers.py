"""Quality tiers by op kind: the rule is one table (``_precision.ADMITTED``), the resolver follows it,
and a plan that admits a non-exact impl only because its op is tolerant says why."""

from __future__ import annotations

import pytest
import torch

import xbackend
from xbackend._precision import ADMITTED, QUALITY_TIERS, admits
from xbackend.ops import neighborhood_attention as na
from xbackend.testing import fresh_runtime

CONTRACTS = [xbackend.EXACT, xbackend.ulp(1), xbackend.ulp(2), xbackend.tolerance(5e-3)]


def test_every_tier_has_a_rule_for_both_op_kinds() -> None:
    assert set(ADMITTED) == {(tier, tolerant) for tier in QUALITY_TIERS for tolerant in (False, True)}


@pytest.mark.parametrize("tier", list(QUALITY_TIERS))
def test_a_tier_that_admits_a_tolerance_contract_admits_every_ulp_contract(tier: str) -> None:
    """An ulp(n) contract bounds every element; a tier that takes the looser Frobenius bound must take it."""
    for tolerant in (False, True):
        if admits(tier, xbackend.tolerance(5e-3), tolerant):
            assert all(admits(tier, p, tolerant) for p in CONTRACTS), (tier, tolerant)


def test_exact_ops_keep_the_ulp_ladder() -> None:
    table = {tier: [str(p) for p in CONTRACTS if admits(tier, p, False)] for tier in QUALITY_TIERS}
    assert table == {"lossless": ["exact"], "high": ["exact", "ulp(1)"],
                     "fast": ["exact", "ulp(1)", "ulp(2)", "tolerance(rel_fro<0.005)"]}


class _NAPlugin:
    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar) -> None:
        registrar.register(op="neighborhood_attention", name="ulp_na", fn=na.reference, priority=20, devices="sm90",
                           precision=xbackend.ulp(1))
        registrar.register(op="neighborhood_attention", name="tol_na", fn=na.reference, priority=10, devices="sm90",
                           precision=xbackend.tolerance(5e-3))


def test_a_tolerant_op_at_lossless_takes_its_tightest_fast_impl_and_the_plan_says_why() -> None:
    with fresh_runtime([("p", _NAPlugin())]):
        p = xbackend.plan("neighborhood_attention", "sm90")
        assert p.quality == "lossless"
        assert p.chosen.qualname == "p:ulp_na", str(p)
        text = str(p)
        assert "note: neighborhood_attention is tolerant" in text and "every tier admits" in text
        exact_op = xbackend.plan("gated_residual", "sm90", dtype=torch.float32)
        assert exact_op.chosen.qualname == "xbackend:reference" and "note:" not in str(exact_op)
