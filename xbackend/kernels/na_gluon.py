"""na_triton's shift launch as a Gluon kernel for Hopper: the KV loop software-pipelined by hand.

The Triton kernel's KV loop is latency-bound on the H200 (Nsight Compute, ``bash lab/gpu/na_ncu.sh``
at the video case: issue slots 46.7% busy, 0.69 eligible warps of 2 per scheduler; torch 2.11, Triton
3.6, 2026-12-02, lab/results/h200/na_ncu.txt): every wgmma is waited for right after it is issued, so the softmax
never overlaps the tensor cores inside a CTA. Here the wgmmas are asynchronous and waited for in an
order of our choosing (the intra-warpgroup overlap of flash-attention 3), one warpgroup per 64 queries
of the tile (64-query tiles: two CTAs per SM at head_dim 128):

    trip j (S_j, the scores of block j, in registers):
        issue S_{j+1} = q . K_{j+1}^T                      tensor cores
        P_j = exp2(S_j * scale - shift), masked            overlaps S_{j+1} and P_{j-1} V_{j-1}
        issue acc += P_j V_j                               tensor cores
        wait until only P_j V_j is in flight               S_{j+1} ready, P_{j-1} V_{j-1} retired
        refill the freed slots: K_{j+4}, V_{j+2}           TMA, three K and three V buffers

It is only the shift walk (``NAConfig.shift``): with every row's exponent shifted by its Cauchy-Schwarz
bound there is no row max and no accumulator rescale, so nothing in a trip waits on P V. Tiles whose
bound is too loose set their flag and walk nothing, exactly as in na_triton's shift launch; its online
(REDO) launch then runs for them. Same grid, arguments and window rules as ``_na_fwd_kernel``; it needs
TMA tiles (``tma_layout_ok``), head_dim 64 or 128, bf16, 64- or 128-query tiles and 64-key blocks, and
sm90 (wgmma). The outputs are na_triton's shift launch's, bit for bit (tests/kernels/test_na_kernels.py).
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

from xbackend.kernels.na_triton_blocks import (
    axis_ok,
    box_walk,
    group_base,
    group_strides,
    next_block,
    shifted_exponent,
    tile_box,
    win_end,
    win_start,
)

__all__ = ["GLUON_HEAD_DIMS", "K_BUFFERS", "OPTIONS", "STRIDED_OPTIONS", "V_BUFFERS", "gluon_supports",
           "na_fwd_shift_kernel", "num_warps", "options"]

# The TMA copies' names: async_load / async_store from Triton 3.7 (3.9 has only these), the
# async_copy_* spelling before (Triton 3.6, the H200 device's).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

GLUON_HEAD_DIMS = (64, 128)
# The kernel's schedule options per head_dim (constexprs of na_fwd_shift_kernel).
OPTIONS = {64: {"Q_REGS": False, "DEEP": True}, 128: {"Q_REGS": True, "DEEP": True}}
# Strided windows keep q in shared memory: with q in registers Triton 3.9 spills 40 B a thread at the
# video case, stride (2, 4, 8) (255 registers; Triton 3.6 fits it in 222).
STRIDED_OPTIONS = {"Q_REGS": False}


def options(head_dim: int, stride: tuple[int, ...]) -> dict[str, bool]:
    """The schedule constexprs for a launch: ``OPTIONS`` by head_dim, ``STRIDED_OPTIONS`` over them."""
    return {**OPTIONS[head_dim], **(STRIDED_OPTIONS if any(s > 1 for s in stride) else {})}


# K is needed at the top of a trip (q.k), V in its middle (p.v), so K is refilled further ahead:
# three buffers of each keep 2 CTAs per SM at head_dim 128 (6 x 16 KiB + 16 KiB of q = 112 KiB a CTA).
K_BUFFERS = gl.constexpr(3)
V_BUFFERS = gl.constexpr(3)


@triton.constexpr_function
def _row_layout(head_dim, num_warps):
    # A [rows, head_dim] blocked layout of 16-byte vectors for q's norm (read once from shared memory).
    cols = head_dim // 8
    return gl.BlockedLayout([1, 8], [32 // cols, cols], [num_warps, 1], [1, 0])


@gluon.jit
def _probs(s, m_i, qk_scale, c0, c1, c2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
           TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr,
           CAUSAL0: gl.constexpr, CAUSAL1: gl.constexpr, CAUSAL2: gl.constexpr, POS_SCALE: gl.constexpr):
    """exp2 of the block's scores shifted by the row bound, 0 outside each query's window (fp32)."""
    if POS_SCALE:
        # The window tests pick the exponent FMA's addend where they can (na_triton_blocks.shifted_exponent).
        return gl.exp2(shifted_exponent(s, qk_scale, -m_i, c0, c1, c2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2,
                                        KS0, KS1, KS2, TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2))
    ok = axis_ok(c0, c0 + n0, qs0, qe0, KS0, TK0, CAUSAL0)
    ok = ok & axis_ok(c1, c1 + n1, qs1, qe1, KS1, TK1, CAUSAL1)
    ok = ok & axis_ok(c2, c2 + n2, qs2, qe2, KS2, TK2, CAUSAL2)
    if POS_SCALE:
        # The scale rides in the exponent's FMA; a masked -inf stays -inf.
        return gl.exp2(gl.where(ok, s, float("-inf")) * qk_scale - m_i[:, None])
    else:
        # scale <= 0: scaled before the mask (-inf * 0 would be NaN, a negative scale would flip it).
        return gl.exp2(gl.where(ok, s * qk_scale, float("-inf")) - m_i[:, None])


@gluon.jit
def _flag_non_finite(acc, flag, ROWS: gl.constexpr, layout: gl.constexpr):
    """Set ``*flag`` to 2 where a row of ``acc`` holds an inf or a NaN, after the walk (once a tile): a
    non-finite V value times p = 0 outside a row's window is NaN, so the tile goes to na_triton's safe
    walk, which runs after the online launch (na_triton_kernel). Row sums keep any inf or NaN and take
    a quad's shuffles, no shared memory (a sum over the whole tile cost na_gluon 48 bytes of spills)."""
    total = gl.sum(acc, 1)
    at = flag + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout)) * 0
    gl.store(at, 2, mask=(total != total) | (gl.abs(total) == float("inf")))


