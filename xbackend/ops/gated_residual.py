"""gated_residual(x, update, gate) — ``(x + update * gate).to(x.dtype)``, the gated residual of a DiT block.

With a gate of x's dtype, bf16/fp16 eager PyTorch rounds twice: ``round(x + round(update * gate))``.
A float32 gate under a bf16/fp16 x (Wan's ``(x.float() + update * gate).type_as(x)``) promotes: the
product and the sum in float32, one rounding to x's dtype at the end. Gates: full, ``[B,1,D]``
(B > 1 too), ``[1,..,1,D]``, per-token ``[B,L,1]``. The output is a new tensor of x's dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C

NAME = "gated_residual"


# -- signature and checks ------------------------------------------------------------------------
def bind(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> tuple[Any, ...]:
    return (x, update, gate)


def check(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> None:
    chk.tensor(NAME, "x", x)
    chk.tensor(NAME, "update", update)
    chk.same_dtype_device(NAME, "update", update, x, "x")
    if update.shape != x.shape:
        raise chk.fail(NAME, "update", f"the shape of 'x' [{', '.join(map(str, x.shape))}]", chk.shape_str(update))
    chk.tensor(NAME, "gate", gate)
    if gate.dtype == torch.float32 and x.dtype != torch.float32:
        if gate.device != x.device:
            raise chk.fail(NAME, "gate", f"device {x.device} (same as 'x')", gate.device)
    else:
        chk.same_dtype_device(NAME, "gate", gate, x, "x")
    chk.broadcasts_to(NAME, "gate", gate, x.shape, "x")


# -- reference -----------------------------------------------------------------------------------
def reference(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return (x + update * gate).to(x.dtype)


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    x = torch.empty(1, 32640, 4096, dtype=dtype, device=device)
    return (x, torch.empty_like(x), torch.empty(1, 1, 4096, dtype=dtype, device=device))


def fake(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    check(x, update, gate)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0) -> torch.Tensor:
        return C.randn(*shape, dtype=dtype, device=device, seed=seed)

    x, u = r(2, 8, 64), r(2, 8, 64, seed=1)
    out = [
        C.Case("full gate", (x, u, r(2, 8, 64, seed=2))),
        C.Case("gate [B,1,D]", (x, u, r(2, 1, 64, seed=2))),
        C.Case("gate [1,1,D]", (x, u, r(1, 1, 64, seed=2))),
        C.Case("gate [D]", (x, u, r(64, seed=2))),
        C.Case("per-token gate [B,L,1]", (x, u, r(2, 8, 1, seed=2))),
        C.Case("gate [1,L,1]", (x, u, r(1, 8, 1, seed=2))),
        C.Case("scalar-like gate [1]", (x, u, r(1, seed=2))),
        C.Case("empty [0,8,64]", (r(0, 8, 64), r(0, 8, 64, seed=1), r(1, 1, 64, seed=2))),
        C.Case("one row", (r(1, 1, 64), r(1, 1, 64, seed=1), r(1, 1, 64, seed=2))),
        C.Case("odd D=1001", (r(3, 1001), r(3, 1001, seed=1), r(1001, seed=2))),
        C.Case("D=1", (r(5, 1), r(5, 1, seed=1), r(1, seed=2))),
        C.Case("padded rows", (C.padded_rows(x), C.padded_rows(u), r(2, 1, 64, seed=2))),
        C.Case("transposed update", (r(2, 16, 64), C.transposed(r(2, 16, 64, seed=1)), r(2, 1, 64, seed=2))),
        C.Case("stride-0 gate", (x, u, C.expanded(r(2, 1, 64, seed=2), 1, 8))),
        C.Case("last-dim stride 2", (C.strided_last(x), u, r(64, seed=2))),
        C.Case("x is update", (x, x, r(2, 1, 64, seed=2))),
        C.Case("NaN and Inf", (C.with_specials(x), u, r(2, 1, 64, seed=2))),
    ]
    if dtype != torch.float32:  # Wan: a half residual gated in float32
        g32 = C.randn(2, 1, 64, dtype=torch.float32, device=device, seed=2)
        out += [C.Case("float32 gate [B,1,D]", (x, u, g32)),
                C.Case("float32 gate [B,1,D] chunk of [B,6,D]",
                       (x, u, C.randn(2, 6, 64, dtype=torch.float32, device=device, seed=3).chunk(6, dim=1)[2])),
                C.Case("float32 gate, NaN and Inf", (C.with_specials(x), u, g32))]
    if big:
        xs = r(2, 4096)
        out.append(C.Case("offset past 2**31", (C.big_offset(xs), r(2, 4096, seed=1), r(4096, seed=2))))
        # a [B,1,D] gate whose rows lie about 2**30 apart (sliced from a modulation table)
        out.append(C.Case("gate rows span past 2**31", (r(3, 5, 4096), r(3, 5, 4096, seed=1),
                                                         *C.span_past_2_31(r(3, 1, 4096, seed=2)))))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
gated_residual_op = SPEC.custom_op  # xbackend::gated_residual
