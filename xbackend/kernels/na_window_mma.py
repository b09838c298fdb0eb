"""The window test of na_triton's shift walk on the tensor cores: rules and the key-side table.

The test is separable per axis, and within one Q tile a row's window along an axis is fixed by one
number, where it starts in the tile's key box, ``s = win_start(row) - lo``, ``0 <= s < R``
(``R = leader_span + 1``: at most the tile's extent at stride 1). So the score of a row and a key
outside its window can be pushed to a huge negative by one extra ``[BLOCK_M, K] x [K, BLOCK_N]``
product accumulated onto ``q . k``:

* the query side, once per tile: a one-hot per axis of the row's ``s`` (columns ``[base_a, base_a + R_a)``);
* the key side, per KV block, a table entry fixed by the block's offset ``c - lo`` in the box:
  row ``base_a + s`` of key ``n`` is ``PENALTY`` where the key's box position ``c_a - lo_a + n_a``
  lies outside ``[s, s + KS_a)``, else 0.

A key inside every window gets ``+0`` (the score is unchanged, bit for bit); one outside gets at
least ``PENALTY``, whose exponent is far below fp32's range after the scale, so ``exp2`` gives 0 as
the masked form's ``-inf`` does. Non-causal axes only (a causal window's end is the query itself,
not ``s + KS``). Pure Python and torch, no Triton import.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from xbackend.kernels.na_triton_config import leader_span

__all__ = ["MIN_FOLD", "PENALTY", "TABLE_MAX_ELEMENTS", "MaskLayout", "mask_layout", "mask_table"]

# bf16 holds 2**126 exactly; three axes' penalties sum to -1.5 * 2**127, inside fp32's range.
PENALTY = -(2.0**126)
# The exponent of a penalised score is at most PENALTY * fold + 2 * SHIFT_MAX; with fold (the
# softmax scale times log2(e)) at least 2**-100 that is below -2**25, and exp2 gives exactly 0.
MIN_FOLD = 2.0**-100
# The table (one [K, BLOCK_N] entry per KV-block offset in the box) stays small enough to live in L2:
# 100 KB at the DiffVAE stage-5 tile; larger boxes take the select form.
TABLE_MAX_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class MaskLayout:
    """Where each axis's one-hot sits and how the kernel finds a KV block's table entry."""

    k: int  # width of the one-hot, the extra product's K: 16 or 32
    types: tuple[int, int, int]  # R per axis: the distinct window starts of a tile's rows in its box
    blocks: tuple[int, int, int]  # KV blocks per axis the table covers (the widest box, whole blocks)
    # Table elements per unit of the block's offset ``c_a - lo_a`` (a multiple of TK_a): the entry of
    # the block at offsets (o0, o1, o2) starts at ``o0 * s0 + o1 * s1 + o2 * s2``.
    strides: tuple[int, int, int]


def mask_layout(q_tile: tuple[int, int, int], kv_tile: tuple[int, int, int], kernel_size: tuple[int, int, int],
                stride: tuple[int, int, int], is_causal: tuple[bool, bool, bool]) -> MaskLayout | None:
    """The layout for a launch, or None where the select form stays: a causal axis, more than 32 row
    types in all, or a table over ``TABLE_MAX_ELEMENTS``."""
    if any(is_causal):
        return None
    types = tuple(leader_span(t, s) + 1 for t, s in zip(q_tile, stride, strict=True))
    total = sum(types)
    if total > 32:
        return None
    k = 16 if total <= 16 else 32
    # A tile's box is at most KS + leader span wide (its last row's window starts at most that far in).
    blocks = tuple(-(-(ks + r - 1) // tk) for ks, r, tk in zip(kernel_size, types, kv_tile, strict=True))
    entry = k * math.prod(kv_tile)
    if math.prod(blocks) * entry > TABLE_MAX_ELEMENTS:
        return None
    strides = (blocks[1] * blocks[2] * entry // kv_tile[0], blocks[2] * entry // kv_tile[1], entry // kv_tile[2])
    return MaskLayout(k, types, blocks, strides)


@functools.lru_cache(maxsize=64)
def mask_table(layout: MaskLayout, kv_tile: tuple[int, int, int], kernel_size: tuple[int, int, int],
               dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The key-side table, ``[prod(blocks) * k, BLOCK_N]``: entry ``(i0, i1, i2)`` (the block at
    offsets ``i_a * TK_a`` in the box) row ``base_a + s``, key ``n``: ``PENALTY`` where the key's box
    position ``i_a * TK_a + n_a`` is outside ``[s, s + KS_a)``, else 0; rows past the last type 0."""
    tk0, tk1, tk2 = kv_tile
    n = torch.arange(tk0 * tk1 * tk2)
    key_pos = (n // (tk1 * tk2), (n // tk2) % tk1, n % tk2)  # the kernel's key order in a block
    table = torch.zeros(*layout.blocks, layout.k, n.numel(), dtype=torch.float32)
    base = 0
    for axis in range(3):
        r, nb, tk, ks = layout.types[axis], layout.blocks[axis], kv_tile[axis], kernel_size[axis]
        pos = torch.arange(nb)[:, None] * tk + key_pos[axis][None, :]  # [nb, BLOCK_N]
        d = pos[:, None, :] - torch.arange(r)[None, :, None]  # [nb, r, BLOCK_N]
        pen = torch.where((d >= 0) & (d < ks), 0.0, PENALTY)
        shape = [1, 1, 1, r, n.numel()]
        shape[axis] = nb
        table[:, :, :, base:base + r, :] = pen.reshape(shape)
        base += r
    return table.reshape(-1, n.numel()).to(dtype=dtype, device=device)
