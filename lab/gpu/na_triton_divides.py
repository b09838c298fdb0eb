"""Comparison variant of xbackend/kernels/na_triton.py for lab/gpu/na_sweep.py and na_tma_shapes.py: the
package's kernel with the KV block coordinates divided out of the trip count every trip (three runtime
integer divides), the softmax scale as a separate multiply after the dot, no score-bound shift, and K
and V loaded together ahead of the q.k dot. Window rules, layout checks and the TMA scratch allocator
are the package's; launch configs are ``NAConfig`` (its ``shift`` is ignored). Not imported by the package.
"""

from __future__ import annotations

import contextvars
import functools
import math

import torch
import triton
import triton.language as tl

from xbackend.kernels.na_triton import _LOG2E, _as_3d, _launch_with_scratch, tma_layout_ok
from xbackend.kernels.na_triton_blocks import axis_ok as _axis_ok
from xbackend.kernels.na_triton_blocks import win_end as _win_end
from xbackend.kernels.na_triton_blocks import win_start as _win_start
from xbackend.kernels.na_triton_config import NAConfig, config_for, pad3


@triton.jit
def _na_fwd_kernel(
    Q, K, V, Out,
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
    TMA: tl.constexpr,  # tiles by TMA over the program's dilation sub-grid (descriptors made in-kernel)
):
    BLOCK_M: tl.constexpr = TQ0 * TQ1 * TQ2
    BLOCK_N: tl.constexpr = TK0 * TK1 * TK2
    pid_t = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_g = tl.program_id(2)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    g2 = pid_g % DIL2
    g1 = (pid_g // DIL2) % DIL1
    g0 = pid_g // (DIL1 * DIL2)
    # This dilation group's length along each axis.
    N0 = (L0 - g0 + DIL0 - 1) // DIL0
    N1 = (L1 - g1 + DIL1 - 1) // DIL1
    N2 = (L2 - g2 + DIL2 - 1) // DIL2
    nt1 = tl.cdiv(N1, TQ1)
    nt2 = tl.cdiv(N2, TQ2)
    # The grid is sized for group 0 (the longest); shorter groups have fewer tiles.
    if pid_t >= tl.cdiv(N0, TQ0) * nt1 * nt2:
        return
    t2 = pid_t % nt2
    t1 = (pid_t // nt2) % nt1
    t0 = pid_t // (nt1 * nt2)
    a0 = t0 * TQ0
    a1 = t1 * TQ1
    a2 = t2 * TQ2
    z0 = tl.minimum(a0 + TQ0, N0) - 1
    z1 = tl.minimum(a1 + TQ1, N1) - 1
    z2 = tl.minimum(a2 + TQ2, N2) - 1
    # Key box = union of the tile's windows.
    lo0 = _win_start(a0, N0, KS0, STRIDE0, CAUSAL0)
    lo1 = _win_start(a1, N1, KS1, STRIDE1, CAUSAL1)
    lo2 = _win_start(a2, N2, KS2, STRIDE2, CAUSAL2)
    hi0 = _win_end(z0, N0, KS0, STRIDE0, CAUSAL0)
    hi1 = _win_end(z1, N1, KS1, STRIDE1, CAUSAL1)
    hi2 = _win_end(z2, N2, KS2, STRIDE2, CAUSAL2)

    offs_m = tl.arange(0, BLOCK_M)
    m0 = a0 + offs_m // (TQ1 * TQ2)
    m1 = a1 + (offs_m // TQ2) % TQ1
    m2 = a2 + offs_m % TQ2
    row_ok = (m0 < N0) & (m1 < N1) & (m2 < N2)
    # Rows past the group's end stand in for its last query (finite softmax, store masked off).
    m0 = tl.minimum(m0, N0 - 1)
    m1 = tl.minimum(m1, N1 - 1)
    m2 = tl.minimum(m2, N2 - 1)
    qs0 = _win_start(m0, N0, KS0, STRIDE0, CAUSAL0)
    qs1 = _win_start(m1, N1, KS1, STRIDE1, CAUSAL1)
    qs2 = _win_start(m2, N2, KS2, STRIDE2, CAUSAL2)
    qe0 = _win_end(m0, N0, KS0, STRIDE0, CAUSAL0)
    qe1 = _win_end(m1, N1, KS1, STRIDE1, CAUSAL1)
    qe2 = _win_end(m2, N2, KS2, STRIDE2, CAUSAL2)

    # HEAD_PAD: HEAD_DIM rounded up to a power of two (block shapes must be). Where they differ, loads
    # fill the pad columns with zeros (they add nothing to q.k; p.v's pad columns are not stored).
    offs_d = tl.arange(0, HEAD_PAD)
    d_ok = offs_d < HEAD_DIM
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    q_base = Q + b64 * sqb + h64 * sqh + g0 * sq0 + g1 * sq1 + g2 * sq2
    k_base = K + b64 * skb + h64 * skh + g0 * sk0 + g1 * sk1 + g2 * sk2
    v_base = V + b64 * svb + h64 * svh + g0 * sv0 + g1 * sv1 + g2 * sv2
    o_base = Out + b64 * sob + h64 * soh + g0 * so0 + g1 * so1 + g2 * so2
    if TMA:
        # One descriptor per tensor over this program's sub-grid [N0, N1, N2, HEAD_DIM]: a box past the
        # group's end or past HEAD_DIM is zero-filled on load (those keys fail the window test, those
        # query rows and pad columns are clipped on store), so nothing is clamped or masked here.
        q_desc = tl.make_tensor_descriptor(q_base, shape=[N0, N1, N2, HEAD_DIM],
                                           strides=[DIL0 * sq0, DIL1 * sq1, DIL2 * sq2, 1],
                                           block_shape=[TQ0, TQ1, TQ2, HEAD_PAD])
        k_desc = tl.make_tensor_descriptor(k_base, shape=[N0, N1, N2, HEAD_DIM],
                                           strides=[DIL0 * sk0, DIL1 * sk1, DIL2 * sk2, 1],
                                           block_shape=[TK0, TK1, TK2, HEAD_PAD])
        v_desc = tl.make_tensor_descriptor(v_base, shape=[N0, N1, N2, HEAD_DIM],
                                           strides=[DIL0 * sv0, DIL1 * sv1, DIL2 * sv2, 1],
                                           block_shape=[TK0, TK1, TK2, HEAD_PAD])
        q = tl.reshape(q_desc.load([a0, a1, a2, 0]), [BLOCK_M, HEAD_PAD])
    else:
        q_row = m0 * (DIL0 * sq0) + m1 * (DIL1 * sq1) + m2 * (DIL2 * sq2)
        if HEAD_PAD != HEAD_DIM:
            q = tl.load(q_base + q_row[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
        else:
            q = tl.load(q_base + q_row[:, None] + offs_d[None, :])

    offs_n = tl.arange(0, BLOCK_N)
    n0 = offs_n // (TK1 * TK2)
    n1 = (offs_n // TK2) % TK1
    n2 = offs_n % TK2
    nb1 = tl.cdiv(hi1 - lo1, TK1)
    nb2 = tl.cdiv(hi2 - lo2, TK2)
    n_blocks = tl.cdiv(hi0 - lo0, TK0) * nb1 * nb2

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    for j in range(0, n_blocks):
        c0 = lo0 + (j // (nb1 * nb2)) * TK0
        c1 = lo1 + ((j // nb2) % nb1) * TK1
        c2 = lo2 + (j % nb2) * TK2
        k0 = c0 + n0
        k1 = c1 + n1
        k2 = c2 + n2
        if TMA:
            kb = tl.reshape(k_desc.load([c0, c1, c2, 0]), [BLOCK_N, HEAD_PAD])
            vb = tl.reshape(v_desc.load([c0, c1, c2, 0]), [BLOCK_N, HEAD_PAD])
        else:
            # Overhang keys are clamped into the box for the load; the window test rejects them.
            r0 = tl.minimum(k0, hi0 - 1)
            r1 = tl.minimum(k1, hi1 - 1)
            r2 = tl.minimum(k2, hi2 - 1)
            k_row = r0 * (DIL0 * sk0) + r1 * (DIL1 * sk1) + r2 * (DIL2 * sk2)
            v_row = r0 * (DIL0 * sv0) + r1 * (DIL1 * sv1) + r2 * (DIL2 * sv2)
            if HEAD_PAD != HEAD_DIM:
                kb = tl.load(k_base + k_row[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
                vb = tl.load(v_base + v_row[:, None] + offs_d[None, :], mask=d_ok[None, :], other=0.0)
            else:
                kb = tl.load(k_base + k_row[:, None] + offs_d[None, :])
                vb = tl.load(v_base + v_row[:, None] + offs_d[None, :])
        qk = tl.dot(q, tl.trans(kb)) * qk_scale
        ok = _axis_ok(c0, k0, qs0, qe0, KS0, TK0, CAUSAL0)
        ok = ok & _axis_ok(c1, k1, qs1, qe1, KS1, TK1, CAUSAL1)
        ok = ok & _axis_ok(c2, k2, qs2, qe2, KS2, TK2, CAUSAL2)
        qk = tl.where(ok, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
        m_i = m_new

    acc = acc / l_i[:, None]
    if TMA:
        o_desc = tl.make_tensor_descriptor(o_base, shape=[N0, N1, N2, HEAD_DIM],
                                           strides=[DIL0 * so0, DIL1 * so1, DIL2 * so2, 1],
                                           block_shape=[TQ0, TQ1, TQ2, HEAD_PAD])
        o_desc.store([a0, a1, a2, 0], tl.reshape(acc.to(Out.dtype.element_ty), [TQ0, TQ1, TQ2, HEAD_PAD]))
    else:
        o_row = m0 * (DIL0 * so0) + m1 * (DIL1 * so1) + m2 * (DIL2 * so2)
        if HEAD_PAD != HEAD_DIM:
            tl.store(
                o_base + o_row[:, None] + offs_d[None, :],
                acc.to(Out.dtype.element_ty),
                mask=row_ok[:, None] & d_ok[None, :],
            )
        else:
            tl.store(o_base + o_row[:, None] + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=row_ok[:, None])


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

    def strides(t: torch.Tensor) -> tuple[int, ...]:
        st = t.stride()
        return (st[0], st[4], st[1], st[2], st[3])

    tma = config.tma and tma_layout_ok(q3, k3, v3, o3)
    launch = functools.partial(
        _na_fwd_kernel[grid],
        q3, k3, v3, o3,
        *strides(q3), *strides(k3), *strides(v3), *strides(o3),
        s0, s1, s2,
        *ks,
        *dil,
        heads,
        float(scale) * _LOG2E,
        *causal,
        *st,
        *tq,
        *config.kv_tile,
        HEAD_DIM=head_dim,
        HEAD_PAD=triton.next_power_of_2(head_dim),
        TMA=tma,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        # Contraction to FMA on: the H200 numbers above were measured under Triton 3.6's default, which
        # is on; Triton 3.10 turns the default off. (A tolerance kernel: speed, not its contract.)
        enable_fp_fusion=True,
    )
    if tma and q.is_cuda:
        # In-kernel descriptors need global scratch, which Triton takes from its allocator: set in a
        # copy of this context, so the caller's allocator (or its absence) is left as it was.
        contextvars.copy_context().run(_launch_with_scratch, launch)
    else:
        launch()
    return out
