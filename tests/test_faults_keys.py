"""Faults at the edge of the dispatch key and the op signature: a cached key must imply that the op's
check() passed for these very argument types (so validation never depends on what ran before), zero
sizes get the op's ValueError rather than an arithmetic error, and a bad call names the op and its
signature. Key-dependent tests run under both key forms (Python, and C++ where it can be built)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import test_fastkey
import torch

import xbackend
from xbackend import _checks as chk
from xbackend import _fastkey
from xbackend.ops import OPS
from xbackend.testing import fresh_runtime

ext = test_fastkey.ext  # the session's one build of the C++ key extension

na = xbackend.get_op("neighborhood_attention")
rmsnorm = xbackend.get_op("rmsnorm")


@pytest.fixture(params=["python", "c++"])
def key_form(request: pytest.FixtureRequest) -> Iterator[str]:
    """Installs one key form for the test and gives the process its own back afterwards."""
    saved = (_fastkey.KEYS, _fastkey._state)
    module = request.getfixturevalue("ext")[0] if request.param == "c++" else None
    _fastkey._install(_fastkey.KeyForm(request.param, "test"), module)
    try:
        yield request.param
    finally:
        _fastkey._set(*saved)


def q_(head_dim: int = 8) -> torch.Tensor:
    return torch.randn(1, 6, 6, 2, head_dim, generator=torch.Generator().manual_seed(0))


# -- a cached key implies that check() passed for these argument types ------------------------------
@pytest.mark.parametrize("name", ["rmsnorm", "rmsnorm_modulate", "qk_norm_rope"])
def test_a_bool_eps_is_rejected_after_an_equal_float_ran(key_form: str, name: str) -> None:
    x = torch.randn(2, 4, 8)
    head = {"rmsnorm": (x, None), "rmsnorm_modulate": (x, x, x, None), "qk_norm_rope": (x, x, None, None, x, x)}[name]
    tail = ("interleaved",) if name == "qk_norm_rope" else ()
    op = xbackend.get_op(name)
    assert isinstance(op._key(*head, 1.0, "torch", *tail)[1], bytes) == (key_form == "c++")
    with fresh_runtime():
        op(*head, 1.0, "torch", *tail)
        with pytest.raises(TypeError, match=f"{name}: argument 'eps' expected a float, got bool"):
            op(*head, True, "torch", *tail)


def test_int_flags_are_rejected_after_equal_bools_ran(key_form: str) -> None:
    q = q_()
    with fresh_runtime():
        na(q, q, q, 3, 1, (True, False))
        with pytest.raises(TypeError, match=r"neighborhood_attention: argument 'is_causal' expected a bool or 2 bools"):
            na(q, q, q, 3, 1, (1, 0))


@pytest.mark.parametrize("warm", [False, True], ids=["first call", "after (3, 3) ran"])
def test_float_kernel_sizes_get_the_ops_type_error(key_form: str, warm: bool) -> None:
    q = q_()
    with fresh_runtime():
        if warm:
            na(q, q, q, (3, 3))
        with pytest.raises(TypeError, match=r"neighborhood_attention: argument 'kernel_size' expected an int or 2 ints .*got \(3\.0, 3\.0\)"):
            na(q, q, q, (3.0, 3.0))


def test_keys_differ_in_the_type_of_equal_scalars(key_form: str) -> None:
    keys = _fastkey.KEYS
    x, q = torch.randn(2, 8), q_()
    for a, b in [(1.0, True), (1, 1.0), (1, True), (0.0, False)]:
        assert keys["rmsnorm"](x, None, a, "torch") != keys["rmsnorm"](x, None, b, "torch"), (a, b)
        assert keys["neighborhood_attention"](q, q, q, (3, 3), (1, 1), (False, False), a, (1, 1)) != \
            keys["neighborhood_attention"](q, q, q, (3, 3), (1, 1), (False, False), b, (1, 1)), (a, b)
    for a, b in [((3, 3), (3.0, 3.0)), ((1, 1), (True, True)), ((3, 3), [3, 3])]:
        assert keys["neighborhood_attention"](q, q, q, a, (1, 1), (False, False), None, (1, 1)) != \
            keys["neighborhood_attention"](q, q, q, b, (1, 1), (False, False), None, (1, 1)), (a, b)
    same = keys["neighborhood_attention"](q, q, q, (3, 3), (1, 1), (False, False), None, (1, 1))
    other = test_fastkey.twin(q)  # new memory, the same metadata and alignment class
    assert same == keys["neighborhood_attention"](other, other, other, (3, 3), (1, 1), (False, False), None, (1, 1))


# -- zero sizes: the op's ValueError ---------------------------------------------------------------
@pytest.mark.parametrize("scale", [None, 0.5])
def test_neighborhood_attention_rejects_head_dim_0(scale: float | None) -> None:
    q = q_(0)
    with pytest.raises(ValueError, match=r"neighborhood_attention: argument 'q' expected a head_dim \(last dim\) >= 1, got shape \[1, 6, 6, 2, 0\]"):
        na(q, q, q, 3, scale=scale)


@pytest.mark.parametrize(("op", "x_shape", "cos_shape"), [
    ("rotary_embedding", (0, 4, 32), (0, 2, 4, 8)),  # no batch
    ("rotary_embedding", (1, 0, 32), (1, 2, 0, 8)),  # no tokens
    ("rotary_embedding", (1, 4, 0), (1, 0, 4, 8)),  # no heads
    ("qk_norm_rope", (0, 4, 32), (0, 2, 4, 8)),
    ("qk_norm_rope", (1, 0, 32), (1, 2, 0, 8)),  # (no heads is a last dim of 0: rmsnorm's check says so)
])  # fmt: skip
def test_split_rope_with_a_per_head_cos_rejects_empty_inputs(op: str, x_shape: tuple[int, ...], cos_shape: tuple[int, ...]) -> None:
    """The [B, T, H*D] x against a [B, H, T, D/2] cos: the reference's reshape into heads fails on a
    zero B, T or H with a bare RuntimeError."""
    x, cos = torch.randn(x_shape), torch.randn(cos_shape)
    args = (x, cos, cos, "split") if op == "rotary_embedding" else (x, x, None, None, cos, cos, 1e-6, "torch", "split")
    name = "x" if op == "rotary_embedding" else "q"
    with fresh_runtime(), pytest.raises(ValueError, match=rf"^{op}: argument '{name}' expected B, H and T >= 1 for a \[B, H, T, D/2\] cos, got shape "):
        xbackend.get_op(op)(*args)


# -- a bad call names the op and its signature -----------------------------------------------------
def valid_args(name: str) -> tuple[Any, ...]:
    x, w = torch.randn(2, 4, 8), torch.randn(8)
    return {
        "rmsnorm": (x, w),
        "rmsnorm_modulate": (x, x, x),
        "add_rmsnorm": (x, x, w),
        "layernorm_modulate": (x, x, x),
        "add_layernorm": (x, x, x),
        "gated_residual": (x, x, x),
        "rotary_embedding": (x, x, x),
        "qk_norm_rope": (x, x, w, w, x, x),
        "qk_norm_rope_3d": (x6 := torch.randn(1, 2, 3, 2, 2, 8), x6, w, w),
        "silu_mul": (x, x),
        "neighborhood_attention": (q_(), q_(), q_(), 3),
    }[name]


@pytest.mark.parametrize("name", list(OPS))
def test_a_bad_call_names_the_op_and_its_signature(name: str) -> None:
    op, args = xbackend.get_op(name), valid_args(name)
    signature = OPS[name].signature
    first = signature.split("(")[1].split(",")[0]
    with fresh_runtime():
        op(*args)  # the arguments themselves are fine
        calls = [
            ((*args,), {"foo": 1}, "unexpected keyword argument 'foo'"),
            ((*args, *[None] * 10), {}, rf"takes at most \d+ positional arguments \({len(args) + 10} given\)"),
            ((), {}, rf"missing required arguments? '{first}'(, '\w+')*"),
            ((*args,), {first: args[0]}, rf"argument '{first}' given twice \(by position and by keyword\)"),
        ]
        for a, kw, problem in calls:
            with pytest.raises(TypeError, match=rf"^{name}: {problem}; signature: {re.escape(signature)}$"):
                op(*a, **kw)


def test_a_type_error_from_inside_bind_is_kept() -> None:
    """Only a signature mismatch is rewritten: bind's own TypeErrors stay what they were."""
    def bind(x: Any, y: Any = 1) -> tuple[Any, ...]:
        raise TypeError("inside")

    assert chk.bad_call("op", "op(x, y=1)", bind, (1,), {"y": 2}) is None
    assert str(chk.bad_call("op", "op(x, y=1)", bind, (1,), {"z": 2})) == \
        "op: unexpected keyword argument 'z'; signature: op(x, y=1)"


