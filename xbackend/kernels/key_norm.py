"""The largest key norm of each (batch, head): the Cauchy-Schwarz factor of na_triton's score-bound shift.

One pass over k (read once, bf16/fp16/fp32, any strides with a contiguous last dim): each program
takes ``BLOCK_T`` tokens of one (batch, head), sums the squares of each row in fp32, and folds the
largest row norm into its (batch, head)'s slot with an atomic max. A non-finite row (inf or NaN)
counts as +inf, so every tile of that head fails the shift's bound and takes the online walk, which
gives the reference's inf/NaN semantics.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["max_key_norm"]

# Tokens a program: 128 reads the keys at 3.0-3.7 TB/s on the H200's large shapes (3-D video 189 µs
# for 708 MB, 3.7x torch's vector_norm + amax; 64 and 256 measured 2-6% slower there, 32 up to 30%;
# lab/gpu/key_norm_bench.py).
BLOCK_T = 128
# CUDA's grid: 2**31 - 1 programs along its first axis, 65535 along its second; more (batch x heads)
# take a 1-D grid.
GRID_Y_MAX = 65535


@triton.jit
def _max_key_norm_kernel(K, OUT, n_heads, S1, S2, n_tok, skb, sk0, sk1, sk2, skh,
                         HEAD_DIM: tl.constexpr, HEAD_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                         FLAT: tl.constexpr = False, n_t=1):
    if FLAT:  # a 1-D grid: batch x heads past the grid's second-axis limit (65535)
        pid_t = tl.program_id(0) % n_t
        pid_bh = tl.program_id(0) // n_t
    else:
        pid_t = tl.program_id(0)
        pid_bh = tl.program_id(1)
    b = pid_bh // n_heads
    h = pid_bh % n_heads
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < n_tok
    t2 = t % S2
    t1 = (t // S2) % S1
    t0 = t // (S1 * S2)
    row = t0.to(tl.int64) * sk0 + t1.to(tl.int64) * sk1 + t2.to(tl.int64) * sk2
    d = tl.arange(0, HEAD_PAD)
    base = K + b.to(tl.int64) * skb + h.to(tl.int64) * skh
    x = tl.load(base + row[:, None] + d[None, :], mask=t_ok[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    x = x.to(tl.float32)
    ss = tl.sum(x * x, 1)
    # NaN != NaN: a row holding NaN counts as +inf (as does one holding inf, whose square is inf).
    ss = tl.where(ss == ss, ss, float("inf"))
    # Within a few ulp of the true largest norm (fp32 sums in another order than torch's, sqrt.approx):
    # the shift needs a bound to keep exp2 from overflowing, which 2**-20 of slack cannot touch.
    tl.atomic_max(OUT + pid_bh, tl.sqrt(tl.max(ss, 0)))


def max_key_norm(k3: torch.Tensor) -> torch.Tensor:
    """fp32 ``[B * heads]``: the largest L2 norm over the key rows of each (batch, head) of ``k3``
    ``[B, S0, S1, S2, heads, head_dim]`` (+inf where a row is not finite)."""
    if k3.dim() != 6 or not k3.is_floating_point() or k3.shape[-1] == 0 or (k3.shape[-1] > 1 and k3.stride(-1) != 1):
        raise ValueError("max_key_norm: k3 expected a [B, S0, S1, S2, heads, head_dim] floating tensor with head_dim "
                         f">= 1 and a contiguous last dim, got {k3.dtype} {tuple(k3.shape)} strides {k3.stride()}")
    batch, s0, s1, s2, heads, head_dim = k3.shape
    out = torch.zeros(batch * heads, dtype=torch.float32, device=k3.device)
    n_tok = s0 * s1 * s2
    if n_tok == 0 or out.numel() == 0:
        return out
    st = k3.stride()
    n_t = triton.cdiv(n_tok, BLOCK_T)
    flat = batch * heads > GRID_Y_MAX
    grid = (n_t * batch * heads,) if flat else (n_t, batch * heads)
    _max_key_norm_kernel[grid](k3, out, heads, s1, s2, n_tok, st[0], st[1], st[2], st[3], st[4],
                               HEAD_DIM=head_dim, HEAD_PAD=triton.next_power_of_2(head_dim), BLOCK_T=BLOCK_T,
                               FLAT=flat, n_t=n_t,
                               # Pinned, as the attention launches it serves pin theirs: the sums' last bits
                               # (and so the shift) do not move with Triton's default (on in 3.6, where this
                               # was measured; off from 3.10).
                               enable_fp_fusion=True)
    return out
