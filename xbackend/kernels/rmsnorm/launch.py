"""Planning and launching the RMSNorm kernels: schedules, vendor launch traits, the per-call fast path.

A ``Launcher`` is one kernel variant (``Variant``: exact or fast, the ``Numerics`` to reproduce, the
vendor's ``LaunchTraits``, a ``Schedule``). Called with the op's tensors, it looks up the launch plan
fixed by their metadata (grid, constexprs, options, operand layouts; planned once per metadata key),
re-checks the pointer alignment aten's vectorized path depends on, and launches: through Triton the
first time for each pointer-alignment class, then through the compiled launcher directly
(``_triton_launch.launch_compiled``), which skips ``JITFunction.run``'s per-call work.

Vendor decisions arrive as data (``backends/<vendor>/launch.py`` builds the records): the numerics,
from which compute capability the device has programmatic dependent launch, and tuned schedules (a
``schedule_table`` keyed by op kind, D range and element size, consulted where the caller sets no rows
or warps). What this module decides by itself is about the host: under Triton's interpreter the
reciprocal square root is ``tl.math.rsqrt`` (inline PTX cannot run there) and there is no PDL.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from xbackend.kernels import _triton_launch
from xbackend.kernels._triton_launch import direct_capable, hooked, launch_compiled
from xbackend.kernels.rmsnorm.exact import COL_STRIDE, ExactConstexprs, _rmsnorm_exact_kernel, gdc_wait
from xbackend.kernels.rmsnorm.fast import FastConstexprs, _rmsnorm_fast_kernel
from xbackend.kernels.rmsnorm.numerics import FLAVOURS, RSQRT_MATH, TORCH_VEC
from xbackend.kernels.rmsnorm.schedules import (
    DEFAULT_TRAITS,
    OPS,
    LaunchTraits,
    Schedule,
    ScheduleEntry,
    Variant,
    op_kind,
    schedule_table,
    table_schedule,
    tuned_schedule,
)
from xbackend.kernels.rmsnorm.supports import (
    ALIGN_REASON,
    MEAN_ALIGN_REASON,
    NotVectorizable,
    exact_reason,
    interpreting,
    mean_checks_alignment,
    supports_rmsnorm_fast,
)
from xbackend.kernels.rmsnorm.tiles import (
    ExactSchedule,
    bcast_layout,
    default_arrangement,
    default_fast_warps,
    default_rows,
    exact_schedule,
    f32,
    meta,
    next_pow2,
)
from xbackend.kernels.spans import wide

MAX_PLANS = 4096  # launch plans kept per launcher (distinct input metadata)
NO_BCAST = (1, 0, 0, 0)  # (inner, outer stride, inner stride, column stride) of an absent operand


# --------------------------------------------------------------------------------------------------
# Operands
# --------------------------------------------------------------------------------------------------


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x as [M, D] rows with unit column stride (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


def _contiguous_layout(t: torch.Tensor, shape: torch.Size) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    te, *lay = bcast_layout(t, shape)
    return te, tuple(lay)


# --------------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _pdl_capable(device_index: int, min_major: int) -> bool:
    """The device has griddepcontrol (compute capability major >= min_major) and this Triton emits it."""
    return gdc_wait is not None and torch.cuda.get_device_capability(device_index)[0] >= min_major


def use_pdl(x: torch.Tensor, traits: LaunchTraits) -> bool:
    if traits.pdl_min_major is None or not x.is_cuda or interpreting():
        return False
    return _pdl_capable(x.get_device(), traits.pdl_min_major)


# --------------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------------


class LaunchPlan(NamedTuple):
    """Everything about one launch that follows from the inputs' metadata (cached per metadata key)."""

    exact: bool
    grid: tuple[int]
    m: int
    rows_view: bool  # x's rows are evenly strided: pass x itself with stride_xm; else copy (rows_of)
    stride_xm: int
    update_view: bool  # the same for update (residual plans; True otherwise)
    stride_um: int
    sc_l: tuple[int, int, int, int] | None  # scale layout; None: recompute per call (needs a copy)
    sh_l: tuple[int, int, int, int] | None
    scalars: tuple[float, float]  # eps in fp32, then the statistic's factor (exact) or 1 / D (fast)
    consts: ExactConstexprs | FastConstexprs
    options: dict
    align: int  # bytes x (and the torch flavour's weight) must be aligned to for aten's vectorized order
    check_x: bool
    check_w: bool
    align_reason: str
    kernels: dict  # (device, pointer alignments) -> the kernel Triton compiled for them


