"""Which PyTorch build's reduction order the exact RMSNorm kernels reproduce: the porting surface.

Everything build-specific about the order is one ``Numerics`` record: the constants of the aten CUDA/HIP
kernels behind ``F.rms_norm`` (``layer_norm_kernel.cu``, ``rms_norm=true``) and ``x.pow(2).mean(-1)``
(``Reduce.cuh``, ``MeanOps``) that decide in which order fp32 squares are added, and which reciprocal
square root the build calls. The exact kernels specialise on these fields and on nothing else about a
vendor. A record also says which PyTorch versions' sources it was read from and on which hardware its
outputs were compared with eager PyTorch bit for bit (``verified_on``; empty: never run).

A new PyTorch build with another order is a new record here, a numpy transliteration of that order in
``tests/kernels/test_triton_rmsnorm.py``, and a backend passing the record (``backends/<vendor>/launch.py``).
This module is data only: it imports neither torch nor triton.
"""

from __future__ import annotations

from typing import NamedTuple

# The two reference expressions whose orders are reproduced; a flavour's code (the kernels' FLAVOUR
# constexpr) is its index here.
FLAVOURS = ("torch", "diffusers")
FLAVOUR_TORCH = FLAVOURS.index("torch")  # F.rms_norm -> aten _fused_rms_norm (layer_norm_kernel.cu)
FLAVOUR_DIFFUSERS = FLAVOURS.index("diffusers")  # x.float().pow(2).mean(-1) -> Reduce.cuh MeanOps

# aten constants every build shares (not Numerics fields: no build differs in them).
TORCH_VEC = 4  # layer_norm_kernel.cu vec_size: 4-element vectors for every dtype
MEAN_VEC = 4  # Reduce.cuh input_vec_size == vt0 == 4 for fp32 input (the squares are fp32): 4 accumulators

# Which reciprocal square root the kernels call (Numerics.rsqrt, the kernels' RSQRT constexpr).
RSQRT_PTX = 0  # inline `rsqrt.approx.f32`: what nvcc emits for rsqrtf, aten's rsqrt on CUDA
RSQRT_MATH = 1  # tl.math.rsqrt: ocml's rsqrt on ROCm, and the only one Triton's interpreter can run

# C10_WARP_SIZE of each vendor's build: the lanes of one warp (NVIDIA) or wavefront (AMD CDNA).
CUDA_WARP = 32
ROCM_WAVEFRONT = 64

# How the exact kernel's loaded tile is arranged (the ARR constexpr). Performance only: the order of
# the tile's axes steers Triton's load layout, never the arithmetic.
ARR_ARKB = 0  # [A, R, K, B]: 4-element vectors, one Triton lane per emulated thread
ARR_MERGED = 2  # [A*B, R, K]: 16-byte vectors, two emulated threads per Triton lane


class Verification(NamedTuple):
    """One run on hardware that compared the kernels' outputs with eager PyTorch by ``torch.equal``."""

    device: str
    torch: str
    triton: str
    evidence: str


class Numerics(NamedTuple):
    """The constants of one PyTorch build that fix the fp32 reduction order (not tunables)."""

    torch_threads: int  # threads per row of aten's vectorized layer-norm kernel: num_threads()
    warp: int  # C10_WARP_SIZE: lanes of aten's shuffle trees
    mean_shfl_increasing: bool  # Reduce.cuh block_x_reduce shuffles offsets 1, 2, 4, .. (else .., 4, 2, 1)
    mean_x_first: bool  # Reduce.cuh reduces block x before block y (else after)
    rsqrt: int  # RSQRT_PTX or RSQRT_MATH: what the build's rsqrtf is
    torch_versions: tuple[str, ...] = ()  # PyTorch versions whose aten sources give these constants
    verified_on: tuple[Verification, ...] = ()  # hardware runs that compared outputs bit for bit


H200_TORCH_2_11 = Verification(
    device="NVIDIA H200 (sm90)",
    torch="2.11.0+cu130",
    triton="3.6",
    evidence="lab/gpu/rmsnorm_exact.py and the gpu-marked tests: per-row statistics equal aten's own, outputs "
    "torch.equal over >= 16.8M random elements per shape, both flavours, bf16/fp16/fp32, with the modulate",
)

# CUDA builds: num_threads() = 4 warps of 32, shuffle offsets decreasing ("fix CUDA to have offset
# decreasing"), block x before block y. torch 2.13's shipped Reduce.cuh and thread_constants.h read the same.
CUDA_NUMERICS = Numerics(
    torch_threads=4 * CUDA_WARP,
    warp=CUDA_WARP,
    mean_shfl_increasing=False,
    mean_x_first=True,
    rsqrt=RSQRT_PTX,
    torch_versions=("2.11", "2.13"),
    verified_on=(H200_TORCH_2_11,),
)

# ROCm builds, read from the `#if USE_ROCM` branches: wave64, increasing shuffle offsets, ocml's rsqrt.
# Never run on an AMD GPU. torch_threads = 1024 is unchecked against torch 2.13, whose thread_constants.h
# gives num_threads() = 256 under USE_ROCM; the guard's first-use comparison decides on hardware.
ROCM_NUMERICS = Numerics(
    torch_threads=1024,
    warp=ROCM_WAVEFRONT,
    mean_shfl_increasing=True,
    mean_x_first=True,
    rsqrt=RSQRT_MATH,
    torch_versions=("2.11", "2.13"),
    verified_on=(),
)

__all__ = [
    "ARR_ARKB",
    "ARR_MERGED",
    "CUDA_NUMERICS",
    "CUDA_WARP",
    "FLAVOURS",
    "FLAVOUR_DIFFUSERS",
    "FLAVOUR_TORCH",
    "H200_TORCH_2_11",
    "MEAN_VEC",
    "ROCM_NUMERICS",
    "ROCM_WAVEFRONT",
    "RSQRT_MATH",
    "RSQRT_PTX",
    "TORCH_VEC",
    "Numerics",
    "Verification",
]
