"""The NVIDIA impls' ``supports`` predicates: the shared kernels' input checks bound to the PyTorch build
whose order they reproduce. Nothing here imports Triton (``launch`` does, on first use), so a host
without Triton plans a simulated NVIDIA GPU exactly as one with it does."""

from __future__ import annotations

from xbackend.kernels.layernorm.numerics import CUDA_LN_NUMERICS
from xbackend.kernels.rmsnorm.numerics import CUDA_NUMERICS
from xbackend.kernels.vendor_supports import VendorSupports

# The order of CUDA builds of PyTorch (128 threads per row, decreasing shuffles, rsqrt.approx.f32).
NUMERICS = CUDA_NUMERICS

# F.layer_norm's order on the same block (Welford, rcp.rn.f32, nvcc's FMA points).
LN_NUMERICS = CUDA_LN_NUMERICS

_BOUND = VendorSupports(NUMERICS, LN_NUMERICS)
supports_rmsnorm = _BOUND.supports_rmsnorm
supports_rmsnorm_modulate = _BOUND.supports_rmsnorm_modulate
supports_add_rmsnorm = _BOUND.supports_add_rmsnorm
supports_qk_norm_rope = _BOUND.supports_qk_norm_rope
supports_qk_norm_rope_3d = _BOUND.supports_qk_norm_rope_3d
supports_layernorm_modulate = _BOUND.supports_layernorm_modulate
supports_add_layernorm = _BOUND.supports_add_layernorm
