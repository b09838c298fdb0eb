"""Launches for Nsight Compute: the shipped qk_norm_rope_3d kernel on a DiffVAE stage-5 tile, and for
comparison the exact torch-flavour RMSNorm of the same per-head rows (one tensor), 3 times each.

    bash lab/gpu/qk3d_ncu.sh    # ncu over these, the metrics that say what bounds each kernel
"""

from __future__ import annotations

import torch
import xbackend_cuda.launch as nvidia

from xbackend.kernels import rmsnorm as R
from xbackend.kernels import triton_qk_norm_rope_3d as K


def main() -> None:
    shape = (1, 40, 96, 96, 4, 64)
    g = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)
    k = torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16)
    w = (1 + 0.3 * torch.randn(64, generator=g, device="cuda")).to(torch.bfloat16)
    for _ in range(3):
        K.qk_norm_rope_3d(q, k, w, w, 1e-6, 0.125, 10000.0, "torch", numerics=nvidia.NUMERICS, traits=nvidia.LAUNCH)
    for _ in range(3):
        R.rmsnorm(q, w, 1e-6, "torch", numerics=nvidia.NUMERICS, traits=nvidia.LAUNCH)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
