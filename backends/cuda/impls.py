"""The NVIDIA impl records. Functions are named as "module:attr" strings so registering imports
neither triton nor the CUDA extension."""

from __future__ import annotations

import torch

import xbackend
from xbackend import Impl
from xbackend.kernels import triton_available

_L = "xbackend_cuda.launch"
_S = "xbackend_cuda.supports"  # no Triton import: a host without it plans this vendor's GPUs
_K = "xbackend.kernels"
# The pointwise kernels have no architecture-specific schedule: one registration covers SM90 to
# SM103 (run on SM90; compiled for SM100/SM103, not run there).
POINTWISE = "sm90..sm103"


def _cuda_ext_available() -> str | None:
    from xbackend.kernels import cuda_gated_residual

    return cuda_gated_residual.available()


# The op's tolerance for bf16 attention against the fp32 reference.
NA_TOLERANCE = xbackend.tolerance(5e-3)
HALF = frozenset({torch.bfloat16, torch.float16})
# Every impl here passed its op's gpu-marked tests (each checks the impl's precision contract against
# the reference) on an H200 (sm90) with torch 2.11 + CUDA 13.0 and Triton 3.6 (README: what has run on
# real hardware). No Blackwell (sm100, sm103) run: those targets plan these impls unverified.
H200 = (("2.11", "3.6", "sm90"),)

