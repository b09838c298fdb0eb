"""rotary_embedding: diffusers' LTX-2 RoPE (interleaved and split) bit for bit, a float64 formula, checks."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import DTYPES, TOL
from hypothesis import given, settings
from hypothesis import strategies as st

import xbackend
from xbackend.ops import rotary_embedding as mod

rotary = xbackend.get_op("rotary_embedding")
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None


def _freqs(shape: tuple[int, ...], g: torch.Generator, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    angle = torch.rand(shape, generator=g) * 6.3
    return angle.cos().to(dtype), angle.sin().to(dtype)


def rope64_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs (2i, 2i+1) rotated by the angle whose cos/sin sit at both channels, in float64, by loop."""
    x64, c64, s64 = x.double(), cos.double().expand(x.shape), sin.double().expand(x.shape)
    out = torch.empty_like(x64)
    for i in range(0, x.shape[-1], 2):
        a, b = x64[..., i], x64[..., i + 1]
        out[..., i] = a * c64[..., i] - b * s64[..., i]
        out[..., i + 1] = b * c64[..., i + 1] + a * s64[..., i + 1]
    return out


@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers not installed")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("freq_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_interleaved_is_diffusers_bit_for_bit(dtype: torch.dtype, freq_dtype: torch.dtype) -> None:
    from diffusers.models.transformers.transformer_ltx2 import apply_interleaved_rotary_emb

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 64, generator=g).to(dtype)
    cos, sin = _freqs((2, 7, 64), g, freq_dtype)
    out = rotary(x, cos, sin)
    assert out.dtype == dtype and torch.equal(out, apply_interleaved_rotary_emb(x, (cos, sin)))


@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers not installed")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("freq_shape", [(2, 7, 32), (2, 4, 7, 8)], ids=["per-token", "per-head [B,H,T,D/2]"])
def test_split_is_diffusers_bit_for_bit(dtype: torch.dtype, freq_shape: tuple[int, ...]) -> None:
    from diffusers.models.transformers.transformer_ltx2 import apply_split_rotary_emb

    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 64, generator=g).to(dtype)
    cos, sin = _freqs(freq_shape, g)
    out = rotary(x, cos, sin, layout="split")
    assert torch.equal(out, apply_split_rotary_emb(x, (cos, sin)))


@settings(max_examples=30, deadline=None)
@given(lead=st.lists(st.integers(0, 3), min_size=0, max_size=3), pairs=st.integers(1, 9), bcast=st.booleans(),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 999))  # fmt: skip
def test_interleaved_matches_float64_rotation(lead: list[int], pairs: int, bcast: bool, dtype: torch.dtype, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    shape = (*lead, 2 * pairs)
    x = torch.randn(shape, generator=g).to(dtype)
    cos, sin = _freqs((2 * pairs,) if bcast else shape, g)
    out = rotary(x, cos, sin)
    assert out.shape == x.shape and out.dtype == dtype
    torch.testing.assert_close(out.double(), rope64_interleaved(x, cos, sin), **{k: 4 * v for k, v in TOL[dtype].items()})


def test_empty_input_gives_empty_output() -> None:
    x = torch.randn(0, 5, 8)
    cos, sin = _freqs((0, 5, 8), torch.Generator().manual_seed(0))
    assert rotary(x, cos, sin).shape == (0, 5, 8)


@pytest.mark.parametrize(
    ("x_shape", "cos_shape", "sin_shape", "layout", "exc", "match"),
    [
        ((2, 4, 7), (2, 4, 7), (2, 4, 7), "interleaved", ValueError, r"argument 'x' expected an even last dim .*got shape \[2, 4, 7\]"),
        ((2, 4, 8), (2, 4, 8), (2, 4, 8), "spiral", ValueError, r"argument 'layout' expected 'interleaved' or 'split', got 'spiral'"),
        ((2, 4, 8), (2, 4, 8), (2, 4, 6), "interleaved", ValueError, r"argument 'sin' expected the shape of 'cos' \[2, 4, 8\], got shape \[2, 4, 6\]"),
        ((2, 4, 8), (3, 4, 8), (3, 4, 8), "interleaved", ValueError, r"argument 'cos' expected a shape that broadcasts to x \[2, 4, 8\]"),
        ((2, 4, 8), (2, 4, 8), (2, 4, 8), "split", ValueError, r"argument 'cos' expected a shape that broadcasts to x's leading dims and D/2 \[2, 4, 4\]"),
        ((2, 4, 8), (2, 3, 4, 1), (2, 3, 4, 1), "split", ValueError, r"argument 'x' expected shape \[2, 4, 6\] for a \[B, H, T, D/2\] cos"),
    ],
)  # fmt: skip
def test_bad_shapes(x_shape, cos_shape, sin_shape, layout: str, exc, match: str) -> None:
    with pytest.raises(exc, match=match):
        rotary(torch.randn(x_shape), torch.randn(cos_shape), torch.randn(sin_shape), layout)


def test_bad_types_and_devices() -> None:
    x = torch.randn(2, 4, 8)
    with pytest.raises(TypeError, match="rotary_embedding: argument 'cos' expected a torch.Tensor, got tuple"):
        rotary(x, (x, x), x)
    with pytest.raises(TypeError, match="argument 'x' expected dtype float16, bfloat16 or float32, got torch.int64"):
        rotary(torch.ones(2, 4, dtype=torch.long), x, x)
    with pytest.raises(ValueError, match="rotary_embedding: argument 'sin' expected device cpu"):
        rotary(x, x, torch.empty(2, 4, 8, device="meta"))


def test_custom_op_passes_opcheck() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 16, generator=g)
    cos, sin = _freqs((2, 5, 16), g)
    torch.library.opcheck(mod.rotary_embedding_op, (x, cos, sin, "interleaved"))
    torch.library.opcheck(mod.rotary_embedding_op, (x, cos[..., :8].contiguous(), sin[..., :8].contiguous(), "split"))


def test_gradients_are_the_references() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 16, generator=g, requires_grad=True)
    cos, sin = _freqs((2, 5, 16), g)
    rotary(x, cos, sin).sum().backward()
    ref_x = x.detach().clone().requires_grad_(True)
    mod.reference(ref_x, cos, sin, "interleaved").sum().backward()
    assert torch.equal(x.grad, ref_x.grad)
