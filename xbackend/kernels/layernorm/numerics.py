"""Which PyTorch build's LayerNorm order the exact kernel reproduces: the porting surface.

``F.layer_norm`` on a GPU runs aten's ``vectorized_layer_norm_kernel`` (``layer_norm_kernel.cu``) when
X, Y, gamma and beta are 4-element aligned, ``N % 4 == 0`` and ``N <= 2**24`` (else the two-pass
``RowwiseMomentsCUDAKernel`` + ``LayerNormForwardCUDAKernel``, which is not reproduced). Its order, for
a block of ``threads`` threads (``warp`` lanes each) per row:

* thread ``t`` reads 4-element vectors ``t, t + threads, ..`` and folds each element into its Welford
  state with ``cuWelfordOnlineSum``: ``delta = v - mean; count += 1; mean = fma(delta, 1/count, mean);
  m2 = fma(delta, v - mean, m2)``; a thread's count after its j-th element is ``j + 1``;
* ``cuWelfordCombine(own, other)`` (own = the lower lane or warp): ``count = own.count + other.count``,
  ``coef = 1/count``, ``nA = other.count * coef``, ``nB = own.count * coef``,
  ``mean = fma(nA, other.mean, nB * own.mean)``,
  ``m2 = fma((delta * delta) * other.count, nB, other.m2 + own.m2)`` with ``delta = own.mean - other.mean``;
  ``(0, 0, 0)`` when the count is 0. Threads that read nothing still combine, and merging an empty
  state is not always a no-op: ``nB = count * (1/count)`` rounds to ``1 - 2**-24`` for counts of
  41, 47, 55, 61, .. times a power of two (reachable in a 64-lane wave: 41 vectors make 164), so the
  tile keeps every thread;
* a shuffle-down tree over each warp's lanes (offsets warp/2 .. 1), then a halving tree over the warps
  (shared memory), then ``var = m2 / float(N)`` (IEEE division) and ``rstd = rsqrt(var + eps)``;
* output ``gamma * (rstd * (x - mean)) + beta``: ``fma(gamma, rstd * (x - mean), beta)``; gamma only
  ``gamma * (rstd * (x - mean))``; beta only ``fma(rstd, x - mean, beta)``; then one rounding to T.

The FMA points are nvcc's contraction (``--fmad=true``, no fast math) of those expressions; read from
the PTX and SASS nvcc 13.0 emits for sm_90 (``fma.rn.f32`` where listed, ``mul.f32``/``add.f32``
elsewhere, ``rcp.rn.f32`` for ``1.f/count``, ``div.rn.f32`` for ``/ float(N)``). LLVM's AMDGPU backend
contracts the same expression trees the same way where f32 FMA is fast (the left product of
``a*b + c*d``; ``llc`` of the contracted IR for gfx90a, the CDNA generation before gfx942/gfx950); a
target without fast f32 FMA would contract nothing, which no record here describes. Unverified on AMD
hardware.

This module is data only: it imports neither torch nor triton.
"""

from __future__ import annotations

from typing import NamedTuple

from xbackend.kernels.rmsnorm.numerics import (
    CUDA_NUMERICS,
    ROCM_NUMERICS,
    RSQRT_MATH,
    RSQRT_PTX,
    TORCH_VEC,
    Verification,
)

# Which reciprocal ``1.f / count`` is (LayerNormNumerics.recip, the kernel's RECIP constexpr).
RCP_IEEE = 0  # correctly rounded: nvcc's rcp.rn.f32 without fast math (what Triton's interpreter runs too)
RCP_AMDGCN = 1  # __builtin_amdgcn_rcpf (v_rcp_f32, 1 ulp): ROCm builds with USE_LAYERNORM_FAST_RECIPROCAL (default on)

VEC = TORCH_VEC  # vec_size: 4-element vectors for every dtype, the same constant as F.rms_norm's
MAX_EXACT_D = 16384  # widest row the kernel unrolls (128 fold steps per thread on CUDA)
MAX_VEC_N = 1 << 24  # aten vectorizes rows of at most 2**24 elements (its count is a float)


class LayerNormNumerics(NamedTuple):
    """The constants of one PyTorch build that fix ``F.layer_norm``'s fp32 order (not tunables)."""

    threads: int  # num_threads() of the vectorized kernel's block (warp x num_threads()/warp)
    warp: int  # at::cuda::warp_size(): lanes of the shuffle tree
    rsqrt: int  # numerics.RSQRT_PTX or RSQRT_MATH: what c10::cuda::compat::rsqrt is
    recip: int  # RCP_IEEE or RCP_AMDGCN: what the Welford's 1.f / count is
    torch_versions: tuple[str, ...] = ()  # PyTorch versions whose aten sources give these constants
    verified_on: tuple[Verification, ...] = ()  # hardware runs that compared outputs bit for bit


# F.layer_norm launches the same block as F.rms_norm (launch_vectorized_layer_norm_kernel, rms_norm=false),
# so the threads, lanes and rsqrt are the RMSNorm record's. Not yet run on a GPU.
CUDA_LN_NUMERICS = LayerNormNumerics(
    threads=CUDA_NUMERICS.torch_threads,
    warp=CUDA_NUMERICS.warp,
    rsqrt=RSQRT_PTX,
    recip=RCP_IEEE,
    torch_versions=("2.11", "2.13"),
    verified_on=(),
)

# ROCm: the RMSNorm record's block (its thread count unchecked against torch 2.13, see rmsnorm.numerics),
# ocml's rsqrt and the fast reciprocal of gfx942/gfx950 builds. Never run on an AMD GPU.
ROCM_LN_NUMERICS = LayerNormNumerics(
    threads=ROCM_NUMERICS.torch_threads,
    warp=ROCM_NUMERICS.warp,
    rsqrt=RSQRT_MATH,
    recip=RCP_AMDGCN,
    torch_versions=("2.11", "2.13"),
    verified_on=(),
)

__all__ = [
    "CUDA_LN_NUMERICS",
    "MAX_EXACT_D",
    "MAX_VEC_N",
    "RCP_AMDGCN",
    "RCP_IEEE",
    "ROCM_LN_NUMERICS",
    "VEC",
    "LayerNormNumerics",
]
