"""The KV-block walk of na_triton's kernel, as Triton device functions: the per-axis window rule, the
window test, the division-free walk over a tile's key box, block loads (TMA or pointers) and the two
softmax walks (online; shifted by a score bound). ``na_triton_config._window`` is ``win_start`` /
``win_end`` in Python.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["axis_ok", "box_walk", "group_base", "group_strides", "kv_loop", "leader", "load_block", "next_block",
           "non_finite", "safe_loop", "scores", "shifted_exponent", "tile_box", "win_end", "win_start", "window_ok"]


@triton.jit
def leader(m, n, S: tl.constexpr, CAUSAL: tl.constexpr):
    """The query whose window query ``m`` shares: queries ``[S*j, S*j + S)`` share their group's middle
    one (causal: its last one), clamped to the axis end. ``S == 1`` is ``m`` itself, folded at compile."""
    if S == 1:
        return m
    else:
        if CAUSAL:
            return tl.minimum((m // S) * S + (S - 1), n - 1)
        else:
            return tl.minimum((m // S) * S + S // 2, n - 1)


@triton.jit
def win_start(m, n, ks, S: tl.constexpr, CAUSAL: tl.constexpr):
    c = leader(m, n, S, CAUSAL)
    if CAUSAL:
        return tl.maximum(c - ks + 1, 0)
    else:
        return tl.minimum(tl.maximum(c - ks // 2, 0), n - ks)


@triton.jit
def win_end(m, n, ks, S: tl.constexpr, CAUSAL: tl.constexpr):
    if CAUSAL:
        # Causal: the leader's window, cut at the query itself (never past its own position).
        return m + 1
    else:
        c = leader(m, n, S, CAUSAL)
        return tl.minimum(tl.maximum(c - ks // 2, 0), n - ks) + ks


@triton.jit
def tile_box(pid_t, pid_g, L0, L1, L2, KS0, KS1, KS2, DIL0, DIL1, DIL2,
             CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
             STRIDE0: tl.constexpr, STRIDE1: tl.constexpr, STRIDE2: tl.constexpr,
             TQ0: tl.constexpr, TQ1: tl.constexpr, TQ2: tl.constexpr):
    """A program's Q tile and key box: its dilation group (g), the group's lengths (N), whether the
    tile exists in this group (``live``), the tile's first query (a) and the box ``[lo, hi)``, the
    union of the tile's windows. The grid is sized for group 0 (the longest); shorter groups have
    fewer tiles, whose programs walk zero KV blocks and store nothing."""
    g2 = pid_g % DIL2
    g1 = (pid_g // DIL2) % DIL1
    g0 = pid_g // (DIL1 * DIL2)
    N0 = (L0 - g0 + DIL0 - 1) // DIL0
    N1 = (L1 - g1 + DIL1 - 1) // DIL1
    N2 = (L2 - g2 + DIL2 - 1) // DIL2
    nt1 = tl.cdiv(N1, TQ1)
    nt2 = tl.cdiv(N2, TQ2)
    live = pid_t < tl.cdiv(N0, TQ0) * nt1 * nt2
    t2 = pid_t % nt2
    t1 = (pid_t // nt2) % nt1
    t0 = pid_t // (nt1 * nt2)
    a0 = t0 * TQ0
    a1 = t1 * TQ1
    a2 = t2 * TQ2
    z0 = tl.minimum(a0 + TQ0, N0) - 1
    z1 = tl.minimum(a1 + TQ1, N1) - 1
    z2 = tl.minimum(a2 + TQ2, N2) - 1
    lo0 = win_start(a0, N0, KS0, STRIDE0, CAUSAL0)
    lo1 = win_start(a1, N1, KS1, STRIDE1, CAUSAL1)
    lo2 = win_start(a2, N2, KS2, STRIDE2, CAUSAL2)
    hi0 = win_end(z0, N0, KS0, STRIDE0, CAUSAL0)
    hi1 = win_end(z1, N1, KS1, STRIDE1, CAUSAL1)
    hi2 = win_end(z2, N2, KS2, STRIDE2, CAUSAL2)
    return g0, g1, g2, N0, N1, N2, live, a0, a1, a2, lo0, lo1, lo2, hi0, hi1, hi2


@triton.jit
def group_base(ptr, b, h, g0, g1, g2, sb, sh, s0, s1, s2, WIDE: tl.constexpr = False):
    """``ptr`` moved to batch ``b``, head ``h`` and dilation group (g0, g1, g2): the origin of a
    program's sub-grid (64-bit offsets: a tensor may pass 2**31 bytes). ``WIDE`` (``spans.wide``): the
    group offsets too, which pass 2**31 elements only where a view's span does."""
    if WIDE:
        return (ptr + b.to(tl.int64) * sb + h.to(tl.int64) * sh + tl.cast(g0, tl.int64) * s0
                + tl.cast(g1, tl.int64) * s1 + tl.cast(g2, tl.int64) * s2)
    else:
        return ptr + b.to(tl.int64) * sb + h.to(tl.int64) * sh + g0 * s0 + g1 * s1 + g2 * s2


