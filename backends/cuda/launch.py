"""NVIDIA launch configurations for the shared kernels (imported on first use, never at registration).

Every vendor decision the shared RMSNorm kernels need is made here, as data: the PyTorch build whose
reduction order they reproduce (``NUMERICS``), and the launch traits measured on the H200
(``LAUNCH``: programmatic dependent launch on sm90+, the tuned torch-flavour schedule). Configs are the
ones measured on the H200 (the scripts lab/README.md lists; docs/performance.md); SM100/SM103 run the same
arch-independent pointwise schedules, compiled for them but not tuned or run there.
"""

from __future__ import annotations

from xbackend.kernels import cuda_gated_residual, triton_gated_residual
from xbackend.kernels import layernorm as ln
from xbackend.kernels import rmsnorm as rms
from xbackend.kernels.vendor_kernels import VendorKernels

# The order of CUDA builds of PyTorch (128 threads per row, decreasing shuffles, rsqrt.approx.f32).
NUMERICS = rms.CUDA_NUMERICS
# F.layer_norm's on the same block: Welford per thread, rcp.rn.f32, nvcc's FMA points.
LN_NUMERICS = ln.CUDA_LN_NUMERICS
S, ARKB, MERGED = rms.Schedule, rms.ARR_ARKB, rms.ARR_MERGED

