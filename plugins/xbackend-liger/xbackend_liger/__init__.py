"""xbackend-liger: Liger-Kernel's Triton RMSNorm, modulated RMSNorm and RoPE as an xbackend plugin."""

from .impl import available, qk_norm_rope, rmsnorm, rmsnorm_modulate, rotary_embedding

__all__ = ["available", "qk_norm_rope", "rmsnorm", "rmsnorm_modulate", "rotary_embedding"]
