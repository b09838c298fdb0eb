"""Environment switches that choose a kernel's launch path (``XBACKEND_NA_SM90``) are read once per
Runtime: a key verified on one path never runs the other because the environment changed meanwhile.
A new Runtime reads them again (its caches start empty, so every key is verified again); a kernel
called outside any Runtime (the fleet's capture workers) reads the environment at each call."""

from __future__ import annotations

import warnings

import pytest
import torch

import xbackend
from xbackend._runtime import set_runtime
from xbackend.kernels import na_sm90
from xbackend.testing import fresh_runtime

gated_residual = xbackend.get_op("gated_residual")


def by_switch(x, update, gate):
    """A stand-in for na_triton's shift launch: the path follows na_sm90's switch, and the path it takes
    switched off is one ulp off (so running it unverified shows in the answer)."""
    out = (x + update * gate).contiguous()
    if not na_sm90.switched_on():
        out = torch.nextafter(out, torch.full_like(out, float("inf")))
    return out


class SwitchedPlugin:
    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="gated_residual", name="switched", fn=by_switch, priority=5, devices="cpu")


def inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 8, 64, generator=g), torch.randn(2, 8, 64, generator=g), torch.randn(2, 1, 64, generator=g)


def test_a_switch_is_read_once_per_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(na_sm90.SWITCH, raising=False)
    with fresh_runtime() as rt:
        assert na_sm90.switched_on()
        monkeypatch.setenv(na_sm90.SWITCH, "0")
        assert na_sm90.switched_on()
        assert rt.switches == {na_sm90.SWITCH: True}
    with fresh_runtime():  # a new Runtime reads the environment as it is now
        assert not na_sm90.switched_on()


def test_a_verified_key_keeps_the_path_its_verification_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(na_sm90.SWITCH, raising=False)
    x, u, g = inputs()
    with fresh_runtime([("p", SwitchedPlugin())]) as rt, warnings.catch_warnings():
        warnings.simplefilter("error", xbackend.FallbackWarning)
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        monkeypatch.setenv(na_sm90.SWITCH, "0")
        for _ in range(2):
            assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert [(e.impl, e.status) for e in rt.events] == [("p:switched", "verified")]
    # The change takes effect in a new Runtime, which verifies the key on the path the switch now picks.
    with fresh_runtime([("p", SwitchedPlugin())]) as rt, pytest.warns(xbackend.FallbackWarning, match="failed verification"):
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert [(e.impl, e.status) for e in rt.events] == [("p:switched", "mismatch"), ("xbackend:reference", "reference")]


def test_outside_a_runtime_a_switch_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel called directly (the fleet's capture workers set a deployment's switches per task)."""
    previous = set_runtime(None)
    try:
        for value, on in [("0", False), ("1", True), ("off", False)]:
            monkeypatch.setenv(na_sm90.SWITCH, value)
            assert na_sm90.switched_on() is on
    finally:
        set_runtime(previous)


def test_a_switch_read_by_two_threads_at_once_has_one_value(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from xbackend import _switches

    monkeypatch.delenv("XBACKEND_TEST_SWITCH", raising=False)
    with fresh_runtime():
        seen: list[bool] = []
        barrier = threading.Barrier(4)

        def reader(flip: bool) -> None:
            barrier.wait()
            if flip:
                monkeypatch.setenv("XBACKEND_TEST_SWITCH", "1")
            seen.append(_switches.switch("XBACKEND_TEST_SWITCH", default=False))

        threads = [threading.Thread(target=reader, args=(i == 0,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 1 and _switches.switch("XBACKEND_TEST_SWITCH", default=False) == seen[0]
