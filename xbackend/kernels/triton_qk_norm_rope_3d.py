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
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import is_fake

from xbackend.kernels._triton_launch import DirectLaunch
from xbackend.kernels.rmsnorm.exact import f32
from xbackend.kernels.rmsnorm.launch import DEFAULT_TRAITS, LaunchTraits, Schedule, exact_schedule, meta, table_schedule
from xbackend.kernels.rmsnorm.numerics import FLAVOURS, RSQRT_MATH, Numerics
from xbackend.kernels.rmsnorm.supports import (
    NotVectorizable,
    alignment_reason,
    aten_order_applies,
    exact_reason,
    interpreting,
    mean_checks_alignment,
)
from xbackend.kernels.triton_qk_norm_rope import norm_rope_rows, pairs, row_tile
from xbackend.kernels.triton_rotary import row_view
from xbackend.ops.qk_norm_rope_3d import axis_angles, rope_dim_split


@triton.jit
def _div(x, m, s, a):
    """``x // d`` for ``0 <= x < 2**31`` where ``(m, s, a) = magic(d)``, as int32."""
    # s and a may arrive as constexprs (Triton specializes integer arguments equal to 1)
    x = x.to(tl.uint32)
    return ((tl.umulhi(x, m.to(tl.uint32)) + x * a) >> s).to(tl.int32)


def magic(d: int) -> tuple[int, int, int]:
    """``(m, s, a)`` with ``x // d == (umulhi(x, m) + a*x) >> s`` for every ``0 <= x < 2**31`` (``umulhi``:
    the high 32 bits of the 64-bit product). ``d == 1``: ``(0, 0, 1)``. Otherwise ``l = ceil(log2 d)``, ``m =
    ceil(2**(31 + l) / d)`` (below 2**32), ``s = l - 1``, ``a = 0``: with ``e = m*d - 2**(31 + l) < d``,
    ``x*m / 2**(31 + l) = x/d + x*e / (d * 2**(31 + l))``, whose second term is below ``2**-l <= 1/d``, so
    the floor is ``x // d``."""
    if d == 1:
        return 0, 0, 1
    lg = (d - 1).bit_length()
    return -(-(1 << (31 + lg)) // d), lg - 1, 0


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


class _Plan(NamedTuple):
    grid: tuple[int]
    rows: int
    stride_q: int
    stride_k: int
    divisors: tuple[int, ...]  # magic(heads), magic(W), magic(H), magic(T), flattened: the kernel's divisors
    consts: tuple  # eps (fp32), factor, then the constexprs in signature order
    num_warps: int
    # torch flavour: aten vectorizes only 4-element aligned q, k and weights; diffusers, fp32 from D = 128:
    # aten's mean reduce reads q and k in place, in 16-byte vectors
    check_alignment: bool


_PLANS: dict[tuple, _Plan | str] = {}
_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_MAX_PLANS = 4096
_MAX_TABLES = 64
_DEFAULT = Schedule()


def _analyze(q, k, q_weight, k_weight, eps, q_scale, base, flavour, num: Numerics, schedule: Schedule) -> _Plan | str:
    if q.dim() != 6 or k.shape != q.shape or k.dtype != q.dtype or k.device != q.device:
        return "q and k must be one [B, T, H, W, heads, head_dim] shape, dtype and device"
    if (q_weight is None) != (k_weight is None):
        return "one of q_weight/k_weight is None"
    d = q.shape[-1]
    if d == 0 or d % 8:
        return "head_dim must be a positive multiple of 8"
    for x, wt in ((q, q_weight), (k, k_weight)):
        reason = exact_reason(x, wt, flavour, num, False)
        if reason:
            return reason
    sq, sk = row_view(q, q.shape), row_view(k, k.shape)
    if sq is None or sk is None:
        return "q/k head rows are not one strided view with a contiguous last dim"
    m = q.numel() // d
    if m >= 2**31:
        return "2**31 or more head rows (the kernel's row arithmetic is 32-bit)"
    plan, factor, r, warps = exact_schedule(m, d, flavour, num, schedule)
    if plan.b % 2:
        return "tile vectors of odd width"
    dim_t, dim_h, _ = rope_dim_split(d)
    consts = (f32(eps), factor, f32(q_scale), d, dim_t, dim_t + dim_h, FLAVOURS.index(flavour), q_weight is not None,
              r, plan.k, plan.a, plan.b, plan.vec_form, num.warp, plan.bw, plan.y, num.mean_shfl_increasing,
              num.mean_x_first, RSQRT_MATH if interpreting() else num.rsqrt,
              m % r == 0 and plan.k * plan.a * plan.b == d)  # fmt: skip
    # An empty grid launches nothing (the launch returns first): any divisor serves its plan.
    divisors = tuple(v for size in (q.shape[4], q.shape[3], q.shape[2], q.shape[1]) for v in magic(max(size, 1)))
    return _Plan((triton.cdiv(m, r),), m, sq.stride(0), sk.stride(0), divisors, consts, warps,
                 flavour == "torch" or mean_checks_alignment(q))


def _plan(q, k, q_weight, k_weight, eps, q_scale, base, flavour, num, schedule, traits=DEFAULT_TRAITS) -> _Plan | str:
    # Shapes, strides and dtypes fix the plan, so the analysis runs once per geometry.
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
           None if q_weight is None else meta(q_weight), None if k_weight is None else meta(k_weight),
           eps, q_scale, flavour, num, schedule, traits)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        schedule = table_schedule(traits.schedules, f"qk_norm_rope_3d-{flavour}", q.shape[-1], q.element_size(), schedule)
        plan = _analyze(q, k, q_weight, k_weight, eps, q_scale, base, flavour, num, schedule)
        if len(_PLANS) < _MAX_PLANS:
            _PLANS[key] = plan
    return plan


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


def supports(q, k, q_weight, k_weight, eps, q_scale, base, flavour, *, numerics: Numerics) -> str | None:
    """Why the kernel cannot reproduce the reference on these inputs, or None (shapes only; pointer
    alignment is checked per call). ``numerics``: the PyTorch build to reproduce."""
    plan = _plan(q, k, q_weight, k_weight, eps, q_scale, base, flavour, numerics, Schedule())
    return plan if isinstance(plan, str) else None


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
