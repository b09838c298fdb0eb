"""The abstract ops, one file each: signature and checks, reference, fake impl, conformance cases, and
one ``define_op`` call (``xbackend._opspec``) that registers the rest. A new op is a file here and an
entry in ``OPS``."""

from __future__ import annotations

from .._opspec import OpSpec
from . import (
    add_layernorm,
    add_rmsnorm,
    gated_residual,
    layernorm_modulate,
    neighborhood_attention,
    qk_norm_rope,
    qk_norm_rope_3d,
    rmsnorm,
    rmsnorm_modulate,
    rotary_embedding,
    silu_mul,
)

OPS: dict[str, OpSpec] = {
    m.SPEC.name: m.SPEC
    for m in (rmsnorm, rmsnorm_modulate, add_rmsnorm, layernorm_modulate, add_layernorm, gated_residual, rotary_embedding, qk_norm_rope, qk_norm_rope_3d, neighborhood_attention,
              silu_mul)
}

__all__ = ["OPS"]
