"""Fused neighborhood attention forward in Triton (tuned for Hopper, SM90).

Flash-attention style: one program per (Q tile, batch*head, dilation group); online softmax in
fp32; bf16/fp16 operands on the tensor cores.

* A Q tile is a spatial box of ``TQ0 x TQ1 x TQ2`` queries (BLOCK_M tokens), read straight from the
  heads-last ``[B, *spatial, heads, dim]`` tensor: every token row is ``dim`` contiguous elements, so
  no permuted copy of q/k/v is ever made and padding is free (rows are clamped / masked).
* The keys a Q tile needs form a box per axis: the union of its queries' windows is
  ``[start(first query), end(last query))`` because window bounds are monotone. That box is walked
  in KV blocks of ``TK0 x TK1 x TK2`` tokens that start at the box origin (not at a global tile
  grid), so the only waste beyond the box is rounding its extent up to the block shape.
* The per-element window test is one unsigned compare per axis (and once per row on axes where
  the KV block is 1 wide). Out-of-box (overhang) keys are clamped for the load and rejected by the
  test, so no load is predicated on the window.
* The KV loop carries its block coordinates (no integer divides per trip) and folds the softmax
  scale into the exponent's FMA: 429 SASS instructions a trip at the video case against 554 with
  per-trip divides and a separate scale multiply (lab/gpu/na_sass.py, sm90, Triton 3.9), 8-14% less
  time on the H200 (lab/gpu/na_sweep.py).
* Shift (``NAConfig.shift``, set by ``config_for`` with the TMA tiles; never for fp16, whose range
  would flush the small terms): a row's scores are bounded by ``|q| * max|k| * |scale|``
  (Cauchy-Schwarz, ``max|k|`` per batch and head from one pass over k, ``key_norm.max_key_norm``). Where a tile's
  bound is at most ``SHIFT_MAX`` the exponent is shifted by it, so the KV loop keeps no row max and
  never rescales the accumulator (372 SASS instructions a trip at the video case against 438;
  2-9% less time on the H200's 3-D cases, more time on 2-D ones). A tile with a looser bound (large
  activations) walks nothing in that launch and sets its flag; a second launch runs the online walk
  for exactly the flagged tiles, the others exiting at once. On large grids a program of that launch
  takes up to ``REDO_CHUNK_MAX`` tiles (a grid apart), reads their flags in one load and exits when none
  is set (``redo_chunk`` keeps at least ``REDO_MIN_PROGRAMS`` programs, so a call whose every tile is
  flagged still fills the GPU).
* Shift walk's window test (scale > 0, ``na_triton_blocks.shifted_exponent``): the tests of axis 2
  and of axes the KV block is 1 wide on choose the exponent FMA's addend (``-m`` or -inf), which a
  thread's accumulator columns share across few distinct axis-2 offsets; only the other axes select
  per element. Bit for bit the masked form; at the stage-5 tile (sm90, Triton 3.6) 280 SASS
  instructions a trip against 310, 2.632-2.674 ms against 2.727-2.797 ms on the H200
  (lab/results/h200/na_sweep_addend_*.txt, na_sweep_regs.txt).
* Pipelined shift launch (``NAConfig.pipelined``, set by ``config_for`` at head_dim 128 on sm90): the
  shift launch runs as ``na_gluon``'s Gluon kernel, the same walk with its wgmmas asynchronous (the
  next block's q.k in flight during this block's softmax, p.v in flight through the next trip) and q
  in registers; bit for bit this kernel's shift launch. The online launch stays this kernel's.
* sm90 shift launch (``na_sm90``, unless ``XBACKEND_NA_SM90`` is 0/false/no/off): at head_dim 64 with 4 x 4 x 4 tiles and
  windows of at most 11 on an sm90 GPU the shift launch is a CUDA C++ kernel that walks each tile's key box in 2 x 2 x 14
  blocks (56 keys: the exact 14-key box width along axis 2, which a power-of-two Triton block rounds
  up to 16), where that computes no more pairs than this kernel's blocks. Same walk, bounds and
  flags; the online launch for flagged tiles stays this kernel's. The stage-5 tile's call takes 4-7%
  less time with it (see ``na_sm90``).
* Dilation: the ``d`` interleaved groups of an axis are independent strided sub-grids, so a
  program works on one group: stride times ``d``, base offset ``g``, group length
  ``ceil((L - g) / d)``.
* Stride (strided NA): queries grouped by ``stride`` share their group leader's window, so the
  window bounds stay monotone in the query and the key box of a tile is still its first query's start
  to its last query's end. The leader is one integer divide per row, before the KV loop; stride 1
  is a compile-time constant that folds it away (the stride-1 kernel is the same code as without
  stride). A Q tile that covers whole stride groups of ``stride = kernel_size`` sees one dense window.
  Strided windows are tested on the H200 (tests/kernels/test_na_kernels.py) and under Triton's interpreter.
* Head dims that are not a power of two (80, 96) run padded to the next one (``HEAD_PAD`` = 128):
  q/k/v loads are masked along the head dim with zero fill and the store masks the pad columns off,
  while strides and pointer math use the real ``HEAD_DIM``. Shared memory and tensor-core work are
  those of head_dim 128, and so is the launch config. For 32, 64 and 128 (``HEAD_PAD == HEAD_DIM``)
  the masks are not generated.

* TMA (``NAConfig.tma``, set by ``config_for`` where it measured faster: 3-D windows at head_dim >= 64):
  q/k/v/out tiles move by tensor descriptors: for calls without dilation at power-of-two head dims,
  four the launch makes over ``[B, S0, S1, S2, heads * head_dim]`` (``host_descriptors_ok``; a head
  is a column range); otherwise four each program makes over its dilation sub-grid
  ``[N0, N1, N2, head_dim]``, a global write and a fence each before first use. The hardware
  zero-fills a box past the group's end or past head_dim on load and clips it on store, so nothing is
  clamped or masked for the loads. A call whose bases or
  strides break TMA's 16-byte rules (``tma_layout_ok``) takes the pointer loads.

* Non-finite values in V: p.v multiplies a tile's whole key box, where a key outside a query's window
  has p = 0 and 0 * inf is NaN. Every walk (shift, online, na_gluon's, na_sm90's) tests its tile's
  accumulator for an inf or a NaN once, after its loop, and flags the tile 2; a last launch runs
  ``na_triton_blocks.safe_loop`` for exactly those tiles (V's non-finite values zeroed for p.v and
  restored by 0/1 products where an in-window key holds one: the reference's inf/NaN positions), the
  others exiting at once as in the REDO launch. The walks' loops are unchanged.
* Offsets (``spans``): where a view spans 2**31 elements or more from its data pointer (q, k and v
  sliced from one fused qkv buffer) or a dilation times a stride reaches 2**31, the launch passes
  ``WIDE`` and the kernel forms index x stride in 64 bits; otherwise the 32-bit code is unchanged.
* Grid: batch x heads (or the dilation groups) past 65535, CUDA's limit on a grid's second and third
  extents, take a 1-D grid of one program a tile (``FLAT``).

Limits (``supports``): CUDA, bf16/fp16, any stride the op accepts, head_dim in ``HEAD_DIMS`` (32, 64, 80, 96, 128), last dim
contiguous.

H200 (benchmarks/na_sol.py, docs/performance.md): the useful TFLOP/s and % of speed of light per case.
"""

