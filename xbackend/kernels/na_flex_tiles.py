"""Tile arithmetic of ``na_flex``: per-axis window bounds over tile-permuted coordinates, and the choice
of the spatial tile (one flex block) that minimises flex's block work.

Dilation is folded into the permutation: each axis is reordered group-major (``i % d`` outer, ``i // d``
inner) and every group is padded to a whole number of tiles; padded queries borrow the window of the
last real query of their group, which keeps tile bounds monotone.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from xbackend.kernels.na_tiled_sdpa import group_lengths, window_bounds

__all__ = ["TILE_TOKENS", "Axis", "axis", "axis_tile_ranges", "choose_tile", "choose_tile_cached", "tile_cost"]

TILE_TOKENS = 128


# ---------------------------------------------------------------- per-axis arithmetic


@dataclass(frozen=True)
class Axis:
    length: int  # L, original
    dilation: int  # d
    tile: int  # t
    padded_group: int  # P: each group padded to P = round_up(ceil(L/d), t)
    lo: torch.Tensor  # [d*P] window start per permuted query coordinate (permuted coords)
    hi: torch.Tensor  # [d*P] window end (exclusive)

    @property
    def padded(self) -> int:
        return self.dilation * self.padded_group

    @property
    def tiles(self) -> int:
        return self.padded // self.tile


def axis(length: int, kernel: int, dilation: int, causal: bool, tile: int, stride: int = 1) -> Axis:
    gmax = -(-length // dilation)
    pgroup = -(-gmax // tile) * tile
    lo = torch.empty(dilation * pgroup, dtype=torch.int64)
    hi = torch.empty_like(lo)
    for g, glen in enumerate(group_lengths(length, dilation)):
        s, e = window_bounds(glen, kernel, causal, stride=stride)
        base = g * pgroup
        lo[base : base + glen] = s + base
        hi[base : base + glen] = e + base
        # Padded queries copy the last real query's window (monotone bounds, no new partial blocks).
        lo[base + glen : base + pgroup] = s[-1] + base
        hi[base + glen : base + pgroup] = e[-1] + base
    return Axis(length, dilation, tile, pgroup, lo, hi)


def axis_tile_ranges(ax: Axis) -> tuple[torch.Tensor, ...]:
    """Per Q tile: touched KV tiles [a, b) and fully covered KV tiles [fa, fb) (tile indices)."""
    t = ax.tile
    lo = ax.lo.view(-1, t)
    hi = ax.hi.view(-1, t)
    # Bounds are monotone inside a tile, so the union of windows is [lo[first], hi[last]) and the
    # intersection is [lo[last], hi[first]).
    a = lo[:, 0] // t
    b = -(-hi[:, -1] // t)
    fa = -(-lo[:, -1] // t)
    fb = torch.maximum(hi[:, 0] // t, fa)
    return a, b, fa, fb


# ---------------------------------------------------------------- tile choice


def choose_tile(spatial: tuple[int, ...], kernel_size: tuple[int, ...], dilation: tuple[int, ...],
                is_causal: tuple[bool, ...] | None = None, tokens: int = TILE_TOKENS,
                partial_cost: float = 2.0) -> tuple[int, ...]:
    """Power-of-two tile of ``tokens`` tokens minimising flex's block work, counted exactly.

    The block structure separates over axes, so the totals over all Q tiles are products of
    per-axis sums: partial + full blocks = prod_a sum_u touched_a(u), full = prod_a sum_u full_a(u).
    ``partial_cost``: a partial block (mask_mod evaluated) costs about twice a full one, measured on
    H200 at (30, 48, 80) / window (18, 24, 24) with tiles (32, 2, 2) and (2, 8, 8) (lab/gpu/neighborhood_attention.py).
    """
    n = len(spatial)
    causal = tuple(is_causal) if is_causal is not None else (False,) * n
    best: tuple[float, tuple[int, ...]] | None = None
    for split in _splits(int(math.log2(tokens)), n):
        tile = tuple(1 << e for e in split)
        # A tile more than twice an axis is all padding on that axis.
        if any(t > 2 * max(1, -(-L // d)) for t, L, d in zip(tile, spatial, dilation, strict=True)):
            continue
        score = tile_cost(spatial, kernel_size, dilation, causal, tile, partial_cost)
        if best is None or score < best[0]:
            best = (score, tile)
    if best is None:  # every tile overhangs some tiny axis: pad along the last one
        return (1,) * (n - 1) + (tokens,)
    return best[1]


def tile_cost(spatial: tuple[int, ...], kernel_size: tuple[int, ...], dilation: tuple[int, ...],
              is_causal: tuple[bool, ...], tile: tuple[int, ...], partial_cost: float = 2.0) -> float:
    """Block work of one (batch, head) in full-block units: full + partial_cost * partial blocks."""
    touched, full = 1, 1
    for L, k, d, c, t in zip(spatial, kernel_size, dilation, is_causal, tile, strict=True):
        a, b, fa, fb = axis_tile_ranges(axis(L, k, d, c, t))
        touched *= int((b - a).sum())
        full *= int((fb - fa).clamp_min(0).sum())
    return full + partial_cost * (touched - full)


@functools.lru_cache(maxsize=64)
def choose_tile_cached(spatial: tuple[int, ...], kernel_size: tuple[int, ...], dilation: tuple[int, ...],
                        is_causal: tuple[bool, ...]) -> tuple[int, ...]:
    return choose_tile(spatial, kernel_size, dilation, is_causal)


def _splits(total: int, parts: int) -> list[tuple[int, ...]]:
    if parts == 1:
        return [(total,)]
    return [(e, *rest) for e in range(total + 1) for rest in _splits(total - e, parts - 1)]
