"""neighborhood_attention: the memory-bounded reference against a brute-force loop, checks, custom op."""

from __future__ import annotations

import pytest
import torch
from helpers import na_brute_force
from hypothesis import given, settings
from hypothesis import strategies as st

import xbackend
from xbackend.ops import neighborhood_attention as mod

na = xbackend.get_op("neighborhood_attention")


@pytest.mark.parametrize(
    ("spatial", "ks", "dil", "causal"),
    [
        ((9,), (3,), (1,), (False,)),
        ((9,), (3,), (2,), (False,)),
        ((9,), (4,), (1,), (True,)),
        ((5, 6), (3, 3), (1, 2), (False, False)),
        ((5, 6), (5, 6), (1, 1), (False, False)),  # window = full extent: dense attention
        ((4, 3, 5), (3, 3, 3), (1, 1, 1), (True, False, False)),
        ((5, 4, 7), (2, 3, 3), (2, 1, 2), (False, False, False)),  # even window, dilation
    ],
)
def test_reference_matches_brute_force(spatial, ks, dil, causal) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, *spatial, 2, 8, generator=g) for _ in range(3))
    out = na(q, k, v, ks, dil, causal)
    torch.testing.assert_close(out.double(), na_brute_force(q, k, v, ks, dil, causal), atol=1e-5, rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_random_shapes_match_brute_force(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 3))
    spatial = tuple(data.draw(st.integers(1, 6)) for _ in range(n))
    dil = tuple(data.draw(st.integers(1, max(1, s // 2))) for s in spatial)
    ks = tuple(data.draw(st.integers(1, s // d)) for s, d in zip(spatial, dil, strict=True))
    causal = tuple(data.draw(st.booleans()) for _ in range(n))
    dtype = data.draw(st.sampled_from([torch.float32, torch.bfloat16]))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    q, k, v = (torch.randn(1, *spatial, 2, 4, generator=g).to(dtype) for _ in range(3))
    out = na(q, k, v, ks, dil, causal, 0.7)
    expected = na_brute_force(q, k, v, ks, dil, causal, 0.7)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), expected, atol=tol, rtol=tol)


def test_is_causal_true_means_first_axis() -> None:
    q = torch.randn(1, 4, 5, 1, 4)
    assert torch.equal(na(q, q, q, 3, is_causal=True), na(q, q, q, 3, is_causal=(True, False)))


def test_reference_chunks_instead_of_materialising(monkeypatch: pytest.MonkeyPatch) -> None:
    q, k, v = (torch.randn(1, 6, 7, 2, 4) for _ in range(3))
    whole = na(q, k, v, (3, 3))
    monkeypatch.setattr(mod, "_REFERENCE_CHUNK_ELEMS", 100)  # a handful of queries per chunk
    assert torch.equal(mod.reference(q, k, v, (3, 3), (1, 1), (False, False), None), whole)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"kernel_size": (3,)}, ValueError, r"argument 'kernel_size' expected an int or 2 ints \(one per spatial dim of 'q'\), got \(3,\)"),
        ({"kernel_size": (3, 9)}, ValueError, r"kernel_size \* dilation <= the spatial size on every axis \(axis 1: size 8\), got kernel_size 9 \* dilation 1 = 9"),
        ({"kernel_size": 3, "dilation": (1, 3)}, ValueError, r"axis 1: size 8\), got kernel_size 3 \* dilation 3 = 9"),
        ({"kernel_size": 0}, ValueError, "argument 'kernel_size' expected values >= 1"),
        ({"kernel_size": 3, "is_causal": (True,)}, TypeError, "argument 'is_causal' expected a bool or 2 bools"),
        ({"kernel_size": "3"}, TypeError, "argument 'kernel_size' expected an int or 2 ints"),
    ],
)
def test_bad_window_arguments(kwargs, exc, match: str) -> None:
    q = torch.randn(1, 6, 8, 2, 4)
    with pytest.raises(exc, match=match):
        na(q, q, q, **kwargs)


def test_bad_tensors() -> None:
    q = torch.randn(1, 6, 8, 2, 4)
    with pytest.raises(ValueError, match=r"argument 'k' expected the shape of 'q' \[1, 6, 8, 2, 4\], got shape \[1, 6, 8, 2, 5\]"):
        na(q, torch.randn(1, 6, 8, 2, 5), q, 3)
    with pytest.raises(ValueError, match="argument 'q' expected .* 1 to 3 spatial dims"):
        na(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4), 3)
    with pytest.raises(TypeError, match="argument 'v' expected dtype torch.float32"):
        na(q, q, q.half(), 3)


def test_empty_batch() -> None:
    q = torch.randn(0, 6, 8, 2, 4)
    assert na(q, q, q, 3).shape == q.shape


def test_opcheck() -> None:
    q, k, v = (torch.randn(1, 5, 6, 2, 8, dtype=torch.bfloat16) for _ in range(3))
    torch.library.opcheck(mod.neighborhood_attention_op, (q, k, v, [3, 3], [1, 2], [True, False], None, [1, 1]))
    torch.library.opcheck(mod.neighborhood_attention_op, (q, k, v, [3, 3], [1, 2], [True, False], None, [2, 3]))



@pytest.mark.parametrize(
    ("spatial", "ks", "dil", "causal", "stride"),
    [
        ((9,), (3,), (1,), (False,), (2,)),
        ((10,), (4,), (1,), (False,), (4,)),  # stride = kernel: blocks attending within themselves
        ((11,), (5,), (2,), (False,), (3,)),
        ((9,), (4,), (1,), (True,), (3,)),
        ((7, 8), (3, 5), (1, 1), (True, False), (2, 4)),
        ((4, 5, 6), (3, 3, 3), (1, 1, 2), (False, True, False), (3, 1, 2)),
    ],
)
def test_strided_reference_matches_natten_window_rule(spatial, ks, dil, causal, stride) -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, *spatial, 2, 8, generator=g) for _ in range(3))
    out = na(q, k, v, ks, dil, causal, stride=stride)
    torch.testing.assert_close(out.double(), na_brute_force(q, k, v, ks, dil, causal, stride=stride), atol=1e-5, rtol=1e-5)


def test_stride_one_is_plain_na_and_stride_is_checked() -> None:
    q = torch.randn(1, 12, 12, 2, 8)
    torch.testing.assert_close(na(q, q, q, (5, 5), stride=1), na(q, q, q, (5, 5)), rtol=0, atol=0)
    with pytest.raises(ValueError, match="argument 'stride' expected values <= kernel_size"):
        na(q, q, q, (3, 3), stride=(4, 1))
    with pytest.raises(ValueError, match="argument 'stride' expected values >= 1"):
        na(q, q, q, (3, 3), stride=0)
