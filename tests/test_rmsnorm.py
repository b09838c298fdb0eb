"""rmsnorm: the reference against independent formulas, both flavours, checks and custom op."""

from __future__ import annotations

import pytest
import torch
from helpers import DTYPES, TOL, rmsnorm64
from hypothesis import given, settings
from hypothesis import strategies as st

import xbackend
from xbackend.ops import rmsnorm as mod

rmsnorm = xbackend.get_op("rmsnorm")


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(0, 5),
    d=st.integers(1, 70),
    dtype=st.sampled_from(DTYPES),
    with_weight=st.booleans(),
    flavour=st.sampled_from(mod.FLAVOURS),
    seed=st.integers(0, 2**16),
)
def test_matches_float64_formula(rows: int, d: int, dtype: torch.dtype, with_weight: bool, flavour: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g).to(dtype)
    w = torch.randn(d, generator=g).to(dtype) if with_weight else None
    y = rmsnorm(x, w, 1e-6, flavour)
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.double(), rmsnorm64(x, w, 1e-6), **TOL[dtype])


def test_torch_flavour_is_f_rms_norm() -> None:
    x = torch.randn(3, 7, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    assert torch.equal(rmsnorm(x, w), torch.nn.functional.rms_norm(x, (64,), w, 1e-6))


def test_diffusers_flavour_rounds_twice() -> None:
    """diffusers rounds h to the weight dtype before multiplying: differs from one rounding."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 512, generator=g).bfloat16()
    w = (torch.randn(512, generator=g) * 3).bfloat16()
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(rmsnorm(x, w, flavour="diffusers"), h.bfloat16() * w)
    assert not torch.equal(rmsnorm(x, w, flavour="diffusers"), (h * w.float()).bfloat16())


def test_empty_rows() -> None:
    x = torch.empty(0, 16, dtype=torch.float16)
    assert rmsnorm(x).shape == (0, 16)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: rmsnorm([1.0]), "argument 'x' expected a torch.Tensor, got list"),
        (lambda: rmsnorm(torch.ones(2, 4, dtype=torch.int32)), "argument 'x' expected dtype"),
        (lambda: rmsnorm(torch.ones(2, 0)), "argument 'x' expected a last"),
        (lambda: rmsnorm(torch.ones(2, 4), torch.ones(5)), r"argument 'weight' expected shape \[4\]"),
        (lambda: rmsnorm(torch.ones(2, 4), torch.ones(4, dtype=torch.float16)), "argument 'weight' expected dtype torch.float32"),
        (lambda: rmsnorm(torch.ones(2, 4), None, -1.0), "argument 'eps' expected a number >= 0"),
        (lambda: rmsnorm(torch.ones(2, 4), None, "1e-6"), "argument 'eps' expected a float, got str"),
        (lambda: rmsnorm(torch.ones(2, 4), flavour="llama"), "argument 'flavour' expected 'torch' or 'diffusers'"),
    ],
)
def test_bad_input_names_op_argument_and_expectation(call, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match) as info:
        call()
    assert str(info.value).startswith("rmsnorm: ")


def test_weight_on_another_device_is_rejected() -> None:
    x = torch.ones(2, 4)
    w = torch.ones(4, device="meta")
    with pytest.raises(ValueError, match="argument 'weight' expected device cpu"):
        rmsnorm(x, w)


def test_opcheck() -> None:
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    w = torch.randn(32, dtype=torch.bfloat16)
    for flavour in mod.FLAVOURS:
        torch.library.opcheck(mod.rmsnorm_op, (x, w, 1e-6, flavour))
        torch.library.opcheck(mod.rmsnorm_op, (x, None, 1e-5, flavour))


def test_gradients_are_the_references() -> None:
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    rmsnorm(x, w, flavour="diffusers").sum().backward()
    gx, gw = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    mod.reference(x, w, 1e-6, "diffusers").sum().backward()
    assert torch.allclose(gx, x.grad) and torch.allclose(gw, w.grad)


def test_ops_survive_deepcopy_and_pickle() -> None:
    import copy
    import pickle

    assert copy.deepcopy(rmsnorm) is rmsnorm
    assert pickle.loads(pickle.dumps(xbackend.get_op("vae_tile_decode"))) is xbackend.get_op("vae_tile_decode")
