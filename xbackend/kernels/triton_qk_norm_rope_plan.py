"""Which inputs the Triton q/k RMSNorm + RoPE kernel takes and how it launches (the norm's tile and
schedule, cos/sin addressing, constexprs), decided from shapes, strides and dtypes alone. No Triton
here: ``supports`` answers where Triton cannot be imported (a CPU host planning a simulated GPU);
``triton_qk_norm_rope`` launches from the same plans.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from xbackend.kernels._grid import cdiv
from xbackend.kernels.rmsnorm.numerics import FLAVOURS, RSQRT_MATH, Numerics
from xbackend.kernels.rmsnorm.schedules import Schedule
from xbackend.kernels.rmsnorm.supports import DTYPES, exact_reason, interpreting, mean_checks_alignment
from xbackend.kernels.rmsnorm.tiles import bcast_layout, exact_schedule, f32, meta
from xbackend.kernels.spans import wide
from xbackend.kernels.triton_rotary_plan import _analyze_split, row_view


class _Plan(NamedTuple):
    grid: tuple[int]
    rows: int
    stride_q: int
    stride_k: int
    # cos/sin over q's rows: interleaved (inner, outer stride, inner stride, 0); split (tokens, batch
    # stride, head stride, token stride)
    f_layout: tuple[int, int, int, int]
    consts: tuple  # eps (fp32), factor, then the constexprs in signature order
    num_warps: int
    # torch flavour: aten vectorizes only 4-element aligned q, k and weights; diffusers, fp32 from D = 128:
    # aten's mean reduce reads q and k in place, in 16-byte vectors
    check_alignment: bool


_PLANS: dict[tuple, _Plan | str] = {}
_MAX_PLANS = 4096


def _analyze(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, num: Numerics,
             num_warps: int | None) -> _Plan | str:  # fmt: skip
    if k.shape != q.shape or k.dtype != q.dtype or k.device != q.device:
        return "q and k differ in shape, dtype or device"
    if (q_weight is None) != (k_weight is None):
        return "one of q_weight/k_weight is None"
    for x, w in ((q, q_weight), (k, k_weight)):
        reason = exact_reason(x, w, flavour, num, False)
        if reason:
            return reason
    if cos.dtype not in DTYPES or sin.dtype not in DTYPES:
        return "cos/sin dtype must be bf16/fp16/fp32"
    if cos.device != q.device or sin.device != q.device:
        return "cos/sin on another device"
    if cos.shape != sin.shape or cos.stride() != sin.stride() or cos.dtype != sin.dtype:
        return "cos and sin must share shape, strides and dtype"
    if q.shape[-1] % 2:
        return "D must be even (RoPE pairs)"
    sq, sk = row_view(q, q.shape), row_view(k, k.shape)
    if sq is None or sk is None:
        return "q/k rows are not one strided view with a contiguous last dim"
    d = q.shape[-1]
    m = q.numel() // max(d, 1)
    plan, factor, r, warps = exact_schedule(m, d, flavour, num, Schedule(num_warps=num_warps))
    if layout == "split":
        split = _analyze_split(q, cos)
        if isinstance(split, str):
            return split
        half = split.half
        # Both halves of a head must sit in one fold step, each half in whole vectors (module docstring).
        if not plan.vec_form or half % plan.b or (plan.a * plan.b) % (2 * half):
            return (f"split layout: heads of {2 * half} channels do not tile this norm's fold steps "
                    f"({plan.a} x {plan.b} channels)")  # fmt: skip
        f_layout = (split.t_len, split.cs_b, split.cs_h, split.cs_t)
        g, h2 = plan.a * plan.b // (2 * half), half // plan.b
    else:
        try:
            if torch.broadcast_shapes(cos.shape, q.shape) != q.shape:
                return "cos/sin broadcasting would grow q"
        except RuntimeError:
            return "cos/sin do not broadcast to q"
        f_lay = bcast_layout(cos, q.shape, copy=False)
        if f_lay is None or (q.shape[-1] > 1 and f_lay[4] != 1):
            return "cos/sin rows need more than two strides or a non-unit column stride"
        _, inner, s_outer, s_inner, _ = f_lay
        if plan.b % 2:
            return "tile vectors of odd width (D < 2)"
        f_layout, g, h2 = (inner, s_outer, s_inner, 0), 1, 1
    consts = (f32(eps), factor, d, FLAVOURS.index(flavour), q_weight is not None, r, plan.k, plan.a,
              plan.b, plan.vec_form, num.warp, plan.bw, plan.y, num.mean_shfl_increasing, num.mean_x_first,
              RSQRT_MATH if interpreting() else num.rsqrt, layout == "split", g, h2,
              layout == "split" and wide(cos, sin))  # fmt: skip
    return _Plan((cdiv(m, r),), m, sq.stride(0), sk.stride(0), f_layout, consts, warps,
                 flavour == "torch" or mean_checks_alignment(q))  # fmt: skip


def _plan(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, num, num_warps=None) -> _Plan | str:
    # Shapes, strides and dtypes fix the plan, so the analysis runs once per geometry.
    key = (q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
           None if q_weight is None else meta(q_weight), None if k_weight is None else meta(k_weight),
           cos.shape, cos.stride(), cos.dtype, cos.device, sin.shape, sin.stride(), sin.dtype, sin.device,
           eps, flavour, layout, num, num_warps)  # fmt: skip
    plan = _PLANS.get(key)
    if plan is None:
        plan = _analyze(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, num, num_warps)
        if len(_PLANS) < _MAX_PLANS:
            _PLANS[key] = plan
    return plan


def supports(
    q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, *, numerics: Numerics
) -> str | None:
    """Why the kernel cannot reproduce the reference on these inputs, or None (shapes only: answers for
    meta tensors; pointer alignment is checked per call). ``numerics``: the PyTorch build to reproduce."""
    plan = _plan(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, numerics)
    return plan if isinstance(plan, str) else None
