"""qk_norm_rope: the two references composed (rmsnorm then RoPE, for q and k), diffusers' LTX-2
attention bit for bit, a float64 formula, checks, the custom op and its inference twin."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import DTYPES, TOL, rmsnorm64

import xbackend
from xbackend.ops import qk_norm_rope as mod
from xbackend.ops import rmsnorm as rms_mod
from xbackend.ops import rotary_embedding as rope_mod

qk = xbackend.get_op("qk_norm_rope")
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None


def _inputs(shape, dtype=torch.float32, freq_shape=None, weight=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(shape, generator=g) * 3).to(dtype)
    k = torch.randn(shape, generator=g).to(dtype)
    d = shape[-1]
    wq = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype) if weight else None
    wk = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype) if weight else None
    angle = torch.rand(freq_shape or shape, generator=g) * 6.3
    return q, k, wq, wk, angle.cos(), angle.sin()


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_op_is_the_two_ops_composed(dtype: torch.dtype, flavour: str) -> None:
    q, k, wq, wk, cos, sin = _inputs((2, 7, 64), dtype)
    q_out, k_out = qk(q, k, wq, wk, cos, sin, 1e-6, flavour)
    rms, rope = xbackend.get_op("rmsnorm"), xbackend.get_op("rotary_embedding")
    assert torch.equal(q_out, rope(rms(q, wq, 1e-6, flavour), cos, sin))
    assert torch.equal(k_out, rope(rms(k, wk, 1e-6, flavour), cos, sin))


@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers not installed")
@pytest.mark.parametrize("dtype", DTYPES)
def test_is_ltx2_attention_bit_for_bit(dtype: torch.dtype) -> None:
    """What LTX2AudioVideoAttnProcessor does between the projections and SDPA (torch.nn.RMSNorm norms)."""
    from diffusers.models.transformers.transformer_ltx2 import apply_interleaved_rotary_emb

    q, k, _, _, cos, sin = _inputs((1, 9, 128), dtype)
    norm_q, norm_k = torch.nn.RMSNorm(128, eps=1e-6).to(dtype), torch.nn.RMSNorm(128, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm_q.weight.uniform_(0.5, 1.5)
        norm_k.weight.uniform_(0.5, 1.5)
    want = (apply_interleaved_rotary_emb(norm_q(q), (cos, sin)), apply_interleaved_rotary_emb(norm_k(k), (cos, sin)))
    got = qk(q, k, norm_q.weight.detach(), norm_k.weight.detach(), cos, sin, 1e-6, "torch")
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_formula(dtype: torch.dtype) -> None:
    q, k, wq, wk, cos, sin = _inputs((3, 5, 32), dtype, freq_shape=(5, 32))
    for out, x, w in zip(qk(q, k, wq, wk, cos, sin, 1e-5, "torch"), (q, k), (wq, wk), strict=True):
        n = rmsnorm64(x, w, 1e-5).to(dtype).double()  # the op rounds the norm before rotating
        ev, od = n[..., 0::2], n[..., 1::2]
        c, s = cos.double(), sin.double()
        want = torch.stack([ev * c[..., 0::2] - od * s[..., 0::2], od * c[..., 1::2] + ev * s[..., 1::2]], dim=-1).flatten(-2)
        torch.testing.assert_close(out.double(), want, **{k_: 2 * v for k_, v in TOL[dtype].items()})


def test_empty_input_and_no_weights() -> None:
    q, k, _, _, cos, sin = _inputs((0, 4, 8), weight=False)
    assert [t.shape for t in qk(q, k, None, None, cos, sin)] == [(0, 4, 8), (0, 4, 8)]
    q, k, _, _, cos, sin = _inputs((2, 4, 8), weight=False)
    q_out, _ = qk(q, k, None, None, cos, sin, 1e-6, "diffusers")
    assert torch.equal(q_out, rope_mod.reference(rms_mod.reference(q, None, 1e-6, "diffusers"), cos, sin, "interleaved"))


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"k": torch.randn(2, 3, 8)}, ValueError, r"qk_norm_rope: argument 'k' expected the shape of 'q' \[2, 4, 8\] .*got shape \[2, 3, 8\]"),
        ({"k": torch.randn(2, 4, 8, dtype=torch.float64)}, TypeError, r"argument 'k' expected dtype"),
        ({"q_weight": torch.randn(7)}, ValueError, r"qk_norm_rope: argument 'q_weight' expected shape \[8\]"),
        ({"k_weight": torch.randn(8, dtype=torch.float16)}, TypeError, r"qk_norm_rope: argument 'k_weight' expected dtype torch.float32 \(same as 'k'\)"),
        ({"cos": torch.randn(3, 4, 8), "sin": torch.randn(3, 4, 8)}, ValueError, r"qk_norm_rope: argument 'cos' expected a shape that broadcasts to q \[2, 4, 8\]"),
        ({"flavour": "apex"}, ValueError, r"argument 'flavour' expected 'torch' or 'diffusers', got 'apex'"),
        ({"layout": "spiral"}, ValueError, r"argument 'layout' expected 'interleaved' or 'split'"),
        ({"eps": -1.0}, ValueError, r"argument 'eps'"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_op_and_argument(change: dict, exc: type, match: str) -> None:
    q, k, wq, wk, cos, sin = _inputs((2, 4, 8))
    args = {"q": q, "k": k, "q_weight": wq, "k_weight": wk, "cos": cos, "sin": sin, "eps": 1e-6, "flavour": "torch",
            "layout": "interleaved"} | change  # fmt: skip
    with pytest.raises(exc, match=match):
        qk(**args)


def test_custom_op_and_inference_op_pass_opcheck() -> None:
    args = (*_inputs((2, 5, 16)), 1e-6, "torch", "interleaved")
    torch.library.opcheck(mod.qk_norm_rope_op, args)
    torch.library.opcheck(torch.ops.xbackend.qk_norm_rope_infer.default, args, test_utils=("test_schema", "test_faketensor"))


def test_gradients_are_the_references() -> None:
    q, k, wq, wk, cos, sin = _inputs((2, 5, 16))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, wq, wk)]
    q_out, k_out = qk(*leaves, cos, sin, 1e-6, "torch")
    (q_out.sum() + 2 * k_out.sum()).backward()
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, wq, wk)]
    rq, rk = mod.reference(*ref_leaves, cos, sin, 1e-6, "torch", "interleaved")
    (rq.sum() + 2 * rk.sum()).backward()
    for a, b in zip(leaves, ref_leaves, strict=True):
        assert torch.equal(a.grad, b.grad)


def test_compiled_call_is_one_inference_node_without_grad() -> None:
    """Under torch.compile without gradients the op is xbackend::qk_norm_rope_infer (no custom_op
    per-call layers); with gradients it stays the autograd-capable custom op."""
    q, k, wq, wk, cos, sin = _inputs((2, 5, 16))
    seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, _inputs) -> object:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    fn = torch.compile(lambda *a: qk(*a, 1e-6, "torch"), backend=backend, fullgraph=True)
    with torch.no_grad():
        out = fn(q, k, wq, wk, cos, sin)
    assert "xbackend.qk_norm_rope_infer.default" in seen
    assert all(torch.equal(a, b) for a, b in zip(out, mod.reference(q, k, wq, wk, cos, sin, 1e-6, "torch", "interleaved"), strict=True))
    seen.clear()
    torch._dynamo.reset()
    fn(q.requires_grad_(True), k, wq, wk, cos, sin)
    assert "xbackend.qk_norm_rope.default" in seen
