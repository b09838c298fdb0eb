"""key_norm.max_key_norm against torch's ``vector_norm(k, dim=-1).amax(spatial)`` (on CPU under Triton's
interpreter, on the GPU compiled): contiguous and strided keys, padded head dims, non-finite rows."""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from xbackend.kernels.key_norm import max_key_norm  # noqa: E402

# CPU tensors run the kernel only under the interpreter, which is on where there is no GPU.
DEVICES = ["cuda"] if HAS_CUDA else ["cpu"]


def _expected(k3: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(k3.float(), dim=-1).amax(dim=(1, 2, 3)).reshape(-1)


def _keys(shape, dtype, device, seed=0):
    g = torch.Generator("cpu").manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 3, 5, 7, 3, 64), (1, 1, 1, 130, 2, 32), (3, 2, 9, 4, 1, 80)])
def test_matches_torch(device, dtype, shape):
    k3 = _keys(shape, dtype, device)
    got = max_key_norm(k3)
    assert got.dtype == torch.float32 and got.shape == (shape[0] * shape[4],)
    torch.testing.assert_close(got, _expected(k3), rtol=2e-6, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_views(device):
    """Keys as a slice of a fused qkv projection (heads-last rows with a gap) and with spatial axes
    permuted: the kernel reads the strides, not a contiguous copy."""
    qkv = _keys((2, 4, 6, 5, 3, 3 * 32), torch.bfloat16, device, seed=1)
    k3 = qkv[..., 32:64]
    assert not k3.is_contiguous()
    torch.testing.assert_close(max_key_norm(k3), _expected(k3), rtol=2e-6, atol=0)
    permuted = _keys((2, 5, 4, 6, 3, 32), torch.bfloat16, device, seed=2).permute(0, 2, 3, 1, 4, 5)
    torch.testing.assert_close(max_key_norm(permuted), _expected(permuted), rtol=2e-6, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_non_finite_rows_count_as_inf(device):
    """An inf or NaN anywhere in a (batch, head)'s keys gives that head +inf (its tiles then fail the
    shift's bound); the other heads keep their finite norms."""
    k3 = _keys((2, 3, 4, 5, 3, 64), torch.bfloat16, device, seed=3)
    k3[0, 1, 2, 3, 0, 5] = float("inf")
    k3[1, 0, 0, 0, 2, 0] = float("nan")
    got = max_key_norm(k3).reshape(2, 3)
    assert got[0, 0] == float("inf") and got[1, 2] == float("inf")
    finite = torch.ones(2, 3, dtype=torch.bool)
    finite[0, 0] = finite[1, 2] = False
    torch.testing.assert_close(got[finite], _expected(k3).reshape(2, 3)[finite], rtol=2e-6, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", [0, 150, 299])
def test_largest_row_in_any_program(device, where):
    """300 tokens a head, three programs: the largest row planted in the first, a middle or the very
    last token (the partial last program) is the one found; all-zero keys give 0."""
    k3 = _keys((1, 3, 10, 10, 2, 64), torch.float32, device, seed=4)
    flat = k3.view(1, 300, 2, 64)
    flat[0, where, 1] = 50.0
    got = max_key_norm(k3)
    assert got[1] == torch.linalg.vector_norm(flat[0, where, 1]), (where, got)
    torch.testing.assert_close(got, _expected(k3), rtol=2e-6, atol=0)
    assert max_key_norm(torch.zeros_like(k3)).tolist() == [0.0, 0.0]


def test_rejects_what_it_cannot_read():
    with pytest.raises(ValueError, match="max_key_norm: k3 expected"):
        max_key_norm(torch.zeros(2, 3, 4, 64))
    with pytest.raises(ValueError, match="contiguous last dim"):
        max_key_norm(torch.zeros(1, 2, 2, 2, 64, 3).transpose(-1, -2))


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    assert max_key_norm(torch.empty((1, 0, 3, 3, 2, 64), device=device)).tolist() == [0.0, 0.0]


@pytest.mark.parametrize("device", DEVICES)
def test_batch_x_heads_past_the_grids_second_axis(device, monkeypatch):
    """More (batch, head) pairs than a grid's second axis holds (65535; lowered to 2 here) take a 1-D grid
    of the same programs: the same norms."""
    from xbackend.kernels import key_norm

    k3 = _keys((2, 3, 5, 7, 3, 64), torch.float32, device, seed=5)
    monkeypatch.setattr(key_norm, "GRID_Y_MAX", 2)
    torch.testing.assert_close(max_key_norm(k3), _expected(k3), rtol=2e-6, atol=0)