def plan(
    v: Variant,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
    flavour: str,
    store_stat: bool,
    update: torch.Tensor | None = None,
) -> LaunchPlan:
    """The launch of ``v`` for inputs with these shapes, strides and dtypes; ValueError if unsupported.
    With ``update`` the kernel normalizes ``x + update`` (exact variant only)."""
    if v.exact:
        reason = exact_reason(x, weight, flavour, v.numerics, False, layout=update is None)
    else:
        reason = supports_rmsnorm_fast(x, weight, eps, flavour)
        if update is not None:
            reason = reason or "the residual add runs on the exact kernel only"
    if update is not None and (update.shape != x.shape or update.dtype != x.dtype or update.device != x.device):
        reason = reason or "update's shape, dtype or device differs from x"
    if reason:
        raise ValueError(f"triton rmsnorm {'exact' if v.exact else 'fast'}: {reason}")
    d = x.shape[-1]
    m = x.numel() // max(d, 1)
    x2 = rows_of(x)
    rows_view = x2.data_ptr() == x.data_ptr() or x.numel() == 0
    u2 = rows_of(update) if update is not None else x2
    update_view = update is None or u2.data_ptr() == update.data_ptr() or update.numel() == 0
    sc_l = sh_l = NO_BCAST
    if scale is not None and shift is not None:
        sc, *sc_l = bcast_layout(scale, x.shape)
        sh, *sh_l = bcast_layout(shift, x.shape)
        sc_l = tuple(sc_l) if sc.data_ptr() == scale.data_ptr() else None
        sh_l = tuple(sh_l) if sh.data_ptr() == shift.data_ptr() else None
    # The interpreter cannot run inline PTX: a host fact, whatever the numerics' build calls.
    rsqrt = RSQRT_MATH if interpreting() else v.numerics.rsqrt
    wide_cols = wide(scale, shift)  # rows are 64-bit in both kernels; scale/shift also form column x stride
    align = check_x = check_w = 0
    pdl = False
    if v.exact:
        kind = op_kind(flavour, scale is not None)
        schedule = table_schedule(v.traits.schedules, kind, d, x.element_size(), v.schedule)
        tile, factor, r, warps = exact_schedule(m, d, flavour, v.numerics, schedule)
        if flavour == "torch":
            align = TORCH_VEC * x.element_size()
            # aten vectorizes on the pointer it normalizes: with a residual that is the fresh sum
            check_x = x.is_contiguous() and update is None
            check_w = weight is not None and weight.is_contiguous()
        elif update is None and mean_checks_alignment(x):
            align, check_x = 16, True
        arrangement = schedule.arrangement
        if arrangement is None:
            arrangement = default_arrangement(flavour, tile, r, scale is not None)
        pdl = use_pdl(x, v.traits)
        # row-invariant scale and shift (no stride over rows), read in place: the flat load applies
        flat = bool(schedule.flat_mod) and all(lay is not None and lay[1:3] == (0, 0) for lay in (sc_l, sh_l))
        scalars = (f32(eps), factor)
        consts: ExactConstexprs | FastConstexprs = ExactConstexprs(
            D=d,
            FLAVOUR=FLAVOURS.index(flavour),
            HAS_W=weight is not None,
            MODULATE=scale is not None,
            STORE_STAT=store_stat,
            R=r,
            K=tile.k,
            A=tile.a,
            B=tile.b,
            VEC_FORM=tile.vec_form,
            ARR=int(arrangement),
            LANES=v.numerics.warp,
            BW=tile.bw,
            Y=tile.y,
            SHFL_ADJ=v.numerics.mean_shfl_increasing,
            X_FIRST=v.numerics.mean_x_first,
            RSQRT=rsqrt,
            PDL=pdl,
            MOD_FLAT=flat and scale is not None,
            RESIDUAL=update is not None,
            WIDE=wide_cols,
        )
    else:
        block_d = next_pow2(d)
        r = v.schedule.rows_per_program or default_rows(block_d)
        warps = v.schedule.num_warps or default_fast_warps(r * block_d)
        scalars = (f32(eps), f32(1.0 / d))
        consts = FastConstexprs(
            D=d,
            FLAVOUR=FLAVOURS.index(flavour),
            HAS_W=weight is not None,
            MODULATE=scale is not None,
            R=r,
            BLOCK_D=block_d,
            RSQRT=rsqrt,
            WIDE=wide_cols,
        )
    return LaunchPlan(
        exact=v.exact,
        grid=(triton.cdiv(m, r),),
        m=m,
        rows_view=rows_view,
        stride_xm=x2.stride(0) if x2.dim() == 2 else d,
        update_view=update_view,
        stride_um=u2.stride(0) if u2.dim() == 2 else d,
        sc_l=sc_l,
        sh_l=sh_l,
        scalars=scalars,
        consts=consts,
        options={"num_warps": warps, "enable_fp_fusion": False, **({"launch_pdl": True} if pdl else {})},
        align=align,
        check_x=bool(check_x),
        check_w=bool(check_w),
        align_reason=ALIGN_REASON if flavour == "torch" else MEAN_ALIGN_REASON,
        kernels={},
    )


# False under the interpreter; tests flip it to time or check Triton's own launch path.
_DIRECT = direct_capable(_rmsnorm_exact_kernel)