IMPLS: list[Impl] = [
    Impl(op="rmsnorm", name="triton", fn=f"{_L}:rmsnorm", supports=f"{_S}:supports_rmsnorm", priority=100,
         devices=POINTWISE, available=triton_available,
         description="Triton, PyTorch's fp32 reduction order reproduced (bit-exact, both flavours)", verified_on=H200),
    # One tree-sum reduction: not faster than the exact kernels at D=4096 (lab/gpu/rmsnorm_exact.py on an H200), so it
    # ranks below them and serves what they reject (odd D, misaligned rows) in looser tiers. bf16/fp16 only: in fp32
    # the tree sum lands 2 (torch) / 3 (diffusers) ulp from eager on the conformance cases (H200, GPU kit).
    Impl(op="rmsnorm", name="triton_fast", fn=f"{_L}:rmsnorm_fast",
         supports=f"{_K}.rmsnorm:supports_rmsnorm_fast_torch", priority=90, dtypes=HALF, devices=POINTWISE,
         precision=xbackend.ulp(1), available=triton_available,
         description="Triton, one tree-sum reduction, torch flavour (max 1 ulp measured on H200)", verified_on=H200),
    Impl(op="rmsnorm", name="triton_fast_diffusers", fn=f"{_L}:rmsnorm_fast",
         supports=f"{_K}.rmsnorm:supports_rmsnorm_fast_diffusers", priority=90, dtypes=HALF, devices=POINTWISE,
         precision=xbackend.ulp(2), available=triton_available,
         description="Triton, one tree-sum reduction, diffusers flavour (max 2 ulp: two roundings)", verified_on=H200),
    Impl(op="rmsnorm_modulate", name="triton", fn=f"{_L}:rmsnorm_modulate", supports=f"{_S}:supports_rmsnorm_modulate",
         priority=100, devices=POINTWISE, available=triton_available,
         description="Triton, norm + (1 + scale) + shift fused, eager's roundings (bit-exact)", verified_on=H200),
    Impl(op="rmsnorm_modulate", name="triton_fast", fn=f"{_L}:rmsnorm_modulate_fast",
         supports=f"{_K}.rmsnorm:supports_rmsnorm_modulate_fast", priority=90, devices=POINTWISE,
         precision=xbackend.tolerance(5e-3), available=triton_available,
         description="Triton fused modulate, one-sum reduction (+shift cancels: up to 64 ulp near 0)",
         verified_on=H200),
    Impl(op="add_rmsnorm", name="triton", fn=f"{_L}:add_rmsnorm", supports=f"{_S}:supports_add_rmsnorm",
         priority=100, devices=POINTWISE, available=triton_available,
         description="Triton, residual add + norm (+ modulate) in one pass, eager's roundings (bit-exact)",
         verified_on=H200),
    # Not yet run on a GPU (verified_on empty): the guard's first-use comparison decides, per input signature.
    Impl(op="layernorm_modulate", name="triton", fn=f"{_L}:layernorm_modulate",
         supports=f"{_S}:supports_layernorm_modulate", priority=100, devices=POINTWISE, available=triton_available,
         description="Triton, aten's Welford LayerNorm order + (1 + scale), shift, per-token tables (bit-exact)"),
    Impl(op="add_layernorm", name="triton", fn=f"{_L}:add_layernorm", supports=f"{_S}:supports_add_layernorm",
         priority=100, devices=POINTWISE, available=triton_available,
         description="Triton, (gated) residual add + LayerNorm (+ modulate) in one pass, eager's roundings (bit-exact)"),
    # CUDA C++ ranks above Triton; a failed build or launch falls to Triton, then the reference.
    Impl(op="gated_residual", name="cuda_vec", fn=f"{_L}:gated_residual_cuda",
         supports=f"{_K}.cuda_gated_residual:supports", priority=110, devices=POINTWISE, available=_cuda_ext_available,
         description="CUDA C++ (JIT), 16-byte vectors, row-tiled broadcast gate, no FMA (bit-exact)", verified_on=H200),
    Impl(op="gated_residual", name="triton", fn=f"{_L}:gated_residual_triton",
         supports=f"{_K}._gated_residual_layout:supports", priority=100, devices=POINTWISE, available=triton_available,
         description="Triton, row-tiled, fp fusion off (bit-exact)", verified_on=H200),
    Impl(op="rotary_embedding", name="triton", fn=f"{_K}.triton_rotary:rotary_embedding",
         supports=f"{_K}.triton_rotary_plan:supports", priority=100, devices=POINTWISE, available=triton_available,
         description="Triton interleaved RoPE: one pass, eager's fp32 roundings (bit-exact)", verified_on=H200),
    Impl(op="silu_mul", name="triton", fn=f"{_K}.triton_silu_mul:silu_mul", supports=f"{_K}.triton_silu_mul_plan:supports",
         priority=100, devices=POINTWISE, available=triton_available,
         description="Triton SwiGLU glue: libdevice expf, IEEE division, eager's two roundings (bit-exact)", verified_on=H200),
    Impl(op="qk_norm_rope", name="triton", fn=f"{_L}:qk_norm_rope", supports=f"{_S}:supports_qk_norm_rope",
         priority=100, devices=POINTWISE, available=triton_available,
         description="Triton q/k RMSNorm + RoPE in one pass, cos/sin read once (bit-exact)", verified_on=H200),
    Impl(op="qk_norm_rope_3d", name="triton", fn=f"{_L}:qk_norm_rope_3d", supports=f"{_S}:supports_qk_norm_rope_3d",
         priority=100, devices=POINTWISE, available=triton_available,
         description="Triton per-head RMSNorm + scale + 3-D axial RoPE of q and k in one pass (bit-exact)",
         verified_on=H200),
    # Hopper-tuned fused kernel, SM90 only: its schedule regressed on SM103.
    Impl(op="neighborhood_attention", name="na_triton", fn=f"{_K}.na_triton:neighborhood_attention",
         supports=f"{_K}.na_triton_config:supports", priority=100, devices="sm90", dtypes=HALF, precision=NA_TOLERANCE,
         available=triton_available, description="Triton fused NA over spatial tiles, skips masked KV blocks",
         verified_on=H200),
    Impl(op="neighborhood_attention", name="na_flex", fn=f"{_K}.na_flex:neighborhood_attention",
         supports=f"{_K}.na_flex:supports", priority=50, devices="sm80..", precision=NA_TOLERANCE,
         available=triton_available, description="flex_attention over token-permuted tiles, compact block mask",
         verified_on=H200),
    Impl(op="neighborhood_attention", name="na_tiled_sdpa", fn=f"{_K}.na_tiled_sdpa:neighborhood_attention",
         supports=f"{_K}.na_tiled_sdpa:supports", priority=10, devices="cuda", precision=NA_TOLERANCE,
         description="SDPA over each query chunk's key box (memory-bounded)", verified_on=H200),
]
