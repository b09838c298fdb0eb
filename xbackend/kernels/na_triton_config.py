"""na_triton's inputs and launch configuration: which inputs it takes (``supports``, ``HEAD_DIMS``), the
frozen ``NAConfig`` record, the tile-shape choice and the work model behind it (``visited_pairs``: the
query-key pairs the kernel computes under a config).

Pure Python, no Triton import: the impl's ``supports`` answers where Triton cannot be imported (a CPU
host planning a simulated GPU). The window rule here (``_window``) is the kernel's
``win_start``/``win_end`` (``na_triton_blocks.py``) in Python.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

__all__ = ["HEAD_DIMS", "TMA_MIN_HEAD_DIM", "NAConfig", "choose_config", "config_for", "leader_span", "pad3",
           "supports", "tma_pays", "visited_pairs"]

# Head dims supports() accepts. 80 and 96 run padded to the next power of two (128), so they cost
# what 128 costs in shared memory and tensor-core work.
HEAD_DIMS = (32, 64, 80, 96, 128)


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
    """Why na_triton cannot take these inputs, or None (shapes, strides and dtypes only)."""
    if q.device.type not in ("cuda", "meta"):  # meta: planning for a simulated device
        return "needs a CUDA device"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype} not supported (bf16/fp16 only)"
    if k.dtype != q.dtype or v.dtype != q.dtype:
        return "q, k, v dtypes differ"
    if not (k.shape == q.shape and v.shape == q.shape):
        return "q, k, v must share one shape"
    if not 1 <= q.dim() - 3 <= 3:
        return "needs 1 to 3 spatial dims"
    if q.shape[-1] not in HEAD_DIMS:
        return f"head_dim {q.shape[-1]} not in {HEAD_DIMS}"
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "needs contiguous last dim"
    return None


@dataclass(frozen=True)
class NAConfig:
    """Launch configuration: Q tile and KV block shapes (3 axes, outermost first), warps, stages."""

    q_tile: tuple[int, int, int]
    kv_tile: tuple[int, int, int]
    num_warps: int
    num_stages: int
    # Move q/k/v/out tiles by TMA (in-kernel tensor descriptors over the program's dilation sub-grid)
    # instead of pointer gathers; ``config_for`` sets it where that measured faster (``tma_pays``).
    tma: bool = False
    # Shift each row's exponent by its Cauchy-Schwarz score bound, where that bound is tight enough,
    # instead of tracking the row max (no max, no accumulator rescale in the KV loop); ``config_for``
    # sets it with ``tma``, where it measured faster (3-D windows at head_dim >= 64: 2-9% on the H200).
    shift: bool = False
    # Run the shift launch as na_gluon's hand-pipelined kernel (asynchronous wgmma, K/V rings) where
    # it applies (``na_gluon.gluon_supports``); the online launch stays na_triton's.
    pipelined: bool = False


# TMA tiles against pointer gathers on the H200 (lab/gpu/na_sweep.py, Triton 3.6): 4-8% less time on 3-D
# windows at head_dim 64 (DiffVAE stage-4 and stage-5 tiles) and 80-128 (the video cases; at the stage-4
# tile, 128 measured within 2% either way), 2% more at head_dim 32, 27-34% more on 2-D windows.
TMA_MIN_HEAD_DIM = 64


# na_gluon's pipelined shift launch against na_triton's on the H200 (lab/gpu/na_sweep.py, Triton 3.6):
# 4-9% less time at head_dim 128 (3-D video, small window, DiffVAE stage-4 tile); at head_dim 64 it
# holds 2-3 CTAs an SM to na_triton's 4 and takes 5-19% more.
PIPELINED_HEAD_DIMS = (128,)
# 128-query tiles (na_gluon_ws's warp-specialized kernel) read half the K/V bytes per pair from L2, which
# bounds the 64-query walk (88% of the L2's throughput at the 3-D video case), but compute more pairs:
# 3% more time than 64-query tiles at the video case, 7-45% more at the small window and DiffVAE
# tiles (lab/gpu/na_sweep.py). ``choose_config`` keeps 64.


def tma_pays(spatial: tuple[int, int, int], head_dim: int) -> bool:
    """The measured rule: TMA for 3-D problems (every axis longer than 1) at head_dim >= 64."""
    return head_dim >= TMA_MIN_HEAD_DIM and all(n > 1 for n in spatial)


def _pow2_le(x: int) -> int:
    return 1 << (max(x, 1).bit_length() - 1)


def _shapes(total: int, limits: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Power-of-two 3-axis shapes of ``total`` tokens whose extents stay within ``limits`` (all
    shapes when none does: a problem smaller than one tile is padded anyway)."""
    e = int(math.log2(total))
    shapes = [(1 << e0, 1 << e1, 1 << (e - e0 - e1)) for e0 in range(e + 1) for e1 in range(e + 1 - e0)]
    fits = [s for s in shapes if all(si <= li for si, li in zip(s, limits, strict=True))]
    return fits or shapes


