"""Triton LayerNorm + adaLN modulate (and the residual add before it), bit-exact to eager PyTorch.

``F.layer_norm`` on a GPU: aten's ``vectorized_layer_norm_kernel`` (``layer_norm_kernel.cu``), one
block per row, each thread folding its 4-element vectors into a Welford state, the states merged by a
shuffle tree per warp and a tree across warps (``numerics`` spells the order and nvcc's FMA points
out). The kernel emulates that block as a tile and rounds the rest like eager:

* ``layernorm_modulate``: flavour "torch" rounds the norm to x's dtype and then ``1 + scale``, the
  product and the sum each (``nn.LayerNorm`` then eager); flavour "fp32" (diffusers' FP32LayerNorm on
  ``x.float()``) modulates the fp32 norm with float32 scale and shift and rounds once. Scale and shift
  broadcast to x (strided ``[B,1,D]`` chunks of one table read in place) or, with a per-token
  ``index``, are two ``[B, D]`` tables selected per token.
* ``add_layernorm``: ``h = x + update`` (or ``x + update * gate``, the gate x's dtype or float32 under
  a half x), rounded like eager and stored; the norm reads the rounded sum in registers.

Modules: ``numerics`` (which build's order: data only), ``primitives`` (the Welford fold, combine and
trees), ``exact`` (the kernel), ``supports`` (which inputs it takes), ``launch`` (plans and launches).
Only ``primitives``, ``exact`` and ``launch`` import Triton; the entry points take the numerics
explicitly and a vendor backend binds its own with the ``*_with`` builders.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

from xbackend.kernels.layernorm.numerics import (
    CUDA_LN_NUMERICS,
    MAX_EXACT_D,
    RCP_AMDGCN,
    RCP_IEEE,
    ROCM_LN_NUMERICS,
    LayerNormNumerics,
)
from xbackend.kernels.layernorm.supports import (
    FLAVOURS,
    NotVectorizable,
    supports_add_layernorm,
    supports_layernorm_modulate,
)

_TRITON_MODULES = ("exact", "launch", "primitives")


def __getattr__(name: str) -> Any:
    if name in _TRITON_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def launcher(numerics: LayerNormNumerics) -> Any:
    """``launch.launcher(numerics)``, the launch module (and Triton) imported on the first call."""
    from xbackend.kernels.layernorm.launch import launcher as launch_launcher

    return launch_launcher(numerics)


def layernorm_modulate(
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
) -> torch.Tensor:
    """The op ``layernorm_modulate`` bit-exact to its reference on the build ``numerics`` describes.
    Raises ValueError where ``supports_layernorm_modulate`` gives a reason and ``NotVectorizable`` for a
    call whose pointers aten would not vectorize."""
    return launcher(numerics)(x, None, None, weight, bias, scale, shift, index, eps, flavour)


def add_layernorm(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, layernorm_modulate(h, ...))`` with ``h`` the residual sum, in one kernel that reads x, update
    (and the gate) once and writes both outputs."""
    return launcher(numerics)(x, update, gate, weight, bias, scale, shift, index, eps, flavour)


def layernorm_stats(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    flavour: str,
    *,
    numerics: LayerNormNumerics,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, per-row mean, per-row rstd), the statistics as aten's kernel keeps them (diagnostics)."""
    m = x.numel() // max(x.shape[-1], 1)
    mean = torch.empty(m, dtype=torch.float32, device=x.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    out = launcher(numerics)(x, None, None, weight, bias, None, None, None, eps, flavour, (mean, rstd))
    return out, mean, rstd


def layernorm_modulate_with(numerics: LayerNormNumerics, fallback: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``layernorm_modulate`` for one fixed ``numerics`` (a backend's registered impl). A call whose
    pointers aten would not vectorize returns ``fallback(...)`` (the op's reference: exact by
    definition), so one misaligned view neither fails the guard nor decides the impl for its key."""
    run = launcher(numerics)

    def layernorm_modulate_fixed(x, scale, shift, weight, bias, eps, flavour, index) -> torch.Tensor:
        try:
            return run(x, None, None, weight, bias, scale, shift, index, eps, flavour)
        except NotVectorizable:
            return fallback(x, scale, shift, weight, bias, eps, flavour, index)

    return layernorm_modulate_fixed


def add_layernorm_with(
    numerics: LayerNormNumerics, fallback: Callable[..., tuple[torch.Tensor, torch.Tensor]]
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """``add_layernorm`` for one fixed ``numerics`` (see ``layernorm_modulate_with``: a weight or bias
    aten would not vectorize on returns ``fallback(...)``; the sum is always a fresh aligned row)."""
    run = launcher(numerics)

    def add_layernorm_fixed(x, update, gate, weight, bias, eps, flavour, scale, shift, index):
        try:
            return run(x, update, gate, weight, bias, scale, shift, index, eps, flavour)
        except NotVectorizable:
            return fallback(x, update, gate, weight, bias, eps, flavour, scale, shift, index)

    return add_layernorm_fixed


__all__ = [
    "CUDA_LN_NUMERICS",
    "FLAVOURS",
    "MAX_EXACT_D",
    "RCP_AMDGCN",
    "RCP_IEEE",
    "ROCM_LN_NUMERICS",
    "LayerNormNumerics",
    "NotVectorizable",
    "add_layernorm",
    "add_layernorm_with",
    "layernorm_modulate",
    "layernorm_modulate_with",
    "layernorm_stats",
    "supports_add_layernorm",
    "supports_layernorm_modulate",
]
