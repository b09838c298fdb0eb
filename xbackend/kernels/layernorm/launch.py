"""Planning and launching the exact LayerNorm kernel: one plan per input metadata, alignment per call.

A ``Launcher`` holds one ``LayerNormNumerics``. Called with the op's tensors it looks up the plan fixed
by their shapes, strides and dtypes (grid, constexprs, operand layouts), re-checks the pointer
alignment aten's vectorized path depends on (``NotVectorizable`` where aten would run its two-pass
kernels), and launches through ``_triton_launch.DirectLaunch``. What it decides by itself is about the
host: under Triton's interpreter the reciprocal square root is ``tl.math.rsqrt`` and ``1/count`` the
IEEE reciprocal (inline assembly cannot run there).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from xbackend.kernels._triton_launch import DirectLaunch
from xbackend.kernels.layernorm.exact import ExactConstexprs, _layernorm_exact_kernel
from xbackend.kernels.layernorm.numerics import RCP_IEEE, VEC, LayerNormNumerics
from xbackend.kernels.layernorm.supports import (
    ALIGN_REASON,
    NotVectorizable,
    misaligned,
    read_in_place,
    supports_add_layernorm,
    supports_layernorm_modulate,
)
from xbackend.kernels.rmsnorm.numerics import RSQRT_MATH
from xbackend.kernels.rmsnorm.supports import interpreting
from xbackend.kernels.rmsnorm.tiles import bcast_layout, f32, last_pow2, meta
from xbackend.kernels.spans import wide

MAX_PLANS = 4096  # launch plans kept per launcher (distinct input metadata)
TILE_ELEMENTS = 4096  # narrow rows are batched until a program's tile holds about this many elements
MAX_ROWS = 16
# One Triton lane per emulated thread: warps = threads / the vendor's warp (4 for CUDA's 128 threads, 16
# wave64s for ROCm's 1024). With two emulated threads per lane (8 wave64s) the same gfx950 kernel took
# 256 VGPRs and spilled; one per lane, 25 (xbackend fleet --compile, Triton 3.9).
MAX_WARPS = 16
NO_ROWS = (1, 0, 0)  # (inner, outer stride, inner stride) of an absent index
NO_OPERAND = (1, 0, 0, 0, 0)  # (inner, outer stride, inner stride, column stride, table stride) of an absent operand

_KERNEL = DirectLaunch(_layernorm_exact_kernel)


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """x as [M, D] rows with unit column stride (a view when possible)."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


