"""Hardware counters for issue 3's gap: copy_ of the same bytes, the production Triton RMSNorm (torch
flavour), the CUDA one-warp-per-row kernel (lab/gpu/rmsnorm_cuda.py) and torch.compile's kernel, each once
at [1, 32640, 4096] bf16 inside a profiler range.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --csv --page details python3 lab/gpu/rmsnorm_ncu.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rmsnorm_cuda import cuda_rmsnorm

from xbackend.kernels import triton_rmsnorm

EPS = 1e-6


def main() -> None:
    shape = (1, 32640, 4096)
    x = torch.randn(shape, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(x)
    w = (1 + 0.5 * torch.randn(shape[-1], device="cuda")).to(torch.bfloat16)
    compiled = torch.compile(lambda t: F.rms_norm(t, (shape[-1],), w, EPS))
    runs = {
        "copy_": lambda: out.copy_(x),
        "triton": lambda: triton_rmsnorm.rmsnorm(x, w, EPS, "torch", rows_per_program=1, num_warps=4),
        "triton_tuned": lambda: triton_rmsnorm.rmsnorm(x, w, EPS, "torch"),  # 2 rows per 8-warp program
        "cuda_warp": lambda: cuda_rmsnorm(x, w, EPS, "torch", warps_per_block=1),
        "compile": lambda: compiled(x),
    }
    for fn in runs.values():  # builds, autotuning and first launches outside the profiled range
        fn()
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, fn in runs.items():
        torch.cuda.nvtx.range_push(name)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()
    print("profiled:", ", ".join(runs))


if __name__ == "__main__":
    main()
