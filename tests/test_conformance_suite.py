"""The plugin conformance suite reports each kind of broken impl, naming op, impl and case."""

from __future__ import annotations

import pytest
import torch

import xbackend
from xbackend.ops import OPS
from xbackend.ops import gated_residual as gr
from xbackend.ops import rmsnorm as rn
from xbackend.testing import conformance


def plugin(**fns):
    class _Plugin:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            for name, (op, fn, extra) in fns.items():
                registrar.register(op=op, name=name, fn=fn, devices="cpu", dtypes={torch.float32}, **extra)

    return ("suspect", _Plugin())


def failures_of(name: str, op: str, fn, **extra) -> list[str]:
    rt, found = conformance.targets(plugin(**{name: (op, fn, extra)}))
    (target,) = found
    failures, ran = conformance.check(rt, target)
    assert ran > 0
    return failures


def test_a_correct_impl_passes_every_case() -> None:
    assert failures_of("copy", "gated_residual", gr.reference) == []
    # The op's reference as define_op wraps it: contiguous outputs (a diffusers-flavour norm of a
    # transposed x keeps x's layout in rn.reference itself).
    assert failures_of("norm", "rmsnorm", xbackend.get_op("rmsnorm").spec.reference) == []
    assert any("'diffusers/transposed': output 0 has strides (1, 16); expected contiguous" in f
               for f in failures_of("norm", "rmsnorm", rn.reference))


def test_wrong_impl_is_reported_with_its_case() -> None:
    def wrong_on_odd_d(x, u, g):
        out = gr.reference(x, u, g)
        return out + 1 if x.shape[-1] % 2 else out

    failures = failures_of("odd", "gated_residual", wrong_on_odd_d)
    assert any("gated_residual:suspect:odd:cpu:float32 case 'odd D=1001': not bit-identical" in f for f in failures)
    assert not any("'full gate'" in f for f in failures)


def test_mutating_impl_is_reported() -> None:
    def mutates(x, u, g):
        out = gr.reference(x, u, g)
        u.zero_()
        return out

    failures = failures_of("mut", "gated_residual", mutates)
    assert any("case 'full gate': modified its input 'update' in place" in f for f in failures)


def test_aliasing_impl_is_reported() -> None:
    def aliases(x, weight, eps, flavour):
        out = rn.reference(x, weight, eps, flavour)
        return x.copy_(out) if x.is_contiguous() else out

    failures = failures_of("alias", "rmsnorm", aliases)
    assert any("case 'torch/[2,64]'" in f and "in place" in f for f in failures)

    def view_of_input(x, u, g):
        return x if bool((u == 0).all()) else gr.reference(x, u, g)

    zero_update = [conformance.Case("zero update", (torch.ones(2, 8), torch.zeros(2, 8), torch.ones(8)))]
    rt, (target,) = conformance.targets(plugin(view=("gated_residual", view_of_input, {})))
    failures, _ = conformance.check(rt, target, zero_update)
    assert any("case 'zero update': returned an output sharing memory with input 'x'" in f for f in failures)


def test_crashing_impl_and_raising_supports_are_reported() -> None:
    def crashes_on_empty(x, u, g):
        if x.numel() == 0:
            raise RuntimeError("CUDA error: invalid configuration argument (simulated)")
        return gr.reference(x, u, g)

    failures = failures_of("crash", "gated_residual", crashes_on_empty)
    assert any("case 'empty [0,8,64]': raised RuntimeError: CUDA error: invalid configuration" in f for f in failures)

    def picky(x, u, g):
        return 1 / 0 if x.shape[-1] == 1 else None

    failures = failures_of("picky", "gated_residual", gr.reference, supports=picky)
    assert any("case 'D=1': supports() raised ZeroDivisionError" in f for f in failures)


def test_nondeterministic_impl_is_reported() -> None:
    calls = {"n": 0}

    def flaky(x, u, g):
        calls["n"] += 1
        out = gr.reference(x, u, g)
        return out if calls["n"] % 2 else out.nextafter(torch.full_like(out, float("inf")))

    failures = failures_of("flaky", "gated_residual", flaky, precision=xbackend.ulp(1))
    assert any("a second call differs from the first" in f for f in failures)


def test_compile_failure_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    # The op is one opaque node under torch.compile, so an impl cannot break tracing by itself; the
    # suite still compiles a call, and a failure there is reported with the impl it ran.
    def broken_compile(fn, **kwargs):
        raise torch._dynamo.exc.Unsupported("graph break in the impl (simulated)")

    monkeypatch.setattr(torch, "compile", broken_compile)
    failures = failures_of("copy", "gated_residual", gr.reference)
    assert failures and "torch.compile(fullgraph=True) over a call failed: Unsupported" in failures[0]
    assert failures[0].startswith("gated_residual:suspect:copy:cpu:float32")


def test_every_op_brings_its_cases() -> None:
    for name, spec in OPS.items():
        assert spec.cases is not None, name
        for case in spec.cases(torch.float32, torch.device("cpu"), False):
            spec.check(*spec.bind(*case.args))


test_conformance_of_a_reference_copy = conformance.suite(plugin(copy=("gated_residual", gr.reference, {})))


def test_runtime_fixture_with_plugins(xbackend_runtime_with) -> None:
    rt = xbackend_runtime_with("cuda", plugin(copy=("gated_residual", gr.reference, {})))
    assert {"cuda", "suspect"} <= set(rt.plugins)
    assert xbackend.runtime() is rt
    from xbackend.testing import assert_no_graph_break
    from xbackend.testing import conformance as c

    assert c is conformance and callable(assert_no_graph_break)
