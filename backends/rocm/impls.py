"""The AMD impl records. None of these has run on AMD hardware here: they are planned and tested on
CPU through simulated gfx942/gfx950 probes, and every one is verified by the guard on first use."""

from __future__ import annotations

import torch

import xbackend
from xbackend import Impl
from xbackend.kernels import triton_available

_L = "xbackend_rocm.launch"
_S = "xbackend_rocm.supports"  # no Triton import: a host without it plans this vendor's GPUs
_K = "xbackend.kernels"
CDNA = "gfx942,gfx950"  # MI300X/MI325X, MI350X/MI355X
HALF = frozenset({torch.float16, torch.bfloat16})
NA_TOLERANCE = xbackend.tolerance(5e-3)


def _aiter_available() -> str | None:
    if not torch.version.hip:
        return "aiter needs a ROCm build of torch"
    from xbackend.kernels import aiter_rmsnorm

    return aiter_rmsnorm.available()


IMPLS: list[Impl] = [
    # xDiT swaps diffusers' RMSNorm for AITER's CK kernel on MI350. One rounding, so it is
    # ulp-bounded, never exact; below the Triton kernel that reproduces the reference bit for bit.
    Impl(op="rmsnorm", name="aiter", fn=f"{_K}.aiter_rmsnorm:rmsnorm", supports=f"{_K}.aiter_rmsnorm:supports_torch_flavour",
         priority=120, devices=CDNA, dtypes=HALF,
         precision=xbackend.ulp(1), available=_aiter_available, description="AMD AITER CK rms_norm (flavour torch)"),
    Impl(op="rmsnorm", name="aiter_diffusers", fn=f"{_K}.aiter_rmsnorm:rmsnorm",
         supports=f"{_K}.aiter_rmsnorm:supports_diffusers_flavour", priority=120, devices=CDNA,
         precision=xbackend.ulp(2), available=_aiter_available,
         description="AMD AITER CK rms_norm standing in for diffusers' two-rounding RMSNorm"),
    Impl(op="rmsnorm", name="triton", fn=f"{_L}:rmsnorm", supports=f"{_S}:supports_rmsnorm", priority=100,
         devices=CDNA, available=triton_available, description="Triton, a ROCm build's reduction order reproduced"),
    # bf16/fp16 only, as on CUDA: in fp32 the same tree sum landed 2-3 ulp from eager there.
    Impl(op="rmsnorm", name="triton_fast", fn=f"{_L}:rmsnorm_fast",
         supports=f"{_K}.rmsnorm:supports_rmsnorm_fast_torch", priority=90, dtypes=HALF, devices=CDNA,
         precision=xbackend.ulp(1), available=triton_available),
    Impl(op="rmsnorm", name="triton_fast_diffusers", fn=f"{_L}:rmsnorm_fast",
         supports=f"{_K}.rmsnorm:supports_rmsnorm_fast_diffusers", priority=90, dtypes=HALF, devices=CDNA,
         precision=xbackend.ulp(2), available=triton_available),
    Impl(op="rmsnorm_modulate", name="triton", fn=f"{_L}:rmsnorm_modulate", supports=f"{_S}:supports_rmsnorm_modulate",
         priority=100, devices=CDNA, available=triton_available),
    Impl(op="rmsnorm_modulate", name="triton_fast", fn=f"{_L}:rmsnorm_modulate_fast",
         supports=f"{_K}.rmsnorm:supports_rmsnorm_modulate_fast", priority=90, devices=CDNA,
         precision=xbackend.tolerance(5e-3), available=triton_available),
    Impl(op="add_rmsnorm", name="triton", fn=f"{_L}:add_rmsnorm", supports=f"{_S}:supports_add_rmsnorm",
         priority=100, devices=CDNA, available=triton_available,
         description="Triton, residual add + norm (+ modulate), a ROCm build's order"),
    Impl(op="layernorm_modulate", name="triton", fn=f"{_L}:layernorm_modulate",
         supports=f"{_S}:supports_layernorm_modulate", priority=100, devices=CDNA, available=triton_available,
         description="Triton, a ROCm build's Welford LayerNorm order + modulate, per-token tables"),
    Impl(op="add_layernorm", name="triton", fn=f"{_L}:add_layernorm", supports=f"{_S}:supports_add_layernorm",
         priority=100, devices=CDNA, available=triton_available,
         description="Triton, (gated) residual add + LayerNorm (+ modulate), a ROCm build's order"),
    Impl(op="gated_residual", name="triton", fn=f"{_L}:gated_residual", supports=f"{_K}._gated_residual_layout:supports",
         priority=100, devices=CDNA, available=triton_available, description="Triton, fp fusion off (bit-exact)"),
    Impl(op="rotary_embedding", name="triton", fn=f"{_K}.triton_rotary:rotary_embedding",
         supports=f"{_K}.triton_rotary_plan:supports", priority=100, devices=CDNA, available=triton_available,
         description="Triton interleaved RoPE, fp32 IEEE steps as eager rounds them"),
    Impl(op="silu_mul", name="triton", fn=f"{_K}.triton_silu_mul:silu_mul", supports=f"{_K}.triton_silu_mul_plan:supports",
         priority=100, devices=CDNA, available=triton_available,
         description="Triton SwiGLU glue: ocml expf (what HIP's expf calls), IEEE division, eager's two roundings"),
    Impl(op="qk_norm_rope", name="triton", fn=f"{_L}:qk_norm_rope", supports=f"{_S}:supports_qk_norm_rope",
         priority=100, devices=CDNA, available=triton_available,
         description="Triton q/k RMSNorm (a ROCm build's order) + RoPE in one pass"),
    Impl(op="qk_norm_rope_3d", name="triton", fn=f"{_L}:qk_norm_rope_3d", supports=f"{_S}:supports_qk_norm_rope_3d",
         priority=100, devices=CDNA, available=triton_available,
         description="Triton per-head RMSNorm (a ROCm build's order) + scale + 3-D axial RoPE in one pass"),
    Impl(op="neighborhood_attention", name="na_flex", fn=f"{_K}.na_flex:neighborhood_attention",
         supports=f"{_K}.na_flex:supports", priority=50, devices=CDNA, precision=NA_TOLERANCE,
         available=triton_available, description="flex_attention over token-permuted tiles (portable path)"),
    Impl(op="neighborhood_attention", name="na_tiled_sdpa", fn=f"{_K}.na_tiled_sdpa:neighborhood_attention",
         supports=f"{_K}.na_tiled_sdpa:supports", priority=10, devices="rocm", precision=NA_TOLERANCE,
         description="SDPA over each query chunk's key box (memory-bounded fallback)"),
]