LAUNCH = rms.LaunchTraits(
    # Hopper's griddepcontrol: compute capability 9 and up. Back-to-back [1, 32640, 4096] bf16
    # torch-flavour norms on the H200 (2 rows per 8-warp program): 130.7-130.8 -> 129.2-129.5 us per
    # call, bit-identical (lab/gpu/rmsnorm_persist.py --pdl at commit 5ce8995,
    # lab/results/h200/rmsnorm_pdl_variant.txt).
    pdl_min_major=9,
    # Schedules measured faster than the default on the H200, by (op kind, D or (d_min, d_max), element
    # size); everything else keeps the default (lab/gpu/rmsnorm_narrow.py prints entries in this form).
    schedules=rms.schedule_table(
        {
            # The plain torch-flavour norm at D = 4096, 2-byte elements: two rows per 8-warp program beat one
            # per 4 warps by 0.5-1.2 us at [32640, 4096] bf16 in four H200 runs (lab/gpu/rmsnorm_sweep.py and
            # lab/gpu/rmsnorm_cuda.py at commit 5ce8995; lab/results/h200/rmsnorm_sweep*, rmsnorm_cuda.*). fp16
            # moves the same bytes; fp32 rows are unmeasured and keep the default. Not for the diffusers
            # flavour (25-45% slower that way) nor the modulate.
            ("rmsnorm-torch", 4096, 2): rms.Schedule(rows_per_program=2, num_warps=8),
            # Narrow rows, 2-byte elements: the best of each (op kind, D) in one H200 sweep, where it beat
            # the default by >= 1 point of copy_; every schedule bit-identical to eager there
            # (python3 lab/gpu/rmsnorm_narrow.py --budget-s 140, lab/results/h200/rmsnorm_narrow.txt: % of
            # copy_ of the same bytes, lowest over the D's shapes, 2026-12-01). Torch-flavour rows of
            # <= 256 elements need `trim` (the default tile leaves 1/2 to 7/8 of its lanes idle: 24% of
            # copy_ at D = 64); modulates want `flat_mod` (scale/shift loaded once per program). Diffusers
            # rows of 64 need `trim` too (half of aten's four accumulators per thread are empty there);
            # [d64]: measured by `--d 64 --kinds rmsnorm-diffusers,modulate-diffusers`, 2026-12-02
            # (lab/results/h200/rmsnorm_narrow_d64.txt).
            ("rmsnorm-torch", 64, 2): S(rows_per_program=32, num_warps=2, arrangement=ARKB, trim=True),  # 103.5% (24%)
            ("rmsnorm-torch", 128, 2): S(rows_per_program=16, num_warps=2, arrangement=ARKB, trim=True),  # 104.7% (47%)
            ("rmsnorm-torch", 256, 2): S(rows_per_program=8, num_warps=2, arrangement=ARKB, trim=True),  # 103.1% (85%)
            ("rmsnorm-torch", 512, 2): S(rows_per_program=4, num_warps=4, arrangement=ARKB),  # 104.8% (102%)
            ("rmsnorm-torch", 1000, 2): S(rows_per_program=2, num_warps=2, arrangement=ARKB),  # 94.2% (92%)
            ("rmsnorm-torch", 1024, 2): S(rows_per_program=2, num_warps=4, arrangement=ARKB),  # 104.2% (102%)
            ("rmsnorm-torch", 2048, 2): S(rows_per_program=1, num_warps=4, arrangement=ARKB),  # 104.2% (101%)
            ("rmsnorm-diffusers", 64, 2): S(rows_per_program=32, num_warps=4, arrangement=ARKB, trim=True),  # 102.9% (72%) [d64]
            ("rmsnorm-diffusers", 128, 2): S(rows_per_program=16, num_warps=4, arrangement=ARKB),  # 104.1% (103%)
            ("rmsnorm-diffusers", 512, 2): S(rows_per_program=4, num_warps=2, arrangement=ARKB),  # 104.6% (102%)
            ("rmsnorm-diffusers", 1024, 2): S(rows_per_program=2, num_warps=2, arrangement=ARKB),  # 103.9% (102%)
            ("rmsnorm-diffusers", 2048, 2): S(rows_per_program=4, num_warps=4, arrangement=ARKB),  # 101.8% (86%)
            ("modulate-torch", 64, 2): S(rows_per_program=32, num_warps=4, arrangement=MERGED, trim=True, flat_mod=True),  # 103.0% (13%)
            ("modulate-torch", 128, 2): S(rows_per_program=32, num_warps=4, arrangement=MERGED, trim=True, flat_mod=True),  # 102.1% (26%)
            ("modulate-torch", 256, 2): S(rows_per_program=8, num_warps=2, arrangement=ARKB, trim=True, flat_mod=True),  # 102.7% (50%)
            ("modulate-torch", 512, 2): S(rows_per_program=4, num_warps=4, arrangement=ARKB, flat_mod=True),  # 104.4% (92%)
            ("modulate-torch", 768, 2): S(rows_per_program=2, num_warps=2, arrangement=ARKB, flat_mod=True),  # 103.7% (58%)
            ("modulate-torch", 1000, 2): S(rows_per_program=2, num_warps=2, arrangement=ARKB, flat_mod=True),  # 93.0% (69%)
            ("modulate-torch", 1024, 2): S(rows_per_program=2, num_warps=4, arrangement=ARKB, flat_mod=True),  # 104.0% (99%)
            ("modulate-torch", 2048, 2): S(rows_per_program=1, num_warps=4, arrangement=ARKB, flat_mod=True),  # 104.1% (101%)
            ("modulate-diffusers", 64, 2): S(rows_per_program=32, num_warps=4, arrangement=MERGED, trim=True, flat_mod=True),  # 102.8% (48%) [d64]
            ("modulate-diffusers", 128, 2): S(rows_per_program=16, num_warps=4, arrangement=MERGED, flat_mod=True),  # 103.5% (79%)
            ("modulate-diffusers", 256, 2): S(rows_per_program=8, num_warps=4, arrangement=MERGED, flat_mod=True),  # 102.7% (97%)
            ("modulate-diffusers", 512, 2): S(rows_per_program=4, num_warps=4, arrangement=ARKB, flat_mod=True),  # 103.9% (101%)
            ("modulate-diffusers", 768, 2): S(rows_per_program=2, num_warps=2, arrangement=ARKB, flat_mod=True),  # 102.7% (99%)
            ("modulate-diffusers", 1000, 2): S(flat_mod=True),  # 90.9% (88%)
            ("modulate-diffusers", 1024, 2): S(rows_per_program=2, num_warps=2, arrangement=ARKB, flat_mod=True),  # 103.0% (101%)
            ("modulate-diffusers", 2048, 2): S(rows_per_program=4, num_warps=4, arrangement=ARKB, flat_mod=True),  # 100.9% (80%)
            # The DiffVAE's q/k prelude, head_dim 64: 16 rows per 2-warp program, trimmed, 200 us (90% of
            # copy_) on a stage-5 tile; 8 rows per warp ties it, more rows per thread lose 10-30 points
            # (python3 lab/gpu/qk3d_sweep.py, lab/results/h200/qk3d_sweep.txt, 2026-12-02).
            ("qk_norm_rope_3d-torch", (8, 128), 2): S(rows_per_program=16, num_warps=2, trim=True),
        }
    ),
)

# The shared kernels' entry points (rmsnorm, supports_rmsnorm, ..., VendorKernels.NAMES) for this data.
KERNELS = VendorKernels(NUMERICS, LAUNCH, LN_NUMERICS)

# Defaults measured best on the H200: 1024/512/256-wide column blocks, 4 rows, 4 warps (lab/gpu/gated_residual.py).
gated_residual_triton = triton_gated_residual.gated_residual


def __getattr__(name: str) -> object:
    # The registered impl's fn is looked up once (Impl.resolved caches it for the process) and entry()
    # builds the extension first, so what is cached is the C function itself, not a Python wrapper
    # around it (on the small shapes one Python frame is ~0.1-0.3 µs of a ~10 µs call).
    if name == "gated_residual_cuda":
        return cuda_gated_residual.entry()
    return KERNELS.attribute(__name__, name)