# -- alignment: a kernel's path can depend on where the data starts ---------------------------------
def wrong_when_misaligned(x, update, gate):
    """Exact on 16-byte-aligned inputs; one ulp off otherwise, as a vectorised path taken only where a
    kernel tests the address would be if it were wrong."""
    out = (x + update * gate).contiguous()
    if any(t.data_ptr() % 16 for t in (x, update, gate)):
        out = torch.nextafter(out, torch.full_like(out, float("inf")))
    return out


class AlignmentPlugin:
    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="gated_residual", name="vectorised", fn=wrong_when_misaligned, priority=5, devices="cpu")


def test_an_impl_verified_on_aligned_inputs_is_verified_again_on_a_misaligned_view(key_form: str) -> None:
    gated_residual = xbackend.get_op("gated_residual")
    buf = torch.randn(2 * 8 * 64 + 1)
    aligned, shifted = buf[:-1].view(2, 8, 64), buf[1:].view(2, 8, 64)  # same shape and strides, 4 bytes apart
    assert aligned.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 4
    u, g = torch.randn(2, 8, 64), torch.randn(2, 1, 64)
    with fresh_runtime([("p", AlignmentPlugin())]) as rt, pytest.warns(xbackend.FallbackWarning, match="failed verification"):
        assert torch.equal(gated_residual(aligned, u, g), aligned + u * g)
        assert [(e.impl, e.status) for e in rt.events] == [("p:vectorised", "verified")]
        assert torch.equal(gated_residual(shifted, u, g), shifted + u * g)
        assert [(e.impl, e.status) for e in rt.events][1:] == [("p:vectorised", "mismatch"), ("xbackend:reference", "reference")]
        assert "align 4" in rt.events[1].key
        # The aligned key keeps its verified impl.
        assert torch.equal(gated_residual(aligned, u, g), aligned + u * g) and len(rt.events) == 3
    assert gated_residual._key(aligned, u, g) != gated_residual._key(shifted, u, g)


