"""The shared Triton kernels bound to one vendor's data: the entry points a vendor backend registers.

The RMSNorm and LayerNorm families and the q/k preludes run the same Triton code on every vendor; what
differs is data the vendor's launch module holds (``backends/<vendor>/launch.py``): the PyTorch build
whose reduction orders the exact kernels reproduce (``Numerics``, ``LayerNormNumerics``) and the launch
traits measured on its hardware (``LaunchTraits``). That module builds one :class:`VendorKernels` from them and serves its attributes
as its own (a module ``__getattr__``), so the impl records keep naming ``"<launch module>:rmsnorm"``.
"""

from __future__ import annotations

from xbackend.kernels import layernorm as ln
from xbackend.kernels import rmsnorm as rms
from xbackend.kernels import triton_qk_norm_rope, triton_qk_norm_rope_3d
from xbackend.ops.add_layernorm import reference as add_layernorm_reference
from xbackend.ops.add_rmsnorm import reference as add_rmsnorm_reference
from xbackend.ops.layernorm_modulate import reference as layernorm_modulate_reference
from xbackend.ops.qk_norm_rope import reference as qk_norm_rope_reference
from xbackend.ops.qk_norm_rope_3d import reference as qk_norm_rope_3d_reference
from xbackend.ops.rmsnorm import reference as rmsnorm_reference
from xbackend.ops.rmsnorm_modulate import reference as modulate_reference

__all__ = ["VendorKernels"]


class VendorKernels:
    """The shared kernels' entry points for one vendor's ``numerics``, ``launch`` traits and ``layernorm``
    numerics.

    Each entry point is built once, here; their ``supports`` predicates, which must import no Triton,
    are ``vendor_supports.VendorSupports``.
    """

    # The attributes a vendor's launch module serves from here.
    NAMES = (
        "rmsnorm", "rmsnorm_modulate", "add_rmsnorm", "rmsnorm_fast", "rmsnorm_modulate_fast", "qk_norm_rope",
        "qk_norm_rope_3d", "layernorm_modulate", "add_layernorm",
    )  # fmt: skip

    def __init__(self, numerics: rms.Numerics, launch: rms.LaunchTraits, layernorm: ln.LayerNormNumerics) -> None:
        self.numerics = numerics
        self.launch = launch
        self.layernorm = layernorm
        self.rmsnorm = rms.rmsnorm_with(numerics, rmsnorm_reference, launch)
        self.rmsnorm_modulate = rms.rmsnorm_modulate_with(numerics, modulate_reference, launch)
        # The plain / modulate norm's schedules: the tile is the same, only x + update is loaded in it.
        self.add_rmsnorm = rms.add_rmsnorm_with(numerics, add_rmsnorm_reference, launch)
        self.rmsnorm_fast = rms.rmsnorm_fast_with(numerics)
        self.rmsnorm_modulate_fast = rms.rmsnorm_modulate_fast_with(numerics)
        self.qk_norm_rope = triton_qk_norm_rope.qk_norm_rope_with(numerics, qk_norm_rope_reference)
        self.qk_norm_rope_3d = triton_qk_norm_rope_3d.qk_norm_rope_3d_with(numerics, qk_norm_rope_3d_reference, launch)
        self.layernorm_modulate = ln.layernorm_modulate_with(layernorm, layernorm_modulate_reference)
        self.add_layernorm = ln.add_layernorm_with(layernorm, add_layernorm_reference)

    def attribute(self, module: str, name: str) -> object:
        """``name`` for the launch module ``module``'s ``__getattr__``: an entry point, or the
        AttributeError Python raises for a module attribute it does not have."""
        if name in self.NAMES:
            return getattr(self, name)
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
