"""add_layernorm(x, update, gate=None, weight=None, bias=None, eps=1e-6, flavour="torch", scale=None,
shift=None, index=None) — a (gated) residual add and the LayerNorm + modulate that reads its result, as
the double-stream DiT blocks write them:

    h = x + update              # gate None: rounded once to x's dtype
    h = (x + update * gate).to(x.dtype)   # with a gate: gated_residual's semantics (x's dtype or a
                                          # float32 gate under a half x, Wan's fp32 residual)
    y = layernorm_modulate(h, scale, shift, weight, bias, eps, flavour, index)

Returns ``(h, y)``, both contiguous: the block keeps ``h`` as its residual stream and feeds ``y`` to the
next layer. Fused, ``h`` is written once and never read back. update has x's shape, dtype and device
(no broadcasting); gate broadcasts to x, or with ``index`` is a ``[2, B, D]`` table selected per token
like scale and shift (``layernorm_modulate``). The norm reads the rounded sum, so ``y`` is bit-identical
to the ops run one after the other.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C
from . import layernorm_modulate as _ln

NAME = "add_layernorm"


# -- signature and checks ------------------------------------------------------------------------
def bind(
    x: torch.Tensor,
    update: torch.Tensor,
    gate: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    flavour: str = "torch",
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    index: torch.Tensor | None = None,
) -> tuple[Any, ...]:
    return (x, update, gate, weight, bias, eps, flavour, scale, shift, index)


def check(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor | None,
          bias: torch.Tensor | None, eps: float, flavour: str, scale: torch.Tensor | None, shift: torch.Tensor | None,
          index: torch.Tensor | None) -> None:  # fmt: skip
    _ln.check_norm(NAME, x, weight, bias, eps, flavour)
    chk.tensor(NAME, "update", update)
    chk.same_dtype_device(NAME, "update", update, x, "x")
    if update.shape != x.shape:
        shape = ", ".join(map(str, x.shape))
        raise chk.fail(NAME, "update", f"the shape of 'x' [{shape}] (no broadcasting)", chk.shape_str(update))
    _ln.check_index(NAME, x, index)
    _ln.check_modulation(NAME, x, scale, shift, flavour, index if scale is not None else None)
    if gate is not None:
        # The gate's dtype follows the residual, not the norm: x's dtype, or float32 (promoting the sum).
        _ln.check_table(NAME, "gate", gate, x, "torch", index, half_ok=True)
    elif index is not None and scale is None:
        raise chk.fail(NAME, "index", "None when there is no gate, scale or shift to select", chk.shape_str(index))


# -- reference -----------------------------------------------------------------------------------
def residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor | None, index: torch.Tensor | None) -> torch.Tensor:
    """``x + update`` or ``(x + update * gate).to(x.dtype)``, made contiguous (what the norm reads: the sum
    of two strided inputs can come out strided)."""
    if gate is None:
        return (x + update).contiguous()
    return (x + update * _ln.select(gate, index)).to(x.dtype).contiguous()


def reference(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor | None,
              bias: torch.Tensor | None, eps: float, flavour: str, scale: torch.Tensor | None,
              shift: torch.Tensor | None, index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    h = residual(x, update, gate, index)
    return h, _ln.reference(h, scale, shift, weight, bias, eps, flavour, index if scale is not None else None)


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    # Qwen-Image's image stream at 1328x1328: 6889 tokens of 3072 channels, [B,1,D] modulation.
    x = torch.empty(1, 6889, 3072, dtype=dtype, device=device)
    mod = torch.empty(1, 1, 3072, dtype=dtype, device=device)
    return (x, torch.empty_like(x), mod, None, None, 1e-6, "torch", mod, mod, None)


def fake(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor | None, weight: torch.Tensor | None,
         bias: torch.Tensor | None, eps: float, flavour: str, scale: torch.Tensor | None, shift: torch.Tensor | None,
         index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    check(x, update, gate, weight, bias, eps, flavour, scale, shift, index)
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))  # fmt: skip


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0, dt: torch.dtype = dtype) -> torch.Tensor:
        return C.randn(*shape, dtype=dt, device=device, seed=seed)

    x, u = r(2, 8, 64), r(2, 8, 64, seed=1)
    w, b = r(64, seed=2), r(64, seed=7)
    near_max = (x.float().clamp(-1, 1) * (0.75 * torch.finfo(dtype).max)).to(dtype)  # sums past the dtype's max
    index = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1], [1, 1, 0, 0, 1, 0, 0, 0]], device=device)
    out = []
    for f in _ln.FLAVOURS:
        mdt = torch.float32 if f == "fp32" else dtype

        def m(*shape: int, seed: int, mdt: torch.dtype = mdt) -> torch.Tensor:
            return r(*shape, seed=seed, dt=mdt)

        shift3, scale3, gate3 = _ln.table_views(m(2, 1, 192, seed=5), 3)
        mod = (m(2, 1, 64, seed=3), m(2, 1, 64, seed=4))
        out += [
            C.Case(f"{f}/plain add, no modulation", (x, u, None, None, None, 1e-6, f, None, None, None)),
            C.Case(f"{f}/plain add, weight and bias", (x, u, None, w, b, 1e-6, f, None, None, None)),
            C.Case(f"{f}/plain add, modulated", (x, u, None, None, None, 1e-6, f, *mod, None)),
            C.Case(f"{f}/gate, scale, shift chunks of [B,1,3D]", (x, u, gate3, None, None, 1e-6, f, scale3, shift3,
                                                                  None)),
            C.Case(f"{f}/gated, weight and bias", (x, u, r(2, 1, 64, seed=6), w, b, 1e-6, f, None, None, None)),
            C.Case(f"{f}/per-token index", (x, u, r(2, 2, 64, seed=6), None, None, 1e-6, f, m(2, 2, 64, seed=3),
                                            m(2, 2, 64, seed=4), index)),
            C.Case(f"{f}/empty", (r(0, 8, 64), r(0, 8, 64, seed=1), None, None, None, 1e-6, f, None, None, None)),
            C.Case(f"{f}/D=1", (r(4, 1), r(4, 1, seed=1), r(1, seed=6), None, None, 1e-6, f, None, None, None)),
            C.Case(f"{f}/odd D=1000", (r(3, 1000), r(3, 1000, seed=1), r(1000, seed=6), None, None, 1e-5, f, None,
                                       None, None)),
            C.Case(f"{f}/padded rows", (C.padded_rows(x), C.padded_rows(u), r(2, 1, 64, seed=6), None, None, 1e-6, f,
                                        *mod, None)),
            C.Case(f"{f}/both transposed", (C.transposed(r(2, 16, 64)), C.transposed(r(2, 16, 64, seed=1)), None, w, b,
                                            1e-6, f, None, None, None)),
            C.Case(f"{f}/x is update", (x, x, r(2, 1, 64, seed=6), None, None, 1e-6, f, *mod, None)),
            C.Case(f"{f}/sums that overflow", (near_max, near_max, None, None, None, 1e-6, f, None, None, None)),
            C.Case(f"{f}/NaN and Inf", (C.with_specials(x), u, r(2, 1, 64, seed=6), None, None, 1e-6, f, *mod, None)),
        ]
        if dtype != torch.float32:  # Wan: a half residual gated in float32
            out.append(C.Case(f"{f}/float32 gate", (x, u, r(2, 1, 64, seed=6, dt=torch.float32), None, None, 1e-6, f,
                                                    *mod, None)))
    if big:
        xs = r(2, 4096)
        out.append(C.Case("torch/offset past 2**31", (C.big_offset(xs), r(2, 4096, seed=1), r(4096, seed=6), None,
                                                      None, 1e-6, "torch", None, None, None)))
        sc, sh = C.span_past_2_31(r(64, seed=3), r(64, seed=4))
        out.append(C.Case("torch/scale, shift columns span past 2**31", (x, u, None, None, None, 1e-6, "torch", sc, sh,
                                                                         None)))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
add_layernorm_op = SPEC.custom_op  # xbackend::add_layernorm
