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


def natten_window(index: int, length: int, ks: int, stride: int, causal: bool) -> tuple[int, int]:
    """``[start, end)`` of one query's window within its dilation group, transcribed from NATTEN's
    reference mask (``get_win_start`` / ``get_win_end``): a stride group's leader picks the window."""
    left, right = ks // 2, ks // 2 + (ks % 2) - 1
    if causal:
        leader = min((index // stride) * stride + stride - 1, length - 1)
        return max(leader - left - right, 0), min(index + 1, length)
    leader = min((index // stride) * stride + stride // 2, length - 1)
    start = max(leader - left, 0) + (leader + right >= length) * (length - right - leader - 1)
    return start, start + ks


def na_brute_force(q, k, v, kernel_size, dilation, is_causal, scale=None, stride=None) -> torch.Tensor:
    """Neighborhood attention by explicit loops over query positions (float64): the window rule
    written directly from its definition, independent of the vectorized reference."""
    stride = stride or (1,) * len(kernel_size)
    spatial, dim = q.shape[1:-2], q.shape[-1]
    scale = dim**-0.5 if scale is None else scale
    out = torch.empty(q.shape, dtype=torch.float64)
    q64, k64, v64 = q.double(), k.double(), v.double()

    def axis_keys(i: int, length: int, ks: int, d: int, causal: bool, st: int) -> list[int]:
        group = [p for p in range(length) if p % d == i % d]
        start, end = natten_window(group.index(i), len(group), ks, st, causal)
        return [group[j] for j in range(start, end)]

    for coord in itertools.product(*(range(n) for n in spatial)):
        per_axis = [axis_keys(c, n, ks, d, cz, st) for c, n, ks, d, cz, st
                    in zip(coord, spatial, kernel_size, dilation, is_causal, stride, strict=True)]
        keys = list(itertools.product(*per_axis))
        kk = torch.stack([k64[(slice(None), *key)] for key in keys], 1)  # [B, W, H, D]
        vv = torch.stack([v64[(slice(None), *key)] for key in keys], 1)
        qq = q64[(slice(None), *coord)]  # [B, H, D]
        att = torch.einsum("bhd,bwhd->bhw", qq, kk) * scale
        out[(slice(None), *coord)] = torch.einsum("bhw,bwhd->bhd", att.softmax(-1), vv)
    assert math.prod(spatial) > 0
    return out


def run_kit(plugin) -> tuple[list[str], int, set[torch.dtype]]:
    """The conformance kit over every target of ``plugin`` (a ``(name, object)`` pair): its failures,
    the number of cases run, and the dtypes it found targets for."""
    from xbackend.testing import conformance

    rt, found = conformance.targets(plugin)
    failures, ran = [], 0
    for target in found:
        f, n = conformance.check(rt, target)
        failures += f
        ran += n
    return failures, ran, {t.dtype for t in found}
