"""Shared test data: dtype-keyed tolerances and independent (float64, loop-based) formulas."""

from __future__ import annotations

import itertools
import math

import torch

# Against a float64 formula: a few roundings of the dtype's epsilon.
TOL = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 2e-3, "rtol": 4e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 3e-2},
}
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def rmsnorm64(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    x64 = x.double()
    y = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + eps)
    return y * weight.double() if weight is not None else y


def na_brute_force(q, k, v, kernel_size, dilation, is_causal, scale=None) -> torch.Tensor:
    """Neighborhood attention by explicit loops over query positions (float64): the window rule
    written directly from its definition, independent of the vectorized reference."""
    spatial, dim = q.shape[1:-2], q.shape[-1]
    scale = dim**-0.5 if scale is None else scale
    out = torch.empty(q.shape, dtype=torch.float64)
    q64, k64, v64 = q.double(), k.double(), v.double()

    def axis_keys(i: int, length: int, ks: int, d: int, causal: bool) -> list[int]:
        group = [p for p in range(length) if p % d == i % d]
        pos = group.index(i)
        if causal:
            return [group[j] for j in range(max(0, pos - ks + 1), pos + 1)]
        start = min(max(pos - ks // 2, 0), len(group) - ks)
        return [group[j] for j in range(start, start + ks)]

    for coord in itertools.product(*(range(n) for n in spatial)):
        per_axis = [axis_keys(c, n, ks, d, cz) for c, n, ks, d, cz in zip(coord, spatial, kernel_size, dilation, is_causal, strict=True)]
        keys = list(itertools.product(*per_axis))
        kk = torch.stack([k64[(slice(None), *key)] for key in keys], 1)  # [B, W, H, D]
        vv = torch.stack([v64[(slice(None), *key)] for key in keys], 1)
        qq = q64[(slice(None), *coord)]  # [B, H, D]
        att = torch.einsum("bhd,bwhd->bhw", qq, kk) * scale
        out[(slice(None), *coord)] = torch.einsum("bhw,bwhd->bhd", att.softmax(-1), vv)
    assert math.prod(spatial) > 0
    return out
