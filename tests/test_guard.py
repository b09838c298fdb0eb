"""The first-use guard: wrong and crashing impls never reach the caller."""

from __future__ import annotations

import logging
import threading
import warnings

import pytest
import torch
from fallbacks import falls_back
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
        with falls_back("faulty:wrong"), falls_back("faulty:crashing", "raised"):
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
    with fresh_runtime([("faulty", FaultyPlugin())]) as rt, falls_back("faulty:wrong"), \
            falls_back("faulty:crashing", "raised"):
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
        with falls_back("flaky:flaky", "raised"):
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
        with falls_back("faulty:wrong"), falls_back("faulty:crashing", "raised"):
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


# -- inputs the guard cannot copy: the reference answers, no impl is blamed -------------------------
RAN: list[str] = []


def reads_pointers(x, u, g):
    """A fast impl as a kernel launch is: it reads each input's data pointer (which a BatchedTensor or a
    functorch wrapper refuses), then computes the exact answer."""
    for t in (x, u, g):
        t.data_ptr()
    RAN.append("fast")
    return (x + u * g).contiguous()


class PointerPlugin:
    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="gated_residual", name="fast", fn=reads_pointers, priority=5, devices="cpu")


def batched(n: int = 3, d: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(d)
    return torch.randn(n, 2, 8, d, generator=g), torch.randn(n, 2, 8, d, generator=g), torch.randn(n, 2, 1, d, generator=g)


@pytest.mark.parametrize("plain_first", [False, True], ids=["vmap first", "plain call first"])
def test_vmap_gets_the_reference_and_the_fast_impl_keeps_its_key(plain_first: bool) -> None:
    x, u, g = batched()
    with fresh_runtime([("p", PointerPlugin())]) as rt, warnings.catch_warnings():
        warnings.simplefilter("error", xbackend.FallbackWarning)
        if plain_first:
            assert torch.equal(gated_residual(x[0], u[0], g[0]), x[0] + u[0] * g[0])
        for _ in range(2):
            assert torch.equal(torch.vmap(gated_residual)(x, u, g), x + u * g)
        vmapped = [e for e in rt.events if e.status != "verified"]
        assert [(e.impl, e.status) for e in vmapped] == [("p:fast", "unverified")] * 2
        assert "cannot copy" in vmapped[0].detail and "BatchedTensor" in vmapped[0].detail
        # A plain call of one example's shape: the fast impl, verified once and never disabled.
        RAN.clear()
        assert torch.equal(gated_residual(x[1], u[1], g[1]), x[1] + u[1] * g[1])
        assert RAN == ["fast"]
        assert [e.status for e in rt.events].count("verified") == 1
        assert not any(e.status in ("raised", "mismatch") for e in rt.events)


def test_fake_tensors_and_dispatch_subclasses_get_the_reference_and_blame_no_impl() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.two_tensor import TwoTensor

    x, u, g = batched(1)
    mode = FakeTensorMode()
    fake = [mode.from_tensor(t[0].clone()) for t in (x, u, g)]
    with fresh_runtime([("p", PointerPlugin())]) as rt, warnings.catch_warnings():
        warnings.simplefilter("error", xbackend.FallbackWarning)
        warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")  # the impl's own read, if it ran
        out = gated_residual(*fake)  # outside any compile: the mode is not active
        assert out.shape == x[0].shape
        # A __torch_dispatch__ subclass: its values are what its dispatch computes (here two tensors at
        # once), so a copy of its bytes is not the tensor the caller passed.
        two = gated_residual(*[TwoTensor(t[0], 2 * t[0]) for t in (x, u, g)])
        assert torch.equal(two.a, x[0] + u[0] * g[0]) and torch.equal(two.b, 2 * x[0] + 4 * u[0] * g[0])
        assert [(e.impl, e.status) for e in rt.events] == [("p:fast", "unverified")] * 2
        RAN.clear()
        assert torch.equal(gated_residual(x[0], u[0], g[0]), x[0] + u[0] * g[0]) and RAN == ["fast"]
        assert [e.status for e in rt.events][-1] == "verified"
