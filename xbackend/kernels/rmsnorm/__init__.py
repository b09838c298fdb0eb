"""Triton RMSNorm and RMSNorm + adaLN modulate, bit-exact to eager PyTorch (see docs/exactness.md).

Two reference flavours (docs/exactness.md derives both from the aten sources):

* ``"torch"``: ``F.rms_norm`` -> aten ``_fused_rms_norm`` -> the vectorized LayerNorm kernel with
  ``rms_norm=true``. One block of ``torch_threads`` threads per row; thread ``t`` reads 4-element
  vectors ``t, t + threads, ...`` and folds ``acc = fma(x, x, acc)`` over them in order; a halving
  shuffle tree over the lanes of each warp, a halving tree over the warps; ``sum / float(D)`` (IEEE
  division), ``rsqrtf(. + eps)``; output ``round(w * (rstd * x))``.
* ``"diffusers"``: ``x.float().pow(2).mean(-1)`` -> aten's ``Reduce.cuh`` (``MeanOps``): per-thread
  accumulators (4 vector lanes, or ``vt0 = 4`` strided ones when D < 128), combined in order, then a
  block-x tree (shared memory above a warp, then shuffles), an optional block-y tree, then
  ``sum * factor``; ``x * rsqrtf(v + eps)`` in fp32, rounded to the weight dtype, times the weight.

Every floating-point step is spelled out (``tl.fma`` where nvcc contracts, ``tl.div_rn`` where CUDA
divides, ``rsqrt.approx.f32`` where CUDA calls ``rsqrtf``) and the kernels are compiled with
``enable_fp_fusion=False`` so LLVM cannot contract anything PyTorch rounds separately.

Modules: ``numerics`` (which build's order: the porting surface, data only), ``primitives`` (the
Triton fold/tree/rsqrt/normalize helpers other kernels reuse), ``exact`` and ``fast`` (the kernels),
``tiles`` (the tiles they load and the default schedule, plain Python), ``supports`` (which inputs
each kernel takes), ``schedules`` (schedules and vendor launch traits, data), ``launch`` (the cached
per-call path). Only ``exact``, ``fast``, ``primitives`` and ``launch`` import Triton. The entry points
below take the ``Numerics`` to reproduce explicitly; a vendor backend binds its own with
``rmsnorm_with`` and friends.

``add_rmsnorm`` runs the same exact kernel on ``x + update`` (rounded as eager's add rounds it) and
also writes that sum.

``rmsnorm_fast`` / ``rmsnorm_modulate_fast`` use one ``tl.sum`` of squares instead, for inputs the
exact kernels reject: ulp-bounded, not bit-exact (``fast``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from xbackend.kernels.rmsnorm.numerics import (
    ARR_ARKB,
    ARR_MERGED,
    CUDA_NUMERICS,
    CUDA_WARP,
    FLAVOURS,
    ROCM_NUMERICS,
    ROCM_WAVEFRONT,
    RSQRT_MATH,
    RSQRT_PTX,
    Numerics,
    Verification,
)
from xbackend.kernels.rmsnorm.schedules import (
    DEFAULT_TRAITS,
    OPS,
    LaunchTraits,
    Schedule,
    ScheduleEntry,
    Variant,
    schedule_table,
)
from xbackend.kernels.rmsnorm.supports import (
    NotVectorizable,
    supports_add_rmsnorm,
    supports_rmsnorm,
    supports_rmsnorm_fast,
    supports_rmsnorm_fast_diffusers,
    supports_rmsnorm_fast_torch,
    supports_rmsnorm_modulate,
    supports_rmsnorm_modulate_fast,
)

_DEFAULT = Schedule()
# The modules that define or launch kernels import Triton; this package and its supports_* do not, so
# an impl's supports() answers where Triton is missing (a CPU host planning a simulated GPU).
_TRITON_MODULES = ("exact", "fast", "launch", "primitives")


def __getattr__(name: str) -> Any:
    if name in _TRITON_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def launcher(variant: Variant) -> Any:
    """``launch.launcher(variant)``, the launch module (and Triton) imported on the first call."""
    from xbackend.kernels.rmsnorm.launch import launcher as launch_launcher

    return launch_launcher(variant)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics,
    schedule: Schedule = _DEFAULT,
    traits: LaunchTraits = DEFAULT_TRAITS,
) -> torch.Tensor:
    """RMSNorm bit-exact to the ``flavour`` reference of the PyTorch build ``numerics`` describes.

    ``schedule`` lays the launch out (default: short rows batched to ~4096 tile elements, one row per
    program from D = 1024, 4 warps per 128 emulated threads); ``traits`` are a vendor's launch
    decisions (PDL, tuned schedules). Raises ValueError where ``supports_rmsnorm`` gives a reason and
    ``NotVectorizable`` for a torch-flavour call whose pointers aten would not vectorize.
    """
    return launcher(Variant(True, numerics, traits, schedule))(x, weight, None, None, eps, flavour)


def rmsnorm_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics,
    schedule: Schedule = _DEFAULT,
    traits: LaunchTraits = DEFAULT_TRAITS,
) -> torch.Tensor:
    """``rmsnorm(x) * (1 + scale) + shift`` in one kernel, every step rounded like eager."""
    return launcher(Variant(True, numerics, traits, schedule))(x, weight, scale, shift, eps, flavour)


def add_rmsnorm(
    x: torch.Tensor,
    update: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    *,
    numerics: Numerics,
    schedule: Schedule = _DEFAULT,
    traits: LaunchTraits = DEFAULT_TRAITS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, rmsnorm(h))`` with ``h = x + update``, modulated when scale and shift are given; one kernel
    reads x and update once and writes both outputs. The schedule is the plain (or modulate) norm's."""
    return launcher(Variant(True, numerics, traits, schedule))(x, weight, scale, shift, eps, flavour, None, update)