@triton.jit
def group_strides(d0, d1, d2, s0, s1, s2, WIDE: tl.constexpr):
    """A dilation group's strides, dilation times stride per axis: 64-bit with ``WIDE``, so a row index
    times one of them is 64-bit too (``spans``: 32-bit products wrap past 2**31 - 1)."""
    if WIDE:
        return tl.cast(d0, tl.int64) * s0, tl.cast(d1, tl.int64) * s1, tl.cast(d2, tl.int64) * s2
    else:
        return d0 * s0, d1 * s1, d2 * s2


@triton.jit
def box_walk(lo0, lo1, lo2, hi0, hi1, hi2, live, TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr):
    """The box walk's length in KV blocks (0 for a tile that is not live) and the ends of its two
    inner axes rounded up to whole blocks (``next_block``'s wrap points)."""
    nb1 = tl.cdiv(hi1 - lo1, TK1)
    nb2 = tl.cdiv(hi2 - lo2, TK2)
    n_blocks = tl.where(live, tl.cdiv(hi0 - lo0, TK0) * nb1 * nb2, 0)
    return n_blocks, lo1 + nb1 * TK1, lo2 + nb2 * TK2


@triton.jit
def axis_ok(c, kv, qs, qe, ks, KV_EXTENT: tl.constexpr, CAUSAL: tl.constexpr):
    """Keys inside [qs, qe) per query row along one axis. c: the block's first coordinate (scalar),
    kv: per-key coordinates [N]. Gives [M, 1] when the block is 1 wide on this axis (one compare
    per row instead of per element), else [M, N]. Unsigned wrap folds both bounds into one compare.
    """
    if KV_EXTENT == 1:
        d = (c - qs)[:, None]
    else:
        d = kv[None, :] - qs[:, None]
    if CAUSAL:
        w = (qe - qs)[:, None]
    else:
        w = ks
    return d.to(tl.uint32, bitcast=True) < w.to(tl.uint32, bitcast=True)


@triton.jit
def next_block(c0, c1, c2, lo1, lo2, end1, end2, TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr):
    """The KV block after the one at (c0, c1, c2) in the box walk (axis 2 fastest): carried counters
    instead of dividing the trip count (three runtime integer divides cost about 50 instructions a
    trip in SASS, a tenth of the loop)."""
    wrap2 = c2 + TK2 >= end2
    s1 = tl.where(wrap2, c1 + TK1, c1)
    wrap1 = s1 >= end1
    return tl.where(wrap1, c0 + TK0, c0), tl.where(wrap1, lo1, s1), tl.where(wrap2, lo2, c2 + TK2)


@triton.jit
def load_block(desc, base, c0, c1, c2, n0, n1, n2, hi0, hi1, hi2, s0, s1, s2, offs_d,
                HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
                tb=0, tcol=0):
    """The [BLOCK_N, HEAD_PAD] K or V block whose first key is (c0, c1, c2). ``TMA``: 0 pointer
    gathers, 1 a 4-D descriptor over the program's sub-grid, 2 the launch's 5-D descriptor over
    ``[batch, S0, S1, S2, heads * head_dim]`` (batch ``tb``, the head's first column ``tcol``)."""
    if TMA == 2:
        return tl.reshape(desc.load([tb, c0, c1, c2, tcol]), [BLOCK_N, HEAD_PAD])
    elif TMA == 1:
        return tl.reshape(desc.load([c0, c1, c2, 0]), [BLOCK_N, HEAD_PAD])
    else:
        # Overhang keys are clamped into the box for the load; the window test rejects them.
        row = (tl.minimum(c0 + n0, hi0 - 1) * s0 + tl.minimum(c1 + n1, hi1 - 1) * s1
               + tl.minimum(c2 + n2, hi2 - 1) * s2)
        if HEAD_PAD != HEAD_DIM:
            return tl.load(base + row[:, None] + offs_d[None, :], mask=(offs_d < HEAD_DIM)[None, :], other=0.0)
        else:
            return tl.load(base + row[:, None] + offs_d[None, :])


