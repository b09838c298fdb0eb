"""gated_residual: every gate form, eager two-rounding order, no aliasing, checks, custom op."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPES, TOL
from hypothesis import given, settings
from hypothesis import strategies as st

import xbackend
from xbackend.ops import gated_residual as mod

gated_residual = xbackend.get_op("gated_residual")
GATES = [(3, 7, 16), (3, 1, 16), (1, 1, 16), (16,), (3, 7, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gate_shape", GATES)
def test_gate_forms_round_twice_like_eager(gate_shape, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    x, update = (torch.randn(3, 7, 16, generator=g).to(dtype) for _ in range(2))
    gate = torch.randn(gate_shape, generator=g).to(dtype)
    out = gated_residual(x, update, gate)
    assert torch.equal(out, x + (update * gate))
    assert out.data_ptr() not in (x.data_ptr(), update.data_ptr())


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), rows=st.integers(0, 5), d=st.integers(1, 33), per_token=st.booleans(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 999))
def test_matches_float64_formula(b: int, rows: int, d: int, per_token: bool, dtype: torch.dtype, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, update = (torch.randn(b, rows, d, generator=g).to(dtype) for _ in range(2))
    gate = torch.randn((b, rows, 1) if per_token else (b, 1, d), generator=g).to(dtype)
    out = gated_residual(x, update, gate)
    torch.testing.assert_close(out.double(), x.double() + update.double() * gate.double(), **{k: 4 * v for k, v in TOL[dtype].items()})


@pytest.mark.parametrize(
    ("update_shape", "gate_shape", "exc", "match"),
    [
        ((2, 4, 9), (2, 1, 8), ValueError, r"argument 'update' expected the shape of 'x' \[2, 4, 8\], got shape \[2, 4, 9\]"),
        ((2, 4, 8), (3, 1, 8), ValueError, r"argument 'gate' expected a shape that broadcasts to x \[2, 4, 8\], got shape \[3, 1, 8\]"),
        ((2, 4, 8), (1, 2, 4, 8), ValueError, "argument 'gate' expected a shape that broadcasts"),
    ],
)
def test_bad_shapes(update_shape, gate_shape, exc, match: str) -> None:
    with pytest.raises(exc, match=match):
        gated_residual(torch.randn(2, 4, 8), torch.randn(update_shape), torch.randn(gate_shape))


def test_bad_dtypes_and_devices() -> None:
    x = torch.randn(2, 4, 8)
    with pytest.raises(TypeError, match="gated_residual: argument 'gate' expected dtype torch.float32"):
        gated_residual(x, x.clone(), torch.randn(8, dtype=torch.float16))
    with pytest.raises(ValueError, match="gated_residual: argument 'update' expected device cpu"):
        gated_residual(x, torch.empty(2, 4, 8, device="meta"), torch.randn(8))
    with pytest.raises(TypeError, match="argument 'x' expected dtype float16, bfloat16 or float32, got torch.int64"):
        gated_residual(torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2), torch.ones(2))


def test_empty() -> None:
    x = torch.empty(2, 0, 8, dtype=torch.bfloat16)
    assert gated_residual(x, x, torch.ones(2, 1, 8, dtype=torch.bfloat16)).shape == (2, 0, 8)


def test_opcheck() -> None:
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    for gate in (torch.randn(2, 1, 16, dtype=torch.bfloat16), torch.randn(2, 5, 1, dtype=torch.bfloat16)):
        torch.library.opcheck(mod.gated_residual_op, (x, torch.randn_like(x), gate))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_gate_under_a_half_x_is_wans_residual(dtype) -> None:
    """Wan: ``(x.float() + update * gate).type_as(x)``: the product and sum in float32, one rounding."""
    g = torch.Generator().manual_seed(1)
    x, update = (torch.randn(2, 9, 64, generator=g).to(dtype) for _ in range(2))
    gate = torch.randn(2, 6, 64, generator=g).chunk(6, dim=1)[2]  # a [B,1,D] view of Wan's float32 table
    out = gated_residual(x, update, gate)
    assert out.dtype == dtype and torch.equal(out, (x.float() + update * gate).type_as(x))
    assert not torch.equal(out, x + update * gate.to(dtype))  # not the half chain
    torch.library.opcheck(mod.gated_residual_op, (x, update, gate))
