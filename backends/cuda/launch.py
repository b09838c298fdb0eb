"""NVIDIA launch configurations for the shared kernels (imported on first use, never at registration).

Every vendor decision the shared RMSNorm kernels need is made here, as data: the PyTorch build whose
reduction order they reproduce (``NUMERICS``), and the launch traits measured on the H200
(``LAUNCH``: programmatic dependent launch on sm90+, the tuned torch-flavour schedule). Configs are the
ones measured on the H200 (lab/gpu/*.py; docs/performance.md); SM100/SM103 run the same
arch-independent pointwise schedules, compiled for them but not tuned or run there.
"""

from __future__ import annotations

from xbackend.kernels import cuda_gated_residual, triton_gated_residual, triton_qk_norm_rope
from xbackend.kernels import rmsnorm as rms
from xbackend.ops.qk_norm_rope import reference as qk_norm_rope_reference
from xbackend.ops.rmsnorm import reference as rmsnorm_reference
from xbackend.ops.rmsnorm_modulate import reference as modulate_reference

# The order of CUDA builds of PyTorch (128 threads per row, decreasing shuffles, rsqrt.approx.f32).
NUMERICS = rms.CUDA_NUMERICS

LAUNCH = rms.LaunchTraits(
    # Hopper's griddepcontrol: compute capability 9 and up. Back-to-back [1, 32640, 4096] bf16
    # torch-flavour norms on the H200 (2 rows per 8-warp program): 130.7-130.8 -> 129.2-129.5 us per
    # call, bit-identical (lab/gpu/rmsnorm_persist.py --pdl, lab/results/h200/rmsnorm_pdl_variant.txt).
    pdl_min_major=9,
    # The plain torch-flavour norm at D = 4096, 2-byte elements: two rows per 8-warp program beat one per
    # 4 warps by 0.5-1.2 us at [32640, 4096] bf16 in four H200 runs (lab/gpu/rmsnorm_sweep.py,
    # lab/gpu/rmsnorm_cuda.py). fp16 moves the same bytes; fp32 rows and other D are unmeasured and keep
    # the default. Not for the diffusers flavour (25-45% slower that way) nor the modulate.
    torch_rmsnorm=(((4096, 2), rms.Schedule(rows_per_program=2, num_warps=8)),),
)

rmsnorm = rms.rmsnorm_with(NUMERICS, rmsnorm_reference, LAUNCH)


rmsnorm_modulate = rms.rmsnorm_modulate_with(NUMERICS, modulate_reference, LAUNCH)


rmsnorm_fast = rms.rmsnorm_fast_with(NUMERICS)


rmsnorm_modulate_fast = rms.rmsnorm_modulate_fast_with(NUMERICS)


def supports_rmsnorm(x, weight, eps, flavour) -> str | None:
    return rms.supports_rmsnorm(x, weight, eps, flavour, alignment=False, numerics=NUMERICS)


def supports_rmsnorm_modulate(x, scale, shift, weight, eps, flavour) -> str | None:
    return rms.supports_rmsnorm_modulate(x, scale, shift, weight, eps, flavour, alignment=False, numerics=NUMERICS)


# Defaults measured best on the H200: 1024/512/256-wide column blocks, 4 rows, 4 warps (lab/gpu/gated_residual.py).
gated_residual_triton = triton_gated_residual.gated_residual


def __getattr__(name: str) -> object:
    # The registered impl's fn is looked up once (Impl.resolved caches it for the process) and entry()
    # builds the extension first, so what is cached is the C function itself, not a Python wrapper
    # around it (on the small shapes one Python frame is ~0.1-0.3 µs of a ~10 µs call).
    if name == "gated_residual_cuda":
        return cuda_gated_residual.entry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


qk_norm_rope = triton_qk_norm_rope.qk_norm_rope_with(NUMERICS, qk_norm_rope_reference)


def supports_qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout) -> str | None:
    return triton_qk_norm_rope.supports(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout, numerics=NUMERICS)