def leader_span(tile: int, stride: int) -> int:
    """Largest distance between the group leaders of the first and last query of a ``tile``-wide Q
    tile (tiles start at multiples of ``tile``; leaders sit at the same offset in every stride group,
    so the span is ``stride`` times the most group boundaries one tile crosses). ``tile - 1`` at
    stride 1."""
    period = stride // math.gcd(tile, stride)  # tile offsets modulo stride repeat after this many tiles
    return stride * max((i * tile + tile - 1) // stride - (i * tile) // stride for i in range(period))


def _window(m: int, n: int, ks: int, s: int, causal: bool) -> tuple[int, int]:
    """Keys ``[start, end)`` of group position ``m`` on one axis: ``_win_start``/``_win_end`` in Python."""
    first = (m // s) * s
    leader = min(first + (s - 1 if causal else s // 2), n - 1)
    if causal:
        return max(leader - ks + 1, 0), m + 1
    start = min(max(leader - ks // 2, 0), n - ks)
    return start, start + ks


def visited_pairs(
    spatial: tuple[int, ...],
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    stride: tuple[int, ...],
    config: NAConfig,
) -> int:
    """Query-key pairs the kernel computes (q.k and p.v) for one batch and head under ``config``:
    every program's padded Q tile times its KV blocks, the key box rounded up to whole blocks. The
    useful pairs are the window sizes summed over queries; the ratio is the fraction of tensor-core
    work that is wasted on padding and on keys outside a query's window."""
    axes = zip(pad3(tuple(spatial), 1), pad3(tuple(kernel_size), 1), pad3(tuple(dilation), 1),
               pad3(tuple(is_causal), False), pad3(tuple(stride), 1), config.q_tile, config.kv_tile, strict=True)
    return math.prod(_axis_pairs(*axis) for axis in axes)


@functools.lru_cache(maxsize=4096)  # choose_config asks for every tile extent of every axis
def _axis_pairs(length: int, ks: int, dil: int, causal: bool, s: int, tq: int, tk: int) -> int:
    """One axis's factor of ``visited_pairs``: over its dilation groups and Q tiles, the tile extent
    times its key box rounded up to whole KV blocks."""
    total = 0
    for g in range(dil):
        group_len = -(-(length - g) // dil)
        for a in range(0, group_len, tq):
            lo = _window(a, group_len, ks, s, causal)[0]
            hi = _window(min(a + tq, group_len) - 1, group_len, ks, s, causal)[1]
            total += tq * -(-(hi - lo) // tk) * tk
    return total


@functools.lru_cache(maxsize=256)  # milliseconds of Python per call otherwise (measured on the H200 host)
def choose_config(
    spatial: tuple[int, int, int],
    kernel_size: tuple[int, int, int],
    dilation: tuple[int, int, int],
    head_dim: int,
    block_m: int | None = None,
    block_n: int = 64,
    stride: tuple[int, int, int] = (1, 1, 1),
    is_causal: tuple[bool, bool, bool] = (False, False, False),
) -> NAConfig:
    """Pick the Q tile / KV block shapes that compute the fewest query-key pairs (``visited_pairs``:
    padded Q tiles times whole KV blocks over each tile's key box); ties go to the first shape in
    ``_shapes`` order. On the H200 the exact count's picks measured as fast as or faster than a
    per-axis max-box bound (3-D video 5.7% less time, small-window 3-D 17%; lab/gpu/na_tile_model.py
    --time). The count leaves out the window test's cost, which grows with the box rim in every shape
    alike.

    ``head_dim`` does not change the pick: every head dim in ``HEAD_DIMS`` gets 4 warps and 3 stages
    at 64-query tiles, and 80 and 96 get what their padded 128 gets. Compiled for sm90, none of them
    spills.
    """
    glen = tuple(-(-L // d) for L, d in zip(spatial, dilation, strict=True))
    if block_m is None:
        # H200: 64-query tiles with 4 warps beat 128/8 at d=128 too (smaller key box per query).
        block_m = 64
    best: tuple[float, NAConfig] | None = None
    q_limits = tuple(_pow2_le(2 * n - 1) for n in glen)  # smallest power of two covering n
    for tq in _shapes(block_m, q_limits):
        box = tuple(min(k + leader_span(t, s), n) for k, t, s, n in zip(kernel_size, tq, stride, glen, strict=True))
        k_limits = tuple(_pow2_le(2 * bx - 1) for bx in box)
        for tk in _shapes(block_n, k_limits):
            cfg = NAConfig(tq, tk, 4 if block_m <= 64 else 8, 3)
            score = visited_pairs(spatial, kernel_size, dilation, is_causal, stride, cfg)
            if best is None or score < best[0]:
                best = (score, cfg)
    if best is None:
        raise ValueError(f"no tile shape of {block_m}x{block_n} fits {spatial}")
    return best[1]


def config_for(
    shape: tuple[int, ...],
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    stride: tuple[int, ...] | None = None,
) -> NAConfig:
    """The config ``neighborhood_attention`` launches with for q of ``shape`` ``[B, *spatial, H, D]``
    and the op's per-axis arguments (1 to 3 axes): TMA tiles and the score-bound shift where
    ``tma_pays`` (both measured faster there, both slower on 2-D windows), with them the pipelined
    shift launch at ``PIPELINED_HEAD_DIMS``."""
    spatial = pad3(tuple(shape[1:-2]), 1)
    cfg = choose_config(spatial, pad3(tuple(kernel_size), 1), pad3(tuple(dilation), 1), shape[-1],
                        stride=pad3(tuple(stride or ()), 1), is_causal=pad3(tuple(bool(c) for c in is_causal), False))
    if not tma_pays(spatial, shape[-1]):
        return cfg
    return dataclasses.replace(cfg, tma=True, shift=True, pipelined=shape[-1] in PIPELINED_HEAD_DIMS)


def pad3(t: tuple, fill) -> tuple:
    return (fill,) * (3 - len(t)) + tuple(t)