@gluon.jit
def _load_kv(desc, bufs, bars, slot, c0, c1, c2, pred, NBYTES: gl.constexpr):
    bar = bars.index(slot)
    mbarrier.expect(bar, NBYTES, pred=pred)
    _tma_load(desc, [c0, c1, c2, 0], bar, bufs.index(slot), pred=pred)


@gluon.jit
def _trip(j, s, p_prev, acc, l_i, c0, c1, c2, kc0, kc1, kc2, vc0, vc1, vc2, q_op, k_bufs, v_bufs, k_bars, v_bars,
          k_desc, v_desc, s_zero, m_i, qk_scale, n_blocks, lo1, lo2, end1, end2, n0, n1, n2,
          qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
          TK0: gl.constexpr, TK1: gl.constexpr, TK2: gl.constexpr,
          CAUSAL0: gl.constexpr, CAUSAL1: gl.constexpr, CAUSAL2: gl.constexpr, POS_SCALE: gl.constexpr,
          HEAD_DIM: gl.constexpr, NBYTES: gl.constexpr, p_layout: gl.constexpr, DEEP: gl.constexpr):
    """One trip of the KV walk: block j's scores ``s`` are in registers, block j - 1's p.v may still run."""
    BLOCK_N: gl.constexpr = TK0 * TK1 * TK2
    ks_ = (j + 1) % K_BUFFERS
    mbarrier.wait(k_bars.index(ks_), ((j + 1) // K_BUFFERS) & 1)
    s_next = warpgroup_mma(q_op, k_bufs.index(ks_).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                           use_acc=False, is_async=True)
    p = _probs(s, m_i, qk_scale, c0, c1, c2,
               n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
               TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, POS_SCALE)
    l_i = l_i + gl.sum(p, 1)
    p = gl.convert_layout(p.to(p_prev.dtype), p_layout)
    vs_ = j % V_BUFFERS
    mbarrier.wait(v_bars.index(vs_), (j // V_BUFFERS) & 1)
    acc = warpgroup_mma(p, v_bufs.index(vs_).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
    if DEEP:
        # q.k of block j+1 and p.v of block j-1 are done; p.v of block j may still run (p stays live).
        s, acc, p_prev = warpgroup_mma_wait(1, deps=[s_next, acc, p_prev])
    else:
        s, acc, p = warpgroup_mma_wait(0, deps=[s_next, acc, p])
    _load_kv(k_desc, k_bufs, k_bars, ks_, kc0, kc1, kc2, j + 1 + K_BUFFERS < n_blocks, NBYTES)
    kc0, kc1, kc2 = next_block(kc0, kc1, kc2, lo1, lo2, end1, end2, TK0, TK1, TK2)
    _load_kv(v_desc, v_bufs, v_bars, (j + V_BUFFERS - 1) % V_BUFFERS, vc0, vc1, vc2,
             j + V_BUFFERS - 1 < n_blocks, NBYTES)
    vc0, vc1, vc2 = next_block(vc0, vc1, vc2, lo1, lo2, end1, end2, TK0, TK1, TK2)
    c0, c1, c2 = next_block(c0, c1, c2, lo1, lo2, end1, end2, TK0, TK1, TK2)
    return s, p, acc, l_i, c0, c1, c2, kc0, kc1, kc2, vc0, vc1, vc2


@gluon.jit
def na_fwd_shift_kernel(
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
    num_warps: gl.constexpr,
):
    BLOCK_M: gl.constexpr = TQ0 * TQ1 * TQ2
    BLOCK_N: gl.constexpr = TK0 * TK1 * TK2
    dtype: gl.constexpr = Q.dtype.element_ty
    NBYTES: gl.constexpr = BLOCK_N * HEAD_DIM * dtype.primitive_bitwidth // 8
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    cols: gl.constexpr = gl.SliceLayout(0, s_layout)
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([TQ0, TQ1, TQ2, HEAD_DIM], dtype)
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

    q_base = group_base(Q, b, h, g0, g1, g2, sqb, sqh, sq0, sq1, sq2, WIDE)
    k_base = group_base(K, b, h, g0, g1, g2, skb, skh, sk0, sk1, sk2, WIDE)
    v_base = group_base(V, b, h, g0, g1, g2, svb, svh, sv0, sv1, sv2, WIDE)
    o_base = group_base(Out, b, h, g0, g1, g2, sob, soh, so0, so1, so2, WIDE)
    gq0, gq1, gq2 = group_strides(DIL0, DIL1, DIL2, sq0, sq1, sq2, WIDE)
    gk0, gk1, gk2 = group_strides(DIL0, DIL1, DIL2, sk0, sk1, sk2, WIDE)
    gv0, gv1, gv2 = group_strides(DIL0, DIL1, DIL2, sv0, sv1, sv2, WIDE)
    # Descriptors over this program's dilation sub-grid: boxes past its end or past head_dim are
    # zero-filled on load (those keys fail the window test) and clipped on store.
    q_desc = tma.make_tensor_descriptor(q_base, [N0, N1, N2, HEAD_DIM], [gq0, gq1, gq2, 1],
                                        [TQ0, TQ1, TQ2, HEAD_DIM], q_sl)
    k_desc = tma.make_tensor_descriptor(k_base, [N0, N1, N2, HEAD_DIM], [gk0, gk1, gk2, 1],
                                        [TK0, TK1, TK2, HEAD_DIM], kv_sl)
    v_desc = tma.make_tensor_descriptor(v_base, [N0, N1, N2, HEAD_DIM], [gv0, gv1, gv2, 1],
                                        [TK0, TK1, TK2, HEAD_DIM], kv_sl)

    q_smem = gl.allocate_shared_memory(dtype, [TQ0, TQ1, TQ2, HEAD_DIM], q_sl)
    k_bufs = gl.allocate_shared_memory(dtype, [K_BUFFERS, TK0, TK1, TK2, HEAD_DIM], kv_sl)
    v_bufs = gl.allocate_shared_memory(dtype, [V_BUFFERS, TK0, TK1, TK2, HEAD_DIM], kv_sl)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [K_BUFFERS, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [V_BUFFERS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(K_BUFFERS):
        mbarrier.init(k_bars.index(i), count=1)
    for i in gl.static_range(V_BUFFERS):
        mbarrier.init(v_bars.index(i), count=1)

    mbarrier.expect(q_bar, BLOCK_M * HEAD_DIM * dtype.primitive_bitwidth // 8)
    _tma_load(q_desc, [a0, a1, a2, 0], q_bar, q_smem)
    # The first K_BUFFERS K blocks and V_BUFFERS - 1 V blocks, with carried load cursors.
    kc0 = lo0
    kc1 = lo1
    kc2 = lo2
    for i in gl.static_range(K_BUFFERS):
        _load_kv(k_desc, k_bufs, k_bars, i, kc0, kc1, kc2, i < n_blocks, NBYTES)
        kc0, kc1, kc2 = next_block(kc0, kc1, kc2, lo1, lo2, end1, end2, TK0, TK1, TK2)
    vc0 = lo0
    vc1 = lo1
    vc2 = lo2
    for i in gl.static_range(V_BUFFERS - 1):
        _load_kv(v_desc, v_bufs, v_bars, i, vc0, vc1, vc2, i < n_blocks, NBYTES)
        vc0, vc1, vc2 = next_block(vc0, vc1, vc2, lo1, lo2, end1, end2, TK0, TK1, TK2)

    # Query coordinates and window bounds per row (rows past the group's end stand in for its last
    # query: finite softmax, clipped on store).
    offs_m = gl.arange(0, BLOCK_M, layout=rows)
    m0 = gl.minimum(a0 + offs_m // (TQ1 * TQ2), N0 - 1)
    m1 = gl.minimum(a1 + (offs_m // TQ2) % TQ1, N1 - 1)
    m2 = gl.minimum(a2 + offs_m % TQ2, N2 - 1)
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

    mbarrier.wait(q_bar, 0)
    q2 = q_smem.reshape([BLOCK_M, HEAD_DIM])
    # |q| * max|k| * |scale| bounds every score of a row (Cauchy-Schwarz); see na_triton's SHIFT.
    qf = q2.load(_row_layout(HEAD_DIM, num_warps)).to(gl.float32)
    # q.k's A operand from registers: a 64 x 64 x 16 wgmma with both operands in shared memory reads
    # 4 KiB for 32 tensor-core cycles, all of the SM's 128 B/clock; with q in registers, half that.
    if Q_REGS:
        q_op = q2.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    else:
        q_op = q2
    m_i = gl.convert_layout(gl.sqrt(gl.sum(qf * qf, 1)), rows) * gl.load(KNORM + pid_bh) * gl.abs(qk_scale)
    fixed = gl.max(m_i, 0) <= SHIFT_MAX
    gl.store(FLAGS + flat_pid, 1, mask=live & (fixed == 0))

    if fixed & (n_blocks > 0):
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        l_i = gl.zeros([BLOCK_M], gl.float32, rows)
        p_prev = gl.zeros([BLOCK_M, BLOCK_N], dtype, p_layout)
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q_op, k_bufs.index(0).reshape([BLOCK_N, HEAD_DIM]).permute((1, 0)), s_zero,
                          use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        # K slot 0 is free: block K_BUFFERS goes there.
        _load_kv(k_desc, k_bufs, k_bars, 0, kc0, kc1, kc2, K_BUFFERS < n_blocks, NBYTES)
        kc0, kc1, kc2 = next_block(kc0, kc1, kc2, lo1, lo2, end1, end2, TK0, TK1, TK2)
        c0 = lo0
        c1 = lo1
        c2 = lo2
        # Unrolled by two, so the scores and probabilities of consecutive trips take alternate
        # registers (one trip per iteration copies both back: 48 moves a trip in SASS).
        for jj in range(0, (n_blocks - 1) // 2):
            s, p_prev, acc, l_i, c0, c1, c2, kc0, kc1, kc2, vc0, vc1, vc2 = _trip(
                2 * jj, s, p_prev, acc, l_i, c0, c1, c2, kc0, kc1, kc2, vc0, vc1, vc2, q_op, k_bufs, v_bufs, k_bars,
                v_bars, k_desc, v_desc, s_zero, m_i, qk_scale, n_blocks, lo1, lo2, end1, end2, n0, n1, n2,
                qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2, TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2,
                POS_SCALE, HEAD_DIM, NBYTES, p_layout, DEEP)
            s, p_prev, acc, l_i, c0, c1, c2, kc0, kc1, kc2, vc0, vc1, vc2 = _trip(
                2 * jj + 1, s, p_prev, acc, l_i, c0, c1, c2, kc0, kc1, kc2, vc0, vc1, vc2, q_op, k_bufs, v_bufs,
                k_bars, v_bars, k_desc, v_desc, s_zero, m_i, qk_scale, n_blocks, lo1, lo2, end1, end2, n0, n1, n2,
                qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2, TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2,
                POS_SCALE, HEAD_DIM, NBYTES, p_layout, DEEP)
        if (n_blocks - 1) % 2 == 1:
            s, p_prev, acc, l_i, c0, c1, c2, kc0, kc1, kc2, vc0, vc1, vc2 = _trip(
                n_blocks - 2, s, p_prev, acc, l_i, c0, c1, c2, kc0, kc1, kc2, vc0, vc1, vc2, q_op, k_bufs, v_bufs,
                k_bars, v_bars, k_desc, v_desc, s_zero, m_i, qk_scale, n_blocks, lo1, lo2, end1, end2, n0, n1, n2,
                qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2, TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2,
                POS_SCALE, HEAD_DIM, NBYTES, p_layout, DEEP)
        last = n_blocks - 1
        p = _probs(s, m_i, qk_scale, c0, c1, c2,
                   n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
                   TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, POS_SCALE)
        l_i = l_i + gl.sum(p, 1)
        p = gl.convert_layout(p.to(dtype), p_layout)
        vs_ = last % V_BUFFERS
        mbarrier.wait(v_bars.index(vs_), (last // V_BUFFERS) & 1)
        acc = warpgroup_mma(p, v_bufs.index(vs_).reshape([BLOCK_N, HEAD_DIM]), acc, is_async=True)
        acc, p, p_prev = warpgroup_mma_wait(0, deps=[acc, p, p_prev])

        # An inf or a NaN in the accumulator: flag 2, for na_triton's safe walk.
        _flag_non_finite(acc, FLAGS + flat_pid, BLOCK_M, o_layout)
        acc = acc / gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))[:, None]
        # q's buffer holds the output tile for the TMA store (every wgmma reading q is done).
        q2.store(acc.to(dtype))
        fence_async_shared()
        go0, go1, go2 = group_strides(DIL0, DIL1, DIL2, so0, so1, so2, WIDE)
        o_desc = tma.make_tensor_descriptor(o_base, [N0, N1, N2, HEAD_DIM], [go0, go1, go2, 1],
                                            [TQ0, TQ1, TQ2, HEAD_DIM], q_sl)
        _tma_store(o_desc, [a0, a1, a2, 0], q_smem)
        tma.store_wait(0)
    else:
        # A flagged tile walks nothing, but its first loads are in flight: let them land first.
        for i in gl.static_range(K_BUFFERS):
            mbarrier.wait(k_bars.index(i), 0, pred=i < n_blocks)
        for i in gl.static_range(V_BUFFERS - 1):
            mbarrier.wait(v_bars.index(i), 0, pred=i < n_blocks)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(K_BUFFERS):
        mbarrier.invalidate(k_bars.index(i))
    for i in gl.static_range(V_BUFFERS):
        mbarrier.invalidate(v_bars.index(i))


def gluon_supports(head_dim: int, q_tile: tuple[int, int, int], kv_tile: tuple[int, int, int]) -> bool:
    """The shapes the kernel is written for: 64- or 128-query tiles (one warpgroup per 64 queries),
    64-key blocks, head_dim 64 or 128."""
    return (head_dim in GLUON_HEAD_DIMS
            and q_tile[0] * q_tile[1] * q_tile[2] in (64, 128) and kv_tile[0] * kv_tile[1] * kv_tile[2] == 64)


def num_warps(q_tile: tuple[int, int, int]) -> int:
    return q_tile[0] * q_tile[1] * q_tile[2] // 16
