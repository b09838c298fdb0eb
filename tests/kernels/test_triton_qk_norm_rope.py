"""Triton q/k RMSNorm + RoPE: the fused kernel is the two exact kernels composed, and the op's reference.

On CPU (TRITON_INTERPRET=1) the fused kernel must equal our RMSNorm kernel followed by our RoPE kernel
bit for bit: the same interpreter roundings on both sides, so any difference is a fusion bug (a
wrong pair, a wrong row of cos, a missing rounding). The interpreter's fp32->bf16 cast truncates, so
against the eager reference it is compared within tolerance there; the GPU tests prove torch.equal.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from xbackend.kernels import rmsnorm, triton_rotary  # noqa: E402
from xbackend.kernels import triton_qk_norm_rope as K  # noqa: E402
from xbackend.kernels.rmsnorm.launch import Schedule, exact_schedule  # noqa: E402
from xbackend.ops.qk_norm_rope import reference  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
EPS = 1e-6
NUM = rmsnorm.ROCM_NUMERICS if torch.version.hip else rmsnorm.CUDA_NUMERICS  # the build the references run
supports = functools.partial(K.supports, numerics=NUM)
qk_norm_rope = functools.partial(K.qk_norm_rope, numerics=NUM)


def _inputs(shape, dtype, freq_shape=None, freq_dtype=torch.float32, weight=True, device=DEVICE, seed=0):
    g = torch.Generator(device).manual_seed(seed)
    q = (torch.randn(shape, generator=g, device=device) * 3).to(dtype)
    k = (torch.randn(shape, generator=g, device=device) * 0.5).to(dtype)
    d = shape[-1]
    wq = (1 + 0.3 * torch.randn(d, generator=g, device=device)).to(dtype) if weight else None
    wk = (1 + 0.3 * torch.randn(d, generator=g, device=device)).to(dtype) if weight else None
    angle = torch.rand(freq_shape or shape, generator=g, device=device) * 6.3
    return q, k, wq, wk, angle.cos().to(freq_dtype), angle.sin().to(freq_dtype)


def _composed(q, k, wq, wk, cos, sin, flavour):
    """Our two exact kernels, one after the other (cos/sin materialized: the RoPE kernel wants rows)."""
    c, s = cos.expand(q.shape).contiguous(), sin.expand(q.shape).contiguous()
    return tuple(
        triton_rotary.rotary_embedding(rmsnorm.rmsnorm(x, w, EPS, flavour, numerics=NUM), c, s) for x, w in ((q, wq), (k, wk))
    )


CASES = [((2, 7, 256), None), ((1, 5, 64), (1, 5, 64)), ((2, 3, 1000), (3, 1000)), ((2, 4, 96), (1, 4, 96)),
         ((3, 2, 4096), None), ((1, 6, 8), (8,))]  # fmt: skip


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,freq_shape", CASES)
def test_fused_equals_the_two_kernels_composed(shape, freq_shape, dtype, flavour) -> None:
    args = _inputs(shape, dtype, freq_shape)
    assert supports(*args, EPS, flavour, "interleaved") is None
    got = qk_norm_rope(*args, EPS, flavour)
    for out, want in zip(got, _composed(*args, flavour), strict=True):
        assert out.dtype == dtype and out.shape == shape and out.is_contiguous()
        assert torch.equal(out, want)


def _split_inputs(b, t, heads, hd, dtype, freq_dtype=torch.float32, weight=True, per_head=True, seed=0):
    """q, k [b, t, heads*hd] with split-RoPE cos/sin [b, heads, t, hd/2] (LTX-2.3), or [b, t, D/2]
    (per_head=False: one rotation over the whole row)."""
    q, k, wq, wk, _, _ = _inputs((b, t, heads * hd), dtype, weight=weight, seed=seed)
    g = torch.Generator(DEVICE).manual_seed(seed + 1)
    angle = torch.rand((b, heads, t, hd // 2) if per_head else (b, t, heads * hd // 2), generator=g, device=DEVICE)
    return q, k, wq, wk, (angle * 6.3).cos().to(freq_dtype), (angle * 6.3).sin().to(freq_dtype)


SPLIT_CASES = [(1, 5, 4, 128), (2, 3, 8, 64), (1, 4, 2, 256), (2, 6, 24, 128), (1, 3, 1, 128), (1, 2, 16, 32)]


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,t,heads,hd", SPLIT_CASES)
def test_split_equals_the_two_kernels_composed(b, t, heads, hd, dtype, flavour) -> None:
    args = _split_inputs(b, t, heads, hd, dtype)
    reason = supports(*args, EPS, flavour, "split")
    plan = exact_schedule(b * t, heads * hd, flavour, NUM, Schedule()).tile
    tiles = plan.vec_form and (hd // 2) % plan.b == 0 and (plan.a * plan.b) % hd == 0
    assert (reason is None) == tiles, reason
    if reason is not None:
        assert "do not tile this norm's fold steps" in reason
        return
    got = qk_norm_rope(*args, EPS, flavour, "split")
    for (x, w), out in zip(((args[0], args[2]), (args[1], args[3])), got, strict=True):
        want = triton_rotary.rotary_embedding(rmsnorm.rmsnorm(x, w, EPS, flavour, numerics=NUM), args[4], args[5], "split")
        assert out.dtype == dtype and out.shape == x.shape and torch.equal(out, want)


def test_split_whole_row_and_reference() -> None:
    """cos [b, t, D/2]: one rotation over each row (diffusers' non-per-head form) when the row fits one
    fold step; fp32 against the eager reference within tolerance (CPU reduces in another order)."""
    args = _split_inputs(2, 3, 1, 256, torch.float32, per_head=False)
    got = qk_norm_rope(*args, EPS, "torch", "split")
    for out, ref in zip(got, reference(*args, EPS, "torch", "split"), strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    wide = _split_inputs(1, 3, 1, 4096, torch.float32, per_head=False)
    assert "do not tile" in supports(*wide, EPS, "torch", "split")


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
def test_without_weights_and_against_the_reference(flavour: str) -> None:
    args = _inputs((2, 5, 128), torch.float32, weight=False)
    got = qk_norm_rope(*args, EPS, flavour)
    for out, ref in zip(got, reference(*args, EPS, flavour, "interleaved"), strict=True):
        # fp32 on CPU: the reference reduces in another order and rsqrt differs from the GPU's
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_strided_rows_and_empty_input() -> None:
    q, k, wq, wk, cos, sin = _inputs((2, 3, 80), torch.float32)
    qv, kv, cv, sv = q[..., :64], k[..., :64], cos[..., :64], sin[..., :64]
    wq, wk = wq[:64].contiguous(), wk[:64].contiguous()
    assert supports(qv, kv, wq, wk, cv, sv, EPS, "torch", "interleaved") is None
    got = qk_norm_rope(qv, kv, wq, wk, cv, sv, EPS, "torch")
    for out, want in zip(got, _composed(qv.contiguous(), kv.contiguous(), wq, wk, cv, sv, "torch"), strict=True):
        assert torch.equal(out, want)
    empty = torch.randn(0, 4, 8, device=DEVICE)
    outs = qk_norm_rope(empty, empty.clone(), None, None, empty.clone(), empty.clone(), EPS, "torch")
    assert [o.shape for o in outs] == [(0, 4, 8), (0, 4, 8)]


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda a: {**a, "q": a["q"][..., :12], "k": a["k"][..., :12], "q_weight": a["q_weight"][:12],
                    "k_weight": a["k_weight"][:12], "cos": a["cos"][..., :6], "sin": a["sin"][..., :6],
                    "layout": "split"}, "do not tile"),
        (lambda a: {**a, "k": a["k"][:, :2]}, "q and k differ"),
        (lambda a: {**a, "k_weight": None}, "one of q_weight/k_weight"),
        (lambda a: {**a, "q": a["q"][..., :6], "k": a["k"][..., :6], "q_weight": a["q_weight"][:6],
                    "k_weight": a["k_weight"][:6], "cos": a["cos"][..., :6], "sin": a["sin"][..., :6]}, "D % 4"),
        (lambda a: {**a, "cos": a["cos"].double(), "sin": a["sin"].double()}, "cos/sin dtype"),
        (lambda a: {**a, "sin": a["sin"][..., :1].expand(a["sin"].shape)}, "share shape, strides"),
        (lambda a: {**a, "cos": a["cos"].transpose(0, 1).contiguous().transpose(0, 1),
                    "sin": a["sin"].transpose(0, 1).contiguous().transpose(0, 1)}, "more than two strides"),
    ],
)  # fmt: skip
def test_supports_gives_reasons(mutate, reason: str) -> None:
    q, k, wq, wk, cos, sin = _inputs((2, 3, 4, 16), torch.float32, freq_shape=(2, 3, 4, 16))
    a = mutate({"q": q, "k": k, "q_weight": wq, "k_weight": wk, "cos": cos, "sin": sin, "layout": "interleaved"})
    args = (a["q"], a["k"], a["q_weight"], a["k_weight"], a["cos"], a["sin"], EPS, "torch", a["layout"])
    assert reason in (supports(*args) or "")
    with pytest.raises(ValueError, match=reason):
        qk_norm_rope(*args)


def test_misaligned_torch_flavour_call_falls_back_per_call() -> None:
    _, k, wq, _, cos, sin = _inputs((1, 3, 65), torch.float32, freq_shape=(1, 3, 65))
    flat = torch.randn(1 + 3 * 64, device=DEVICE)
    qm = flat[1:].view(1, 3, 64)  # contiguous, its data pointer one fp32 past an aligned one (aten: Welford)
    km = k[..., :64].contiguous()
    w = wq[:64].contiguous()
    c, s = cos[..., :64].contiguous(), sin[..., :64].contiguous()
    with pytest.raises(rmsnorm.NotVectorizable):
        qk_norm_rope(qm, km, w, w, c, s, EPS, "torch")
    fixed = K.qk_norm_rope_with(NUM, reference)
    got = fixed(qm, km, w, w, c, s, EPS, "torch", "interleaved")
    for out, ref in zip(got, reference(qm, km, w, w, c, s, EPS, "torch", "interleaved"), strict=True):
        assert torch.equal(out, ref)  # the reference itself ran for this call


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("freq_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,freq_shape", [((1, 8160, 4096), None), ((1, 126, 2048), None), ((2, 300, 3072), (1, 300, 3072)),
                                              ((1, 17, 128), (17, 128)), ((4, 5, 64), None), ((1, 9, 1000), None)])  # fmt: skip
def test_gpu_fused_is_bit_exact_to_the_reference(shape, freq_shape, dtype, freq_dtype, flavour) -> None:
    args = _inputs(shape, dtype, freq_shape, freq_dtype)
    got = qk_norm_rope(*args, EPS, flavour)
    for out, ref in zip(got, reference(*args, EPS, flavour, "interleaved"), strict=True):
        assert out.dtype == ref.dtype and torch.equal(out, ref)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("freq_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,t,heads,hd", [(1, 8160, 32, 128), (1, 126, 32, 64), (2, 300, 24, 128), (1, 17, 8, 64)])
def test_gpu_split_is_bit_exact_to_the_reference(b, t, heads, hd, dtype, freq_dtype, flavour) -> None:
    args = _split_inputs(b, t, heads, hd, dtype, freq_dtype)
    got = qk_norm_rope(*args, EPS, flavour, "split")
    for out, ref in zip(got, reference(*args, EPS, flavour, "split"), strict=True):
        assert out.dtype == ref.dtype and torch.equal(out, ref)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
def test_gpu_no_weight_and_8_warps_are_bit_exact(flavour: str) -> None:
    args = _inputs((1, 2048, 4096), torch.bfloat16, weight=False)
    for warps in (None, 8):
        got = qk_norm_rope(*args, EPS, flavour, num_warps=warps)
        for out, ref in zip(got, reference(*args, EPS, flavour, "interleaved"), strict=True):
            assert torch.equal(out, ref)


def test_strided_weights_and_many_stride_freqs_are_refused_with_a_reason() -> None:
    q, k, _, wk, cos, sin = _inputs((2, 3, 16), torch.float32)
    w2 = torch.randn(32, device=DEVICE)[::2]
    assert "weight is not contiguous" in supports(q, k, w2, wk, cos, sin, EPS, "torch", "interleaved")
    assert "weight is not contiguous" in rmsnorm.supports_rmsnorm(q, w2, EPS, "torch", numerics=NUM)
    # the same answer for meta tensors (plans for other devices) as for real ones, and no copy of cos
    qm = torch.empty(2, 3, 4, 16, device="meta")
    cm = torch.empty(4, 3, 2, 16, device="meta").permute(2, 1, 0, 3)
    assert "more than two strides" in supports(qm, qm, None, None, cm, cm, EPS, "torch", "interleaved")