def rmsnorm_stats(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics,
    schedule: Schedule = _DEFAULT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, per-row statistic): rstd for "torch", mean of squares for "diffusers" (diagnostics)."""
    m = x.numel() // max(x.shape[-1], 1)
    stat = torch.empty(m, dtype=torch.float32, device=x.device)
    out = launcher(Variant(True, numerics, DEFAULT_TRAITS, schedule))(x, weight, None, None, eps, flavour, stat)
    return out, stat


def rmsnorm_fast(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics,
    schedule: Schedule = _DEFAULT,
) -> torch.Tensor:
    """RMSNorm with one tree-summed reduction: same roundings as the flavour, not bit-exact. Of
    ``numerics`` only the reciprocal square root is used."""
    return launcher(Variant(False, numerics, DEFAULT_TRAITS, schedule))(x, weight, None, None, eps, flavour)


def rmsnorm_modulate_fast(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics,
    schedule: Schedule = _DEFAULT,
) -> torch.Tensor:
    """Fused approximate ``rmsnorm_fast(x) * (1 + scale) + shift`` with eager's per-op roundings."""
    return launcher(Variant(False, numerics, DEFAULT_TRAITS, schedule))(x, weight, scale, shift, eps, flavour)


def rmsnorm_with(
    numerics: Numerics, fallback: Callable[..., torch.Tensor], traits: LaunchTraits = DEFAULT_TRAITS
) -> Callable[..., torch.Tensor]:
    """``rmsnorm`` for one fixed ``numerics`` and ``traits`` and the default schedule, without the keyword
    layers (a backend's registered impl: every frame is host time on the small shapes). A call whose
    pointers aten would not vectorize returns ``fallback(x, weight, eps, flavour)`` (the op's reference:
    exact by definition), so one misaligned view neither fails the guard nor decides the impl for its key."""
    run = launcher(Variant(True, numerics, traits))

    def rmsnorm_fixed(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
        try:
            return run(x, weight, None, None, eps, flavour)
        except NotVectorizable:
            return fallback(x, weight, eps, flavour)

    return rmsnorm_fixed


def rmsnorm_modulate_with(
    numerics: Numerics, fallback: Callable[..., torch.Tensor], traits: LaunchTraits = DEFAULT_TRAITS
) -> Callable[..., torch.Tensor]:
    """``rmsnorm_modulate`` for one fixed ``numerics`` and ``traits`` (see ``rmsnorm_with``)."""
    run = launcher(Variant(True, numerics, traits))

    def rmsnorm_modulate_fixed(x, scale, shift, weight, eps, flavour) -> torch.Tensor:
        try:
            return run(x, weight, scale, shift, eps, flavour)
        except NotVectorizable:
            return fallback(x, scale, shift, weight, eps, flavour)

    return rmsnorm_modulate_fixed


def add_rmsnorm_with(
    numerics: Numerics, fallback: Callable[..., tuple[torch.Tensor, torch.Tensor]], traits: LaunchTraits = DEFAULT_TRAITS
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``add_rmsnorm`` for one fixed ``numerics`` and ``traits`` (see ``rmsnorm_with``: a torch-flavour
    weight aten would not vectorize on returns ``fallback(...)``; the sum is always a fresh aligned row)."""
    run = launcher(Variant(True, numerics, traits))

    def add_rmsnorm_fixed(x, update, weight, eps, flavour, scale, shift) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            return run(x, weight, scale, shift, eps, flavour, None, update)
        except NotVectorizable:
            return fallback(x, update, weight, eps, flavour, scale, shift)

    return add_rmsnorm_fixed


def rmsnorm_fast_with(numerics: Numerics) -> Callable[..., torch.Tensor]:
    """``rmsnorm_fast`` with one vendor's reciprocal square root (a backend's registered impl)."""
    run = launcher(Variant(False, numerics))

    def rmsnorm_fast_fixed(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
        return run(x, weight, None, None, eps, flavour)

    return rmsnorm_fast_fixed


def rmsnorm_modulate_fast_with(numerics: Numerics) -> Callable[..., torch.Tensor]:
    """``rmsnorm_modulate_fast`` with one vendor's reciprocal square root (a backend's registered impl)."""
    run = launcher(Variant(False, numerics))

    def rmsnorm_modulate_fast_fixed(x, scale, shift, weight, eps, flavour) -> torch.Tensor:
        return run(x, weight, scale, shift, eps, flavour)

    return rmsnorm_modulate_fast_fixed


__all__ = [
    "ARR_ARKB",
    "ARR_MERGED",
    "CUDA_NUMERICS",
    "CUDA_WARP",
    "FLAVOURS",
    "OPS",
    "ROCM_NUMERICS",
    "ROCM_WAVEFRONT",
    "RSQRT_MATH",
    "RSQRT_PTX",
    "LaunchTraits",
    "NotVectorizable",
    "Numerics",
    "Schedule",
    "ScheduleEntry",
    "Verification",
    "add_rmsnorm",
    "add_rmsnorm_with",
    "rmsnorm",
    "rmsnorm_fast",
    "rmsnorm_fast_with",
    "rmsnorm_modulate",
    "rmsnorm_modulate_fast",
    "rmsnorm_modulate_fast_with",
    "rmsnorm_modulate_with",
    "rmsnorm_stats",
    "rmsnorm_with",
    "schedule_table",
    "supports_add_rmsnorm",
    "supports_rmsnorm",
    "supports_rmsnorm_fast",
    "supports_rmsnorm_fast_diffusers",
    "supports_rmsnorm_fast_torch",
    "supports_rmsnorm_modulate",
    "supports_rmsnorm_modulate_fast",
]
