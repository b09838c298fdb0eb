"""rmsnorm_modulate(x, scale, shift, weight=None, eps=1e-6, flavour="torch") — the adaLN site of a DiT
block: ``rmsnorm(x) * (1 + scale) + shift``, each step rounded to the dtype as eager PyTorch does.

scale and shift broadcast to x: ``[B,1,D]``, ``[B,L,D]``, ``[D]``, ``[1,..,1,D]``, and the DiffVAE's
``[B,1,1,1,D]`` on a 5-D x.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C
from . import rmsnorm as _rmsnorm

NAME = "rmsnorm_modulate"


# -- signature and checks ------------------------------------------------------------------------
def bind(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    flavour: str = "torch",
) -> tuple[Any, ...]:
    return (x, scale, shift, weight, eps, flavour)


def check(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> None:
    _rmsnorm.check(x, weight, eps, flavour, op=NAME)
    for name, t in (("scale", scale), ("shift", shift)):
        chk.tensor(NAME, name, t)
        chk.same_dtype_device(NAME, name, t, x, "x")
        chk.broadcasts_to(NAME, name, t, x.shape, "x")


# -- reference -----------------------------------------------------------------------------------
def reference(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
    return _rmsnorm.reference(x, weight, eps, flavour) * (1 + scale) + shift


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    x = torch.empty(1, 4096, 3072, dtype=dtype, device=device)
    mod = torch.empty(1, 1, 3072, dtype=dtype, device=device)
    return (x, mod, mod, None, 1e-6, "diffusers")


def fake(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
    check(x, scale, shift, weight, eps, flavour)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0) -> torch.Tensor:
        return C.randn(*shape, dtype=dtype, device=device, seed=seed)

    out = []
    x = r(2, 8, 64)
    for f in _rmsnorm.FLAVOURS:
        w = r(64, seed=3)
        out += [
            C.Case(f"{f}/mod [B,1,D]", (x, r(2, 1, 64, seed=1), r(2, 1, 64, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/mod [1,1,D] + weight", (x, r(1, 1, 64, seed=1), r(1, 1, 64, seed=2), w, 1e-6, f)),
            C.Case(f"{f}/mod [D]", (x, r(64, seed=1), r(64, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/mod full", (x, r(2, 8, 64, seed=1), r(2, 8, 64, seed=2), w, 1e-6, f)),
            C.Case(f"{f}/per-token mod [B,L,1]", (x, r(2, 8, 1, seed=1), r(2, 8, 1, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/mixed scale [B,1,D] shift [D]", (x, r(2, 1, 64, seed=1), r(64, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/empty", (r(0, 8, 64), r(1, 1, 64, seed=1), r(1, 1, 64, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/odd D=1000", (r(2, 3, 1000), r(2, 1, 1000, seed=1), r(2, 1, 1000, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/padded rows", (C.padded_rows(x), r(2, 1, 64, seed=1), r(2, 1, 64, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/stride-0 scale", (x, C.expanded(r(2, 1, 64, seed=1), 1, 8), r(2, 1, 64, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/5-D channels-last rows", (r(1, 2, 3, 4, 128), r(1, 1, 1, 1, 128, seed=1),
                                                     r(1, 1, 1, 1, 128, seed=2), None, 1e-6, f)),
            C.Case(f"{f}/NaN and Inf", (C.with_specials(x), r(2, 1, 64, seed=1), r(2, 1, 64, seed=2), None, 1e-6, f)),
        ]
    if big:
        xs = r(2, 4096)
        out.append(C.Case("torch/offset past 2**31", (C.big_offset(xs), r(4096, seed=1), r(4096, seed=2), None, 1e-6, "torch")))
        # scale and shift [D] as columns of a table: column 63 sits past element 2**31
        sc, sh = C.span_past_2_31(r(64, seed=1), r(64, seed=2))
        out.append(C.Case("torch/scale, shift columns span past 2**31", (x, sc, sh, None, 1e-6, "torch")))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
rmsnorm_modulate_op = SPEC.custom_op  # xbackend::rmsnorm_modulate
