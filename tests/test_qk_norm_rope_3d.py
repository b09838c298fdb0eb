"""qk_norm_rope_3d: diffusers' DiffVAE attention prelude bit for bit, a float64 formula, the chunk
split, checks, the custom op, its gradients and its inference twin."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import DTYPES, TOL, rmsnorm64

import xbackend
from xbackend.ops import qk_norm_rope_3d as mod

op = xbackend.get_op("qk_norm_rope_3d")
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None


def _inputs(shape=(1, 3, 4, 5, 2, 64), dtype=torch.float32, weight=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(shape, generator=g) * 3).to(dtype)
    k = torch.randn(shape, generator=g).to(dtype)
    d = shape[-1]
    wq = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype) if weight else None
    wk = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype) if weight else None
    return q, k, wq, wk


@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers not installed")
@pytest.mark.parametrize("head_dim", [64, 24, 96])
@pytest.mark.parametrize("dtype", DTYPES)
def test_is_diffvae_project_qkv_bit_for_bit(dtype: torch.dtype, head_dim: int) -> None:
    """What LTX2VideoVaeNeighborhoodAttention.project_qkv does after its projections."""
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeNeighborhoodAttention

    torch.manual_seed(0)
    attn = LTX2VideoVaeNeighborhoodAttention(2 * head_dim, (3, 3, 3), head_dim=head_dim).to(dtype)
    with torch.no_grad():
        attn.norm_q.weight.uniform_(0.5, 1.5)
        attn.norm_k.weight.uniform_(0.5, 1.5)
        x = torch.randn(1, 3, 4, 5, 2 * head_dim).to(dtype)
        want_q, want_k, _ = attn.project_qkv(x)
        shape = (1, 3, 4, 5, 2, head_dim)
        got = op(attn.to_q(x).view(shape), attn.to_k(x).view(shape), attn.norm_q.weight, attn.norm_k.weight,
                 attn.norm_q.eps, attn.scale, attn.rope.base, "torch")  # fmt: skip
    assert mod.rope_dim_split(head_dim) == attn.rope.rope_dim_split
    assert torch.equal(got[0], want_q) and torch.equal(got[1], want_k)


@pytest.mark.parametrize("head_dim,split", [(64, (16, 24, 24)), (8, (0, 4, 4)), (16, (4, 6, 6)), (24, (4, 10, 10)),
                                            (32, (8, 12, 12)), (128, (32, 48, 48))])  # fmt: skip
def test_chunk_split(head_dim: int, split: tuple[int, int, int]) -> None:
    assert mod.rope_dim_split(head_dim) == split and sum(split) == head_dim


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_formula(dtype: torch.dtype) -> None:
    shape = (2, 3, 4, 5, 2, 32)
    q, k, wq, wk = _inputs(shape, dtype)
    scale = 32**-0.5
    out = op(q, k, wq, wk, 1e-5, scale, 1000.0, "torch")
    for o, x, w, s in zip(out, (q, k), (wq, wk), (scale, 1.0), strict=True):
        n = (rmsnorm64(x, w, 1e-5) * s).double()
        want = torch.empty_like(n)
        lo = 0
        for axis, dim in enumerate(mod.rope_dim_split(32), 1):
            inv = 1.0 / 1000.0 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
            pos = torch.arange(shape[axis], dtype=torch.float64)
            view = [1] * 6
            view[axis] = shape[axis]
            ang = (pos[:, None] * inv[None, :]).reshape(*view[:-1], dim // 2)
            ev, od = n[..., lo : lo + dim : 2], n[..., lo + 1 : lo + dim : 2]
            want[..., lo : lo + dim : 2] = ev * ang.cos() - od * ang.sin()
            want[..., lo + 1 : lo + dim : 2] = ev * ang.sin() + od * ang.cos()
            lo += dim
        torch.testing.assert_close(o.double(), want, **{k_: 3 * v for k_, v in TOL[dtype].items()})


def test_empty_input_no_weights_and_scale_rounding() -> None:
    q, k, _, _ = _inputs((1, 0, 4, 5, 2, 16), weight=False)
    assert [t.shape for t in op(q, k, None, None)] == [q.shape, k.shape]
    q, k, _, _ = _inputs((1, 2, 2, 3, 1, 16), torch.bfloat16, weight=False)
    q_out, k_out = op(q, k, None, None, 1e-6, 0.3, 10000.0, "diffusers")
    from xbackend.ops import rmsnorm as rms_mod

    # the scaled norm is rounded to bf16 before the rotation, as eager rounds it
    n = rms_mod.reference(q, None, 1e-6, "diffusers") * 0.3
    assert n.dtype == torch.bfloat16 and torch.equal(q_out, mod.rope3d(n, 10000.0))
    assert torch.equal(k_out, mod.rope3d(rms_mod.reference(k, None, 1e-6, "diffusers"), 10000.0))


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"q": torch.randn(3, 4, 5, 2, 16)}, ValueError, r"qk_norm_rope_3d: argument 'q' expected 6 dims \[B, T, H, W, heads, head_dim\], got shape \[3, 4, 5, 2, 16\]"),
        ({"k": torch.randn(1, 2, 4, 5, 2, 16)}, ValueError, r"argument 'k' expected the shape of 'q' \[1, 3, 4, 5, 2, 16\], got shape \[1, 2, 4, 5, 2, 16\]"),
        ({"q": torch.randn(1, 3, 4, 5, 2, 12), "k": torch.randn(1, 3, 4, 5, 2, 12)}, ValueError, r"argument 'q' expected a head_dim that is a positive multiple of 8"),
        ({"k": torch.randn(1, 3, 4, 5, 2, 16, dtype=torch.float64)}, TypeError, r"argument 'k' expected dtype"),
        ({"q_weight": torch.randn(15)}, ValueError, r"argument 'q_weight' expected shape \[16\] \(head_dim of 'q'\)"),
        ({"q_scale": "0.5"}, TypeError, r"qk_norm_rope_3d: argument 'q_scale' expected a float, got str"),
        ({"q_scale": float("nan")}, ValueError, r"qk_norm_rope_3d: argument 'q_scale' expected a number, got nan"),
        ({"base": 0.0}, ValueError, r"argument 'base' expected a positive RoPE base, got 0.0"),
        ({"flavour": "apex"}, ValueError, r"argument 'flavour' expected 'torch' or 'diffusers', got 'apex'"),
        ({"eps": -1.0}, ValueError, r"argument 'eps'"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_op_and_argument(change: dict, exc: type, match: str) -> None:
    q, k, wq, wk = _inputs((1, 3, 4, 5, 2, 16))
    args = {"q": q, "k": k, "q_weight": wq, "k_weight": wk, "eps": 1e-6, "q_scale": 0.25, "base": 10000.0,
            "flavour": "torch"} | change  # fmt: skip
    with pytest.raises(exc, match=match):
        op(**args)


def test_custom_op_and_inference_op_pass_opcheck() -> None:
    args = (*_inputs((1, 2, 3, 2, 2, 16)), 1e-6, 0.25, 10000.0, "torch")
    torch.library.opcheck(mod.qk_norm_rope_3d_op, args)
    torch.library.opcheck(torch.ops.xbackend.qk_norm_rope_3d_infer.default, args, test_utils=("test_schema", "test_faketensor"))


def test_gradients_are_the_references() -> None:
    base = _inputs((1, 2, 3, 2, 2, 16))
    leaves = [t.clone().requires_grad_(True) for t in base]
    q_out, k_out = op(*leaves, 1e-6, 0.25, 10000.0, "torch")
    (q_out.sum() + 2 * k_out.sum()).backward()
    ref_leaves = [t.clone().requires_grad_(True) for t in base]
    rq, rk = mod.reference(*ref_leaves, 1e-6, 0.25, 10000.0, "torch")
    (rq.sum() + 2 * rk.sum()).backward()
    for a, b in zip(leaves, ref_leaves, strict=True):
        assert torch.equal(a.grad, b.grad)