@triton.jit
def scores(q, c0, c1, c2, k_desc, v_desc, k_base, v_base, n0, n1, n2, hi0, hi1, hi2, ks0, ks1, ks2, vs0, vs1, vs2,
            offs_d, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
            TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr,
            CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
            qk_scale, HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
            POS_SCALE: tl.constexpr, tb=0, tcol=0):
    """q.k of the KV block at (c0, c1, c2), -inf outside each query's window, and the block's V. With
    ``POS_SCALE`` (scale > 0) the scores are left unscaled for the caller's exponent FMA to scale (a
    masked -inf stays -inf); otherwise they are scaled before the mask (-inf * 0 would be NaN, and a
    negative scale would turn it into +inf)."""
    # K and V of a block are loaded together, ahead of the first dot (measured on the H200 with
    # Triton 3.6: V's TMA load placed after the q.k dot gave wrong results for square
    # BLOCK_N x HEAD_PAD blocks, 64 x 64 and 128 x 128; lab/gpu/na_tma_shapes.py).
    kb = load_block(k_desc, k_base, c0, c1, c2, n0, n1, n2, hi0, hi1, hi2, ks0, ks1, ks2, offs_d,
                    HEAD_DIM, HEAD_PAD, BLOCK_N, TMA, tb, tcol)
    vb = load_block(v_desc, v_base, c0, c1, c2, n0, n1, n2, hi0, hi1, hi2, vs0, vs1, vs2, offs_d,
                    HEAD_DIM, HEAD_PAD, BLOCK_N, TMA, tb, tcol)
    qk = tl.dot(q, tl.trans(kb))
    ok = axis_ok(c0, c0 + n0, qs0, qe0, KS0, TK0, CAUSAL0)
    ok = ok & axis_ok(c1, c1 + n1, qs1, qe1, KS1, TK1, CAUSAL1)
    ok = ok & axis_ok(c2, c2 + n2, qs2, qe2, KS2, TK2, CAUSAL2)
    if POS_SCALE:
        return tl.where(ok, qk, float("-inf")), vb
    else:
        return tl.where(ok, qk * qk_scale, float("-inf")), vb


@triton.jit
def shifted_exponent(qk, fold, neg_m, c0, c1, c2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
                     TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr,
                     CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr):
    """The shift walk's exponent ``qk * fold - m``, -inf outside each query's window, for unmasked
    scores ``qk`` (scale > 0). The window tests of axis 2 and of every axis the block is 1 wide on
    pick the FMA's addend (``-m`` or -inf): a thread's accumulator columns hold few distinct axis-2
    offsets, so those selects are per row and offset, not per element; only the tests of axes 0 and 1
    where the block is wider select per element. In the window the value is the FMA the masked form
    computes (bit for bit); outside it is -inf either way."""
    ok_add = axis_ok(c2, c2 + n2, qs2, qe2, KS2, TK2, CAUSAL2)
    if TK0 == 1:
        ok_add = ok_add & axis_ok(c0, c0 + n0, qs0, qe0, KS0, TK0, CAUSAL0)
    if TK1 == 1:
        ok_add = ok_add & axis_ok(c1, c1 + n1, qs1, qe1, KS1, TK1, CAUSAL1)
    x = qk * fold + tl.where(ok_add, neg_m[:, None], float("-inf"))
    if TK0 > 1:
        if TK1 > 1:
            x = tl.where(axis_ok(c0, c0 + n0, qs0, qe0, KS0, TK0, CAUSAL0)
                         & axis_ok(c1, c1 + n1, qs1, qe1, KS1, TK1, CAUSAL1), x, float("-inf"))
        else:
            x = tl.where(axis_ok(c0, c0 + n0, qs0, qe0, KS0, TK0, CAUSAL0), x, float("-inf"))
    elif TK1 > 1:
        x = tl.where(axis_ok(c1, c1 + n1, qs1, qe1, KS1, TK1, CAUSAL1), x, float("-inf"))
    return x


