"""layernorm_modulate(x, scale=None, shift=None, weight=None, bias=None, eps=1e-6, flavour="torch", index=None)
— the adaLN site of a DiT block built on LayerNorm: ``layer_norm(x) * (1 + scale) + shift``.

Two flavours, one per rounding sequence the models use:

    "torch": y = F.layer_norm(x, (D,), weight, bias, eps)           # nn.LayerNorm, x's dtype
             y = y * (1 + scale) + shift                             # each step rounded to x's dtype
    "fp32":  y = F.layer_norm(x.float(), (D,), weight.float(), bias.float(), eps)   # FP32LayerNorm
             y = (y * (1 + scale) + shift).to(x.dtype)               # scale, shift float32: one rounding

``(1 + scale) * y`` (Flux.2's order) is the same product. scale and shift come together or not at all
(without them: the plain norm, e.g. an affine FP32LayerNorm's ``norm(x.float()).type_as(x)``) and
broadcast to x: ``[B,1,D]`` (often strided views of one modulation table), ``[B,L,D]``, ``[D]``.

``index`` (``[B, L]``, integer or bool, x ``[B, L, D]``): per-token tables. scale and shift are then
``[2, B, D]`` and token ``(b, l)`` reads entry 0 where ``index[b, l] == 0`` and entry 1 elsewhere:
``torch.where(index[..., None] == 0, t[0][:, None], t[1][:, None])``, a selection, so exact.
weight and bias: ``[D]``; x's dtype in "torch", any float dtype in "fp32" (cast to float32, exactly).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C

NAME = "layernorm_modulate"
FLAVOURS = ("torch", "fp32")
_INDEX_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


# -- signature and checks ------------------------------------------------------------------------
def bind(
    x: torch.Tensor,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    flavour: str = "torch",
    index: torch.Tensor | None = None,
) -> tuple[Any, ...]:
    return (x, scale, shift, weight, bias, eps, flavour, index)


def check_norm(op: str, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
               flavour: str) -> None:  # fmt: skip
    """The LayerNorm's arguments (shared with ``add_layernorm``)."""
    chk.tensor(op, "x", x)
    if x.shape[-1] == 0:
        raise chk.fail(op, "x", "a last (normalized) dimension of size >= 1", chk.shape_str(x))
    chk.choice(op, "flavour", flavour, FLAVOURS)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is None:
            continue
        chk.tensor(op, name, t)
        if tuple(t.shape) != (x.shape[-1],):
            raise chk.fail(op, name, f"shape [{x.shape[-1]}] (the last dim of 'x')", chk.shape_str(t))
        if flavour == "torch":
            chk.same_dtype_device(op, name, t, x, "x")
        elif t.device != x.device:
            raise chk.fail(op, name, f"device {x.device} (same as 'x')", t.device)
    chk.real_number(op, "eps", eps, minimum=0.0)


def check_index(op: str, x: torch.Tensor, index: torch.Tensor | None) -> None:
    if index is None:
        return
    if not isinstance(index, torch.Tensor):
        raise chk.fail(op, "index", "a torch.Tensor or None", type(index).__name__, TypeError)
    if index.dtype not in _INDEX_DTYPES:
        raise chk.fail(op, "index", "an integer or bool tensor", index.dtype, TypeError)
    if x.dim() != 3 or tuple(index.shape) != tuple(x.shape[:2]):
        raise chk.fail(op, "index", "shape [B, L] with 'x' of shape [B, L, D]",
                       f"{chk.shape_str(index)} with 'x' of {chk.shape_str(x)}")
    if index.device != x.device:
        raise chk.fail(op, "index", f"device {x.device} (same as 'x')", index.device)


def check_table(op: str, name: str, t: torch.Tensor, x: torch.Tensor, flavour: str, index: torch.Tensor | None,
                half_ok: bool = False) -> None:  # fmt: skip
    """A modulation tensor (scale, shift, gate): x's dtype ("torch"; also float32 with ``half_ok``) or
    float32 ("fp32"); broadcast to x, or a ``[2, B, D]`` table with ``index``."""
    chk.tensor(op, name, t)
    if flavour == "fp32":
        if t.dtype != torch.float32:
            raise chk.fail(op, name, "dtype torch.float32 (flavour 'fp32' modulates in float32)", t.dtype, TypeError)
        if t.device != x.device:
            raise chk.fail(op, name, f"device {x.device} (same as 'x')", t.device)
    elif half_ok and t.dtype == torch.float32:
        if t.device != x.device:
            raise chk.fail(op, name, f"device {x.device} (same as 'x')", t.device)
    else:
        chk.same_dtype_device(op, name, t, x, "x")
    if index is None:
        chk.broadcasts_to(op, name, t, x.shape, "x")
    elif tuple(t.shape) != (2, x.shape[0], x.shape[-1]):
        raise chk.fail(op, name, f"shape [2, {x.shape[0]}, {x.shape[-1]}] (two [B, D] tables, as 'index' is given)",
                       chk.shape_str(t))