def tile(d: int, num: LayerNormNumerics) -> tuple[int, int, int]:
    """(K, A, B): aten's block of ``num.threads`` threads, each reading up to ceil(D/4 / threads)
    4-vectors (every thread is kept: merging an empty one is not always a no-op)."""
    return -(-(d // VEC) // num.threads), num.threads, VEC


def _operand_layout(t: torch.Tensor, x: torch.Tensor, index: torch.Tensor | None) -> tuple[int, ...] | None:
    """How the kernel addresses t for every row: (inner, outer, inner stride, column, table stride), or
    None where t must be copied per call (a broadcast with more than two row groups)."""
    if index is not None:  # a [2, B, D] table: row (b, l) reads t[sel, b]
        return (x.shape[1], t.stride(1), 0, t.stride(2), t.stride(0))
    te, *lay = bcast_layout(t, x.shape)
    return (*lay, 0) if te.data_ptr() == t.data_ptr() else None


def _operand(t: torch.Tensor | None, lay: tuple[int, ...] | None, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
    if t is None:
        return x, NO_OPERAND
    if lay is not None:
        return t, lay
    te, *copied = bcast_layout(t, x.shape)
    return te, (*copied, 0)


class LaunchPlan(NamedTuple):
    """Everything about one launch that follows from the inputs' metadata."""

    grid: tuple[int]
    m: int
    rows_view: bool  # x's rows are evenly strided: pass x itself; else copy (rows_of)
    stride_xm: int
    update_view: bool
    stride_um: int
    idx_l: tuple[int, int, int]
    sc_l: tuple[int, ...] | None
    sh_l: tuple[int, ...] | None
    g_l: tuple[int, ...] | None
    eps: float
    consts: ExactConstexprs
    options: dict
    check_x: bool  # aten reads x itself: its pointer's alignment decides aten's path
    check_w: bool
    check_b: bool


def plan(num: LayerNormNumerics, x: torch.Tensor, update: torch.Tensor | None, gate: torch.Tensor | None,
         weight: torch.Tensor | None, bias: torch.Tensor | None, scale: torch.Tensor | None,
         shift: torch.Tensor | None, index: torch.Tensor | None, eps: float, flavour: str,
         store_stat: bool) -> LaunchPlan:  # fmt: skip
    """The launch for inputs with these shapes, strides and dtypes; ValueError if unsupported. With
    ``update`` the kernel normalizes the residual sum. ``index`` selects the gate's table too; the
    caller passes it for scale and shift only when they exist."""
    if update is None:
        reason = supports_layernorm_modulate(x, scale, shift, weight, bias, eps, flavour, index, numerics=num,
                                             alignment=False)  # fmt: skip
    else:
        reason = supports_add_layernorm(x, update, gate, weight, bias, eps, flavour, scale, shift, index,
                                        numerics=num, alignment=False)  # fmt: skip
    if reason:
        raise ValueError(f"triton layernorm exact: {reason}")
    d = x.shape[-1]
    m = x.numel() // max(d, 1)
    x2 = rows_of(x)
    u2 = rows_of(update) if update is not None else x2
    k, a, b = tile(max(d, VEC), num)
    rows = max(1, min(MAX_ROWS, last_pow2(max(1, TILE_ELEMENTS // (k * a * b)))))  # per-step tile: [rows, a, b]
    table = index is not None and (scale is not None or gate is not None)
    idx_l = (x.shape[1], index.stride(0), index.stride(1)) if table else NO_ROWS
    lay = {}
    for name, t in (("sc", scale), ("sh", shift), ("g", gate)):
        lay[name] = _operand_layout(t, x, index if table else None) if t is not None else NO_OPERAND
    consts = ExactConstexprs(
        D=d,
        R=rows,
        K=k,
        A=a,
        B=b,
        LANES=num.warp,
        FP32_OUT=flavour == "fp32",
        HAS_W=weight is not None,
        HAS_B=bias is not None,
        MODULATE=scale is not None,
        INDEX=table,
        RESIDUAL=update is not None,
        GATE=gate is not None,
        STORE_STAT=store_stat,
        RSQRT=RSQRT_MATH if interpreting() else num.rsqrt,  # inline PTX cannot run in the interpreter
        RECIP=RCP_IEEE if interpreting() else num.recip,
        # rows are 64-bit; scale, shift and gate also multiply a column by their column stride
        WIDE=wide(scale, shift, gate),
    )
    return LaunchPlan(
        grid=(triton.cdiv(m, rows),),
        m=m,
        rows_view=x2.data_ptr() == x.data_ptr() or x.numel() == 0,
        stride_xm=x2.stride(0),
        update_view=update is None or u2.data_ptr() == update.data_ptr() or update.numel() == 0,
        stride_um=u2.stride(0),
        idx_l=idx_l,
        sc_l=lay["sc"],
        sh_l=lay["sh"],
        g_l=lay["g"],
        eps=f32(eps),
        consts=consts,
        options={"num_warps": max(1, min(MAX_WARPS, a // num.warp)), "enable_fp_fusion": False},
        check_x=update is None and read_in_place(x, flavour),
        check_w=weight is not None and read_in_place(weight, flavour),
        check_b=bias is not None and read_in_place(bias, flavour),
    )


class Launcher:
    """``launcher(x, update, gate, weight, bias, scale, shift, index, eps, flavour, stats)`` -> the output,
    or ``(h, output)`` with an update. ``stats``: two float32 [M] tensors that receive each row's mean and
    rstd. Raises ValueError for inputs the kernel does not take and ``NotVectorizable`` for a call whose
    pointers aten would not vectorize."""

    __slots__ = ("numerics", "plans")

    def __init__(self, numerics: LayerNormNumerics) -> None:
        self.numerics = numerics
        self.plans: dict[tuple, LaunchPlan] = {}

    def __call__(
        self,
        x: torch.Tensor,
        update: torch.Tensor | None,
        gate: torch.Tensor | None,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        scale: torch.Tensor | None,
        shift: torch.Tensor | None,
        index: torch.Tensor | None,
        eps: float,
        flavour: str,
        stats: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        key = (meta(x), meta(update), meta(gate), meta(weight), meta(bias), meta(scale), meta(shift), meta(index),
               eps, flavour, stats is None)  # fmt: skip
        lp = self.plans.get(key)
        if lp is None:
            lp = plan(self.numerics, x, update, gate, weight, bias, scale, shift, index, eps, flavour,
                      stats is not None)  # fmt: skip
            if len(self.plans) < MAX_PLANS:
                self.plans[key] = lp
        if (lp.check_x and misaligned(x, flavour)) or (lp.check_w and misaligned(weight, flavour)) or (
            lp.check_b and misaligned(bias, flavour)
        ):
            raise NotVectorizable(f"triton layernorm exact: {ALIGN_REASON}")
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        h = torch.empty_like(x, memory_format=torch.contiguous_format) if update is not None else out
        result = (h, out) if update is not None else out
        if lp.m == 0 or x.shape[-1] == 0:
            return result
        xr = x if lp.rows_view else rows_of(x)
        u = xr
        if update is not None:
            u = update if lp.update_view else rows_of(update)
        sc, sc_l = _operand(scale, lp.sc_l, x)
        sh, sh_l = _operand(shift, lp.sh_l, x)
        g, g_l = _operand(gate, lp.g_l, x)
        mean, rstd = stats if stats is not None else (out, out)
        args = (xr, u, g, weight if weight is not None else xr, bias if bias is not None else xr, sc, sh,
                index if lp.consts.INDEX else xr, out, h, mean, rstd, lp.m, lp.stride_xm, lp.stride_um, *lp.idx_l,
                *sc_l, *sh_l, *g_l, lp.eps, *lp.consts)  # fmt: skip
        _KERNEL(lp.grid, args, **lp.options)
        return result


@functools.lru_cache(maxsize=16)
def launcher(numerics: LayerNormNumerics) -> Launcher:
    """The process's one ``Launcher`` for ``numerics`` (its plans and compiled kernels are shared)."""
    return Launcher(numerics)


__all__ = ["LaunchPlan", "Launcher", "launcher", "plan", "rows_of", "tile"]
