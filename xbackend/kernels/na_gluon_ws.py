"""na_gluon's shift walk for 128-query tiles, warp-specialized: two consumer warpgroups, each its own partition.

With 64-query tiles the 3-D video case re-reads its key boxes from L2 at 88% of the L2's peak
throughput (Nsight Compute on the H200: 9.46 TB/s; ``KERNEL=na_fwd_shift bash lab/gpu/na_ncu.sh``, torch
2.11, Triton 3.6, 2026-12-02, lab/results/h200/na_ncu_gluon.txt); K/V bytes per computed query-key pair
are ``4 * head_dim / BLOCK_M``, so a 128-query tile halves them for 8% more pairs (a larger box:
useful/computed 0.648 against 0.702, lab/results/h200/na_sweep_ws.txt). Run as
one 8-warp program, the two warpgroups of such a tile walk in lockstep: the CTA barriers that guard
each TMA refill against the wgmmas still reading the slot stop both, and at one CTA an SM nothing
overlaps them. Here each warpgroup is its own partition and loads one stream for both:

    consumer h=0,1:  na_gluon's trip over its 64 queries of the tile; frees a K slot when its q.k
                     retires and a V slot when its p.v does (one arrive per warpgroup); then
                     refills its stream (h=0: K, h=1: V) once both have freed the slot
                     (mbarriers, no CTA barrier)

The two consumers walk the same blocks (the tile's key box) on their own schedule. On the H200
(``python3 lab/gpu/na_sweep.py``, torch 2.11, Triton 3.6, 2026-12-02) it computes 544-553 TFLOP/s at the
video case against 503-527 for na_gluon's 8-warp program at the same tiles (lab/results/h200/
na_sweep_ws.txt, na_sweep_ws_pingpong.txt, na_sweep_gluon_q128.txt; in one run 41.6 against 45.0 ms,
na_sweep_ws.txt), but 64-query tiles with q in registers compute fewer pairs and take 3% less time
there (39.5 against 40.9 ms, na_sweep_ws_final.txt); ``config_for`` keeps 64-query tiles. Tile, window
rules, shift bound and flags are na_gluon's (``_na_fwd_kernel``'s): a tile whose bound is too loose
walks nothing and is left to na_triton's online (REDO) launch at the same config. The output is
na_triton's shift launch's at the same config, bit for bit (tests/kernels/test_na_kernels.py).
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from xbackend.kernels.na_gluon import _flag_non_finite, _probs, _row_layout, _tma_load, _tma_store
from xbackend.kernels.na_triton_blocks import (
    box_walk,
    group_base,
    group_strides,
    next_block,
    tile_box,
    win_end,
    win_start,
)

__all__ = ["CONSUMER_REGS", "KV_BUFFERS", "K_LEAD", "OPTIONS", "V_LEAD", "na_fwd_ws_kernel", "ws_supports"]

# Four K and four V slots: 8 x 16 KiB + 32 KiB of q at head_dim 128 (160 KiB, one CTA an SM). A slot
# is refilled about two trips before it is read (4 to 6 slots, leads 3/2 or 4/3, measured the same:
# 552-556 computed TFLOP/s at the video case, ``python3 lab/gpu/na_ws_slots.py``, H200, 2026-12-02,
# lab/results/h200/na_ws_slots.txt).
KV_BUFFERS = gl.constexpr(4)
# The first consumer loads K, three blocks ahead of its walk (K_{j+3} at trip j: the other consumer
# may trail by two trips before the refill waits for it); the second loads V two ahead (V is read in
# the middle of a trip and freed one trip later than K).
K_LEAD = gl.constexpr(3)
V_LEAD = gl.constexpr(2)
# The second warpgroup's setmaxnreg budget: 2 x 128 threads at 256 is the SM's 64 Ki registers (a
# separate load warp would cap every thread at 168, and ptxas then serializes the wgmmas).
CONSUMER_REGS = gl.constexpr(256)
# Over na_gluon.options: q stays in shared memory (with q in registers Triton 3.9 spills 72 B a thread
# at head_dim 128; the H200 measurements of this kernel are with q in shared memory).
OPTIONS = {"Q_REGS": False}


@triton.constexpr_function
def _split_axis(tq0, tq1, tq2):
    # The two consumers' halves: split the outermost axis that is at least 2 wide.
    return 0 if tq0 >= 2 else (1 if tq1 >= 2 else 2)


@triton.constexpr_function
def _half(t, axis, a):
    return t // 2 if axis == a else t


@gluon.jit
def _refill(desc, bufs, full, empty, i, c0, c1, c2, n_walk, lo1, lo2, end1, end2,
            TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr, NBYTES: gl.constexpr):
    """Load block i (first key c0, c1, c2) into its slot once both consumers freed the slot's previous
    block; the cursor of the block after it."""
    slot = i % KV_BUFFERS
    go = i < n_walk
    # A fresh barrier has "completed" the phase before its first: the first round passes.
    mbarrier.wait(empty.index(slot), ((i // KV_BUFFERS) & 1) ^ 1, pred=go)
    mbarrier.expect(full.index(slot), NBYTES, pred=go)
    _tma_load(desc, [c0, c1, c2, 0], full.index(slot), bufs.index(slot), pred=go)
    return next_block(c0, c1, c2, lo1, lo2, end1, end2, TK0, TK1, TK2)


@gluon.jit
def _trip(j, s, p_prev, acc, l_i, c0, c1, c2, lc0, lc1, lc2, q_op, k_bufs, v_bufs, k_full, v_full, k_empty, v_empty,
          l_desc, l_bufs, l_full, l_empty, n_walk,
          s_zero, m_i, qk_scale, lo1, lo2, end1, end2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
          TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr,
          CAUSAL0: gl.constexpr, CAUSAL1: gl.constexpr, CAUSAL2: gl.constexpr, POS_SCALE: gl.constexpr,
          HEAD_DIM: gl.constexpr, p_layout: gl.constexpr, DEEP: gl.constexpr, LEAD: gl.constexpr,
          NBYTES: gl.constexpr):
    """na_gluon's trip: block j's scores ``s`` in registers, p.v of j - 1 in flight; this consumer's
    refill (block j + LEAD of its stream) at the end."""
    BLOCK_N: gl.constexpr = TK0 * TK1 * TK2
    ks_ = (j + 1) % KV_BUFFERS
    mbarrier.wait(k_full.index(ks_), ((j + 1) // KV_BUFFERS) & 1)
    s_next = warpgroup_mma(q_op, k_bufs.index(ks_).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                           use_acc=False, is_async=True)
    p = _probs(s, m_i, qk_scale, c0, c1, c2,
               n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
               TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, POS_SCALE)
    l_i = l_i + gl.sum(p, 1)
    p = gl.convert_layout(p.to(p_prev.dtype), p_layout)
    vs_ = j % KV_BUFFERS
    mbarrier.wait(v_full.index(vs_), (j // KV_BUFFERS) & 1)
    acc = warpgroup_mma(p, v_bufs.index(vs_).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
    if DEEP:
        # q.k of block j+1 and p.v of block j-1 retired: their K and V slots are free.
        s, acc, p_prev = warpgroup_mma_wait(1, deps=[s_next, acc, p_prev])
        mbarrier.arrive(k_empty.index(ks_))
        mbarrier.arrive(v_empty.index((j + KV_BUFFERS - 1) % KV_BUFFERS), pred=j > 0)
    else:
        s, acc, p = warpgroup_mma_wait(0, deps=[s_next, acc, p])
        mbarrier.arrive(k_empty.index(ks_))
        mbarrier.arrive(v_empty.index(vs_))
    lc0, lc1, lc2 = _refill(l_desc, l_bufs, l_full, l_empty, j + LEAD, lc0, lc1, lc2, n_walk, lo1, lo2, end1, end2,
                            TK0, TK1, TK2, NBYTES)
    c0, c1, c2 = next_block(c0, c1, c2, lo1, lo2, end1, end2, TK0, TK1, TK2)
    return s, p, acc, l_i, c0, c1, c2, lc0, lc1, lc2


@gluon.jit
def _consumer(q_buf, k_bufs, v_bufs, k_full, v_full, k_empty, v_empty, l_desc, l_bufs, l_full, l_empty,
              o_desc, knorm, qk_scale, flag,
              b0, b1, b2, N0, N1, N2, lo0, lo1, lo2, end1, end2, n_walk, KS0, KS1, KS2,
              CAUSAL0: gl.constexpr, CAUSAL1: gl.constexpr, CAUSAL2: gl.constexpr,
              STRIDE0: gl.constexpr, STRIDE1: gl.constexpr, STRIDE2: gl.constexpr,
              SQ0: gl.constexpr, SQ1: gl.constexpr, SQ2: gl.constexpr,
              TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr,
              HEAD_DIM: gl.constexpr, POS_SCALE: gl.constexpr, Q_REGS: gl.constexpr, DEEP: gl.constexpr,
              LEAD: gl.constexpr, NBYTES: gl.constexpr):
    """One warpgroup's 64 queries (origin b0, b1, b2, shape SQ0 x SQ1 x SQ2) over the tile's key box;
    it also loads one stream (``l_desc``: K or V), LEAD blocks ahead of its walk. ``flag``: the tile's
    entry of FLAGS, set to 2 where this warpgroup's accumulator holds an inf or a NaN."""
    HALF_M: gl.constexpr = SQ0 * SQ1 * SQ2
    BLOCK_N: gl.constexpr = TK0 * TK1 * TK2
    NW: gl.constexpr = 4
    dtype: gl.constexpr = q_buf.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols: gl.constexpr = gl.SliceLayout(0, s_layout)

    offs_m = gl.arange(0, HALF_M, layout=rows)
    m0 = gl.minimum(b0 + offs_m // (SQ1 * SQ2), N0 - 1)
    m1 = gl.minimum(b1 + (offs_m // SQ2) % SQ1, N1 - 1)
    m2 = gl.minimum(b2 + offs_m % SQ2, N2 - 1)
    qs0 = win_start(m0, N0, KS0, STRIDE0, CAUSAL0)
    qs1 = win_start(m1, N1, KS1, STRIDE1, CAUSAL1)
    qs2 = win_start(m2, N2, KS2, STRIDE2, CAUSAL2)
    qe0 = win_end(m0, N0, KS0, STRIDE0, CAUSAL0)
    qe1 = win_end(m1, N1, KS1, STRIDE1, CAUSAL1)
    qe2 = win_end(m2, N2, KS2, STRIDE2, CAUSAL2)
    offs_n = gl.arange(0, BLOCK_N, layout=cols)
    n0 = offs_n // (TK1 * TK2)
    n1 = (offs_n // TK2) % TK1
    n2 = offs_n % TK2

    q2 = q_buf.reshape([HALF_M, HEAD_DIM])
    qf = q2.load(_row_layout(HEAD_DIM, NW)).to(gl.float32)
    if Q_REGS:
        q_op = q2.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    else:
        q_op = q2
    m_i = gl.convert_layout(gl.sqrt(gl.sum(qf * qf, 1)), rows) * knorm * gl.abs(qk_scale)

    # This consumer's stream: its first LEAD blocks (the others come LEAD trips ahead of use).
    lc0 = lo0
    lc1 = lo1
    lc2 = lo2
    for i in gl.static_range(LEAD):
        lc0, lc1, lc2 = _refill(l_desc, l_bufs, l_full, l_empty, i, lc0, lc1, lc2, n_walk, lo1, lo2, end1, end2,
                                TK0, TK1, TK2, NBYTES)
    if n_walk > 0:
        s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)
        l_i = gl.zeros([HALF_M], gl.float32, rows)
        p_prev = gl.zeros([HALF_M, BLOCK_N], dtype, p_layout)
        mbarrier.wait(k_full.index(0), 0)
        s = warpgroup_mma(q_op, k_bufs.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                          use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        mbarrier.arrive(k_empty.index(0))
        c0 = lo0
        c1 = lo1
        c2 = lo2
        # Unrolled by two, as in na_gluon (alternate registers for consecutive trips' scores).
        for jj in range(0, (n_walk - 1) // 2):
            s, p_prev, acc, l_i, c0, c1, c2, lc0, lc1, lc2 = _trip(
                2 * jj, s, p_prev, acc, l_i, c0, c1, c2, lc0, lc1, lc2, q_op, k_bufs, v_bufs, k_full, v_full, k_empty, v_empty,
                l_desc, l_bufs, l_full, l_empty, n_walk, s_zero, m_i, qk_scale, lo1, lo2, end1, end2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2,
                KS0, KS1, KS2, TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, POS_SCALE, HEAD_DIM, p_layout, DEEP,
                LEAD, NBYTES)
            s, p_prev, acc, l_i, c0, c1, c2, lc0, lc1, lc2 = _trip(
                2 * jj + 1, s, p_prev, acc, l_i, c0, c1, c2, lc0, lc1, lc2, q_op, k_bufs, v_bufs, k_full, v_full, k_empty, v_empty,
                l_desc, l_bufs, l_full, l_empty, n_walk, s_zero, m_i, qk_scale, lo1, lo2, end1, end2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2,
                KS0, KS1, KS2, TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, POS_SCALE, HEAD_DIM, p_layout, DEEP,
                LEAD, NBYTES)
        if (n_walk - 1) % 2 == 1:
            s, p_prev, acc, l_i, c0, c1, c2, lc0, lc1, lc2 = _trip(
                n_walk - 2, s, p_prev, acc, l_i, c0, c1, c2, lc0, lc1, lc2, q_op, k_bufs, v_bufs, k_full, v_full, k_empty, v_empty,
                l_desc, l_bufs, l_full, l_empty, n_walk, s_zero, m_i, qk_scale, lo1, lo2, end1, end2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2,
                KS0, KS1, KS2, TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, POS_SCALE, HEAD_DIM, p_layout, DEEP,
                LEAD, NBYTES)
        last = n_walk - 1
        p = _probs(s, m_i, qk_scale, c0, c1, c2,
                   n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
                   TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, POS_SCALE)
        l_i = l_i + gl.sum(p, 1)
        p = gl.convert_layout(p.to(dtype), p_layout)
        vs_ = last % KV_BUFFERS
        mbarrier.wait(v_full.index(vs_), (last // KV_BUFFERS) & 1)
        acc = warpgroup_mma(p, v_bufs.index(vs_).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        acc, p, p_prev = warpgroup_mma_wait(0, deps=[acc, p, p_prev])

        # An inf or a NaN (na_gluon's test): the tile goes to na_triton's safe walk.
        _flag_non_finite(acc, flag, HALF_M, o_layout)
        acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        # This warpgroup's q buffer holds its output rows for the TMA store (its wgmmas are done).
        q2.store(acc.to(dtype))
        fence_async_shared()
        _tma_store(o_desc, [b0, b1, b2, 0], q_buf)
        tma.store_wait(0)


@gluon.jit
def na_fwd_ws_kernel(
    Q, K, V, Out,
    KNORM,  # [B * heads] fp32: the largest key norm of each (batch, head)
    FLAGS,  # [programs] int32: set for the programs left to the online (REDO) launch
    sqb, sqh, sq0, sq1, sq2,
    skb, skh, sk0, sk1, sk2,
    svb, svh, sv0, sv1, sv2,
    sob, soh, so0, so1, so2,
    L0, L1, L2,
    KS0, KS1, KS2,
    DIL0, DIL1, DIL2,
    n_heads,
    qk_scale,
    CAUSAL0: gl.constexpr, CAUSAL1: gl.constexpr, CAUSAL2: gl.constexpr,
    STRIDE0: gl.constexpr, STRIDE1: gl.constexpr, STRIDE2: gl.constexpr,
    TQ0: gl.constexpr, TQ1: gl.constexpr, TQ2: gl.constexpr,
    TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr,
    HEAD_DIM: gl.constexpr,
    SHIFT_MAX: gl.constexpr,
    POS_SCALE: gl.constexpr,
    Q_REGS: gl.constexpr,  # q.k's A operand (q) from registers instead of shared memory
    DEEP: gl.constexpr,  # leave a trip's p.v in flight through the next trip (two P register sets)
    WIDE: gl.constexpr,  # spans.wide: a group's base and strides in 64 bits
    num_warps: gl.constexpr,  # 4: the first consumer warpgroup; the second is a worker partition
):
    BLOCK_N: gl.constexpr = TK0 * TK1 * TK2
    AX: gl.constexpr = _split_axis(TQ0, TQ1, TQ2)
    SQ0: gl.constexpr = _half(TQ0, AX, 0)
    SQ1: gl.constexpr = _half(TQ1, AX, 1)
    SQ2: gl.constexpr = _half(TQ2, AX, 2)
    HALF_M: gl.constexpr = SQ0 * SQ1 * SQ2
    dtype: gl.constexpr = Q.dtype.element_ty
    NBYTES: gl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([SQ0, SQ1, SQ2, HEAD_DIM], dtype)
    kv_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TK0, TK1, TK2, HEAD_DIM], dtype)

    pid_t = gl.program_id(0)
    pid_bh = gl.program_id(1)
    pid_g = gl.program_id(2)
    flat_pid = pid_t + gl.num_programs(0) * (pid_bh + gl.num_programs(1) * pid_g)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    g0, g1, g2, N0, N1, N2, live, a0, a1, a2, lo0, lo1, lo2, hi0, hi1, hi2 = tile_box(
        pid_t, pid_g, L0, L1, L2, KS0, KS1, KS2, DIL0, DIL1, DIL2, CAUSAL0, CAUSAL1, CAUSAL2,
        STRIDE0, STRIDE1, STRIDE2, TQ0, TQ1, TQ2)
    n_blocks, end1, end2 = box_walk(lo0, lo1, lo2, hi0, hi1, hi2, live, TK0, TK1, TK2)
    # The second consumer's origin: the first's, moved by half the tile along the split axis.
    d0 = SQ0 if AX == 0 else 0
    d1 = SQ1 if AX == 1 else 0
    d2 = SQ2 if AX == 2 else 0

    q_base = group_base(Q, b, h, g0, g1, g2, sqb, sqh, sq0, sq1, sq2, WIDE)
    k_base = group_base(K, b, h, g0, g1, g2, skb, skh, sk0, sk1, sk2, WIDE)
    v_base = group_base(V, b, h, g0, g1, g2, svb, svh, sv0, sv1, sv2, WIDE)
    o_base = group_base(Out, b, h, g0, g1, g2, sob, soh, so0, so1, so2, WIDE)
    gq0, gq1, gq2 = group_strides(DIL0, DIL1, DIL2, sq0, sq1, sq2, WIDE)
    gk0, gk1, gk2 = group_strides(DIL0, DIL1, DIL2, sk0, sk1, sk2, WIDE)
    gv0, gv1, gv2 = group_strides(DIL0, DIL1, DIL2, sv0, sv1, sv2, WIDE)
    go0, go1, go2 = group_strides(DIL0, DIL1, DIL2, so0, so1, so2, WIDE)
    # Descriptors over this program's dilation sub-grid, as in na_gluon (zero-filled loads past the
    # end fail the window test; stores past it are clipped).
    q_desc = tma.make_tensor_descriptor(q_base, [N0, N1, N2, HEAD_DIM], [gq0, gq1, gq2, 1], [SQ0, SQ1, SQ2, HEAD_DIM],
                                        q_sl)
    k_desc = tma.make_tensor_descriptor(k_base, [N0, N1, N2, HEAD_DIM], [gk0, gk1, gk2, 1], [TK0, TK1, TK2, HEAD_DIM],
                                        kv_sl)
    v_desc = tma.make_tensor_descriptor(v_base, [N0, N1, N2, HEAD_DIM], [gv0, gv1, gv2, 1], [TK0, TK1, TK2, HEAD_DIM],
                                        kv_sl)
    o_desc = tma.make_tensor_descriptor(o_base, [N0, N1, N2, HEAD_DIM], [go0, go1, go2, 1], [SQ0, SQ1, SQ2, HEAD_DIM],
                                        q_sl)

    q_smem = gl.allocate_shared_memory(dtype, [2, SQ0, SQ1, SQ2, HEAD_DIM], q_sl)
    k_bufs = gl.allocate_shared_memory(dtype, [KV_BUFFERS, TK0, TK1, TK2, HEAD_DIM], kv_sl)
    v_bufs = gl.allocate_shared_memory(dtype, [KV_BUFFERS, TK0, TK1, TK2, HEAD_DIM], kv_sl)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [KV_BUFFERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(KV_BUFFERS):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        # One arrive per consumer warpgroup frees a slot.
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    fence_async_shared()

    mbarrier.expect(q_bar, 2 * HALF_M * HEAD_DIM * dtype.primitive_bitwidth // 8)
    _tma_load(q_desc, [a0, a1, a2, 0], q_bar, q_smem.index(0))
    _tma_load(q_desc, [a0 + d0, a1 + d1, a2 + d2, 0], q_bar, q_smem.index(1))
    mbarrier.wait(q_bar, 0)
    # The tile's shift bound (na_gluon's, over all 128 rows) decides, for both partitions, whether
    # this program walks or is left to the REDO launch. (Each consumer recomputes its own rows' norms:
    # a worker partition takes scalars and shared memory, not this region's register tensors.)
    knorm = gl.load(KNORM + pid_bh)
    qa = q_smem.index(0).reshape([HALF_M, HEAD_DIM]).load(_row_layout(HEAD_DIM, num_warps)).to(gl.float32)
    qb = q_smem.index(1).reshape([HALF_M, HEAD_DIM]).load(_row_layout(HEAD_DIM, num_warps)).to(gl.float32)
    bound = gl.maximum(gl.max(gl.sqrt(gl.sum(qa * qa, 1)), 0), gl.max(gl.sqrt(gl.sum(qb * qb, 1)), 0))
    fixed = bound * knorm * gl.abs(qk_scale) <= SHIFT_MAX
    gl.store(FLAGS + flat_pid, 1, mask=live & (fixed == 0))
    n_walk = gl.where(fixed, n_blocks, 0)

    gl.warp_specialize([
        (_consumer, (q_smem.index(0), k_bufs, v_bufs, k_full, v_full, k_empty, v_empty,
                     k_desc, k_bufs, k_full, k_empty, o_desc, knorm, qk_scale, FLAGS + flat_pid,
                     a0, a1, a2, N0, N1, N2, lo0, lo1, lo2, end1, end2, n_walk, KS0, KS1, KS2,
                     CAUSAL0, CAUSAL1, CAUSAL2, STRIDE0, STRIDE1, STRIDE2, SQ0, SQ1, SQ2, TK0, TK1, TK2,
                     HEAD_DIM, POS_SCALE, Q_REGS, DEEP, K_LEAD, NBYTES)),
        (_consumer, (q_smem.index(1), k_bufs, v_bufs, k_full, v_full, k_empty, v_empty,
                     v_desc, v_bufs, v_full, v_empty, o_desc, knorm, qk_scale, FLAGS + flat_pid,
                     a0 + d0, a1 + d1, a2 + d2, N0, N1, N2, lo0, lo1, lo2, end1, end2, n_walk, KS0, KS1, KS2,
                     CAUSAL0, CAUSAL1, CAUSAL2, STRIDE0, STRIDE1, STRIDE2, SQ0, SQ1, SQ2, TK0, TK1, TK2,
                     HEAD_DIM, POS_SCALE, Q_REGS, DEEP, V_LEAD, NBYTES)),
    ], [4], [CONSUMER_REGS])

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(KV_BUFFERS):
        mbarrier.invalidate(k_full.index(i))
        mbarrier.invalidate(v_full.index(i))
        mbarrier.invalidate(k_empty.index(i))
        mbarrier.invalidate(v_empty.index(i))


def ws_supports(head_dim: int, q_tile: tuple[int, int, int], kv_tile: tuple[int, int, int]) -> bool:
    """128-query tiles split in two 64-query halves along one axis, 64-key blocks, head_dim 64 or 128."""
    return (head_dim in (64, 128) and q_tile[0] * q_tile[1] * q_tile[2] == 128
            and kv_tile[0] * kv_tile[1] * kv_tile[2] == 64)
