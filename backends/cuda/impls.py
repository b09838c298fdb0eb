"""The NVIDIA impl records. Functions are named as "module:attr" strings so registering imports
neither triton nor the CUDA extension."""

from __future__ import annotations

import xbackend
from xbackend import Impl

_L = "xbackend_cuda.launch"
_K = "xbackend.kernels"
# Seed 000 qualified the arch-independent pointwise kernels on SM90 and SM103; SM100 shares them.
POINTWISE = "sm90..sm103"


def _triton_available() -> str | None:
    from .plugin import triton_available

    return triton_available()


def _cuda_ext_available() -> str | None:
    from xbackend.kernels import cuda_gated_residual

    return cuda_gated_residual.available()


IMPLS: list[Impl] = [
    Impl(op="rmsnorm", name="triton", fn=f"{_L}:rmsnorm", supports=f"{_L}:supports_rmsnorm", priority=100,
         devices=POINTWISE, available=_triton_available,
         description="Triton, PyTorch's fp32 reduction order reproduced (bit-exact, both flavours)"),
    Impl(op="rmsnorm", name="triton_fast", fn=f"{_K}.triton_rmsnorm:rmsnorm_fast",
         supports=f"{_K}.triton_rmsnorm:supports_rmsnorm_fast", priority=90, devices=POINTWISE,
         precision=xbackend.ulp(1), available=_triton_available,
         description="Triton, one tree-sum reduction (a few elements per million differ by 1 ulp)"),
    Impl(op="rmsnorm_modulate", name="triton", fn=f"{_L}:rmsnorm_modulate", supports=f"{_L}:supports_rmsnorm_modulate",
         priority=100, devices=POINTWISE, available=_triton_available,
         description="Triton, norm + (1 + scale) + shift fused, eager's roundings (bit-exact)"),
    Impl(op="rmsnorm_modulate", name="triton_fast", fn=f"{_K}.triton_rmsnorm:rmsnorm_modulate_fast",
         supports=f"{_K}.triton_rmsnorm:supports_rmsnorm_modulate_fast", priority=90, devices=POINTWISE,
         precision=xbackend.ulp(1), available=_triton_available,
         description="Triton fused modulate with a one-sum reduction (1 ulp)"),
    # Seed 001: CUDA C++ above Triton; a failed build or launch falls to Triton, then the reference.
    Impl(op="gated_residual", name="cuda_vec", fn=f"{_L}:gated_residual_cuda",
         supports=f"{_K}.cuda_gated_residual:supports", priority=110, devices=POINTWISE, available=_cuda_ext_available,
         description="CUDA C++ (JIT), 16-byte vectors, row-tiled broadcast gate, no FMA (bit-exact)"),
    Impl(op="gated_residual", name="triton", fn=f"{_L}:gated_residual_triton",
         supports=f"{_K}.triton_gated_residual:supports", priority=100, devices=POINTWISE, available=_triton_available,
         description="Triton, row-tiled, fp fusion off (bit-exact)"),
]
