"""Which inputs the RMSNorm kernels take: ``supports_*`` predicates (None, or a short reason).

The exact kernels reproduce aten's vectorized layer-norm kernel ("torch") and its mean reduce
("diffusers") only where aten itself takes those paths: a torch-flavour row with D % 4 != 0 or an
x / weight pointer not aligned to 4 elements runs aten's Welford kernel instead, a diffusers row
with D >= 128 and D % 4 != 0 is shifted by aten, and very long rows reduce across blocks. Those
inputs are refused here with the reason. Pointer alignment is a property of each call, not of the
shapes a plan or a dispatch key is cached by: ``alignment=False`` leaves it to the call, which then
raises ``NotVectorizable``.

Nothing here imports Triton (the tile arithmetic is ``tiles``'): an impl's ``supports`` answers on a
host without it, as when a CPU runner plans a simulated GPU.
"""

from __future__ import annotations

import os

import torch

from xbackend.kernels.rmsnorm.numerics import FLAVOURS, MEAN_VEC, TORCH_VEC, Numerics
from xbackend.kernels.rmsnorm.tiles import MAX_EXACT_D, MAX_FAST_D, MEAN_VECTORIZE_D, mean_tile

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ALIGN_REASON = "x or weight not aligned to 4 elements (aten runs its Welford kernel)"
MEAN_ALIGN_REASON = "fp32 x not 16-byte aligned (aten's mean reduce starts each row with a shifted head)"


def interpreting() -> bool:
    """Triton's interpreter runs the kernels (on CPU tensors): a fact about this host, not a vendor."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class NotVectorizable(ValueError):
    """x or the weight is not 4-element aligned, so aten runs its Welford kernel for this call and the
    torch-flavour exact kernel (its vectorized order) does not apply. Raised per call: alignment is a
    property of the pointer, not of the shapes a launch plan (or a dispatch key) is cached by."""


def _check_common(x: torch.Tensor, weight: torch.Tensor | None, flavour: str) -> str | None:
    if flavour not in FLAVOURS:
        return f"unknown flavour {flavour!r}"
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype} not in bf16/fp16/fp32"
    # CUDA/ROCm, the interpreter on CPU, or meta tensors when the resolver plans for another device.
    if not (x.is_cuda or x.is_meta or (interpreting() and x.device.type == "cpu")):
        return "needs a CUDA/ROCm tensor"
    if x.dim() == 0:
        return "needs at least one dimension"
    if weight is not None:
        if weight.dtype != x.dtype:
            return "weight dtype differs from x"
        if tuple(weight.shape) != (x.shape[-1],):
            return "weight is not [D]"
        if weight.device != x.device:
            return "weight on another device"
        if x.shape[-1] > 1 and weight.stride(0) != 1:
            return "weight is not contiguous (the kernels read it with unit stride)"
    return None


def _check_bcast(x: torch.Tensor, t: torch.Tensor, name: str) -> str | None:
    if t.dtype != x.dtype:
        return f"{name} dtype differs from x"
    if t.device != x.device:
        return f"{name} on another device"
    try:
        torch.broadcast_shapes(t.shape, x.shape)
    except RuntimeError:
        return f"{name} does not broadcast to x"
    if torch.broadcast_shapes(t.shape, x.shape) != x.shape:
        return f"{name} broadcasting would grow x"
    return None


def aten_vectorizes(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """aten takes the vectorized kernel only if X (after expect_contiguous) and gamma are aligned."""
    align = TORCH_VEC * x.element_size()
    if x.is_contiguous() and x.data_ptr() % align:
        return False
    return weight_vectorizes(weight)


def weight_vectorizes(weight: torch.Tensor | None) -> bool:
    """The gamma half of ``aten_vectorizes``: a contiguous weight 4-element aligned (or none)."""
    return weight is None or not weight.is_contiguous() or weight.data_ptr() % (TORCH_VEC * weight.element_size()) == 0


def mean_checks_alignment(x: torch.Tensor) -> bool:
    """The diffusers flavour reduces ``x.to(float32)``, which is x itself for fp32 x: from D >= 128 aten
    then loads 4-wide vectors from each row's own address, so a misaligned x changes the order (per
    call: ``mean_aligned``). Other dtypes reduce a fresh, aligned copy."""
    return x.dtype == torch.float32 and x.shape[-1] >= MEAN_VECTORIZE_D


def mean_aligned(x: torch.Tensor) -> bool:
    return x.data_ptr() % (MEAN_VEC * x.element_size()) == 0


def aten_order_applies(x: torch.Tensor, weight: torch.Tensor | None, flavour: str) -> bool:
    """Per call: the pointers are aligned the way the emulated order assumes (see ``aten_vectorizes``,
    ``mean_checks_alignment``)."""
    if flavour == "torch":
        return aten_vectorizes(x, weight)
    return not mean_checks_alignment(x) or mean_aligned(x)


def alignment_reason(flavour: str) -> str:
    return ALIGN_REASON if flavour == "torch" else MEAN_ALIGN_REASON


def mean_layout_reason(x: torch.Tensor) -> str | None:
    """Why aten's mean reduce of ``x.to(float32)`` does not run in the emulated order (contiguous rows
    reduced along their last dim), or None. ``.to`` keeps x's strides for fp32 x and for a dense,
    non-overlapping x (a transposed one too); anything else becomes a contiguous copy."""
    d = x.shape[-1]
    if d <= 1 or x.numel() == 0:
        return None
    reduced = x if x.dtype == torch.float32 else torch.empty_like(x, dtype=torch.float32, device="meta")
    if reduced.is_contiguous():
        return None
    outer = [(n, st) for n, st in zip(reduced.shape[:-1], reduced.stride()[:-1], strict=True) if n > 1]
    if any(0 < st < reduced.stride(-1) for _, st in outer):
        return "diffusers exact: the rows' last dim is not their fastest (aten's mean reduces across it)"
    if d >= MEAN_VECTORIZE_D:
        if reduced.stride(-1) != 1:
            return "diffusers exact from D >= 128 needs unit-stride rows (aten vectorizes only those)"
        if any(st % MEAN_VEC for _, st in outer):
            return "diffusers exact from D >= 128 needs row strides in multiples of 4 (aten shifts misaligned rows)"
    return None


def exact_reason(
    x: torch.Tensor, weight: torch.Tensor | None, flavour: str, num: Numerics, alignment: bool = True,
    layout: bool = True,
) -> str | None:
    """Why the exact kernels cannot reproduce the flavour on these rows, or None. ``layout=False``: the
    rows normalized are a fresh contiguous tensor, not x (``add_rmsnorm``'s sum)."""
    reason = _check_common(x, weight, flavour)
    if reason:
        return reason
    d = x.shape[-1]
    if d > MAX_EXACT_D:
        return f"D > {MAX_EXACT_D}"
    if flavour == "torch":
        if d % TORCH_VEC:
            return "torch exact needs D % 4 == 0 (aten runs its Welford kernel otherwise)"
        if alignment and not aten_vectorizes(x, weight):
            return ALIGN_REASON
        return None
    m = x.numel() // max(d, 1)
    tile = mean_tile(max(m, 1), d, num)
    if isinstance(tile, str):
        return tile
    if layout and (reason := mean_layout_reason(x)):
        return reason
    if layout and alignment and mean_checks_alignment(x) and not mean_aligned(x):
        return MEAN_ALIGN_REASON
    return None


def supports_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics,
    alignment: bool = True,
) -> str | None:
    """None if ``rmsnorm`` reproduces the reference of the build ``numerics`` describes bit for bit on
    this input, else a short reason. ``alignment=False`` leaves out the per-pointer alignment (for a
    caller that handles ``NotVectorizable`` per call, as ``rmsnorm_with(..., fallback)`` does)."""
    return exact_reason(x, weight, flavour, numerics, alignment)


