"""NVIDIA impls: Triton kernels shared with the ROCm backend, launched with NVIDIA configs, and a
CUDA C++ gated residual compiled on first use.

The pointwise kernels have no architecture-specific schedule, so they cover sm90..sm103 (run on SM90,
compiled for SM100/SM103); neighborhood attention's fused kernel is tuned for Hopper only.
"""

from __future__ import annotations

import xbackend
from xbackend.kernels import triton_available


@xbackend.hookimpl
def xbackend_register_impls(registrar: xbackend.Registrar) -> None:
    from . import impls

    for impl in impls.IMPLS:
        registrar.register(impl)


@xbackend.hookimpl
def xbackend_report_header() -> list[str]:
    reason = triton_available()
    return [f"cuda backend: triton {'available' if reason is None else 'missing (' + reason + ')'}"]
