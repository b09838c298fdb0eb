"""RMSNorm through AMD AITER's CK-tile kernel (``aiter.rms_norm``), as xDiT uses it on MI350.

Not run on AMD hardware here: tested on CPU with a stand-in ``aiter`` module that checks the call we
make against the documented signature ``rms_norm(input, weight, epsilon, use_model_sensitive_rmsnorm=0)``.
AITER normalizes in fp32 and rounds once, so it is not declared exact against either flavour: ulp(1)
against the torch flavour (a different fp32 reduction order flips a rare last bit), ulp(2) against
the diffusers flavour (which rounds twice). The guard checks both on first use.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


@functools.cache
def _aiter() -> Any:
    import aiter  # raises RuntimeError ("ROCm version file not found") off ROCm, not ImportError

    return aiter


def available() -> str | None:
    """None when aiter imports (the ROCm backend asks only on a ROCm build of torch), else why not."""
    try:
        _aiter()
    except Exception as e:
        return f"aiter not importable: {type(e).__name__}: {e}"
    return None


@functools.cache
def _ones(device: torch.device, d: int, dtype: torch.dtype) -> torch.Tensor:
    # AITER has no weightless variant; a cached ones vector keeps the call allocation-free.
    return torch.ones(d, device=device, dtype=dtype)


def supports(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"AITER's CK rms_norm takes fp16/bf16, got {str(x.dtype).removeprefix('torch.')}"
    if x.stride(-1) != 1:
        return "needs a contiguous last dim"
    if x.numel() == 0:
        return "empty input (the reference returns it without a launch)"
    return None


def supports_torch_flavour(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    return supports(x, weight, eps, flavour) if flavour == "torch" else "registered for flavour 'torch' only"


def supports_diffusers_flavour(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    return supports(x, weight, eps, flavour) if flavour == "diffusers" else "registered for flavour 'diffusers' only"


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
    d = x.shape[-1]
    w = weight if weight is not None else _ones(x.device, d, x.dtype)
    rows = x.reshape(-1, d)
    if not rows.is_contiguous():
        rows = rows.contiguous()
    out = _aiter().rms_norm(rows, w, eps, use_model_sensitive_rmsnorm=0)
    return out.view(x.shape)
