"""rmsnorm(x, weight=None, eps=1e-6, flavour="torch") — RMS normalization over the last dim.

Two flavours exist in the wild and models depend on their exact rounding:
``torch`` is ``F.rms_norm`` (fp32 accumulate, one rounding of ``x*rstd*w``); ``diffusers`` is
diffusers' ``RMSNorm.forward`` (fp32 statistics, round to the weight dtype, then a second rounding
after ``*w``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C

NAME = "rmsnorm"
FLAVOURS = ("torch", "diffusers")
_HALF = (torch.float16, torch.bfloat16)


# -- signature and checks ------------------------------------------------------------------------
def bind(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6, flavour: str = "torch") -> tuple[Any, ...]:
    return (x, weight, eps, flavour)


def check(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str, op: str = NAME) -> None:
    chk.tensor(op, "x", x)
    if x.shape[-1] == 0:
        raise chk.fail(op, "x", "a last (normalized) dimension of size >= 1", chk.shape_str(x))
    check_weight(op, x, weight)
    chk.real_number(op, "eps", eps, minimum=0.0)
    chk.choice(op, "flavour", flavour, FLAVOURS)


def check_weight(op: str, x: torch.Tensor, weight: torch.Tensor | None) -> None:
    if weight is None:
        return
    chk.tensor(op, "weight", weight)
    if tuple(weight.shape) != (x.shape[-1],):
        raise chk.fail(op, "weight", f"shape [{x.shape[-1]}] (the last dim of 'x')", chk.shape_str(weight))
    chk.same_dtype_device(op, "weight", weight, x, "x")


# -- reference -----------------------------------------------------------------------------------
def reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
    if flavour == "torch":
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # diffusers.models.normalization.RMSNorm.forward, operation for operation.
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(variance + eps)
    if weight is None:
        return h.to(x.dtype)
    if weight.dtype in _HALF:
        h = h.to(weight.dtype)
    return h * weight


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    x = torch.empty(1, 4096, 3072, dtype=dtype, device=device)
    return (x, torch.empty(3072, dtype=dtype, device=device), 1e-6, "torch")


def fake(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
    check(x, weight, eps, flavour)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0) -> torch.Tensor:
        return C.randn(*shape, dtype=dtype, device=device, seed=seed)

    out = []
    for f in FLAVOURS:
        w = r(64, seed=1)
        out += [
            C.Case(f"{f}/[2,64]", (r(2, 64), w, 1e-6, f)),
            C.Case(f"{f}/no weight", (r(3, 64), None, 1e-6, f)),
            C.Case(f"{f}/empty [0,64]", (r(0, 64), w, 1e-6, f)),
            C.Case(f"{f}/one row", (r(1, 64), w, 1e-6, f)),
            C.Case(f"{f}/D=1", (r(4, 1), r(1, seed=1), 1e-6, f)),
            C.Case(f"{f}/odd D=1000", (r(3, 1000), r(1000, seed=1), 1e-5, f)),
            C.Case(f"{f}/large D=8192", (r(2, 8192), r(8192, seed=1), 1e-6, f)),
            C.Case(f"{f}/[2,5,64] 3-D", (r(2, 5, 64), w, 1e-6, f)),
            C.Case(f"{f}/padded rows", (C.padded_rows(r(4, 64)), w, 1e-6, f)),
            C.Case(f"{f}/last-dim stride 2", (C.strided_last(r(4, 64)), w, 1e-6, f)),
            C.Case(f"{f}/transposed", (C.transposed(r(16, 64)), w, 1e-6, f)),
            C.Case(f"{f}/stride-0 rows", (C.expanded(r(1, 64), 0, 4), w, 1e-6, f)),
            C.Case(f"{f}/NaN and Inf", (C.with_specials(r(4, 64)), w, 1e-6, f)),
            C.Case(f"{f}/eps=0", (r(4, 64), w, 0.0, f)),
            # Rows wide enough for aten's vectorized loads (the diffusers mean reduce reads fp32 x in place)
            C.Case(f"{f}/D=256 transposed", (C.transposed(r(24, 256)), w256 := r(256, seed=1), 1e-6, f)),
            C.Case(f"{f}/D=256 padded rows", (C.padded_rows(r(4, 256)), w256, 1e-6, f)),
            C.Case(f"{f}/D=256 stride-0 rows", (C.expanded(r(1, 256), 0, 4), w256, 1e-6, f)),
            C.Case(f"{f}/D=256 one element off alignment", (C.misaligned(r(4, 256)), w256, 1e-6, f)),
        ]
        if big:
            out.append(C.Case(f"{f}/offset past 2**31", (C.big_offset(r(2, 4096)), r(4096, seed=1), 1e-6, f)))
    if big:  # three rows about 2**30 apart: 12288 elements spanning past 2**31
        out.append(C.Case("torch/rows span past 2**31", (*C.span_past_2_31(r(3, 4096)), r(4096, seed=1), 1e-6, "torch")))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
rmsnorm_op = SPEC.custom_op  # xbackend::rmsnorm
