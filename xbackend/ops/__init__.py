"""The abstract ops, one file each: signature and checks, reference, fake impl, custom op."""

from __future__ import annotations

from .._opspec import OpSpec
from . import gated_residual, neighborhood_attention, rmsnorm, rmsnorm_modulate, rotary_embedding

OPS: dict[str, OpSpec] = {
    m.SPEC.name: m.SPEC for m in (rmsnorm, rmsnorm_modulate, gated_residual, rotary_embedding, neighborhood_attention)
}

__all__ = ["OPS"]
