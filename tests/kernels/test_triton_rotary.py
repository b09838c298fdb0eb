"""Triton interleaved RoPE against diffusers' expression (the op's reference).

On CPU the kernel runs under TRITON_INTERPRET=1, which computes fp32 and fp16 like eager (separate fp32
products and sum, round-to-nearest fp16): those compare with torch.equal; its fp32->bf16 cast
truncates, so bf16 is compared within one bf16 rounding. The GPU tests prove every dtype bit-exact.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from xbackend.kernels import triton_rotary as K  # noqa: E402
from xbackend.ops.rotary_embedding import reference  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def _inputs(shape, dtype, freq_shape=None, freq_dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(shape, generator=g, device=device).to(dtype)
    angle = torch.rand(freq_shape or shape, generator=g, device=device) * 6.3
    return x, angle.cos().to(freq_dtype), angle.sin().to(freq_dtype)


def _assert_matches(out: torch.Tensor, ref: torch.Tensor, exact: bool) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    if exact:
        assert torch.equal(out, ref)
    else:  # the interpreter's truncating bf16 cast: within one bf16 rounding
        torch.testing.assert_close(out.float(), ref.float(), atol=0, rtol=2**-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,freq_shape", [((1, 60, 64), None), ((2, 7, 96), None), ((3, 5, 6), (6,)),
                                              ((1, 9, 2050), (1, 9, 2050)), ((4, 1, 8), (1, 8))])  # fmt: skip
def test_kernel_matches_reference(shape, freq_shape, dtype: torch.dtype) -> None:
    x, cos, sin = _inputs(shape, dtype, freq_shape)
    out = K.rotary_embedding(x, cos, sin)
    _assert_matches(out, reference(x, cos, sin, "interleaved"), exact=HAS_CUDA or dtype != torch.bfloat16)


@pytest.mark.parametrize("freq_dtype", [torch.bfloat16, torch.float16])
def test_half_precision_freqs_are_upcast_like_eager(freq_dtype: torch.dtype) -> None:
    x, cos, sin = _inputs((2, 7, 96), torch.float32, freq_dtype=freq_dtype)
    _assert_matches(K.rotary_embedding(x, cos, sin), reference(x, cos, sin, "interleaved"), exact=True)


def test_strided_rows_and_empty_input() -> None:
    base, cos, sin = _inputs((3, 5, 24), torch.float32)
    x = base[..., :16]  # rows 24 apart, last dim contiguous
    c, s = cos[..., :16], sin[..., :16]
    assert K.supports(x, c, s, "interleaved") is None
    _assert_matches(K.rotary_embedding(x, c, s), reference(x, c, s, "interleaved"), exact=True)
    empty = torch.randn(0, 4, 8)
    assert K.rotary_embedding(empty, empty.clone(), empty.clone()).shape == (0, 4, 8)


@pytest.mark.parametrize(
    ("x_shape", "freq_shape", "layout", "reason"),
    [
        ((2, 4, 8), (2, 1, 4), "split", "broadcast over an outer dim"),
        ((2, 7, 16), (7, 16), "interleaved", "broadcast over an outer dim"),
        ((2, 7, 16), (1, 7, 16), "interleaved", "broadcast over an outer dim"),
    ],
)
def test_supports_gives_reasons(x_shape, freq_shape, layout: str, reason: str) -> None:
    x, cos, sin = _inputs(x_shape, torch.float32, freq_shape)
    assert reason in (K.supports(x, cos, sin, layout) or "")
    with pytest.raises(ValueError, match=reason):
        K.rotary_embedding(x, cos, sin, layout)


# Split layout (LTX-2.3): x [B, T, H*D] against cos [B, H, T, D/2]; x [..., D] against cos [..., D/2].
SPLIT_CASES = [((2, 5, 48), (2, 3, 5, 8)), ((1, 9, 64), (1, 2, 9, 16)), ((2, 3, 5, 16), (2, 3, 5, 8)),
               ((2, 5, 16), (2, 5, 8)), ((1, 7, 32), (16,)), ((3, 6), (3, 3))]  # fmt: skip


def _split_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    """On CPU aten's addcmul and the interpreter's fma may each round differently from the CUDA FMA:
    within one fp32 rounding before the cast (the GPU tests compare with torch.equal)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    if HAS_CUDA:
        assert torch.equal(out, ref)
    else:
        tol = {torch.float32: 2e-6, torch.float16: 2**-10, torch.bfloat16: 2**-7}[out.dtype]
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,freq_shape", SPLIT_CASES)
def test_split_kernel_matches_reference(shape, freq_shape, dtype: torch.dtype) -> None:
    x, cos, sin = _inputs(shape, dtype, freq_shape)
    assert K.supports(x, cos, sin, "split") is None
    _split_close(K.rotary_embedding(x, cos, sin, "split"), reference(x, cos, sin, "split"))


def test_split_heads_are_not_mixed_up() -> None:
    """Each head rotates its own halves with its own frequencies: head h of token t reads cos[b, h, t]."""
    x = torch.randn(2, 5, 3 * 8)
    cos = torch.ones(2, 3, 5, 4)
    sin = torch.zeros(2, 3, 5, 4)
    cos[:, 1], sin[:, 1] = 0.0, 1.0  # head 1 turns a quarter: (x1, x2) -> (-x2, x1)
    out = K.rotary_embedding(x, cos, sin, "split").view(2, 5, 3, 8)
    xv = x.view(2, 5, 3, 8)
    assert torch.equal(out[:, :, [0, 2]], xv[:, :, [0, 2]])
    assert torch.equal(out[:, :, 1], torch.cat([-xv[:, :, 1, 4:], xv[:, :, 1, :4]], dim=-1))


def test_transposed_x_is_rejected() -> None:
    x = torch.randn(1, 16, 7).transpose(1, 2)
    cos = torch.randn(1, 7, 16)
    assert "evenly strided" in K.supports(x, cos, cos.clone(), "interleaved")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("freq_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,freq_shape", [((1, 8160, 4096), None), ((1, 126, 2048), None), ((1, 8160, 2048), None),
                                              ((2, 7, 64), None), ((1, 300, 130), (130,))])  # fmt: skip
def test_gpu_kernel_is_bit_exact(shape, freq_shape, dtype: torch.dtype, freq_dtype: torch.dtype) -> None:
    x, cos, sin = _inputs(shape, dtype, freq_shape, freq_dtype, device="cuda")
    x = x * 8  # spread exponents so the fp32 rounding of both products and the sum matters
    out = K.rotary_embedding(x, cos, sin)
    _assert_matches(out, reference(x, cos, sin, "interleaved"), exact=True)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("freq_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,freq_shape", [((1, 8160, 4096), (1, 32, 8160, 64)), ((2, 126, 2048), (2, 16, 126, 64)),
                                              ((1, 4, 300, 128), (1, 4, 300, 64)), ((2, 7, 64), (2, 7, 32))])  # fmt: skip
def test_gpu_split_kernel_is_bit_exact(shape, freq_shape, dtype: torch.dtype, freq_dtype: torch.dtype) -> None:
    x, cos, sin = _inputs(shape, dtype, freq_shape, freq_dtype, device="cuda")
    x = x * 8
    out = K.rotary_embedding(x, cos, sin, "split")
    _assert_matches(out, reference(x, cos, sin, "split"), exact=True)