def supports_rmsnorm_modulate(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: Numerics,
    alignment: bool = True,
) -> str | None:
    """None if ``rmsnorm_modulate`` is bit-exact on this input, else a short reason (see ``supports_rmsnorm``)."""
    reason = exact_reason(x, weight, flavour, numerics, alignment)
    return reason or _check_bcast(x, scale, "scale") or _check_bcast(x, shift, "shift")


def supports_add_rmsnorm(
    x: torch.Tensor,
    update: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    flavour: str,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    *,
    numerics: Numerics,
    alignment: bool = True,
) -> str | None:
    """None if ``add_rmsnorm`` is bit-exact on this input, else a short reason. aten normalizes the sum
    it allocates (contiguous, aligned), so x's own layout and alignment do not matter; the weight's
    alignment does (``alignment=False`` leaves it to the call, see ``supports_rmsnorm``)."""
    if not isinstance(update, torch.Tensor) or update.shape != x.shape:
        return "update's shape differs from x"
    if update.dtype != x.dtype or update.device != x.device:
        return "update's dtype or device differs from x"
    reason = exact_reason(x, weight, flavour, numerics, False, layout=False)
    if reason is None and alignment and flavour == "torch" and not weight_vectorizes(weight):
        reason = ALIGN_REASON
    if reason is None and (scale is None) != (shift is None):
        reason = "scale and shift come together"
    if reason is None and scale is not None:
        reason = _check_bcast(x, scale, "scale") or _check_bcast(x, shift, "shift")
    return reason


def supports_rmsnorm_fast(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    """None if ``rmsnorm_fast`` can run (approximate: ulp contract, not exact)."""
    reason = _check_common(x, weight, flavour)
    if reason is None and x.shape[-1] > MAX_FAST_D:
        reason = f"D > {MAX_FAST_D}"
    return reason


def supports_rmsnorm_fast_torch(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    """``supports_rmsnorm_fast`` for flavour "torch" only (max 1 ulp: one registration, ulp(1))."""
    return (
        supports_rmsnorm_fast(x, weight, eps, flavour) if flavour == "torch" else "registered for flavour 'torch' only"
    )


def supports_rmsnorm_fast_diffusers(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str
) -> str | None:
    """``supports_rmsnorm_fast`` for flavour "diffusers" only (max 2 ulp: its own registration, ulp(2))."""
    if flavour != "diffusers":
        return "registered for flavour 'diffusers' only"
    return supports_rmsnorm_fast(x, weight, eps, flavour)


def supports_rmsnorm_modulate_fast(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str
) -> str | None:
    """None if ``rmsnorm_modulate_fast`` can run (approximate)."""
    reason = supports_rmsnorm_fast(x, weight, eps, flavour)
    return reason or _check_bcast(x, scale, "scale") or _check_bcast(x, shift, "shift")


__all__ = [
    "ALIGN_REASON",
    "DTYPES",
    "MEAN_ALIGN_REASON",
    "NotVectorizable",
    "alignment_reason",
    "aten_order_applies",
    "aten_vectorizes",
    "exact_reason",
    "interpreting",
    "mean_aligned",
    "mean_checks_alignment",
    "mean_layout_reason",
    "supports_add_rmsnorm",
    "supports_rmsnorm",
    "supports_rmsnorm_fast",
    "supports_rmsnorm_fast_diffusers",
    "supports_rmsnorm_fast_torch",
    "supports_rmsnorm_modulate",
    "supports_rmsnorm_modulate_fast",
    "weight_vectorizes",
]
