"""AMD launch configurations for the shared Triton kernels (CDNA3 gfx942, CDNA4 gfx950).

Not run on AMD hardware here. CDNA runs 64-wide wavefronts, so the same tile wants half the warps;
the RMSNorm kernels reproduce a ROCm build's reduction order (``NUMERICS``: 1024 threads, wave64,
increasing shuffle offsets, ocml's rsqrt: docs/exactness.md) and the guard verifies that on first use.
``LAUNCH`` leaves programmatic dependent launch off (a CUDA feature) and tunes nothing.
"""

from __future__ import annotations

import torch

from xbackend.kernels import rmsnorm as rms
from xbackend.kernels import triton_gated_residual, triton_qk_norm_rope, triton_qk_norm_rope_3d
from xbackend.ops.add_rmsnorm import reference as add_rmsnorm_reference
from xbackend.ops.qk_norm_rope import reference as qk_norm_rope_reference
from xbackend.ops.qk_norm_rope_3d import reference as qk_norm_rope_3d_reference
from xbackend.ops.rmsnorm import reference as rmsnorm_reference
from xbackend.ops.rmsnorm_modulate import reference as modulate_reference

NUMERICS = rms.ROCM_NUMERICS
LAUNCH = rms.LaunchTraits(pdl_min_major=None, schedules=())

rmsnorm = rms.rmsnorm_with(NUMERICS, rmsnorm_reference, LAUNCH)


rmsnorm_modulate = rms.rmsnorm_modulate_with(NUMERICS, modulate_reference, LAUNCH)


# The plain / modulate norm's schedules: the tile is the same, only x + update is loaded in it.
add_rmsnorm = rms.add_rmsnorm_with(NUMERICS, add_rmsnorm_reference, LAUNCH)


rmsnorm_fast = rms.rmsnorm_fast_with(NUMERICS)


rmsnorm_modulate_fast = rms.rmsnorm_modulate_fast_with(NUMERICS)


def supports_rmsnorm(x, weight, eps, flavour) -> str | None:
    return rms.supports_rmsnorm(x, weight, eps, flavour, alignment=False, numerics=NUMERICS)


def supports_rmsnorm_modulate(x, scale, shift, weight, eps, flavour) -> str | None:
    return rms.supports_rmsnorm_modulate(x, scale, shift, weight, eps, flavour, alignment=False, numerics=NUMERICS)


def supports_add_rmsnorm(x, update, weight, eps, flavour, scale, shift) -> str | None:
    return rms.supports_add_rmsnorm(x, update, weight, eps, flavour, scale, shift, alignment=False, numerics=NUMERICS)


def gated_residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return triton_gated_residual.gated_residual(x, update, gate, block_d=1024, block_rows=2, num_warps=4)


qk_norm_rope = triton_qk_norm_rope.qk_norm_rope_with(NUMERICS, qk_norm_rope_reference)


def supports_qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout) -> str | None:
    return triton_qk_norm_rope.supports(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, numerics=NUMERICS)


qk_norm_rope_3d = triton_qk_norm_rope_3d.qk_norm_rope_3d_with(NUMERICS, qk_norm_rope_3d_reference)


def supports_qk_norm_rope_3d(q, k, q_weight, k_weight, eps, q_scale, base, flavour) -> str | None:
    return triton_qk_norm_rope_3d.supports(q, k, q_weight, k_weight, eps, q_scale, base, flavour, numerics=NUMERICS)
