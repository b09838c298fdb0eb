"""add_rmsnorm(x, update, weight=None, eps=1e-6, flavour="torch", scale=None, shift=None) — a residual
add and the RMSNorm that reads its result, as pre-norm blocks write them:

    h = x + update                        # rounded once to x's dtype, a new contiguous tensor
    y = rmsnorm(h, weight, eps, flavour)  # the rmsnorm op's semantics (rmsnorm.py)
    y = y * (1 + scale) + shift           # only with scale and shift: rmsnorm_modulate's semantics

Returns ``(h, y)``: the block keeps ``h`` as its residual stream and feeds ``y`` to the next layer.
Fused, ``h`` is written once and never read back (the separate ops read it again for the norm).
update has x's shape, dtype and device (no broadcasting); scale and shift come together or not at
all and broadcast to x as in ``rmsnorm_modulate``. The norm reads the rounded sum, so ``y`` is
bit-identical to the two ops run one after the other.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C
from . import rmsnorm as _rmsnorm
from . import rmsnorm_modulate as _modulate

NAME = "add_rmsnorm"


# -- signature and checks ------------------------------------------------------------------------
def bind(
    x: torch.Tensor,
    update: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    flavour: str = "torch",
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
) -> tuple[Any, ...]:
    return (x, update, weight, eps, flavour, scale, shift)


def check(x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str,
          scale: torch.Tensor | None, shift: torch.Tensor | None) -> None:  # fmt: skip
    _rmsnorm.check(x, weight, eps, flavour, op=NAME)
    chk.tensor(NAME, "update", update)
    chk.same_dtype_device(NAME, "update", update, x, "x")
    if update.shape != x.shape:
        shape = ", ".join(map(str, x.shape))
        raise chk.fail(NAME, "update", f"the shape of 'x' [{shape}] (no broadcasting)", chk.shape_str(update))
    if (scale is None) != (shift is None):
        given, missing = ("scale", "shift") if shift is None else ("shift", "scale")
        raise chk.fail(NAME, missing, f"a tensor, as '{given}' is given (modulate with both or neither)", "None")
    for name, t in (("scale", scale), ("shift", shift)):
        if t is not None:
            chk.tensor(NAME, name, t)
            chk.same_dtype_device(NAME, name, t, x, "x")
            chk.broadcasts_to(NAME, name, t, x.shape, "x")


# -- reference -----------------------------------------------------------------------------------
def reference(x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str,
              scale: torch.Tensor | None, shift: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``x + update`` made contiguous (what the norm reads: the sum of two strided inputs can come out
    strided, and the diffusers flavour's reduction order depends on its layout), then the norm."""
    h = (x + update).contiguous()
    if scale is None:
        return h, _rmsnorm.reference(h, weight, eps, flavour)
    return h, _modulate.reference(h, scale, shift, weight, eps, flavour)


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    # The DiffVAE's stage-5 tile: 40x96x96 tokens of 256 channels, modulated per block.
    x = torch.empty(1, 40, 96, 96, 256, dtype=dtype, device=device)
    mod = torch.empty(1, 1, 1, 1, 256, dtype=dtype, device=device)
    return (x, torch.empty_like(x), torch.empty(256, dtype=dtype, device=device), 1e-6, "torch", mod, mod)


def fake(x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str,
         scale: torch.Tensor | None, shift: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    check(x, update, weight, eps, flavour, scale, shift)
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))  # fmt: skip


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0) -> torch.Tensor:
        return C.randn(*shape, dtype=dtype, device=device, seed=seed)

    x, u = r(2, 8, 64), r(2, 8, 64, seed=1)
    near_max = (x.float().clamp(-1, 1) * (0.75 * torch.finfo(dtype).max)).to(dtype)  # sums past the dtype's max
    out = []
    for f in _rmsnorm.FLAVOURS:
        w = r(64, seed=2)
        mod = (r(2, 1, 64, seed=3), r(2, 1, 64, seed=4))
        out += [
            C.Case(f"{f}/[2,8,64]", (x, u, w, 1e-6, f, None, None)),
            C.Case(f"{f}/no weight", (x, u, None, 1e-6, f, None, None)),
            C.Case(f"{f}/modulated [B,1,D]", (x, u, w, 1e-6, f, *mod)),
            C.Case(f"{f}/modulated [D], no weight", (x, u, None, 1e-6, f, r(64, seed=3), r(64, seed=4))),
            C.Case(f"{f}/empty [0,8,64]", (r(0, 8, 64), r(0, 8, 64, seed=1), w, 1e-6, f, None, None)),
            C.Case(f"{f}/D=1", (r(4, 1), r(4, 1, seed=1), r(1, seed=2), 1e-6, f, None, None)),
            C.Case(f"{f}/odd D=1000", (r(3, 1000), r(3, 1000, seed=1), r(1000, seed=2), 1e-5, f, None, None)),
            C.Case(f"{f}/padded rows", (C.padded_rows(x), C.padded_rows(u), w, 1e-6, f, *mod)),
            C.Case(f"{f}/transposed update", (r(2, 16, 64), C.transposed(r(2, 16, 64, seed=1)), w, 1e-6, f, None, None)),
            C.Case(f"{f}/both transposed", (C.transposed(r(2, 16, 64)), C.transposed(r(2, 16, 64, seed=1)), w, 1e-6,
                                            f, None, None)),
            C.Case(f"{f}/x is update", (x, x, w, 1e-6, f, None, None)),
            C.Case(f"{f}/5-D channels-last rows", (r(1, 2, 3, 4, 128), r(1, 2, 3, 4, 128, seed=1), r(128, seed=2),
                                                     1e-6, f, r(1, 1, 1, 1, 128, seed=3), r(1, 1, 1, 1, 128, seed=4))),
            C.Case(f"{f}/sums that overflow", (near_max, near_max, w, 1e-6, f, None, None)),
            C.Case(f"{f}/NaN and Inf", (C.with_specials(x), u, w, 1e-6, f, *mod)),
        ]
    if big:
        xs = r(2, 4096)
        out.append(C.Case("torch/offset past 2**31", (C.big_offset(xs), r(2, 4096, seed=1), r(4096, seed=2), 1e-6,
                                                      "torch", None, None)))
        # scale and shift [D] as columns of a table: column 63 sits past element 2**31
        sc, sh = C.span_past_2_31(r(64, seed=3), r(64, seed=4))
        out.append(C.Case("torch/scale, shift columns span past 2**31", (x, u, r(64, seed=2), 1e-6, "torch", sc, sh)))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
add_rmsnorm_op = SPEC.custom_op  # xbackend::add_rmsnorm