@triton.jit
def kv_loop(q, acc, l_i, m_i, n_blocks, qk_scale, lo0, lo1, lo2, end1, end2,
            k_desc, v_desc, k_base, v_base, n0, n1, n2, hi0, hi1, hi2, ks0, ks1, ks2, vs0, vs1, vs2,
            offs_d, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
            TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr,
            CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
            HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
            POS_SCALE: tl.constexpr, FIXED: tl.constexpr, tb=0, tcol=0):
    """The walk over the tile's KV blocks. Online softmax (running row max, accumulator rescaled when
    it grows), or with ``FIXED`` a per-row shift ``m_i`` known to bound every score of the row: no row
    max, no rescale (the kernel's ``SHIFT`` launch). Scores and ``m_i`` are in log2 units (the scale
    includes log2(e))."""
    if POS_SCALE:
        fold = qk_scale  # scores arrive unscaled: the scale rides in the exponent's FMA
    else:
        fold = 1.0  # scores arrive scaled (see ``scores``)
    c0 = lo0
    c1 = lo1
    c2 = lo2
    for _ in range(0, n_blocks):
        if FIXED:
            if POS_SCALE:
                kb = load_block(k_desc, k_base, c0, c1, c2, n0, n1, n2, hi0, hi1, hi2, ks0, ks1, ks2, offs_d,
                                HEAD_DIM, HEAD_PAD, BLOCK_N, TMA, tb, tcol)
                vb = load_block(v_desc, v_base, c0, c1, c2, n0, n1, n2, hi0, hi1, hi2, vs0, vs1, vs2, offs_d,
                                HEAD_DIM, HEAD_PAD, BLOCK_N, TMA, tb, tcol)
                p = tl.math.exp2(shifted_exponent(tl.dot(q, tl.trans(kb)), fold, -m_i, c0, c1, c2, n0, n1, n2,
                                                  qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2, TK0, TK1, TK2,
                                                  CAUSAL0, CAUSAL1, CAUSAL2))
            else:
                qk, vb = scores(q, c0, c1, c2, k_desc, v_desc, k_base, v_base, n0, n1, n2, hi0, hi1, hi2,
                                ks0, ks1, ks2, vs0, vs1, vs2, offs_d, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
                                TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, qk_scale, HEAD_DIM, HEAD_PAD, BLOCK_N,
                                TMA, POS_SCALE, tb, tcol)
                p = tl.math.exp2(qk * fold - m_i[:, None])
            l_i = l_i + tl.sum(p, 1)
            acc = acc + tl.dot(p.to(vb.dtype), vb)
        else:
            qk, vb = scores(q, c0, c1, c2, k_desc, v_desc, k_base, v_base, n0, n1, n2, hi0, hi1, hi2,
                            ks0, ks1, ks2, vs0, vs1, vs2, offs_d, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
                            TK0, TK1, TK2, CAUSAL0, CAUSAL1, CAUSAL2, qk_scale, HEAD_DIM, HEAD_PAD, BLOCK_N, TMA,
                            POS_SCALE, tb, tcol)
            m_new = tl.maximum(m_i, tl.max(qk, 1) * fold)
            p = tl.math.exp2(qk * fold - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
            m_i = m_new
        c0, c1, c2 = next_block(c0, c1, c2, lo1, lo2, end1, end2, TK0, TK1, TK2)
    return acc, l_i


@triton.jit
def window_ok(c0, c1, c2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
              TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr,
              CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr):
    """[M, N]: key n of the block at (c0, c1, c2) lies in query row m's window."""
    ok = axis_ok(c0, c0 + n0, qs0, qe0, KS0, TK0, CAUSAL0)
    ok = ok & axis_ok(c1, c1 + n1, qs1, qe1, KS1, TK1, CAUSAL1)
    ok = ok & axis_ok(c2, c2 + n2, qs2, qe2, KS2, TK2, CAUSAL2)
    return ok


@triton.jit
def non_finite(acc):
    """[M]: the rows of an [M, D] accumulator that hold an inf or a NaN, by each row's sum (inf and NaN
    survive it; the threads of a row reduce by shuffles, no shared memory). A finite row whose sum
    overflows counts too: its tile is redone, at no harm."""
    total = tl.sum(acc, 1)
    return (total != total) | (tl.abs(total) == float("inf"))


@triton.jit
def safe_loop(q, n_blocks, qk_scale, lo0, lo1, lo2, end1, end2, k_base, v_base, n0, n1, n2, hi0, hi1, hi2,
              ks0, ks1, ks2, vs0, vs1, vs2, offs_d, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2,
              TK0: tl.constexpr, TK1: tl.constexpr, TK2: tl.constexpr,
              CAUSAL0: tl.constexpr, CAUSAL1: tl.constexpr, CAUSAL2: tl.constexpr,
              HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The tile's attention where its fast walk met an inf or a NaN: p.v over V with its non-finite
    values zeroed, so a key outside a row's window (p = 0) adds exact zeros, and the non-finite values
    of keys inside it restored by 0/1 products, as the reference's sum over the window has them:
    NaN from a NaN value or from an infinite one whose probability is 0 (0 * inf), +inf from +inf with
    p > 0, -inf likewise, NaN from both. Two passes over the key box (pointer loads): the row max and sum
    of the scores (online), then probabilities shifted by the max. Whether a key's probability is 0 is
    decided as the fp32 reference's softmax rounds it, 2**y / l < 2**-150 with y its shifted score and l
    the row's sum, not by this walk's exp2 (the GPU's flushes results below 2**-126 to 0, 24 binades
    earlier). Returns (acc / l plus the restored non-finite values)."""
    c0 = lo0
    c1 = lo1
    c2 = lo2
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    for _ in range(0, n_blocks):
        kb = load_block(k_base, k_base, c0, c1, c2, n0, n1, n2, hi0, hi1, hi2, ks0, ks1, ks2, offs_d,
                        HEAD_DIM, HEAD_PAD, BLOCK_N, 0)
        ok = window_ok(c0, c1, c2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2, TK0, TK1, TK2,
                       CAUSAL0, CAUSAL1, CAUSAL2)
        s = tl.where(ok, tl.dot(q, tl.trans(kb)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # -inf - -inf is NaN: a row with no finite score yet keeps a zero sum.
        alpha = tl.where(m_new == float("-inf"), 0.0, tl.math.exp2(m_i - m_new))
        e = tl.where(s == float("-inf"), 0.0, tl.math.exp2(s - m_new[:, None]))
        l_1 = l_1 * alpha + tl.sum(e, 1)
        m_i = m_new
        c0, c1, c2 = next_block(c0, c1, c2, lo1, lo2, end1, end2, TK0, TK1, TK2)
    floor = tl.log2(l_1) - 150.0  # shifted scores below it: probability 0 in the fp32 reference
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    # Per column, counts of in-window keys bringing +inf or NaN (up), -inf or NaN (down). Only "> 0" is
    # read, which fp16 counts keep (non-negative terms: rounding or overflow to inf never gives 0), in
    # half the registers of fp32 ones: the walk then does not spill at head_dim 128 (sm90).
    up = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float16)
    down = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float16)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    c0 = lo0
    c1 = lo1
    c2 = lo2
    for _ in range(0, n_blocks):
        kb = load_block(k_base, k_base, c0, c1, c2, n0, n1, n2, hi0, hi1, hi2, ks0, ks1, ks2, offs_d,
                        HEAD_DIM, HEAD_PAD, BLOCK_N, 0)
        vb = load_block(v_base, v_base, c0, c1, c2, n0, n1, n2, hi0, hi1, hi2, vs0, vs1, vs2, offs_d,
                        HEAD_DIM, HEAD_PAD, BLOCK_N, 0)
        ok = window_ok(c0, c1, c2, n0, n1, n2, qs0, qs1, qs2, qe0, qe1, qe2, KS0, KS1, KS2, TK0, TK1, TK2,
                       CAUSAL0, CAUSAL1, CAUSAL2)
        s = tl.where(ok, tl.dot(q, tl.trans(kb)) * qk_scale, float("-inf"))
        y = s - m_i[:, None]
        p = tl.math.exp2(y)
        l_i = l_i + tl.sum(p, 1)
        nan_v = vb != vb
        bad = nan_v | (tl.abs(vb) == float("inf"))
        acc = tl.dot(p.to(vb.dtype), tl.where(bad, 0.0, vb).to(vb.dtype), acc)
        # 0/1 products (exact counts in fp32): which in-window keys bring which non-finite value.
        live = ok & (y >= floor[:, None])
        kept = live.to(tl.float16)
        lost = (ok & (live == 0)).to(tl.float16)  # in the window, probability 0: 0 * inf or 0 * NaN is NaN
        bad01 = bad.to(tl.float16)
        up = tl.dot(kept, ((vb == float("inf")) | nan_v).to(tl.float16), up, out_dtype=tl.float16)
        up = tl.dot(lost, bad01, up, out_dtype=tl.float16)
        down = tl.dot(kept, ((vb == float("-inf")) | nan_v).to(tl.float16), down, out_dtype=tl.float16)
        down = tl.dot(lost, bad01, down, out_dtype=tl.float16)
        c0, c1, c2 = next_block(c0, c1, c2, lo1, lo2, end1, end2, TK0, TK1, TK2)
    # The finite part plus the restored value: IEEE addition gives NaN for NaN, +inf + -inf or a NaN
    # row (a NaN score), and the infinity itself over a finite sum.
    special = tl.where((up > 0) & (down > 0), float("nan"),
                       tl.where(up > 0, float("inf"), tl.where(down > 0, float("-inf"), 0.0)))
    return acc / l_i[:, None] + special