from __future__ import annotations

import contextvars
import functools
import math
from collections.abc import Callable

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from xbackend.kernels import _triton_launch, na_sm90, spans
from xbackend.kernels.key_norm import max_key_norm
from xbackend.kernels.na_triton_kernel import _na_fwd_kernel

try:  # Gluon (triton.experimental.gluon) ships with Triton 3.6 and later
    from xbackend.kernels import na_gluon, na_gluon_ws
except ImportError:  # pragma: no cover - older Triton: the shift launch stays na_triton's
    na_gluon = na_gluon_ws = None
from xbackend.kernels.na_triton_config import (
    HEAD_DIMS,
    NAConfig,
    choose_config,
    config_for,
    leader_span,
    pad3,
    supports,
    visited_pairs,
)

__all__ = ["HEAD_DIMS", "NAConfig", "choose_config", "config_for", "leader_span", "neighborhood_attention", "supports",
           "tma_layout_ok", "visited_pairs"]

_LOG2E = 1.4426950408889634

# The largest score bound (log2 units) the shift path takes: the best key's term is then at least
# 2**-(2 * SHIFT_MAX), far above fp32's smallest normal (2**-126), so no row's sum underflows.
SHIFT_MAX = 48.0


# ---------------------------------------------------------------- entry points


def _as_3d(x: torch.Tensor) -> torch.Tensor:
    """View [B, *spatial(1..3), H, D] as [B, S0, S1, S2, H, D] with leading unit axes."""
    while x.dim() < 6:
        x = x.unsqueeze(1)
    return x


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
    config: NAConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused neighborhood attention forward. Output has q's shape and dtype (contiguous)."""
    if q.is_cuda and q.device.index != _triton_launch._current_device():
        # Triton launches on the current device: go to the data's (a kernel on another GPU than its
        # tensors faults, and a fault poisons the process's CUDA context).
        with torch.cuda.device(q.device):
            return neighborhood_attention(q, k, v, kernel_size, dilation, is_causal, scale, stride,
                                          config=config, out=out)
    ks = pad3(tuple(kernel_size), 1)
    st = pad3(tuple(stride) if stride is not None else (), 1)
    dil = pad3(tuple(dilation), 1)
    causal = pad3(tuple(bool(c) for c in is_causal), False)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    q3, k3, v3, o3 = (_as_3d(t) for t in (q, k, v, out))
    batch, s0, s1, s2, heads, head_dim = q3.shape
    if config is None:
        config = config_for(q.shape, kernel_size, dilation, is_causal, stride)
    tq = config.q_tile
    glen0 = [-(-L // d) for L, d in zip((s0, s1, s2), dil, strict=True)]
    n_tiles = math.prod(-(-n // t) for n, t in zip(glen0, tq, strict=True))
    grid = (n_tiles, batch * heads, math.prod(dil))
    n_programs = math.prod(grid)

    def strides(t: torch.Tensor) -> tuple[int, ...]:
        st = t.stride()
        return (st[0], st[4], st[1], st[2], st[3])

    tma = config.tma and tma_layout_ok(q3, k3, v3, o3)
    # fp16 p would lose the small terms the shift leaves (fp16 normals end at 2**-14); bf16 has fp32's
    # range (and fp32, which only the interpreter tests run, is fp32).
    shift = config.shift and q.dtype != torch.float16
    # Per tile: 1 for the online walk (a SHIFT launch's loose bound), 2 for the safe walk (non-finite).
    flags = torch.zeros(n_programs, dtype=torch.int32, device=q.device)
    # The shift launch's bound needs each (batch, head)'s largest key norm: one pass over k.
    knorm = max_key_norm(k3) if shift else o3  # o3: not read
    wide = _wide(dil, q3, k3, v3, o3)
    flat = grid[1] > GRID_YZ_MAX or grid[2] > GRID_YZ_MAX
    args = (q3, k3, v3, o3, knorm, flags,
            *strides(q3), *strides(k3), *strides(v3), *strides(o3),
            s0, s1, s2, *ks, *dil, heads, float(scale) * _LOG2E, *causal, *st, *tq, *config.kv_tile)
    head_pad = triton.next_power_of_2(head_dim)
    mode = 0
    if tma:
        mode = 2 if HOST_DESCRIPTORS and host_descriptors_ok(dil, head_dim, q3, k3, v3, o3) else 1
    chunk = redo_chunk(n_programs)
    if mode == 2:
        kv_block = [1, *config.kv_tile, head_pad]
        descs = (_descriptor(q3, [1, *tq, head_pad]), _descriptor(k3, kv_block), _descriptor(v3, kv_block),
                 _descriptor(o3, [1, *tq, head_pad]))
        targs = (*descs, *args[4:])
    else:
        targs = args

    def launch(redo: int, shift: bool) -> None:
        one_d = redo and chunk > 1
        safe = redo == SAFE
        _na_fwd_kernel[(triton.cdiv(n_programs, chunk),) if one_d else (n_programs,) if flat else grid](
            *((*args[:-3], *_safe_kv_tile(config.kv_tile, 32 if head_pad <= 64 else 16)) if safe else targs),
            HEAD_DIM=head_dim,
            HEAD_PAD=head_pad,
            TMA=0 if safe else mode,  # the safe walk reads through pointers
            SHIFT=shift,
            REDO=redo,
            SHIFT_MAX=SHIFT_MAX,
            POS_SCALE=float(scale) > 0,
            WIDE=wide,
            REDO_CHUNK=chunk if one_d else 1,
            FLAT=flat and not one_d,
            n_programs=n_programs,
            grid_t=grid[0],
            grid_bh=grid[1],
            # The safe walk holds an fp32 and two fp16 [BLOCK_M, HEAD_PAD] accumulators and several
            # [BLOCK_M, BLOCK_N] masks: with 32-key blocks and 4 warps at head_dim <= 64, 16-key blocks and 8
            # warps at 128, it does not spill (sm90, Triton 3.9; 64-key blocks spilled 88-224 bytes a thread).
            num_warps=8 if safe and head_pad >= 128 else 4 if safe else config.num_warps,
            num_stages=1 if safe else config.num_stages,
            # Contraction to FMA on: the H200 numbers above were measured under Triton 3.6's default, which
            # is on; Triton 3.10 turns the default off. (A tolerance kernel: speed, not its contract.)
            enable_fp_fusion=True,
        )

    # With ``shift``: the shift launch, then the online walk for the programs it flagged 1 (those exit at
    # once otherwise). Without: the online walk alone. Last, the safe walk for the programs flagged 2.
    launches = ([functools.partial(launch, redo=0, shift=True), functools.partial(launch, redo=ONLINE, shift=False)]
                if shift else [functools.partial(launch, redo=0, shift=False)])
    launches.append(functools.partial(launch, redo=SAFE, shift=False))
    if shift and tma and config.pipelined and na_gluon is not None and _hopper(q) and not flat:
        # The shift launch as a pipelined Gluon kernel (the same walk: bit for bit its result).
        pipelined = _pipelined_kernel(head_dim, tq, config.kv_tile, st)
        if pipelined is not None:
            kernel, warps, schedule = pipelined
            launches[0] = functools.partial(kernel[grid], *args, HEAD_DIM=head_dim, SHIFT_MAX=SHIFT_MAX,
                                            POS_SCALE=float(scale) > 0, WIDE=wide, num_warps=warps,
                                            enable_fp_fusion=True, **schedule)
    if shift and na_sm90.takes(q3, k3, v3, o3, ks, dil, causal, st, float(scale), tq, config.kv_tile):
        # The shift launch in 56-key blocks (CUDA C++, sm_90a): the same walk and flags, 1/8 fewer q.k pairs.
        launches[0] = functools.partial(na_sm90.shift_launch, q3, k3, v3, o3, knorm, flags, ks,
                                        float(scale) * _LOG2E, SHIFT_MAX)
    for one in launches:
        if tma and q.is_cuda:
            # In-kernel descriptors need global scratch, which Triton takes from its allocator: set in a
            # copy of this context, so the caller's allocator (or its absence) is left as it was.
            contextvars.copy_context().run(_launch_with_scratch, one)
        else:
            one()
    return out


# CUDA's grid: 2**31 - 1 programs along its first axis, 65535 along the other two; past that (batch x
# heads, or the dilation groups) the launch takes a 1-D grid.
GRID_YZ_MAX = 65535
# The flag values of a tile (``_na_fwd_kernel``'s REDO): left to the online walk, left to the safe walk.
ONLINE = 1
SAFE = 2


def _safe_kv_tile(kv_tile: tuple[int, int, int], keys: int) -> tuple[int, int, int]:
    """The safe walk's key blocks: the config's, its widest axis halved down to ``keys`` keys (any block
    shape walks the same key box; smaller blocks keep its [BLOCK_M, BLOCK_N] masks and probabilities, of
    which it holds several, in registers)."""
    blocks = list(kv_tile)
    while blocks[0] * blocks[1] * blocks[2] > keys:
        widest = max(range(3), key=lambda a: (blocks[a], a))
        blocks[widest] //= 2
    return tuple(blocks)


def _wide(dilation: tuple[int, int, int], *tensors: torch.Tensor) -> bool:
    """``spans.wide`` for the kernel's offsets: each view's span (a contiguous one's is its numel,
    read without the per-dim sum: 0.7 against 8 us a call on a CPU core), and where an axis is
    dilated, a group's stride (dilation times the axis stride, which a group's base and its
    descriptors form; past the span by up to one stride)."""
    extra = max((t.numel() for t in tensors if t.is_contiguous()), default=0)
    if dilation != (1, 1, 1):
        extra = max(extra, *(d * t.stride(1 + a) for t in tensors for a, d in enumerate(dilation)))
    return spans.wide(*(t for t in tensors if not t.is_contiguous()), extra=extra)


# 128-query tiles take the warp-specialized kernel (two consumer warpgroups, each its own partition)
# when this is set, else na_gluon's 8-warp kernel (lab/gpu/na_sweep.py compares them).
WARP_SPECIALIZED = True


def _pipelined_kernel(head_dim: int, q_tile: tuple[int, int, int], kv_tile: tuple[int, int, int],
                      stride: tuple[int, int, int]):
    """The Gluon kernel, warp count and schedule constexprs for a pipelined shift launch at this
    shape, or None."""
    options = na_gluon.options(head_dim, stride)
    if WARP_SPECIALIZED and na_gluon_ws.ws_supports(head_dim, q_tile, kv_tile):
        return na_gluon_ws.na_fwd_ws_kernel, 4, {**options, **na_gluon_ws.OPTIONS}
    if na_gluon.gluon_supports(head_dim, q_tile, kv_tile):
        return na_gluon.na_fwd_shift_kernel, na_gluon.num_warps(q_tile), options
    return None


def _hopper(q: torch.Tensor) -> bool:
    # na_gluon issues wgmma, which is sm90's alone (a meta tensor is a plan for the registry's sm90 device).
    # The interpreter's CPU tensors take na_triton's shift launch.
    return q.device.type == "meta" or (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9)


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    # The caching allocator's blocks are 512-byte aligned (TMA descriptors need 64 bytes).
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _launch_with_scratch(launch: Callable[[], object]) -> None:
    triton.set_allocator(_scratch)
    launch()


# TMA tiles through four descriptors the launch makes (kernel parameters, where ``host_descriptors_ok``)
# rather than four each program builds (each a global write, a fence and a barrier before its first
# use): on the H200 (Triton 3.6) the DiffVAE stage-5 tile took 2.663 / 2.576 ms against 2.730 / 2.692
# ms with the programs' own, two passes of one process (lab/results/h200/na_sweep_launch_forms_*.txt).
HOST_DESCRIPTORS = True
# The REDO launch's programs take up to this many tiles each (``redo_chunk``); 1 keeps a
# program per tile, whose 23040 programs at the stage-5 tile cost 29 us exiting at once (H200).
REDO_CHUNK_MAX = 8
# Tiles a REDO launch keeps as separate programs before it groups them: 2048 is about 4 waves of
# 4 programs an SM on the H200's 132 SMs, so a launch whose every tile is flagged still fills the GPU.
REDO_MIN_PROGRAMS = 2048


def redo_chunk(n_programs: int) -> int:
    """Tiles per REDO program: the largest power of two up to ``REDO_CHUNK_MAX`` that
    leaves at least ``REDO_MIN_PROGRAMS`` programs (1 for smaller grids)."""
    chunk = 1
    while chunk < REDO_CHUNK_MAX and n_programs // (2 * chunk) >= REDO_MIN_PROGRAMS:
        chunk *= 2
    return chunk


def host_descriptors_ok(dilation: tuple[int, int, int], head_dim: int, *tensors: torch.Tensor) -> bool:
    """Whether one 5-D descriptor ``[B, S0, S1, S2, heads * head_dim]`` per tensor serves every
    program: no dilation (a group is a strided sub-grid of its own), head_dim a power of two (a
    padded box would read the next head's columns instead of zeros) and heads packed at head_dim
    apart (one head is a column range of the last axis)."""
    if dilation != (1, 1, 1) or head_dim & (head_dim - 1):
        return False
    return all(t.shape[4] == 1 or t.stride(4) == head_dim for t in tensors)


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    b, s0, s1, s2, heads, head_dim = t.shape
    st = t.stride()
    return TensorDescriptor(t, [b, s0, s1, s2, heads * head_dim], [st[0], st[1], st[2], st[3], 1], block)


def tma_layout_ok(*tensors: torch.Tensor) -> bool:
    """TMA's global-memory rules, per call: 16-byte aligned base addresses and every stride but the
    last (which is 1) a multiple of 16 bytes. Other layouts take the pointer loads."""
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:-1]):
            return False
    return True
