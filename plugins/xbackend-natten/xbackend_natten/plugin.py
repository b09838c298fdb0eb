"""The NATTEN plugin's hook: registers NATTEN's fused neighborhood attention with xbackend.

NATTEN's fused kernels cover sm80..sm103. On Blackwell (sm100, sm103) they are the preferred path
(vLLM-Omni routes SM100/103 to NATTEN too); on sm80..sm90 they rank below xbackend's own
Hopper Triton kernel (sm90) but above the portable flex path. Not run on hardware here: NATTEN has
no wheel for the test environment, so it is tested against a stand-in module.
"""

from __future__ import annotations

import torch

import xbackend

from .impl import available

_FN = "xbackend_natten.impl:neighborhood_attention"
_SUPPORTS = "xbackend_natten.impl:supports"
_DTYPES = frozenset({torch.bfloat16, torch.float16})
# bf16 kernels against the fp32 reference: the op's bar (relative Frobenius error).
_PRECISION = xbackend.tolerance(5e-3)


@xbackend.hookimpl
def xbackend_register_impls(registrar: xbackend.Registrar) -> None:
    common = {"op": "neighborhood_attention", "fn": _FN, "supports": _SUPPORTS, "available": available,
              "dtypes": _DTYPES, "precision": _PRECISION}
    registrar.register(name="natten_blackwell", priority=120, devices="sm100..sm103",
                       description="NATTEN fused NA (blackwell-fna); preferred on SM100/SM103", **common)
    registrar.register(name="natten", priority=60, devices="sm80..sm90",
                       description="NATTEN fused NA (hopper-fna / cutlass-fna, NATTEN picks)", **common)


@xbackend.hookimpl
def xbackend_report_header() -> list[str]:
    reason = available()
    return [f"natten plugin: {'natten importable' if reason is None else reason}"]
