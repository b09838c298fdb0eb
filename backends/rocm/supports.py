"""The AMD impls' ``supports`` predicates: the shared kernels' input checks bound to the PyTorch build
whose order they reproduce. Nothing here imports Triton (``launch`` does, on first use), so a host
without Triton plans a simulated AMD GPU exactly as one with it does."""

from __future__ import annotations

from xbackend.kernels.layernorm.numerics import ROCM_LN_NUMERICS
from xbackend.kernels.rmsnorm.numerics import ROCM_NUMERICS
from xbackend.kernels.vendor_supports import VendorSupports

# The order of ROCm builds of PyTorch (1024 threads, wave64, increasing shuffle offsets, ocml's rsqrt).
NUMERICS = ROCM_NUMERICS

# F.layer_norm's order on the same block (Welford, the fast v_rcp_f32 reciprocal).
LN_NUMERICS = ROCM_LN_NUMERICS

_BOUND = VendorSupports(NUMERICS, LN_NUMERICS)
supports_rmsnorm = _BOUND.supports_rmsnorm
supports_rmsnorm_modulate = _BOUND.supports_rmsnorm_modulate
supports_add_rmsnorm = _BOUND.supports_add_rmsnorm
supports_qk_norm_rope = _BOUND.supports_qk_norm_rope
supports_qk_norm_rope_3d = _BOUND.supports_qk_norm_rope_3d
supports_layernorm_modulate = _BOUND.supports_layernorm_modulate
supports_add_layernorm = _BOUND.supports_add_layernorm
