"""Which inputs the Triton ``qk_norm_rope_3d`` kernel takes and how it launches (the norm's tile and
schedule, the row divisors, constexprs), decided from shapes, strides and dtypes alone. No Triton
here: ``supports`` answers where Triton cannot be imported (a CPU host planning a simulated GPU);
``triton_qk_norm_rope_3d`` launches from the same plans.
"""

from __future__ import annotations

from typing import NamedTuple

from xbackend.kernels._grid import cdiv
from xbackend.kernels.rmsnorm.numerics import FLAVOURS, RSQRT_MATH, Numerics
from xbackend.kernels.rmsnorm.schedules import DEFAULT_TRAITS, Schedule, table_schedule
from xbackend.kernels.rmsnorm.supports import exact_reason, interpreting, mean_checks_alignment
from xbackend.kernels.rmsnorm.tiles import exact_schedule, f32, meta
from xbackend.kernels.triton_rotary_plan import row_view
from xbackend.ops.qk_norm_rope_3d import rope_dim_split


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
_MAX_PLANS = 4096


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
    return _Plan((cdiv(m, r),), m, sq.stride(0), sk.stride(0), divisors, consts, warps,
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


def supports(q, k, q_weight, k_weight, eps, q_scale, base, flavour, *, numerics: Numerics) -> str | None:
    """Why the kernel cannot reproduce the reference on these inputs, or None (shapes only; pointer
    alignment is checked per call). ``numerics``: the PyTorch build to reproduce."""
    plan = _plan(q, k, q_weight, k_weight, eps, q_scale, base, flavour, numerics, Schedule())
    return plan if isinstance(plan, str) else None
