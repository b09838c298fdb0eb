"""Ops that return several tensors (``qk_norm_rope``'s ``(q, k)``): the guard's comparison, the
reference's gradients, the guard itself and the plugin kit, on a toy two-output op."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fallbacks import falls_back

import xbackend
from xbackend import _fastkey
from xbackend._opspec import OpSpec, register_reference_autograd, tensor_sig
from xbackend._precision import EXACT, compare, ulp
from xbackend.bench import _equal
from xbackend.ops import OPS
from xbackend.testing import check_impl, fresh_runtime

NAME = "toy_pair"


def pair_reference(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Each input feeds both outputs, so a gradient that dropped either output would be visibly wrong.
    return x * y.sin(), x.exp() + y * y


@torch.library.custom_op("xbackend_tests::toy_pair", mutates_args=())
def pair_op(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return pair_reference(x, y)


@pair_op.register_fake
def _fake(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


register_reference_autograd(pair_op, pair_reference, (0, 1))


def _check(x: torch.Tensor, y: torch.Tensor) -> None:
    if x.shape != y.shape:
        raise ValueError(f"{NAME}: argument 'y' expected the shape of 'x', got {list(y.shape)}")


SPEC = OpSpec(
    name=NAME,
    bind=lambda x, y: (x, y),
    check=_check,
    reference=pair_reference,
    key=lambda x, y: (NAME, tensor_sig(x), tensor_sig(y)),
    example=lambda dtype, device: (torch.empty(4, 8, dtype=dtype, device=device),) * 2,
    custom_op=pair_op,
    tensor_args=(0, 1),
    signature=f"{NAME}(x, y)",
    positional_arity=2,
)


def exact_pair(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return pair_reference(x, y)


def second_off_by_one_ulp(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = pair_reference(x, y)
    flat = k.view(-1)
    flat[0] = torch.nextafter(flat[0], torch.tensor(float("inf"), dtype=k.dtype))
    return q, k


def only_first(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return pair_reference(x, y)[0]


def inputs(dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 8, 16, generator=g).to(dtype), torch.randn(2, 8, 16, generator=g).to(dtype)


@pytest.fixture
def toy_op(monkeypatch: pytest.MonkeyPatch) -> Iterator[OpSpec]:
    """The toy op as one of the runtime's ops for one test. The key form is fixed first, so the
    process's key table never learns the toy op's name."""
    _fastkey.decide()
    monkeypatch.setitem(OPS, NAME, SPEC)
    yield SPEC


def plugin(*impls: tuple[str, Any, int]) -> object:
    class Plugin:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar: Any) -> None:
            for name, fn, priority in impls:
                registrar.register(op=NAME, name=name, fn=fn, priority=priority, devices="cpu")

    return Plugin()


# -- compare ---------------------------------------------------------------------------------------
def test_compare_passes_equal_tuples_and_lists() -> None:
    q, k = pair_reference(*inputs())
    assert compare((q.clone(), k.clone()), (q, k), EXACT) is None
    assert compare([q.clone(), k.clone()], (q, k), EXACT) is None
    assert compare((q, k), [q, k], ulp(1)) is None


def test_compare_names_the_first_output_that_differs() -> None:
    x, y = inputs()
    ref = pair_reference(x, y)
    reason = compare(second_off_by_one_ulp(x, y), ref, EXACT)
    assert reason == "output 1: not bit-identical: 1 of 256 elements differ, max 1 ulp"
    assert compare(second_off_by_one_ulp(x, y), ref, ulp(1)) is None
    assert compare((ref[0], ref[1].float()), ref, EXACT) == (
        "output 1: returned torch.float32[2, 8, 16], reference is torch.bfloat16[2, 8, 16]"
    )


def test_compare_rejects_a_different_number_of_outputs() -> None:
    q, k = pair_reference(*inputs())
    assert compare((q,), (q, k), EXACT) == "returned 1 output(s), reference has 2"
    assert compare(q, (q, k), EXACT) == "returned 1 output(s), reference has 2"
    assert compare((q, k, q), (q, k), EXACT) == "returned 3 output(s), reference has 2"
    assert compare((q, k), q, EXACT) == "returned 2 output(s), reference has 1"
    assert compare(None, q, EXACT) == "returned NoneType, reference is a tensor"  # type: ignore[arg-type]


def test_single_tensor_compare_is_unchanged() -> None:
    x, y = inputs()
    q = pair_reference(x, y)[0]
    nudged = q.clone()
    nudged.view(-1)[3] = torch.nextafter(nudged.view(-1)[3], torch.tensor(float("inf"), dtype=q.dtype))
    assert compare(q.clone(), q, EXACT) is None
    assert compare(nudged, q, EXACT) == "not bit-identical: 1 of 256 elements differ, max 1 ulp"


def test_bench_exactness_covers_every_output() -> None:
    x, y = inputs()
    ref = pair_reference(x, y)
    assert _equal(exact_pair(x, y), ref)
    assert not _equal(second_off_by_one_ulp(x, y), ref)
    assert not _equal(ref[0], ref) and not _equal(ref, ref[0])
    assert _equal(ref[0].clone(), ref[0]) and not _equal(ref[1], ref[0])


# -- gradients -------------------------------------------------------------------------------------
def _leaves(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(t.to(dtype).requires_grad_(True) for t in inputs(torch.float32))  # type: ignore[return-value]


def test_gradients_through_both_outputs_are_the_references() -> None:
    x, y = _leaves()
    g = torch.Generator().manual_seed(1)
    gq, gk = torch.randn(2, 8, 16, generator=g, dtype=x.dtype), torch.randn(2, 8, 16, generator=g, dtype=x.dtype)
    q, k = pair_op(x, y)
    ((q * gq).sum() + (k * gk).sum()).backward()
    x2, y2 = (t.detach().clone().requires_grad_(True) for t in (x, y))
    q2, k2 = pair_reference(x2, y2)
    ((q2 * gq).sum() + (k2 * gk).sum()).backward()
    assert torch.equal(q, q2) and torch.equal(k, k2)
    assert torch.allclose(x.grad, x2.grad) and torch.allclose(y.grad, y2.grad)


def test_gradient_of_one_output_when_the_other_is_unused() -> None:
    x, y = _leaves()
    pair_op(x, y)[1].sum().backward()
    x2, y2 = (t.detach().clone().requires_grad_(True) for t in (x, y))
    pair_reference(x2, y2)[1].sum().backward()
    assert torch.allclose(x.grad, x2.grad) and torch.allclose(y.grad, y2.grad)


def test_gradient_only_for_inputs_that_want_one() -> None:
    x, y = _leaves()
    y = y.detach()
    q, _ = pair_op(x, y)
    q.sum().backward()
    assert torch.allclose(x.grad, y.sin())
    assert y.grad is None


def test_gradcheck_and_opcheck_of_the_two_output_op() -> None:
    x, y = (t[:1, :2, :3].detach().requires_grad_(True) for t in _leaves())
    assert torch.autograd.gradcheck(pair_op, (x, y))
    torch.library.opcheck(pair_op, (x, y))


# -- guard and plugin kit --------------------------------------------------------------------------
def test_guard_verifies_an_impl_that_returns_a_tuple(toy_op: OpSpec) -> None:
    with fresh_runtime([("pairs", plugin(("exact", exact_pair, 10)))]) as rt:
        x, y = inputs()
        out = rt.dispatch(toy_op, (x, y))
        assert isinstance(out, tuple) and len(out) == 2
        assert compare(out, pair_reference(x, y), EXACT) is None
        rt.dispatch(toy_op, (x, y))  # cached: no second verification
        assert [(e.impl, e.status) for e in rt.events] == [("pairs:exact", "verified")]


def test_guard_disables_an_impl_whose_second_output_is_wrong(toy_op: OpSpec) -> None:
    impls = [("wrong", second_off_by_one_ulp, 30), ("short", only_first, 20), ("exact", exact_pair, 10)]
    with fresh_runtime([("pairs", plugin(*impls))]) as rt:
        x, y = inputs()
        with falls_back("pairs:wrong"), falls_back("pairs:short"):
            out = rt.dispatch(toy_op, (x, y))
        assert compare(out, pair_reference(x, y), EXACT) is None
        assert [(e.impl, e.status) for e in rt.events] == [
            ("pairs:wrong", "mismatch"),
            ("pairs:short", "mismatch"),
            ("pairs:exact", "verified"),
        ]
        assert rt.events[0].detail == "output 1: not bit-identical: 1 of 256 elements differ, max 1 ulp"
        assert rt.events[1].detail == "returned 1 output(s), reference has 2"


def test_forced_impl_with_a_wrong_second_output_raises(toy_op: OpSpec) -> None:
    with fresh_runtime([("pairs", plugin(("wrong", second_off_by_one_ulp, 30)))]) as rt:
        with (
            xbackend.use(**{NAME: "wrong"}),
            pytest.raises(xbackend.ImplUnusableError, match="output 1: not bit-identical"),
        ):
            rt.dispatch(toy_op, inputs())


def test_check_impl_on_a_tuple_op(toy_op: OpSpec) -> None:
    with fresh_runtime([("pairs", plugin(("exact", exact_pair, 10), ("wrong", second_off_by_one_ulp, 5)))]) as rt:
        check_impl(rt, NAME, "exact", cases=[inputs(), inputs(torch.float32)])
        with pytest.raises(AssertionError, match="toy_pair:wrong on .*: output 1: not bit-identical"):
            check_impl(rt, NAME, "wrong", cases=[inputs()])
