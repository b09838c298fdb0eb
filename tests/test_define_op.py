"""``define_op``: one call makes an op, end to end. A toy ``scaled_add(x, y, alpha=1.0)`` defined here
the way every file in ``xbackend/ops`` defines its op is planned by the resolver, guarded (a wrong impl
falls back, the exact one is verified), compiled with ``fullgraph=True`` and differentiated through
its reference."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import test_fastkey
import torch

import xbackend
from xbackend import _api, _fastkey
from xbackend import _checks as chk
from xbackend._guard import alignment
from xbackend._opspec import OpSpec, define_op
from xbackend.ops import OPS
from xbackend.ops import _cases as C
from xbackend.testing import assert_no_graph_break, check_impl, fresh_runtime

NAME = "scaled_add"
ext = test_fastkey.ext  # the session's one build of the C++ key extension


# -- the op, as an op file writes it: signature and checks, reference, fake, cases, SPEC ------------
def bind(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> tuple[Any, ...]:
    return (x, y, alpha)


def check(x: torch.Tensor, y: torch.Tensor, alpha: float) -> None:
    chk.tensor(NAME, "x", x)
    chk.tensor(NAME, "y", y)
    chk.same_dtype_device(NAME, "y", y, x, "x")
    if y.shape != x.shape:
        raise chk.fail(NAME, "y", f"the shape of 'x' {chk.shape_str(x)}", chk.shape_str(y))
    chk.real_number(NAME, "alpha", alpha)


def reference(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x + alpha * y  # two roundings in bf16: alpha * y, then the sum


def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    x = torch.empty(4, 1024, dtype=dtype, device=device)
    return (x, torch.empty_like(x), 0.5)


def fake(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    check(x, y, alpha)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0) -> torch.Tensor:
        return C.randn(*shape, dtype=dtype, device=device, seed=seed)

    return [C.Case("[2,64]", (r(2, 64), r(2, 64, seed=1), 0.5)), C.Case("transposed", (C.transposed(r(16, 8)), r(16, 8, seed=1), 2.0))]


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases,
                 namespace="xbackend_tests")


# -- impls a plugin registers ------------------------------------------------------------------------
def exact(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return torch.add(x, torch.mul(y, alpha)).contiguous()  # a strided x's layout would carry through


def fused(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    # One rounding instead of two: off by an ulp on some bf16 elements, which EXACT refuses.
    return (x.float() + alpha * y.float()).to(x.dtype)


def plugin() -> object:
    class Toy:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar: Any) -> None:
            registrar.register(op=NAME, name="fused", fn=fused, priority=20, devices="cpu")
            registrar.register(op=NAME, name="exact", fn=exact, priority=10, devices="cpu")

    return Toy()


@pytest.fixture
def op(monkeypatch: pytest.MonkeyPatch) -> Iterator[xbackend.Op]:
    """The toy op among the runtime's ops (``OPS``, ``get_op``) for one test. The key form is fixed
    first, so the process's key table never learns the toy op's name."""
    _fastkey.decide()
    monkeypatch.setitem(OPS, NAME, SPEC)
    found = xbackend.Op(SPEC)
    monkeypatch.setitem(_api._OPS, NAME, found)
    yield found


def inputs(dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 256, generator=g).to(dtype), torch.randn(4, 256, generator=g).to(dtype)


# -- what define_op made ---------------------------------------------------------------------------
def test_the_spec_comes_from_bind() -> None:
    assert isinstance(SPEC, OpSpec)
    assert SPEC.signature == "scaled_add(x, y, alpha=1.0)"
    assert SPEC.tensor_args == (0, 1) and SPEC.positional_arity == 3
    assert str(torch.ops.xbackend_tests.scaled_add.default._schema) == \
        "xbackend_tests::scaled_add(Tensor x, Tensor y, float alpha) -> Tensor"
    assert str(torch.ops.xbackend_tests.scaled_add_infer.default._schema) == \
        "xbackend_tests::scaled_add_infer(Tensor x, Tensor y, float alpha) -> Tensor"


def test_the_key_is_flat_and_tags_non_tensors() -> None:
    x, y = inputs()
    assert SPEC.key(x, y, 0.5) == (NAME, x.shape, x.stride(), x.dtype, x.device, alignment(x),
                                   y.shape, y.stride(), y.dtype, y.device, alignment(y), 0.5, float)
    assert SPEC.key(x=x, y=y, alpha=0.5) == SPEC.key(x, y, 0.5)
    assert len({SPEC.key(x, y, 1), SPEC.key(x, y, 1.0), SPEC.key(x, y, True)}) == 3  # equal values, other types
    assert SPEC.key(x, y.t().contiguous().t(), 0.5) != SPEC.key(x, y, 0.5)  # strides


def test_the_python_key_agrees_with_the_cpp_key(ext) -> None:
    fast = ext[0].make(NAME, 0b11, SPEC.key)
    x, y = inputs()
    calls = [(x, y, 0.5), (x, y, 1), (x, y, 1.0), (x, y, True), (x, x, 0.5), (x.float(), y.float(), 0.5),
             (x, y.t().contiguous().t(), 0.5), (x, y, (1, 2)), (x, y, (1.0, 2.0))]
    for a in calls:
        assert isinstance(fast(*a)[1], bytes)
        for b in calls:
            assert (fast(*a) == fast(*b)) == (SPEC.key(*a) == SPEC.key(*b)), (a[2], b[2])


def test_define_op_refuses_what_it_cannot_register() -> None:
    def odd_bind(x: torch.Tensor, mode: dict) -> tuple[Any, ...]:
        return (x, mode)

    def odd_fake(x: torch.Tensor, mode: dict) -> torch.Tensor:
        return x

    with pytest.raises(TypeError, match=r"annotation of 'mode' .* has no schema type"):
        define_op("odd", bind=odd_bind, check=check, reference=reference, fake=odd_fake, example=example,
                  namespace="xbackend_tests")
    with pytest.raises(TypeError, match=r"fake takes \(x, y, alpha\), bind \(x, mode\)"):
        define_op("odd", bind=odd_bind, check=check, reference=reference, fake=fake, example=example,
                  namespace="xbackend_tests")

    def unannotated(x: torch.Tensor, y: torch.Tensor, alpha: float):  # no return annotation
        return x

    with pytest.raises(TypeError, match="fake's return annotation expected torch.Tensor or a tuple of them"):
        define_op("odd", bind=bind, check=check, reference=reference, fake=unannotated, example=example,
                  namespace="xbackend_tests")


# -- end to end: resolver, guard, compile, gradients ---------------------------------------------------
def test_the_resolver_plans_it(op: xbackend.Op) -> None:
    with fresh_runtime([("toy", plugin())]):
        plan = xbackend.plan(NAME, "cpu", dtype=torch.float32)
        assert [(r.qualname, r.verdict) for r in plan.rows] == [
            ("toy:fused", "chosen"), ("toy:exact", "lower_priority"), ("xbackend:reference", "lower_priority")]
        assert "float32[4,1024] float32[4,1024] 0.5" in str(plan)
        elsewhere = xbackend.plan(NAME, "sm100")
        assert elsewhere.chosen.qualname == "xbackend:reference"
        assert [r.verdict for r in elsewhere.rows[:2]] == ["arch", "arch"]


def test_the_guard_falls_back_from_a_wrong_impl_to_the_exact_one(op: xbackend.Op) -> None:
    with fresh_runtime([("toy", plugin())]) as rt:
        x, y = inputs()
        with pytest.warns(xbackend.FallbackWarning, match="scaled_add impl toy:fused failed verification"):
            out = op(x, y, 0.3)  # 0.3 * y rounds in bf16 (0.5 * y would not)
        assert torch.equal(out, reference(x, y, 0.3))
        assert torch.equal(op(x, y, alpha=0.3), out)  # the cached, verified impl
        assert [(e.impl, e.status) for e in rt.events] == [("toy:fused", "mismatch"), ("toy:exact", "verified")]
        assert rt.events[0].detail.startswith("not bit-identical")
        with xbackend.use(scaled_add="fused"), pytest.raises(xbackend.ImplUnusableError, match="not bit-identical"):
            op(x[:2], y[:2], 0.3)
        check_impl(rt, NAME, "exact", cases=[c.args for c in SPEC.cases(torch.bfloat16, torch.device("cpu"))])
        with pytest.raises(ValueError, match=r"^scaled_add: argument 'y' expected the shape of 'x'"):
            op(x, y[:1], 0.5)
        with pytest.raises(TypeError, match=r"^scaled_add: .*; signature: scaled_add\(x, y, alpha=1\.0\)$"):
            op(x, y, 0.5, 1)


def test_it_compiles_without_a_graph_break(op: xbackend.Op) -> None:
    with fresh_runtime([("toy", plugin())]) as rt:
        x, y = inputs()
        with pytest.warns(xbackend.FallbackWarning, match="toy:fused failed verification"):
            out = assert_no_graph_break(lambda a, b: op(a, b, 0.3) * 2, x, y)
        assert torch.equal(out, reference(x, y, 0.3) * 2)
        assert [e.impl for e in rt.events if e.status == "verified"] == ["toy:exact"]


def test_gradients_are_the_references(op: xbackend.Op) -> None:
    with fresh_runtime([("toy", plugin())]):
        x, y = (t.requires_grad_(True) for t in inputs(torch.float32))
        out = op(x, y, 0.5)
        out.backward(torch.ones_like(out))
        assert torch.equal(x.grad, torch.ones_like(x)) and torch.equal(y.grad, torch.full_like(y, 0.5))
        small = (x[:2, :3].detach().requires_grad_(True), y[:2, :3].detach().requires_grad_(True), 0.5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not a double precision floating point": check() takes fp32 at most
            assert torch.autograd.gradcheck(SPEC.custom_op, small, eps=1e-2, atol=1e-3)
        torch.library.opcheck(SPEC.custom_op, small)
        compiled = torch.compile(lambda a, b: op(a, b, 2.0).sum(), fullgraph=True, backend="aot_eager")
        a, b = (t.detach().requires_grad_(True) for t in (x, y))
        compiled(a, b).backward()
        assert torch.equal(a.grad, torch.ones_like(a)) and torch.equal(b.grad, torch.full_like(b, 2.0))
