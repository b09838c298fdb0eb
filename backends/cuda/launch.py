"""NVIDIA launch configurations for the shared kernels (imported on first use, never at registration).

Configs are the ones measured on the H200 (lab/gpu/*.py; docs/performance.md); SM100/SM103 take the same
arch-independent pointwise schedules (seed 000) and are not tuned here.
"""

from __future__ import annotations

from xbackend.kernels import cuda_gated_residual, triton_gated_residual, triton_qk_norm_rope, triton_rmsnorm
from xbackend.ops.qk_norm_rope import reference as qk_norm_rope_reference
from xbackend.ops.rmsnorm import reference as rmsnorm_reference
from xbackend.ops.rmsnorm_modulate import reference as modulate_reference

rmsnorm = triton_rmsnorm.rmsnorm_with(triton_rmsnorm.CUDA_NUMERICS, rmsnorm_reference)


rmsnorm_modulate = triton_rmsnorm.rmsnorm_modulate_with(triton_rmsnorm.CUDA_NUMERICS, modulate_reference)


def supports_rmsnorm(x, weight, eps, flavour) -> str | None:
    return triton_rmsnorm.supports_rmsnorm(
        x, weight, eps, flavour, alignment=False, numerics=triton_rmsnorm.CUDA_NUMERICS
    )


def supports_rmsnorm_modulate(x, scale, shift, weight, eps, flavour) -> str | None:
    return triton_rmsnorm.supports_rmsnorm_modulate(
        x, scale, shift, weight, eps, flavour, alignment=False, numerics=triton_rmsnorm.CUDA_NUMERICS
    )


# Defaults measured best on the H200: 1024/512/256-wide column blocks, 4 rows, 4 warps (lab/gpu/gated_residual.py).
gated_residual_triton = triton_gated_residual.gated_residual


def __getattr__(name: str) -> object:
    # The registered impl's fn is looked up once (Impl.resolved caches it for the process) and entry()
    # builds the extension first, so what is cached is the C function itself, not a Python wrapper
    # around it (issue 3's small-shape host bar: one Python frame is ~0.1-0.3 µs of a ~10 µs call).
    if name == "gated_residual_cuda":
        return cuda_gated_residual.entry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


qk_norm_rope = triton_qk_norm_rope.qk_norm_rope_with(triton_rmsnorm.CUDA_NUMERICS, qk_norm_rope_reference)


def supports_qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout) -> str | None:
    return triton_qk_norm_rope.supports(
        q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, numerics=triton_rmsnorm.CUDA_NUMERICS
    )
