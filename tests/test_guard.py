"""The first-use guard: wrong and crashing impls never reach the caller."""

from __future__ import annotations

import logging
import threading

import pytest
import torch
from plugin_fixtures import CALLS, FaultyPlugin, SlowPlugin, off_by_one_ulp

import xbackend
from xbackend.testing import fresh_runtime

gated_residual = xbackend.get_op("gated_residual")


def inputs(d: int = 64, dtype: torch.dtype = torch.bfloat16):
    g = torch.Generator().manual_seed(d)
    x, u = (torch.randn(2, 8, d, generator=g).to(dtype) for _ in range(2))
    return x, u, torch.randn(2, 1, d, generator=g).to(dtype)


def test_wrong_and_crashing_impls_fall_back_to_the_exact_one(caplog: pytest.LogCaptureFixture) -> None:
    with fresh_runtime([("faulty", FaultyPlugin())]) as rt, caplog.at_level(logging.WARNING, "xbackend"):
        x, u, g = inputs()
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        statuses = [(e.impl, e.status) for e in rt.events]
        assert statuses == [("faulty:wrong", "mismatch"), ("faulty:crashing", "raised"), ("faulty:exact", "verified")]
        assert "not bit-identical: 1 of 1024 elements differ, max 1 ulp" in rt.events[0].detail
        assert "illegal memory access" in rt.events[1].detail
        assert len(caplog.records) == 2  # one warning per failed impl and key
        # Second call: straight to the verified impl, no new events or warnings.
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert len(rt.events) == 3 and len(caplog.records) == 2
        report = str(xbackend.report())
        assert "faulty:wrong" in report and "mismatch" in report and "verified" in report


def test_disabling_is_per_key() -> None:
    with fresh_runtime([("faulty", FaultyPlugin())]) as rt:
        gated_residual(*inputs(64))
        gated_residual(*inputs(32))  # a new key checks every candidate again
        assert [e.status for e in rt.events].count("mismatch") == 2


def test_impl_that_starts_failing_after_verification_falls_back() -> None:
    state = {"fail": False}

    def flaky(x, u, g):
        if state["fail"]:
            raise RuntimeError("launch failed")
        return x + u * g

    class Flaky:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="gated_residual", name="flaky", fn=flaky, priority=5, devices="cpu")

    with fresh_runtime([("flaky", Flaky())]) as rt:
        x, u, g = inputs()
        gated_residual(x, u, g)
        state["fail"] = True
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert [e.status for e in rt.events] == ["verified", "raised", "reference"]


def test_forced_impl_that_fails_raises_instead_of_falling_back() -> None:
    with fresh_runtime([("faulty", FaultyPlugin())]), xbackend.use(gated_residual="wrong"):
        with pytest.raises(xbackend.ImplUnusableError, match="forced impl 'faulty:wrong' failed its check .* not bit-identical"):
            gated_residual(*inputs())


def test_eight_threads_on_one_first_use_verify_once() -> None:
    with fresh_runtime([("slow", SlowPlugin())]) as rt:
        x, u, g = inputs()
        CALLS["slow_exact"] = 0
        results: list[torch.Tensor] = []
        barrier = threading.Barrier(8)

        def worker() -> None:
            barrier.wait()
            results.append(gated_residual(x, u, g))

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 8 and all(torch.equal(r, x + u * g) for r in results)
        assert [e.status for e in rt.events] == ["verified"]
        assert CALLS["slow_exact"] == 8  # one verified first call, then seven fast-path calls


def test_no_verification_while_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    with fresh_runtime([("faulty", FaultyPlugin())]) as rt:
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        rt.dispatch(xbackend.get_op("gated_residual").spec, inputs())
        assert [e.status for e in rt.events] == ["unverified"]
        monkeypatch.undo()
        x, u, g = inputs()
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert [e.status for e in rt.events][-1] == "verified"


def test_ulp_contract_is_checked_by_ulp_distance() -> None:
    class Approx:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="gated_residual", name="approx", fn=off_by_one_ulp, priority=5, devices="cpu", precision=xbackend.ulp(1))

    with fresh_runtime([("approx", Approx())]) as rt:
        x, u, g = inputs()
        assert torch.equal(gated_residual(x, u, g), x + u * g)  # lossless: approx not admitted
        with xbackend.quality("high"):
            out = gated_residual(x, u, g)
        assert not torch.equal(out, x + u * g)
        assert [e.status for e in rt.events] == ["reference", "verified"]