def check_modulation(op: str, x: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None,
                     flavour: str, index: torch.Tensor | None) -> None:  # fmt: skip
    if (scale is None) != (shift is None):
        given, missing = ("scale", "shift") if shift is None else ("shift", "scale")
        raise chk.fail(op, missing, f"a tensor, as '{given}' is given (modulate with both or neither)", "None")
    check_index(op, x, index)
    if scale is None:
        if index is not None:
            raise chk.fail(op, "index", "None when there is no scale and shift to select", chk.shape_str(index))
        return
    check_table(op, "scale", scale, x, flavour, index)
    check_table(op, "shift", shift, x, flavour, index)


def check(x: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None, weight: torch.Tensor | None,
          bias: torch.Tensor | None, eps: float, flavour: str, index: torch.Tensor | None) -> None:  # fmt: skip
    check_norm(NAME, x, weight, bias, eps, flavour)
    check_modulation(NAME, x, scale, shift, flavour, index)


# -- reference -----------------------------------------------------------------------------------
def select(t: torch.Tensor, index: torch.Tensor | None) -> torch.Tensor:
    """A modulation tensor as the model applies it: itself, or with ``index`` the per-token selection
    between its two ``[B, D]`` tables (Qwen-Image's ``torch.where``)."""
    if index is None:
        return t
    return torch.where(index.unsqueeze(-1) == 0, t[0].unsqueeze(1), t[1].unsqueeze(1))


