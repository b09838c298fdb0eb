"""Triton ``qk_norm_rope_3d``: per-head RMSNorm, query scale and 3-D axial RoPE of q and k in one pass,
bit-exact to ``xbackend.ops.qk_norm_rope_3d.reference`` on the same GPU.

The rows are the heads (``D = head_dim``); the norm is the q/k norm + RoPE kernel's
(``triton_qk_norm_rope.norm_rope_rows``: PyTorch's reduction order, eager's roundings, fp fusion off),
with the query's scale rounded where eager rounds it. The rotation is the interleaved one: diffusers'
``even * cos - odd * sin`` and ``even * sin + odd * cos`` are, bit for bit, ``even * cos + (-odd) *
sin`` and ``odd * cos + even * sin`` (negation is exact, IEEE addition commutes).

cos and sin come from a table built on the device by the reference's own expressions
(``axis_angles(...).cos()``, once per grid shape, cached): ``[T + H + W, D]`` fp32, row ``t`` holding
the T chunk's channels at frame t, row ``T + h`` the H chunk's, row ``T + H + w`` the W chunk's, each
angle repeated over its channel pair. The kernel picks a channel's row from the token's (t, h, w) and
the channel's chunk, so the table (a few KB, cache-resident) replaces a [tokens, D] cos/sin stream.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import is_fake

from xbackend.kernels._triton_launch import DirectLaunch
from xbackend.kernels.rmsnorm.numerics import Numerics
from xbackend.kernels.rmsnorm.schedules import DEFAULT_TRAITS, LaunchTraits, Schedule
from xbackend.kernels.rmsnorm.supports import NotVectorizable, alignment_reason, aten_order_applies
from xbackend.kernels.triton_qk_norm_rope import norm_rope_rows, pairs, row_tile

# Which inputs the kernel takes and its launch plans (no Triton: triton_qk_norm_rope_3d_plan).
from xbackend.kernels.triton_qk_norm_rope_3d_plan import _plan
from xbackend.kernels.triton_qk_norm_rope_3d_plan import supports as supports
from xbackend.ops.qk_norm_rope_3d import axis_angles, rope_dim_split


@triton.jit
def _div(x, m, s, a):
    """``x // d`` for ``0 <= x < 2**31`` where ``(m, s, a) = magic(d)``, as int32."""
    # s and a may arrive as constexprs (Triton specializes integer arguments equal to 1)
    x = x.to(tl.uint32)
    return ((tl.umulhi(x, m.to(tl.uint32)) + x * a) >> s).to(tl.int32)


@triton.jit
def _qk_norm_rope_3d_kernel(
    q_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr,
    M, stride_q, stride_k, T, H, W, m_heads, s_heads, a_heads, m_w, s_w, a_w, m_h, s_h, a_h, m_t, s_t, a_t,
    eps, factor, q_scale,
    D: tl.constexpr, DIM_T: tl.constexpr, DIM_TH: tl.constexpr, FLAVOUR: tl.constexpr, HAS_W: tl.constexpr,
    R: tl.constexpr, K: tl.constexpr, A: tl.constexpr, B: tl.constexpr, VEC_FORM: tl.constexpr,
    LANES: tl.constexpr, BW: tl.constexpr, Y: tl.constexpr, SHFL_ADJ: tl.constexpr, X_FIRST: tl.constexpr,
    RSQRT: tl.constexpr, FULL: tl.constexpr,
):  # fmt: skip
    _, rr, cols, cmask, mask = row_tile(M, D, R, K, A, B, FULL)
    # row = ((((b * T + t) * H + h) * W + w) * heads + head); the table row of channel c. Each division
    # by a runtime size is a multiply by its ``magic`` (host) and a shift: an integer division costs
    # about 20 instructions, and this kernel is issue-bound (ncu, H200: 78% of issue slots busy).
    tok = _div(rr, m_heads, s_heads, a_heads)
    tw = _div(tok, m_w, s_w, a_w)
    w = tok - tw * W
    th = _div(tw, m_h, s_h, a_h)
    h = tw - th * H
    t = th - _div(th, m_t, s_t, a_t) * T
    if DIM_T % B == 0 and DIM_TH % B == 0:
        # chunk boundaries between vectors: pick the row once per B-wide vector, not per element
        cvec = tl.arange(0, A)[:, None, None, None] * B + tl.arange(0, K)[None, None, :, None] * (A * B)
        trow = tl.where(cvec < DIM_T, t, tl.where(cvec < DIM_TH, T + h, T + H + w))
    else:
        trow = tl.where(cols < DIM_T, t, tl.where(cols < DIM_TH, T + h, T + H + w))
    f_off = trow * D + cols
    c1, c2 = pairs(tl.load(cos_ptr + f_off, mask=mask, other=0.0))
    s1, s2 = pairs(tl.load(sin_ptr + f_off, mask=mask, other=0.0))
    norm_rope_rows(q_ptr, wq_ptr, qo_ptr, stride_q, rr, cols, cmask, mask, c1, c2, s1, s2, eps, factor,
                   D, FLAVOUR, HAS_W, R, K, A, B, VEC_FORM, LANES, BW, Y, SHFL_ADJ, X_FIRST, RSQRT,
                   False, 1, 1, q_scale, True, True, True)  # fmt: skip
    norm_rope_rows(k_ptr, wk_ptr, ko_ptr, stride_k, rr, cols, cmask, mask, c1, c2, s1, s2, eps, factor,
                   D, FLAVOUR, HAS_W, R, K, A, B, VEC_FORM, LANES, BW, Y, SHFL_ADJ, X_FIRST, RSQRT,
                   False, 1, 1, q_scale, False, True, True)  # fmt: skip


