"""AMD impls: the shared Triton kernels launched with CDNA configs, and AITER's rms_norm (as xDiT uses it on MI350)."""

from __future__ import annotations

import xbackend


@xbackend.hookimpl
def xbackend_register_impls(registrar: xbackend.Registrar) -> None:
    from . import impls

    for impl in impls.IMPLS:
        registrar.register(impl)