class Launcher:
    """Launches one ``Variant``: ``launcher(x, weight, scale, shift, eps, flavour, stat)`` -> output.

    ``stat`` (exact only): a float32 [M] tensor that receives each row's rstd ("torch") or mean of
    squares ("diffusers"). ``update`` (exact only): normalize ``x + update`` instead, and return
    ``(x + update, output)``. Raises ValueError for inputs the variant does not support and
    ``NotVectorizable`` for a torch-flavour call whose pointers aten would not vectorize."""

    __slots__ = ("plans", "variant")

    def __init__(self, variant: Variant) -> None:
        self.variant = variant
        self.plans: dict[tuple, LaunchPlan] = {}

    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor | None,
        scale: torch.Tensor | None,
        shift: torch.Tensor | None,
        eps: float,
        flavour: str,
        stat: torch.Tensor | None = None,
        update: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # The plan depends on metadata only; the pointer alignments aten checks are re-read per call.
        key = (
            x.shape,
            x.stride(),
            x.dtype,
            x.device,
            weight is None or meta(weight),
            scale is None or meta(scale),
            shift is None or meta(shift),
            eps,
            flavour,
            stat is None,
            update is None or meta(update),
        )
        lp = self.plans.get(key)
        if lp is None:
            lp = plan(self.variant, x, weight, scale, shift, eps, flavour, stat is not None, update)
            if len(self.plans) < MAX_PLANS:
                self.plans[key] = lp
        if lp.align and ((lp.check_x and x.data_ptr() % lp.align) or (lp.check_w and weight.data_ptr() % lp.align)):
            raise NotVectorizable(f"triton rmsnorm exact: {lp.align_reason}")
        out = torch.empty_like(x, memory_format=torch.contiguous_format)  # a third of torch.empty's host cost
        if update is not None:
            h = torch.empty_like(x, memory_format=torch.contiguous_format)
            result: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = (h, out)
        else:
            result = out
        if lp.m == 0 or x.shape[-1] == 0:
            return result
        xr = x if lp.rows_view else rows_of(x)
        sc = sh = xr
        sc_l = sh_l = NO_BCAST
        if scale is not None and shift is not None:
            sc, sc_l = (scale, lp.sc_l) if lp.sc_l is not None else _contiguous_layout(scale, x.shape)
            sh, sh_l = (shift, lp.sh_l) if lp.sh_l is not None else _contiguous_layout(shift, x.shape)
        w = weight if weight is not None else xr
        if lp.exact:
            if update is not None:
                u = update if lp.update_view else rows_of(update)
            else:
                u, h = xr, out  # unread: RESIDUAL is off
            ptrs: tuple = (xr, w, sc, sh, out, stat if stat is not None else out, u, h)
            tail = (lp.m, lp.stride_xm, COL_STRIDE, lp.stride_um, *sc_l, *sh_l, *lp.scalars, *lp.consts)
            fn = _rmsnorm_exact_kernel
        else:
            ptrs = (xr, w, sc, sh, out)
            tail = (lp.m, lp.stride_xm, *sc_l, *sh_l, *lp.scalars, *lp.consts)
            fn = _rmsnorm_fast_kernel
        if not _DIRECT:  # the interpreter
            fn[lp.grid](*ptrs, *tail, **lp.options)
            return result
        device = xr.get_device()
        if device < 0:  # not a GPU tensor: Triton's own path gives its own error
            fn[lp.grid](*ptrs, *tail, **lp.options)
            return result
        if device != _triton_launch._current_device():  # Triton launches on the current device: go to the data
            with torch.cuda.device(device):
                fn[lp.grid](*ptrs, *tail, **lp.options)
            return result
        ints = tuple([t.data_ptr() for t in ptrs])
        # Triton specialises pointers on 16-byte alignment; everything else in the key is fixed by lp.
        kkey = (device, *[p & 15 == 0 for p in ints])
        kernel = lp.kernels.get(kkey)
        if kernel is None or hooked():
            kernel = fn[lp.grid](*ptrs, *tail, **lp.options)
            if kernel is not None:
                lp.kernels[kkey] = kernel
        else:
            launch_compiled(kernel, lp.grid, device, (*ints, *tail))
        return result


@functools.lru_cache(maxsize=256)
def launcher(variant: Variant) -> Launcher:
    """The process's one ``Launcher`` for ``variant`` (its plans and compiled kernels are shared)."""
    return Launcher(variant)


__all__ = [
    "DEFAULT_TRAITS",
    "NO_BCAST",
    "OPS",
    "ExactSchedule",
    "LaunchPlan",
    "LaunchTraits",
    "Launcher",
    "Schedule",
    "ScheduleEntry",
    "Variant",
    "bcast_layout",
    "default_arrangement",
    "default_rows",
    "exact_schedule",
    "launcher",
    "meta",
    "op_kind",
    "plan",
    "rows_of",
    "schedule_table",
    "table_schedule",
    "tuned_schedule",
    "use_pdl",
]