_KERNEL = DirectLaunch(_qk_norm_rope_3d_kernel)


_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_MAX_TABLES = 64
_DEFAULT = Schedule()


def tables(lengths: tuple[int, int, int], head_dim: int, base: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[T + H + W, head_dim]`` fp32 cos and sin tables (module docstring), cached per grid (up to
    ``_MAX_TABLES`` grids; beyond that, built per call)."""
    key = (tuple(lengths), head_dim, float(base), device)
    found = _TABLES.get(key)
    if found is not None:
        return found
    # Each axis's rows hold its chunk's channels, zeros elsewhere; built by pad and cat (no in-place
    # fills: planning for a simulated device builds fake tensors, and a CPU build of torch cannot copy_
    # into fake CUDA ones)
    blocks: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    col = 0
    for n, dim in zip(lengths, rope_dim_split(head_dim), strict=True):
        angles = axis_angles(n, dim, base, device)
        for out, values in zip(blocks, (angles.cos(), angles.sin()), strict=True):
            out.append(F.pad(values.repeat_interleave(2, dim=-1), (col, head_dim - col - dim)))
        col += dim
    cos, sin = torch.cat(blocks[0]), torch.cat(blocks[1])
    # Cached only when built eagerly on a real device (under CUDA-graph capture the fill would only be
    # recorded; fake tensors plan for a simulated device), never evicted (another stream may still read
    # an old table), and complete before any other stream can find it: one synchronisation per grid.
    if is_fake(cos) or len(_TABLES) >= _MAX_TABLES:
        return cos, sin
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return cos, sin
        torch.cuda.current_stream(device).synchronize()
    _TABLES[key] = (cos, sin)
    return cos, sin


def qk_norm_rope_3d(q, k, q_weight, k_weight, eps=1e-6, q_scale=1.0, base=10000.0, flavour="torch", *,
                    numerics: Numerics, schedule: Schedule = _DEFAULT,
                    traits: LaunchTraits = DEFAULT_TRAITS) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The op's reference as one kernel. Raises ValueError where ``supports`` gives a reason,
    ``NotVectorizable`` for a misaligned torch-flavour call. ``traits.schedules`` (op kind
    ``qk_norm_rope_3d-<flavour>``) picks the launch where ``schedule`` sets neither rows nor warps."""
    plan = _plan(q, k, q_weight, k_weight, eps, q_scale, base, flavour, numerics, schedule, traits)
    if isinstance(plan, str):
        raise ValueError(f"triton qk_norm_rope_3d: {plan}")
    if plan.check_alignment and not (aten_order_applies(q, q_weight, flavour) and aten_order_applies(k, k_weight, flavour)):
        raise NotVectorizable(f"triton qk_norm_rope_3d: {alignment_reason(flavour)}")
    q_out = torch.empty_like(q, memory_format=torch.contiguous_format)
    k_out = torch.empty_like(k, memory_format=torch.contiguous_format)
    if plan.rows == 0:
        return q_out, k_out
    lengths = tuple(q.shape[1:4])
    cos, sin = tables(lengths, q.shape[5], base, q.device)
    eps32, factor, scale32, *consts = plan.consts
    wq = q_weight if q_weight is not None else q
    wk = k_weight if k_weight is not None else k
    _KERNEL(plan.grid, (q, k, wq, wk, cos, sin, q_out, k_out, plan.rows, plan.stride_q, plan.stride_k, *lengths,
                        *plan.divisors, eps32, factor, scale32, *consts), num_warps=plan.num_warps, enable_fp_fusion=False)  # fmt: skip
    return q_out, k_out


def qk_norm_rope_3d_with(numerics: Numerics, fallback: Callable[..., tuple[torch.Tensor, torch.Tensor]],
                         traits: LaunchTraits = DEFAULT_TRAITS):  # fmt: skip
    """``qk_norm_rope_3d`` for one fixed ``numerics`` (a backend's registered impl). A call whose pointers
    aten would not vectorize returns ``fallback(...)`` (the op's reference) for that call."""

    def qk_norm_rope_3d_fixed(q, k, q_weight, k_weight, eps, q_scale, base, flavour):
        try:
            return qk_norm_rope_3d(q, k, q_weight, k_weight, eps, q_scale, base, flavour, numerics=numerics,
                                   traits=traits)  # fmt: skip
        except NotVectorizable:
            return fallback(q, k, q_weight, k_weight, eps, q_scale, base, flavour)

    return qk_norm_rope_3d_fixed
