"""rmsnorm_modulate: every broadcast form, eager rounding order, checks, custom op."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPES, TOL, rmsnorm64
from hypothesis import given, settings
from hypothesis import strategies as st

import xbackend
from xbackend.ops import rmsnorm_modulate as mod

modulate = xbackend.get_op("rmsnorm_modulate")

# x shape -> scale/shift shapes that must be accepted (the DiT and DiffVAE modulation forms).
FORMS = {
    (2, 5, 8): [(2, 1, 8), (2, 5, 8), (8,), (1, 1, 8)],
    (2, 3, 2, 2, 8): [(2, 1, 1, 1, 8), (8,), (1, 1, 1, 1, 8)],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize(("x_shape", "mod_shape"), [(x, m) for x, ms in FORMS.items() for m in ms])
def test_each_broadcast_form_matches_eager_chain(x_shape, mod_shape, flavour: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(x_shape, generator=g).to(dtype)
    scale, shift = (torch.randn(mod_shape, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(x_shape[-1], generator=g).to(dtype)
    out = modulate(x, scale, shift, w, flavour=flavour)
    n = xbackend.get_op("rmsnorm")(x, w, flavour=flavour)
    assert torch.equal(out, n * (1 + scale) + shift)
    expected = rmsnorm64(x, w, 1e-6) * (1 + scale.double()) + shift.double()
    torch.testing.assert_close(out.double(), expected, **{k: 3 * v for k, v in TOL[dtype].items()})


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), rows=st.integers(0, 4), d=st.integers(1, 40), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 999))
def test_matches_float64_formula(b: int, rows: int, d: int, dtype: torch.dtype, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, rows, d, generator=g).to(dtype)
    scale = (0.1 * torch.randn(b, 1, d, generator=g)).to(dtype)
    shift = torch.randn(d, generator=g).to(dtype)
    out = modulate(x, scale, shift)
    expected = rmsnorm64(x, None, 1e-6) * (1 + scale.double()) + shift.double()
    torch.testing.assert_close(out.double(), expected, **{k: 3 * v for k, v in TOL[dtype].items()})


@pytest.mark.parametrize(
    ("scale_shape", "shift_shape", "match"),
    [
        ((2, 1, 9), (2, 1, 8), r"argument 'scale' expected a shape that broadcasts to x \[2, 5, 8\], got shape \[2, 1, 9\]"),
        ((2, 1, 8), (3, 1, 8), "argument 'shift' expected a shape that broadcasts"),
        ((1, 2, 1, 8), (8,), "argument 'scale' expected a shape that broadcasts"),
    ],
)
def test_non_broadcasting_modulation_is_rejected(scale_shape, shift_shape, match: str) -> None:
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=match):
        modulate(x, torch.randn(scale_shape), torch.randn(shift_shape))


def test_mixed_dtypes_are_rejected() -> None:
    x = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="rmsnorm_modulate: argument 'scale' expected dtype torch.bfloat16"):
        modulate(x, torch.randn(8), torch.randn(8, dtype=torch.bfloat16))


def test_opcheck() -> None:
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    s = torch.randn(2, 1, 16, dtype=torch.bfloat16)
    torch.library.opcheck(mod.rmsnorm_modulate_op, (x, s, s, None, 1e-6, "diffusers"))
    torch.library.opcheck(mod.rmsnorm_modulate_op, (x, s, s, torch.randn(16, dtype=torch.bfloat16), 1e-6, "torch"))
