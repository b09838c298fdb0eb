"""na_triton's kernel: one Q tile's attention (``_na_tile``) and the launch entry (``_na_fwd_kernel``)
whose programs run one tile each, or, for a REDO launch on a large grid, several. The design, the
launch switches and the measured numbers are ``na_triton``'s docstring; the walk's device functions
are ``na_triton_blocks``.

Flags (one int32 per tile of the grid): 1, set by a SHIFT launch, leaves the tile to the online walk
(``REDO=1``); 2, set by any walk whose accumulator holds an inf or a NaN, leaves it to the safe walk
(``REDO=2``, ``na_triton_blocks.safe_loop``), which the launch runs last.
"""

from __future__ import annotations

import triton
import triton.language as tl

from xbackend.kernels.na_triton_blocks import (
    box_walk,
    group_base,
    group_strides,
    kv_loop,
    non_finite,
    safe_loop,
    tile_box,
    win_end,
    win_start,
)


@triton.jit
def _na_tile(
    pid_t, pid_bh, pid_g, flat_pid,  # this tile's Q tile, batch * head, dilation group; its flag's index
    Q, K, V, Out,
    KNORM,  # [B * heads] fp32: the largest key norm of each (batch, head); read when SHIFT
    FLAGS,  # [programs] int32: set by a SHIFT launch for the programs it left to the REDO launch
    sqb, sqh, sq0, sq1, sq2,
    skb, skh, sk0, sk1, sk2,
    svb, svh, sv0, sv1, sv2,
    sob, soh, so0, so1, so2,
    L0, L1, L2,
    KS0, KS1, KS2,
    DIL0, DIL1, DIL2,
    n_heads,
    qk_scale,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    STRIDE0: tl.constexpr, STRIDE1: tl.constexpr, STRIDE2: tl.constexpr,
    TQ0: tl.constexpr, TQ1: tl.constexpr, TQ2: tl.constexpr,
    TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    # 0: pointer gathers; 1: TMA by 4-D descriptors made in-kernel over the program's dilation sub-grid;
    # 2: TMA by the launch's 5-D descriptors Q, K, V, Out over [batch, S0, S1, S2, heads * head_dim]
    TMA: tl.constexpr,
    SHIFT: tl.constexpr,  # shift by the Cauchy-Schwarz bound where it is tight enough (no row max)
    REDO: tl.constexpr,  # 0: every tile; 1: the online walk of tiles flagged 1; 2: the safe walk of tiles flagged 2
    SHIFT_MAX: tl.constexpr,
    POS_SCALE: tl.constexpr,  # scale > 0: the scale folds into the exponent's FMA after the mask
    WIDE: tl.constexpr,  # spans.wide: offsets past 2**31 elements, so index x stride in 64 bits
    run=True,  # False: walk no KV block and store nothing (a chunked REDO program's unflagged tile)
):
    """One Q tile's attention (the kernel's body; a chunked REDO program runs several)."""
    BLOCK_M: tl.constexpr = TQ0 * TQ1 * TQ2
    BLOCK_N: tl.constexpr = TK0 * TK1 * TK2
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    g0, g1, g2, N0, N1, N2, live, a0, a1, a2, lo0, lo1, lo2, hi0, hi1, hi2 = tile_box(
        pid_t, pid_g, L0, L1, L2, KS0, KS1, KS2, DIL0, DIL1, DIL2, CAUSAL0, CAUSAL1, CAUSAL2,
        STRIDE0, STRIDE1, STRIDE2, TQ0, TQ1, TQ2)
    live = live & run

    offs_m = tl.arange(0, BLOCK_M)
    m0 = a0 + offs_m // (TQ1 * TQ2)
    m1 = a1 + (offs_m // TQ2) % TQ1
    m2 = a2 + offs_m % TQ2
    row_ok = (m0 < tl.where(live, N0, 0)) & (m1 < N1) & (m2 < N2)
    # Rows past the group's end stand in for its last query (finite softmax, store masked off).
    m0 = tl.minimum(m0, N0 - 1)
    m1 = tl.minimum(m1, N1 - 1)
    m2 = tl.minimum(m2, N2 - 1)
    qs0 = win_start(m0, N0, KS0, STRIDE0, CAUSAL0)
    qs1 = win_start(m1, N1, KS1, STRIDE1, CAUSAL1)
    qs2 = win_start(m2, N2, KS2, STRIDE2, CAUSAL2)
    qe0 = win_end(m0, N0, KS0, STRIDE0, CAUSAL0)
    qe1 = win_end(m1, N1, KS1, STRIDE1, CAUSAL1)
    qe2 = win_end(m2, N2, KS2, STRIDE2, CAUSAL2)

    # HEAD_PAD: HEAD_DIM rounded up to a power of two (block shapes must be). Where they differ, loads
    # fill the pad columns with zeros (they add nothing to q.k; p.v's pad columns are not stored).
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_DIM
    tcol = h * HEAD_DIM  # the head's first column on a TMA == 2 descriptor's last axis
    # A dilation group's strides (64-bit with WIDE: a row index times one passes 2**31 there).
    gq0, gq1, gq2 = group_strides(DIL0, DIL1, DIL2, sq0, sq1, sq2, WIDE)
    ks0, ks1, ks2 = group_strides(DIL0, DIL1, DIL2, sk0, sk1, sk2, WIDE)
    vs0, vs1, vs2 = group_strides(DIL0, DIL1, DIL2, sv0, sv1, sv2, WIDE)
    go0, go1, go2 = group_strides(DIL0, DIL1, DIL2, so0, so1, so2, WIDE)
    if TMA != 2:  # pointers into this program's (batch, head, dilation group)
        q_base = group_base(Q, b, h, g0, g1, g2, sqb, sqh, sq0, sq1, sq2, WIDE)
        k_base = group_base(K, b, h, g0, g1, g2, skb, skh, sk0, sk1, sk2, WIDE)
        v_base = group_base(V, b, h, g0, g1, g2, svb, svh, sv0, sv1, sv2, WIDE)
        o_base = group_base(Out, b, h, g0, g1, g2, sob, soh, so0, so1, so2, WIDE)
    if TMA == 2:
        # The launch's descriptors (kernel parameters): nothing to build or fence before the first load.
        k_desc = K
        v_desc = V
        k_base = K  # unused: load_block reads through the descriptor
        v_base = V
        q = tl.reshape(Q.load([b, a0, a1, a2, tcol]), [BLOCK_M, HEAD_PAD])
    elif TMA == 1:
        # One descriptor per tensor over this program's sub-grid [N0, N1, N2, HEAD_DIM]: a box past the
        # group's end or past HEAD_DIM is zero-filled on load (those keys fail the window test, those
        # query rows and pad columns are clipped on store), so nothing is clamped or masked here.
        q_desc = tl.make_tensor_descriptor(q_base, shape=[N0, N1, N2, HEAD_DIM], strides=[gq0, gq1, gq2, 1],
                                           block_shape=[TQ0, TQ1, TQ2, HEAD_PAD])
        k_desc = tl.make_tensor_descriptor(k_base, shape=[N0, N1, N2, HEAD_DIM], strides=[ks0, ks1, ks2, 1],
                                           block_shape=[TK0, TK1, TK2, HEAD_PAD])
        v_desc = tl.make_tensor_descriptor(v_base, shape=[N0, N1, N2, HEAD_DIM], strides=[vs0, vs1, vs2, 1],
                                           block_shape=[TK0, TK1, TK2, HEAD_PAD])
        q = tl.reshape(q_desc.load([a0, a1, a2, 0]), [BLOCK_M, HEAD_PAD])
    else:
        k_desc = k_base  # unused: load_block reads through pointers
        v_desc = v_base
        q_row = m0 * gq0 + m1 * gq1 + m2 * gq2
        if HEAD_PAD != HEAD_DIM:
            q = tl.load(q_base + q_row[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        else:
            q = tl.load(q_base + q_row[:, None] + offs_d[None, :])

    offs_n = tl.arange(0, BLOCK_N)
    n0 = offs_n // (TK1 * TK2)
    n1 = (offs_n // TK2) % TK1
    n2 = offs_n % TK2
    n_blocks, end1, end2 = box_walk(lo0, lo1, lo2, hi0, hi1, hi2, live, TK0, TK1, TK2)
    if REDO == 2:
        # A tile whose walk met an inf or a NaN (flagged 2): the non-finite-safe walk, pointer tiles.
        tl.static_assert(TMA == 0, "the safe walk reads through pointers")
        res = safe_loop(q, n_blocks, qk_scale, lo0, lo1, lo2, end1, end2, k_base, v_base, n0, n1, n2, hi0, hi1,
                        hi2, ks0, ks1, ks2, vs0, vs1, vs2, offs_d, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
                        TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, HEAD_DIM, HEAD_PAD, BLOCK_M, BLOCK_N)
        o_row = m0 * go0 + m1 * go1 + m2 * go2
        tl.store(o_base + o_row[:, None] + offs_d[None, :], res.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])
        return

    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    if SHIFT:
        # |q| * max|k| * |scale| bounds every score of a row (Cauchy-Schwarz). Where the tile's bound is
        # at most SHIFT_MAX (log2 units), the best key's term is at least 2**-(2 * SHIFT_MAX) = 2**-96,
        # 30 binades above fp32's smallest normal, and the walk shifts by the bound instead of tracking
        # the row max. A tile with a looser bound walks nothing here and is flagged for the REDO launch.
        qf = q.to(tl.float32)
        m_i = tl.sqrt(tl.sum(qf * qf, 1)) * tl.load(KNORM + pid_bh) * tl.abs(qk_scale)
        fixed = tl.max(m_i, 0) <= SHIFT_MAX
        tl.store(FLAGS + flat_pid, 1, mask=live & (fixed == 0))
        live = live & fixed
        row_ok = row_ok & (m0 < tl.where(fixed, N0, 0))
        n_blocks = tl.where(fixed, n_blocks, 0)
    else:
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # the online walk's running max
    acc, l_i = kv_loop(q, acc, l_i, m_i, n_blocks, qk_scale, lo0, lo1, lo2, end1, end2,
                       k_desc, v_desc, k_base, v_base, n0, n1, n2, hi0, hi1, hi2, ks0, ks1, ks2, vs0, vs1, vs2,
                       offs_d, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2, TK0, TK1, TK2,
                       CAUSAL0, CAUSAL1, CAUSAL2, HEAD_DIM, HEAD_PAD, BLOCK_N, TMA, POS_SCALE, SHIFT, b, tcol)

    # An inf or a NaN in the accumulator (a non-finite value of V met by p = 0 outside some row's
    # window gives NaN, one inside it inf or NaN): the tile is left to the safe walk (REDO=2), which
    # runs after this launch and overwrites what this one stores. A tile that walked nothing (not
    # live, or left to the online walk) has a zero accumulator and sets nothing.
    tl.store(FLAGS + flat_pid + offs_m * 0, 2, mask=non_finite(acc))
    acc = acc / l_i[:, None]
    if TMA == 2:
        if live:
            Out.store([b, a0, a1, a2, tcol], tl.reshape(acc.to(q.dtype), [1, TQ0, TQ1, TQ2, HEAD_PAD]))
    elif TMA == 1:
        o_desc = tl.make_tensor_descriptor(o_base, shape=[N0, N1, N2, HEAD_DIM], strides=[go0, go1, go2, 1],
                                           block_shape=[TQ0, TQ1, TQ2, HEAD_PAD])
        if live:
            o_desc.store([a0, a1, a2, 0], tl.reshape(acc.to(Out.dtype.element_ty), [TQ0, TQ1, TQ2, HEAD_PAD]))
    else:
        o_row = m0 * go0 + m1 * go1 + m2 * go2
        if HEAD_PAD != HEAD_DIM:
            tl.store(
                o_base + o_row[:, None] + offs_d[None, :],
                acc.to(Out.dtype.element_ty),
                mask=row_ok[:, None] & d_ok[None, :],
            )
        else:
            tl.store(o_base + o_row[:, None] + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _na_fwd_kernel(
    Q, K, V, Out,
    KNORM,  # [B * heads] fp32: the largest key norm of each (batch, head); read when SHIFT
    FLAGS,  # [programs] int32: set by a SHIFT launch for the programs it left to the REDO launch
    sqb, sqh, sq0, sq1, sq2,
    skb, skh, sk0, sk1, sk2,
    svb, svh, sv0, sv1, sv2,
    sob, soh, so0, so1, so2,
    L0, L1, L2,
    KS0, KS1, KS2,
    DIL0, DIL1, DIL2,
    n_heads,
    qk_scale,
    CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
    STRIDE0: tl.constexpr, STRIDE1: tl.constexpr, STRIDE2: tl.constexpr,
    TQ0: tl.constexpr, TQ1: tl.constexpr, TQ2: tl.constexpr,
    TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    # 0: pointer gathers; 1: TMA by 4-D descriptors made in-kernel over the program's dilation sub-grid;
    # 2: TMA by the launch's 5-D descriptors Q, K, V, Out over [batch, S0, S1, S2, heads * head_dim]
    TMA: tl.constexpr,
    SHIFT: tl.constexpr,  # shift by the Cauchy-Schwarz bound where it is tight enough (no row max)
    REDO: tl.constexpr,  # 0: every tile; 1 or 2: the tiles whose flag is this value (online, safe walk)
    SHIFT_MAX: tl.constexpr,
    POS_SCALE: tl.constexpr,  # scale > 0: the scale folds into the exponent's FMA after the mask
    WIDE: tl.constexpr,  # spans.wide: offsets past 2**31 elements, so index x stride in 64 bits
    REDO_CHUNK: tl.constexpr,  # REDO: tiles a program takes (1-D grid) where more than 1
    FLAT: tl.constexpr,  # a 1-D grid of one program a tile (the tile grid's second or third extent > 65535)
    n_programs,  # the tile grid's size (REDO_CHUNK > 1 or FLAT)
    grid_t, grid_bh,  # its first two extents
):
    if REDO_CHUNK > 1:
        # A REDO program per REDO_CHUNK tiles: one load of their flags and, where none is set, an exit.
        # 23040 one-tile programs exiting at once took 29 us of a DiffVAE stage-5 tile's call (H200).
        # Program p takes tiles p, p + P, p + 2P, ... (P programs): programs in flight together take
        # neighbouring tiles, whose key boxes overlap in L2, as one-tile programs do (with every tile
        # flagged, the 3-D small window's launch took 5.1-5.2 against 5.7 ms with consecutive tiles; H200).
        first = tl.program_id(0)
        step = tl.num_programs(0)
        offs = first + tl.arange(0, REDO_CHUNK) * step
        if tl.max((tl.load(FLAGS + offs, mask=offs < n_programs, other=0) == REDO).to(tl.int32), 0) == 0:
            return
        # Every tile of the chunk goes through the tile body, an unflagged one (or one past the grid)
        # walking zero blocks and storing nothing: one straight-line body, no branch around it.
        for i in range(REDO_CHUNK):
            tile = first + i * step
            flat_pid = tl.minimum(tile, n_programs - 1)
            flagged = (tile < n_programs) & (tl.load(FLAGS + flat_pid) == REDO)
            pid_t = flat_pid % grid_t
            pid_bh = (flat_pid // grid_t) % grid_bh
            pid_g = flat_pid // (grid_t * grid_bh)
            _na_tile(
                pid_t, pid_bh, pid_g, flat_pid, Q, K, V, Out, KNORM, FLAGS, sqb, sqh, sq0, sq1, sq2, skb,
                skh, sk0, sk1, sk2, svb, svh, sv0, sv1, sv2, sob, soh, so0, so1, so2, L0, L1, L2, KS0,
                KS1, KS2, DIL0, DIL1, DIL2, n_heads, qk_scale, CAUSAL0, CAUSAL1, CAUSAL2, STRIDE0,
                STRIDE1, STRIDE2, TQ0, TQ1, TQ2, TK0, TK1, TK2, HEAD_DIM, HEAD_PAD, TMA, SHIFT, REDO,
                SHIFT_MAX, POS_SCALE, WIDE, flagged)
    else:
        if FLAT:
            flat_pid = tl.program_id(0)
            pid_t = flat_pid % grid_t
            pid_bh = (flat_pid // grid_t) % grid_bh
            pid_g = flat_pid // (grid_t * grid_bh)
        else:
            pid_t = tl.program_id(0)
            pid_bh = tl.program_id(1)
            pid_g = tl.program_id(2)
            flat_pid = pid_t + tl.num_programs(0) * (pid_bh + tl.num_programs(1) * pid_g)
        if REDO:
            if tl.load(FLAGS + flat_pid) != REDO:
                return
        _na_tile(
            pid_t, pid_bh, pid_g, flat_pid, Q, K, V, Out, KNORM, FLAGS, sqb, sqh, sq0, sq1, sq2, skb, skh, sk0,
            sk1, sk2, svb, svh, sv0, sv1, sv2, sob, soh, so0, so1, so2, L0, L1, L2, KS0, KS1, KS2, DIL0, DIL1,
            DIL2, n_heads, qk_scale, CAUSAL0, CAUSAL1, CAUSAL2, STRIDE0, STRIDE1, STRIDE2, TQ0, TQ1, TQ2, TK0,
            TK1, TK2, HEAD_DIM, HEAD_PAD, TMA, SHIFT, REDO, SHIFT_MAX, POS_SCALE, WIDE)
