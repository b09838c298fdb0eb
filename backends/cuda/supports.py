"""The NVIDIA impls' ``supports`` predicates: the shared kernels' input checks bound to the PyTorch build
whose order they reproduce. Nothing here imports Triton (``launch`` does, on first use), so a host
without Triton plans a simulated NVIDIA GPU exactly as one with it does."""

from __future__ import annotations

from torch import Tensor

from xbackend.kernels import triton_qk_norm_rope_3d_plan, triton_qk_norm_rope_plan
from xbackend.kernels.rmsnorm import supports as rms
from xbackend.kernels.rmsnorm.numerics import CUDA_NUMERICS

# The order of CUDA builds of PyTorch (128 threads per row, decreasing shuffles, rsqrt.approx.f32).
NUMERICS = CUDA_NUMERICS


def supports_rmsnorm(x: Tensor, weight: Tensor | None, eps: float, flavour: str) -> str | None:
    return rms.supports_rmsnorm(x, weight, eps, flavour, alignment=False, numerics=NUMERICS)


def supports_rmsnorm_modulate(x: Tensor, scale: Tensor, shift: Tensor, weight: Tensor | None, eps: float,
                              flavour: str) -> str | None:
    return rms.supports_rmsnorm_modulate(x, scale, shift, weight, eps, flavour, alignment=False, numerics=NUMERICS)


def supports_add_rmsnorm(x: Tensor, update: Tensor, weight: Tensor | None, eps: float, flavour: str,
                         scale: Tensor | None, shift: Tensor | None) -> str | None:
    return rms.supports_add_rmsnorm(x, update, weight, eps, flavour, scale, shift, alignment=False, numerics=NUMERICS)


def supports_qk_norm_rope(q: Tensor, k: Tensor, q_weight: Tensor | None, k_weight: Tensor | None, cos: Tensor,
                          sin: Tensor, eps: float, flavour: str, layout: str) -> str | None:
    return triton_qk_norm_rope_plan.supports(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout,
                                             numerics=NUMERICS)


def supports_qk_norm_rope_3d(q: Tensor, k: Tensor, q_weight: Tensor | None, k_weight: Tensor | None, eps: float,
                             q_scale: float, base: float, flavour: str) -> str | None:
    return triton_qk_norm_rope_3d_plan.supports(q, k, q_weight, k_weight, eps, q_scale, base, flavour,
                                                numerics=NUMERICS)
