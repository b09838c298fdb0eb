"""Which inputs the exact LayerNorm kernel takes: ``supports_*`` predicates (None, or a short reason).

The kernel reproduces aten's ``vectorized_layer_norm_kernel`` only where aten runs it: rows of
``D % 4 == 0`` (at most ``MAX_EXACT_D``), and the X, gamma and beta pointers aten hands it 4-element
aligned. aten normalizes ``X = x.expect_contiguous()`` and ``gamma = weight.expect_contiguous()``:
a non-contiguous operand becomes a fresh, aligned copy, a contiguous one is read in place. Flavour
"fp32" normalizes ``x.float()`` with ``weight.float()``: a fresh copy unless the tensor is float32
already. So a misaligned pointer matters only for a contiguous operand read in place; alignment is a
property of each call, not of the shapes a plan or a dispatch key holds, so ``alignment=False`` leaves
it to the call, which raises ``NotVectorizable`` (the registered impls answer it with the reference).

Nothing here imports Triton: an impl's ``supports`` answers on a host without it.
"""

from __future__ import annotations

import torch

from xbackend.kernels.layernorm.numerics import MAX_EXACT_D, VEC, LayerNormNumerics
from xbackend.kernels.rmsnorm.supports import NotVectorizable, interpreting

FLAVOURS = ("torch", "fp32")
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INDEX_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
ALIGN_REASON = "x, weight or bias not aligned to 4 elements where aten reads it in place (aten runs its two-pass kernels)"


def read_in_place(t: torch.Tensor, flavour: str) -> bool:
    """Whether aten's vectorized kernel reads ``t`` itself (its alignment then decides the path): a
    contiguous tensor that flavour "fp32" does not convert (``t.float()`` of a float32 t is t)."""
    return t.is_contiguous() and (flavour == "torch" or t.dtype == torch.float32)


def misaligned(t: torch.Tensor | None, flavour: str) -> bool:
    return t is not None and read_in_place(t, flavour) and t.data_ptr() % (VEC * t.element_size()) != 0


def _norm_reason(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, flavour: str,
                 check_x: bool, alignment: bool) -> str | None:  # fmt: skip
    if flavour not in FLAVOURS:
        return f"unknown flavour {flavour!r}"
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype} not in bf16/fp16/fp32"
    # CUDA/ROCm, the interpreter on CPU, or meta tensors when the resolver plans for another device.
    if not (x.is_cuda or x.is_meta or (interpreting() and x.device.type == "cpu")):
        return "needs a CUDA/ROCm tensor"
    if x.dim() == 0:
        return "needs at least one dimension"
    d = x.shape[-1]
    if d % VEC:
        return f"D % {VEC} != 0 (aten runs its two-pass kernels, RowwiseMomentsCUDAKernel's order)"
    if d > MAX_EXACT_D:
        return f"D > {MAX_EXACT_D}"
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if flavour == "torch" and t.dtype != x.dtype:
            return f"{name} dtype differs from x (flavour 'torch')"
        if t.dtype not in DTYPES:
            return f"{name} dtype {t.dtype} not in bf16/fp16/fp32"
        if tuple(t.shape) != (d,):
            return f"{name} is not [D]"
        if t.device != x.device:
            return f"{name} on another device"
        if d > 1 and t.stride(0) != 1:
            return f"{name} is not contiguous (the kernel reads it with unit stride)"
    if alignment and ((check_x and misaligned(x, flavour)) or misaligned(weight, flavour) or misaligned(bias, flavour)):
        return ALIGN_REASON
    return None


def _operand_reason(x: torch.Tensor, t: torch.Tensor, name: str, dtypes: tuple[torch.dtype, ...],
                    index: torch.Tensor | None) -> str | None:  # fmt: skip
    if t.dtype not in dtypes:
        return f"{name} dtype {t.dtype} (expected {' or '.join(map(str, dtypes))})"
    if t.device != x.device:
        return f"{name} on another device"
    if index is not None:
        if x.dim() != 3 or tuple(t.shape) != (2, x.shape[0], x.shape[-1]):
            return f"{name} is not a [2, B, D] table for x [B, L, D]"
        return None
    try:
        shape = torch.broadcast_shapes(t.shape, x.shape)
    except RuntimeError:
        return f"{name} does not broadcast to x"
    if shape != x.shape:
        return f"{name} broadcasting would grow x"
    return None


def _modulation_reason(x: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None, flavour: str,
                       index: torch.Tensor | None) -> str | None:  # fmt: skip
    if (scale is None) != (shift is None):
        return "scale and shift come together"
    if index is not None:
        if index.dtype not in INDEX_DTYPES:
            return f"index dtype {index.dtype} is not an integer or bool"
        if x.dim() != 3 or tuple(index.shape) != tuple(x.shape[:2]) or index.device != x.device:
            return "index is not [B, L] on x's device"
    if scale is None:
        return None
    dtypes = (x.dtype,) if flavour == "torch" else (torch.float32,)
    return _operand_reason(x, scale, "scale", dtypes, index) or _operand_reason(x, shift, "shift", dtypes, index)


def supports_layernorm_modulate(
    x: torch.Tensor,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    flavour: str,
    index: torch.Tensor | None = None,
    *,
    numerics: LayerNormNumerics,
    alignment: bool = True,
) -> str | None:
    """None if ``layernorm_modulate`` reproduces the reference of the build ``numerics`` describes bit
    for bit on this input, else a short reason. ``alignment=False`` leaves out the per-pointer check
    (for a caller that handles ``NotVectorizable`` per call)."""
    reason = _norm_reason(x, weight, bias, flavour, True, alignment)
    return reason or _modulation_reason(x, scale, shift, flavour, index)


def supports_add_layernorm(
    x: torch.Tensor,
    update: torch.Tensor,
    gate: torch.Tensor | None,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    flavour: str,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
    *,
    numerics: LayerNormNumerics,
    alignment: bool = True,
) -> str | None:
    """None if ``add_layernorm`` is bit-exact on this input, else a short reason. aten normalizes the sum
    it allocates (contiguous, aligned): x's own layout and alignment do not matter, the weight's and
    bias' do (``alignment=False`` leaves them to the call)."""
    if not isinstance(update, torch.Tensor) or update.shape != x.shape:
        return "update's shape differs from x"
    if update.dtype != x.dtype or update.device != x.device:
        return "update's dtype or device differs from x"
    reason = _norm_reason(x, weight, bias, flavour, False, alignment)
    reason = reason or _modulation_reason(x, scale, shift, flavour, index if scale is not None else None)
    if reason is None and gate is not None:
        if index is not None and (index.dtype not in INDEX_DTYPES or tuple(index.shape) != tuple(x.shape[:2])):
            return "index is not an integer or bool [B, L]"
        gates = (x.dtype,) if x.dtype == torch.float32 else (x.dtype, torch.float32)
        reason = _operand_reason(x, gate, "gate", gates, index)
    return reason


__all__ = [
    "ALIGN_REASON",
    "DTYPES",
    "FLAVOURS",
    "NotVectorizable",
    "misaligned",
    "read_in_place",
    "supports_add_layernorm",
    "supports_layernorm_modulate",
]