@pytest.mark.gpu
def test_cuda_views_key_and_copy_by_their_alignment_class(key_form: str) -> None:
    """On the GPU, where the caching allocator aligns blocks to 512 bytes: views at every offset key by
    their class in both key forms, and the guard's copy of each starts at the same class."""
    from xbackend._guard import ALIGN, alignment, isolated_inputs

    op, spec = xbackend.get_op("gated_residual"), OPS["gated_residual"]
    buf = torch.randn(2048 + 256, device="cuda")
    assert buf.data_ptr() % ALIGN == 0
    views = [buf[off:off + 2048].view(8, 256) for off in (0, 1, 2, 3, 4, 8, 16, 32, 64, 128, 256)]
    classes = [alignment(v) for v in views]
    assert classes == [512, 4, 8, 4, 16, 32, 64, 128, 256, 512, 512]
    keys = [op._key(v, v, v[:, :1]) for v in views]
    python = [spec.key(v, v, v[:, :1]) for v in views]
    for i in range(len(views)):
        for j in range(len(views)):
            assert (keys[i] == keys[j]) == (python[i] == python[j]) == (classes[i] == classes[j])
        copied, _ = isolated_inputs((views[i], views[i], views[i][:, :1]), spec.tensor_args, spec.arg_names)
        assert [alignment(t) for t in copied] == [classes[i]] * 3
