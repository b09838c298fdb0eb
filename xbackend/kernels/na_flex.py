"""Portable neighborhood attention on ``torch.nn.attention.flex_attention`` (NVIDIA and AMD).

Tokens are permuted so that each flex block is one spatial tile (e.g. 4x4x8 = 128 tokens). A
neighborhood window then covers a box of whole tiles plus a rim, so most blocks of the block mask
are either fully inside every query's window (``full`` blocks: no mask_mod call) or fully outside
(skipped); only the rim blocks evaluate ``mask_mod``.

The BlockMask is built from per-axis tile arithmetic (which KV tiles a Q tile touches, which of
those it fully covers), never from an N x N (or even dense block x block) tensor on CUDA: memory is
O(Q blocks x KV blocks touched per Q block).

Dilation is folded into the permutation: each axis is reordered group-major (``i % d`` outer,
``i // d`` inner) and every group is padded to a whole number of tiles, so a tile never straddles
two groups and a group's windows are contiguous in the permuted coordinate.

Padding: axes are padded to ``d * round_up(ceil(L / d), t)``. Padded keys are outside every
window; padded queries borrow the window of the last real query of their group (their output is
discarded), which keeps tile bounds monotone and never turns a full block partial.

Non-finite values in V: flex multiplies every key of a partial block by its probability, 0 outside a
query's window, and 0 * inf is NaN. So flex runs on V with its non-finite values zeroed, and two more
flex calls over 0/1 indicators of V's +inf (or NaN) and -inf (or NaN) values, p-weighted, say where a
key of the window with p > 0 brings one: those are added back (+inf, -inf, NaN for both), the
reference's values. The indicator calls' block mask is multiplied on the device by "V holds a
non-finite value", so where it holds none they walk no block (no host synchronisation: the call stays
capturable in a CUDA graph). Not restored: an in-window infinite value whose probability flex's exp2
flushes to 0 (below 2**-126, 87 nats under its row's maximum) where the fp32 reference's is still a
subnormal (reference inf or NaN, here the finite sum or NaN).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from xbackend.kernels.na_flex_tiles import Axis, axis, axis_tile_ranges, choose_tile, choose_tile_cached, tile_cost

__all__ = ["build_block_mask", "choose_tile", "clear_cache", "neighborhood_attention", "supports", "tile_cost"]

_CACHE_SIZE = 32
_RECOMPILE_LIMIT = 64


# ---------------------------------------------------------------- block mask


def _block_lists(axes: list[Axis]) -> tuple[torch.Tensor, ...]:
    """Compact per-Q-block lists of partial and full KV blocks (global block ids)."""
    n = len(axes)
    ranges = [axis_tile_ranges(ax) for ax in axes]
    spans = [int((b - a).max()) for a, b, _, _ in ranges]
    # Q blocks enumerate (groups..., tiles...) exactly like the token permutation does.
    groups = [ax.dilation for ax in axes]
    ntiles = [ax.padded_group // ax.tile for ax in axes]

    def grid(sizes: list[int]) -> list[torch.Tensor]:
        return list(torch.meshgrid(*[torch.arange(s) for s in sizes], indexing="ij"))

    gq = grid(groups)
    tq = grid(ntiles)
    # Permuted axis tile index of each Q block: u = g * ntiles + j, shape [*groups, *ntiles].
    u = [
        (gq[a].reshape(groups + [1] * n) * ntiles[a] + tq[a].reshape([1] * n + ntiles)).reshape(-1)
        for a in range(n)
    ]
    offs = grid(spans)
    offs = [o.reshape(-1) for o in offs]
    valid = None
    full = None
    kv_id = None
    for a in range(n):
        ra, rb, fa, fb = (r[u[a]] for r in ranges[a])
        v_a = ra[:, None] + offs[a][None, :]  # [nQ, R] candidate KV tile along axis a
        ok = v_a < rb[:, None]
        fu = (v_a >= fa[:, None]) & (v_a < fb[:, None])
        g_a, j_a = v_a // ntiles[a], v_a % ntiles[a]
        valid = ok if valid is None else valid & ok
        full = fu if full is None else full & fu
        # Global block id = (group index row-major) * tiles_per_group + (tile index row-major).
        term_g = g_a * math.prod(groups[a + 1 :])
        term_j = j_a * math.prod(ntiles[a + 1 :])
        kv_id = (term_g, term_j) if kv_id is None else (kv_id[0] + term_g, kv_id[1] + term_j)
    assert valid is not None and full is not None and kv_id is not None
    block_id = kv_id[0] * math.prod(ntiles) + kv_id[1]
    partial = valid & ~full
    full = valid & full
    return _compact(partial, block_id) + _compact(full, block_id)


def _compact(keep: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    counts = keep.sum(1).to(torch.int32)
    width = max(int(counts.max()), 1)
    # Stable sort puts the kept ids first, in ascending KV order (good for KV locality in flex).
    order = torch.sort((~keep).to(torch.int8), dim=1, stable=True).indices[:, :width]
    idx = torch.gather(ids, 1, order)
    idx = torch.where(torch.gather(keep, 1, order), idx, 0).to(torch.int32)
    return counts, idx


def _decoder(axes: list[Axis]):
    """Function mapping permuted token indices to per-axis permuted coordinates (group-major)."""
    n = len(axes)
    tiles = [ax.tile for ax in axes]
    ntiles = [ax.padded_group // ax.tile for ax in axes]
    groups = [ax.dilation for ax in axes]
    vol = math.prod(tiles)
    per_group = math.prod(ntiles) * vol

    def coords(idx):
        grp, rest = idx // per_group, idx % per_group
        tile_id, intra = rest // vol, rest % vol
        out = []
        for a in range(n):
            g_a = (grp // math.prod(groups[a + 1 :])) % groups[a]
            j_a = (tile_id // math.prod(ntiles[a + 1 :])) % ntiles[a]
            r_a = (intra // math.prod(tiles[a + 1 :])) % tiles[a]
            out.append(g_a * (ntiles[a] * tiles[a]) + j_a * tiles[a] + r_a)
        return out

    return coords


def _mask_mod_for(axes: list[Axis], device: torch.device, packed: bool | None = None):
    """mask_mod over permuted token indices.

    ``packed`` (default when every axis coordinate fits its bit field): three int32 tables over the
    tokens hold the key coordinates and the query windows' low/high bounds, all axes bit-packed, so
    the kernel does one gather per row / column and a few shifts and compares per element.
    Otherwise each index is decoded arithmetically (integer divisions) and windows are looked up
    per axis.
    """
    n = len(axes)
    bits = 31 // n
    fits = all(ax.padded < (1 << bits) for ax in axes)
    if packed is None:
        packed = fits
    coords = _decoder(axes)
    los = [ax.lo.to(dtype=torch.int32) for ax in axes]
    his = [ax.hi.to(dtype=torch.int32) for ax in axes]
    if packed:
        if not fits:
            raise ValueError(f"axis coordinates do not fit {bits}-bit fields")
        tokens = math.prod(ax.padded for ax in axes)
        pc = coords(torch.arange(tokens, dtype=torch.int32))
        kpack = sum(pc[a] << (bits * a) for a in range(n))
        qlo = sum(los[a][pc[a]] << (bits * a) for a in range(n))
        qhi = sum(his[a][pc[a]] << (bits * a) for a in range(n))
        kpack, qlo, qhi = (t.to(device=device, dtype=torch.int32) for t in (kpack, qlo, qhi))
        field = (1 << bits) - 1

        def mask_packed(b, h, q_idx, kv_idx):
            kc, lo, hi = kpack[kv_idx], qlo[q_idx], qhi[q_idx]
            ok = None
            for a in range(n):
                sh = bits * a
                k_a = (kc >> sh) & field
                ok_a = (k_a >= ((lo >> sh) & field)) & (k_a < ((hi >> sh) & field))
                ok = ok_a if ok is None else ok & ok_a
            return ok

        return mask_packed

    los = [t.to(device) for t in los]
    his = [t.to(device) for t in his]

    def mask_arith(b, h, q_idx, kv_idx):
        qc = coords(q_idx)
        kc = coords(kv_idx)
        ok = (kc[0] >= los[0][qc[0]]) & (kc[0] < his[0][qc[0]])
        for a in range(1, n):
            ok = ok & (kc[a] >= los[a][qc[a]]) & (kc[a] < his[a][qc[a]])
        return ok

    return mask_arith


def _from_kv_blocks(lists: tuple[torch.Tensor, ...], vol: int, tokens: int, mask_mod,
                    device: torch.device) -> BlockMask:
    kvn, kvi, fkvn, fkvi = (t.to(device)[None, None] for t in lists)
    kwargs: dict[str, Any] = {"seq_lengths": (tokens, tokens)}
    # The Q-major transpose is only needed for backward; it would materialise a dense
    # [Q blocks, KV blocks] table, which is what this module avoids.
    if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters:
        kwargs["compute_q_blocks"] = False
    return BlockMask.from_kv_blocks(kvn, kvi, fkvn, fkvi, BLOCK_SIZE=vol, mask_mod=mask_mod, **kwargs)


def _pad_indices(lists: tuple[torch.Tensor, ...], width: int) -> tuple[torch.Tensor, ...]:
    """Give the partial and full index tables one common width.

    Torch's own masks always carry two tables of identical shape; some torch versions' kernels
    index the full table with the partial table's strides (an out-of-bounds read when the widths
    differ, seen as an illegal memory access on torch 2.11), and flex's CPU lowering wants one
    column per KV block. One spare column keeps a "next block" prefetch inside the table.
    """
    out = []
    for i, t in enumerate(lists):
        if i % 2 == 1:
            t = F.pad(t, (0, width - t.shape[1]))
        out.append(t)
    return tuple(out)


def build_block_mask(
    spatial: tuple[int, ...],
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    tile: tuple[int, ...],
    device: torch.device,
    wide_indices: bool = False,
    stride: tuple[int, ...] | None = None,
) -> tuple[BlockMask, list[Axis]]:
    """BlockMask over tile-permuted tokens, plus the per-axis layout used to permute them.

    Index tables are compact (as wide as the most KV blocks any Q block touches, plus one) unless
    ``wide_indices`` or the device is a CPU: then one column per KV block, like torch's own masks.
    """
    stride = stride or (1,) * len(spatial)
    axes = [axis(L, k, d, c, t, s)
            for L, k, d, c, t, s in zip(spatial, kernel_size, dilation, is_causal, tile, stride, strict=True)]
    lists = _block_lists(axes)
    vol = math.prod(tile)
    nblocks = math.prod(ax.tiles for ax in axes)
    if wide_indices or device.type == "cpu":
        width = nblocks
    else:
        width = min(max(lists[1].shape[1], lists[3].shape[1]) + 1, nblocks)
    lists = _pad_indices(lists, width)
    mm = _mask_mod_for(axes, device)
    return _from_kv_blocks(lists, vol, nblocks * vol, mm, device), axes


_cache: OrderedDict[tuple, tuple[BlockMask, list[Axis]]] = OrderedDict()


def _cached_block_mask(key: tuple) -> tuple[BlockMask, list[Axis]]:
    hit = _cache.get(key)
    if hit is not None:
        _cache.move_to_end(key)
        return hit
    value = build_block_mask(*key)
    _cache[key] = value
    if len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return value


def clear_cache() -> None:
    _cache.clear()


# ---------------------------------------------------------------- permutation


def _to_tiles(x: torch.Tensor, axes: list[Axis]) -> torch.Tensor:
    """[B, *spatial, H, D] -> [B, H, N_padded, D] in (group, tile, intra-tile) order."""
    b, h, dim = x.shape[0], x.shape[-2], x.shape[-1]
    n = len(axes)
    pad: list[int] = [0, 0, 0, 0]
    for ax in reversed(axes):
        pad += [0, ax.padded - ax.length]
    # F.pad lists dims from last to first: (D, H, then spatial axes innermost first).
    x = F.pad(x, pad[: 4 + 2 * n])
    shape = [b]
    for ax in axes:
        shape += [ax.padded_group // ax.tile, ax.tile, ax.dilation]  # i = (j*t + r)*d + g
    x = x.reshape(*shape, h, dim)
    g_dims = [1 + 3 * a + 2 for a in range(n)]
    j_dims = [1 + 3 * a for a in range(n)]
    r_dims = [1 + 3 * a + 1 for a in range(n)]
    hd = 1 + 3 * n
    x = x.permute(0, hd, *g_dims, *j_dims, *r_dims, hd + 1)
    return x.reshape(b, h, -1, dim)


def _from_tiles(o: torch.Tensor, axes: list[Axis], like: torch.Tensor) -> torch.Tensor:
    b, h, dim = like.shape[0], like.shape[-2], like.shape[-1]
    n = len(axes)
    shape = (
        [b, h]
        + [ax.dilation for ax in axes]
        + [ax.padded_group // ax.tile for ax in axes]
        + [ax.tile for ax in axes]
        + [dim]
    )
    o = o.reshape(shape)
    # Inverse of _to_tiles: back to [B, (j, r, g) per axis, H, D].
    order = [0]
    for a in range(n):
        order += [2 + n + a, 2 + 2 * n + a, 2 + a]
    order += [1, 2 + 3 * n]
    o = o.permute(order).reshape(b, *[ax.padded for ax in axes], h, dim)
    # Contiguous like the op's fake impl promises (a compiled caller asserts the strides).
    return o[(slice(None), *[slice(0, ax.length) for ax in axes])].contiguous()


# ---------------------------------------------------------------- entry points


@functools.cache
def _compiled_flex():
    # dynamic=False: one specialised kernel per shape, the fastest flex configuration.
    return torch.compile(flex_attention, dynamic=False)


def supports(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    stride: tuple[int, ...] | None = None,
) -> str | None:
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {q.dtype} not supported"
    if not (k.shape == q.shape and v.shape == q.shape):
        return "q, k, v must share one shape"
    if not 1 <= q.dim() - 3 <= 3:
        return "needs 1 to 3 spatial dims"
    if q.shape[-1] < 16 or q.shape[-1] & (q.shape[-1] - 1):
        return "head_dim must be a power of two >= 16"
    return None


def neighborhood_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    stride: tuple[int, ...] | None = None,
    *,
    tile: tuple[int, ...] | None = None,
    compiled: bool | None = None,
    kernel_options: dict[str, Any] | None = None,
    wide_indices: bool = False,
) -> torch.Tensor:
    """Neighborhood attention through flex_attention over tile-permuted tokens.

    ``tile``: spatial tile shape (one flex block; its volume is the BlockMask block size), chosen by
    :func:`choose_tile` when None. ``compiled``: run the torch.compile'd flex kernel (default on
    GPUs; eager flex materialises dense scores, so it is only for tiny CPU runs).
    ``wide_indices``: block index tables with one column per KV block (torch's own layout, O(blocks^2)
    int32) instead of the compact default.
    """
    spatial = tuple(q.shape[1:-2])
    kernel_size, dilation = tuple(kernel_size), tuple(dilation)
    is_causal = tuple(bool(c) for c in is_causal)
    if tile is None:
        tile = choose_tile_cached(spatial, kernel_size, dilation, is_causal)
    if compiled is None:
        compiled = q.device.type != "cpu"
    key = (spatial, kernel_size, dilation, is_causal, tuple(tile), q.device, wide_indices,
           tuple(stride or (1,) * len(spatial)))
    block_mask, axes = _cached_block_mask(key)
    qt, kt, vt = (_to_tiles(t, axes) for t in (q, k, v))
    # Under an outer torch.compile, Dynamo traces flex_attention into the caller's graph.
    flex = flex_attention if not compiled or torch.compiler.is_compiling() else _recompiling_flex
    bad = ~vt.isfinite()
    nan = vt.isnan()
    o = flex(qt, kt, vt.masked_fill(bad, 0.0), block_mask=block_mask, scale=scale, kernel_options=kernel_options)
    # Where V holds no inf or NaN the indicator calls' blocks are zeroed: they walk nothing.
    gated = _gated(block_mask, bad.any())
    up = flex(qt, kt, (vt.isposinf() | nan).to(vt.dtype), block_mask=gated, scale=scale, kernel_options=kernel_options)
    down = flex(qt, kt, (vt.isneginf() | nan).to(vt.dtype), block_mask=gated, scale=scale,
                kernel_options=kernel_options)
    return _from_tiles(o + _special(up > 0, down > 0, o.dtype), axes, q)


def _recompiling_flex(*args: Any, **kwargs: Any) -> torch.Tensor:
    # Every new shape is a recompile of the one compiled function; past Dynamo's default limit (8) it
    # would silently fall back to eager flex, which materialises dense scores.
    with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT):
        return _compiled_flex()(*args, **kwargs)


def _gated(mask: BlockMask, gate: torch.Tensor) -> BlockMask:
    """``build_block_mask``'s ``mask`` with its block counts multiplied by ``gate`` (a 0-d bool tensor,
    read on the device)."""
    gate = gate.to(mask.kv_num_blocks.dtype)
    lists = (mask.kv_num_blocks[0, 0] * gate, mask.kv_indices[0, 0], mask.full_kv_num_blocks[0, 0] * gate,
             mask.full_kv_indices[0, 0])
    return _from_kv_blocks(lists, mask.BLOCK_SIZE[0], mask.seq_lengths[0], mask.mask_mod, gate.device)


def _special(up: torch.Tensor, down: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where neither indicator holds, +inf for ``up``, -inf for ``down``, NaN for both: added to a
    finite attention output, the IEEE sum over the window's keys that the reference computes."""
    inf = torch.tensor(float("inf"), dtype=dtype, device=up.device)
    return torch.where(up, inf, 0.0).to(dtype) + torch.where(down, -inf, 0.0).to(dtype)