def reference(x: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None, weight: torch.Tensor | None,
              bias: torch.Tensor | None, eps: float, flavour: str, index: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    shape = (x.shape[-1],)
    if flavour == "torch":
        y = F.layer_norm(x, shape, weight, bias, eps)
    else:  # diffusers' FP32LayerNorm on x.float(); its .to(origin dtype) is float32 -> float32
        y = F.layer_norm(x.float(), shape, None if weight is None else weight.float(),
                         None if bias is None else bias.float(), eps)
    if scale is not None:
        y = y * (1 + select(scale, index)) + select(shift, index)
    return y.to(x.dtype)


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    # Flux.2 dev's image stream at 1024x1024: 4096 tokens of 6144 channels, [B,1,D] views of one table.
    x = torch.empty(1, 4096, 6144, dtype=dtype, device=device)
    mod = torch.empty(1, 1, 6144, dtype=dtype, device=device)
    return (x, mod, mod, None, None, 1e-6, "torch", None)


def fake(x: torch.Tensor, scale: torch.Tensor | None, shift: torch.Tensor | None, weight: torch.Tensor | None,
         bias: torch.Tensor | None, eps: float, flavour: str, index: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    check(x, scale, shift, weight, bias, eps, flavour, index)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# -- conformance cases ---------------------------------------------------------------------------
def table_views(t: torch.Tensor, parts: int, dim: int = -1) -> tuple[torch.Tensor, ...]:
    """``t`` chunked as the models chunk one projected modulation table: strided views."""
    return t.chunk(parts, dim=dim)


def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0, dt: torch.dtype = dtype) -> torch.Tensor:
        return C.randn(*shape, dtype=dt, device=device, seed=seed)

    x, w, b = r(2, 8, 64), r(64, seed=3), r(64, seed=4)
    out = []
    for f in FLAVOURS:
        mdt = torch.float32 if f == "fp32" else dtype

        def m(*shape: int, seed: int, mdt: torch.dtype = mdt) -> torch.Tensor:
            return r(*shape, seed=seed, dt=mdt)

        # Flux.2 / Qwen-Image: shift, scale, gate as [B,1,D] chunks of one [B,1,3D] projection
        shift3, scale3, _ = table_views(m(2, 1, 192, seed=5), 3)
        # Wan: six [B,1,D] chunks of a [B,6,D] table along dim 1
        wan = table_views(m(2, 6, 64, seed=6), 6, dim=1)
        index = torch.tensor([[0, 1, 1, 0, 0, 1, 0, 1], [1, 1, 0, 0, 1, 0, 0, 0]], device=device)
        out += [
            C.Case(f"{f}/no modulation", (x, None, None, None, None, 1e-6, f, None)),
            C.Case(f"{f}/weight and bias, no modulation", (x, None, None, w, b, 1e-6, f, None)),
            C.Case(f"{f}/mod [B,1,D]", (x, m(2, 1, 64, seed=1), m(2, 1, 64, seed=2), None, None, 1e-6, f, None)),
            C.Case(f"{f}/mod [B,1,D] chunks of [B,1,3D]", (x, scale3, shift3, None, None, 1e-6, f, None)),
            C.Case(f"{f}/mod [B,1,D] chunks of [B,6,D]", (x, wan[1], wan[0], None, None, 1e-6, f, None)),
            C.Case(f"{f}/mod [D] + weight, bias", (x, m(64, seed=1), m(64, seed=2), w, b, 1e-6, f, None)),
            C.Case(f"{f}/mod full [B,L,D]", (x, m(2, 8, 64, seed=1), m(2, 8, 64, seed=2), None, None, 1e-6, f, None)),
            C.Case(f"{f}/per-token index", (x, m(2, 2, 64, seed=1), m(2, 2, 64, seed=2), None, None, 1e-6, f, index)),
            C.Case(f"{f}/bool index", (x, m(2, 2, 64, seed=1), m(2, 2, 64, seed=2), None, None, 1e-6, f, index.bool())),
            C.Case(f"{f}/empty", (r(0, 8, 64), m(1, 1, 64, seed=1), m(1, 1, 64, seed=2), None, None, 1e-6, f, None)),
            C.Case(f"{f}/D=1", (r(4, 1), m(1, seed=1), m(1, seed=2), None, None, 1e-6, f, None)),
            C.Case(f"{f}/odd D=1000", (r(2, 3, 1000), m(2, 1, 1000, seed=1), m(2, 1, 1000, seed=2), None, None, 1e-5,
                                       f, None)),
            C.Case(f"{f}/D=3072", (r(1, 5, 3072), m(1, 1, 3072, seed=1), m(1, 1, 3072, seed=2), None, None, 1e-6,
                                   f, None)),
            C.Case(f"{f}/padded rows", (C.padded_rows(x), m(2, 1, 64, seed=1), m(2, 1, 64, seed=2), None, None, 1e-6,
                                        f, None)),
            C.Case(f"{f}/transposed", (C.transposed(r(2, 16, 64)), m(2, 1, 64, seed=1), m(2, 1, 64, seed=2), w, b,
                                       1e-6, f, None)),
            C.Case(f"{f}/misaligned rows", (C.misaligned(r(2, 4, 256)), m(2, 1, 256, seed=1), m(2, 1, 256, seed=2),
                                            None, None, 1e-6, f, None)),
            C.Case(f"{f}/constant rows", (torch.full((3, 64), 2.5, dtype=dtype, device=device), m(64, seed=1),
                                          m(64, seed=2), None, None, 1e-6, f, None)),
            C.Case(f"{f}/eps=0", (x, m(2, 1, 64, seed=1), m(2, 1, 64, seed=2), None, None, 0.0, f, None)),
            C.Case(f"{f}/NaN and Inf", (C.with_specials(x), m(2, 1, 64, seed=1), m(2, 1, 64, seed=2), None, None,
                                        1e-6, f, None)),
        ]
        if f == "fp32":  # FP32LayerNorm keeps float32 weights under a half model
            w32, b32 = r(64, seed=3, dt=torch.float32), r(64, seed=4, dt=torch.float32)
            out.append(C.Case("fp32/float32 weight, bias", (x, None, None, w32, b32, 1e-6, f, None)))
    if big:
        xs = r(2, 4096)
        out.append(C.Case("torch/offset past 2**31", (C.big_offset(xs), r(4096, seed=1), r(4096, seed=2), None, None,
                                                      1e-6, "torch", None)))
        sc, sh = C.span_past_2_31(r(64, seed=1), r(64, seed=2))
        out.append(C.Case("torch/scale, shift columns span past 2**31", (x, sc, sh, None, None, 1e-6, "torch", None)))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
layernorm_modulate_op = SPEC.custom_op  # xbackend::layernorm_modulate
