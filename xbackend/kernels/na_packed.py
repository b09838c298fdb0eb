"""The packed key walk of na_triton's shift launch: rules and tables.

A 64-query tile of a 3-D window sees the union of its rows' windows, a box of ``U_a = KS_a +
leader_span_a`` keys per axis (14 x 14 x 14 for a 4 x 4 x 4 tile and an 11^3 window). The box walk
covers it with ``TK0 x TK1 x TK2`` KV blocks, rounding every axis up to whole blocks (14 x 14 x 16 =
3136 keys in 49 blocks of 64). The packed walk instead numbers the box's keys ``p = (c0 * U1 + c1)
* U2 + c2`` and takes them ``BLOCK_N`` at a time (2744 keys in 43 blocks), loading each key at its
row (a block of keys is no box: pointer loads, not TMA).

Each row's window is then tested on the tensor cores (``onehot_table``): within one
tile a row's window along an axis is fixed by where it starts in the box, ``s_a = win_start(row) -
origin_a`` with ``0 <= s_a < R_a = U_a - KS_a + 1``, so one ``[BLOCK_M, K] x [K, BLOCK_N]`` product of
a per-row one-hot of ``(s_0, s_1, s_2)`` and a per-block table entry (``window_table``) adds ``+0``
to the score of a key inside the row's window (q.k unchanged, bit for bit) and at most ``PENALTY``
outside it, where ``exp2`` of the scaled score is exactly 0, as the select form's ``-inf`` gives.

The box's origin is ``min(lo_a, N_a - U_a)`` (``lo``: the tile's first window start), so it lies in
the group wherever ``U_a <= N_a``. Non-causal axes only (a causal window ends at the query itself,
not at ``s + KS``). Pure Python and torch, no Triton import.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from xbackend.kernels.na_triton_config import leader_span

__all__ = ["MIN_FOLD", "PENALTY", "TABLE_MAX_ELEMENTS", "PackedLayout", "offsets_fit", "onehot_table", "packed_layout",
           "window_table"]

# bf16 holds 2**126 exactly; three axes' penalties sum to -1.5 * 2**127, inside fp32's range.
PENALTY = -(2.0**126)
# The exponent of a penalised score is at most PENALTY * fold + 2 * SHIFT_MAX; with fold (the
# softmax scale times log2(e)) at least 2**-100 that is below -2**25, and exp2 gives exactly 0.
MIN_FOLD = 2.0**-100
# The window table (one [K, BLOCK_N] entry per block) stays small enough to live in L2: 88 KB at the
# DiffVAE stage-5 tile; larger boxes take the box walk.
TABLE_MAX_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class PackedLayout:
    """A launch's packed walk: the box, the one-hot's columns per axis, the block count."""

    box: tuple[int, int, int]  # U per axis: the keys a tile's windows span
    types: tuple[int, int, int]  # R per axis: the distinct window starts of a tile's rows in the box
    k: int  # width of the one-hot, the window product's K: 16 or 32
    block_n: int
    blocks: int  # KV blocks a tile walks: the box's keys over BLOCK_N, rounded up


def packed_layout(spatial: tuple[int, int, int], q_tile: tuple[int, int, int], block_n: int,
                  kernel_size: tuple[int, int, int], dilation: tuple[int, int, int], stride: tuple[int, int, int],
                  is_causal: tuple[bool, bool, bool]) -> PackedLayout | None:
    """The layout for a launch, or None where the box walk stays: a causal axis, a dilation group
    shorter than the box on an axis whose groups differ in length, more than 32 row types in all,
    or a table over ``TABLE_MAX_ELEMENTS``."""
    if any(is_causal):
        return None
    box = []
    for n, t, ks, d, s in zip(spatial, q_tile, kernel_size, dilation, stride, strict=True):
        u = ks + leader_span(t, s)
        shortest = n // d  # dilation groups are n // d or n // d + 1 long
        if shortest < u:
            if n % d:
                return None  # groups of unequal length: no one box fits them all
            u = shortest  # the whole axis: every tile's box is the group
        box.append(u)
    types = tuple(u - ks + 1 for u, ks in zip(box, kernel_size, strict=True))
    if sum(types) > 32:
        return None
    k = 16 if sum(types) <= 16 else 32
    blocks = -(-math.prod(box) // block_n)
    if blocks * k * block_n > TABLE_MAX_ELEMENTS:
        return None
    return PackedLayout(tuple(box), types, k, block_n, blocks)


def _box_coords(layout: PackedLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per walk position ``p`` (``blocks * BLOCK_N`` of them): its box coordinates (the last key for
    positions past the box) and whether it is in the box."""
    u0, u1, u2 = layout.box
    total = u0 * u1 * u2
    p = torch.arange(layout.blocks * layout.block_n)
    q = p.clamp(max=total - 1)
    return q // (u1 * u2), (q // u2) % u1, q % u2, p < total


@functools.lru_cache(maxsize=64)
def window_table(layout: PackedLayout, kernel_size: tuple[int, int, int], dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """The key side of the window product, ``[blocks * k, BLOCK_N]``: block ``j``'s entry, row
    ``base_a + s`` (``base``: the one-hot's first column of axis a), key ``n`` is ``PENALTY`` where
    the key at walk position ``j * BLOCK_N + n`` has box coordinate ``c_a`` outside ``[s, s + KS_a)``
    or lies past the box, else 0; rows past the last type 0."""
    coords = _box_coords(layout)
    table = torch.zeros(layout.k, layout.blocks * layout.block_n, dtype=torch.float32)
    base = 0
    for axis in range(3):
        d = coords[axis][None, :] - torch.arange(layout.types[axis])[:, None]  # [R_a, positions]
        inside = (d >= 0) & (d < kernel_size[axis]) & coords[3][None, :]
        table[base:base + layout.types[axis]] = torch.where(inside, 0.0, PENALTY)
        base += layout.types[axis]
    table = table.reshape(layout.k, layout.blocks, layout.block_n).transpose(0, 1)
    return table.reshape(-1, layout.block_n).to(dtype=dtype, device=device).contiguous()


def offsets_fit(layout: PackedLayout, strides: tuple[int, int, int]) -> bool:
    """Whether the box's farthest key is within int32 of its origin under the group's per-axis strides
    (the kernel's row offsets are 32-bit)."""
    return sum((u - 1) * abs(s) for u, s in zip(layout.box, strides, strict=True)) < 2**31


@functools.lru_cache(maxsize=64)
def onehot_table(layout: PackedLayout, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The query side of the window product by row type, ``[R0 * R1 * R2, k]``: row ``(s0 * R1 + s1)
    * R2 + s2`` is 1 at columns ``s0``, ``R0 + s1`` and ``R0 + R1 + s2``, else 0."""
    r0, r1, r2 = layout.types
    s = torch.cartesian_prod(torch.arange(r0), torch.arange(r1), torch.arange(r2)).reshape(-1, 3)
    table = torch.zeros(len(s), layout.k, dtype=torch.float32)
    table.scatter_(1, s + torch.tensor([0, r0, r0 + r1]), 1.0)
    return table.to(dtype=dtype, device=device)
