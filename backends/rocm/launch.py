"""AMD launch configurations for the shared Triton kernels (CDNA3 gfx942, CDNA4 gfx950).

Not run on AMD hardware here. CDNA runs 64-wide wavefronts, so the same tile wants half the warps;
the RMSNorm kernels reproduce a ROCm build's reduction order (``NUMERICS``: 1024 threads, wave64,
increasing shuffle offsets, ocml's rsqrt: docs/exactness.md) and the guard verifies that on first use.
``LAUNCH`` leaves programmatic dependent launch off (a CUDA feature) and tunes nothing.
"""

from __future__ import annotations

import torch

from xbackend.kernels import layernorm as ln
from xbackend.kernels import rmsnorm as rms
from xbackend.kernels import triton_gated_residual
from xbackend.kernels.vendor_kernels import VendorKernels

NUMERICS = rms.ROCM_NUMERICS
LN_NUMERICS = ln.ROCM_LN_NUMERICS  # the same block, ocml's rsqrt, the fast v_rcp_f32 reciprocal
LAUNCH = rms.LaunchTraits(pdl_min_major=None, schedules=())

# The shared kernels' entry points (rmsnorm, supports_rmsnorm, ..., VendorKernels.NAMES) for this data.
KERNELS = VendorKernels(NUMERICS, LAUNCH, LN_NUMERICS)


def __getattr__(name: str) -> object:
    return KERNELS.attribute(__name__, name)


def gated_residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return triton_gated_residual.gated_residual(x, update, gate, block_d=1024, block_rows=2, num_warps=4)
