"""The shared kernels' ``supports`` predicates bound to one vendor's numerics: what a vendor backend
registers as its impls' ``supports``.

Nothing here imports Triton (the kernels' launch modules do, on first use), so a host without Triton
plans a simulated GPU exactly as one with it does. The exact RMSNorm and LayerNorm kernels answer a call
whose pointers aten would not vectorize with the op's reference (``rmsnorm_with``,
``layernorm_modulate_with``), so their predicates leave pointer alignment out (``alignment=False``).
"""

from __future__ import annotations

import functools

from xbackend.kernels import triton_qk_norm_rope_3d_plan, triton_qk_norm_rope_plan
from xbackend.kernels.layernorm import supports as ln
from xbackend.kernels.layernorm.numerics import LayerNormNumerics
from xbackend.kernels.rmsnorm import supports as rms
from xbackend.kernels.rmsnorm.numerics import Numerics

__all__ = ["VendorSupports"]


class VendorSupports:
    """The predicates for one vendor's ``numerics`` and ``layernorm`` numerics (the PyTorch build whose
    orders the kernels reproduce)."""

    def __init__(self, numerics: Numerics, layernorm: LayerNormNumerics) -> None:
        self.numerics = numerics
        self.layernorm = layernorm
        self.supports_rmsnorm = functools.partial(rms.supports_rmsnorm, alignment=False, numerics=numerics)
        self.supports_rmsnorm_modulate = functools.partial(rms.supports_rmsnorm_modulate, alignment=False,
                                                           numerics=numerics)  # fmt: skip
        self.supports_add_rmsnorm = functools.partial(rms.supports_add_rmsnorm, alignment=False, numerics=numerics)
        self.supports_qk_norm_rope = functools.partial(triton_qk_norm_rope_plan.supports, numerics=numerics)
        self.supports_qk_norm_rope_3d = functools.partial(triton_qk_norm_rope_3d_plan.supports, numerics=numerics)
        self.supports_layernorm_modulate = functools.partial(ln.supports_layernorm_modulate, alignment=False,
                                                             numerics=layernorm)  # fmt: skip
        self.supports_add_layernorm = functools.partial(ln.supports_add_layernorm, alignment=False, numerics=layernorm)
