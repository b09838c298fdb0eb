"""The LayerNorm sites of the Wan, Flux.2 and Qwen-Image block patches: which norm modules the
``layernorm_modulate`` / ``add_layernorm`` ops reproduce, the per-call checks, and the fused calls.

Two flavours, one per way the models call their norm (``xbackend/ops/layernorm_modulate.py``):

- "torch": an ``nn.LayerNorm`` called on x and modulated in x's dtype (Flux.2, Qwen-Image);
- "fp32": diffusers' ``FP32LayerNorm`` called on ``x.float()``, modulated with float32 tables and cast
  back with ``.type_as(x)`` (Wan).

`ln_modulate` and `add_ln` return None where the op is not the model's expression for these inputs;
the caller then runs the expression as diffusers writes it. `block_sites` decides, once per block at
patch time, which norms, residual folds and gates a block routes and reports the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .._api import get_op
from ._common import (
    _FLOAT,
    Site,
    Skipped,
    _broadcasts,
    can_add,
    diffusers_mismatch,
    fused,
    hookless,
    hookless_now,
    is_eps,
)

_LAYERNORM_MODULATE = get_op("layernorm_modulate")
_ADD_LAYERNORM = get_op("add_layernorm")
_INDEX_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_FP32_LAYERNORM: list[type] = []


def fp32_layernorm_class() -> type | None:
    """diffusers' ``FP32LayerNorm``, imported once."""
    if not _FP32_LAYERNORM:
        try:
            from diffusers.models.normalization import FP32LayerNorm
        except ImportError:
            return None
        _FP32_LAYERNORM.append(FP32LayerNorm)
    return _FP32_LAYERNORM[0]


def layernorm_flavour(module: nn.Module, want: str) -> tuple[str | None, str]:
    """(``want``, detail) when ``module`` is the norm class whose call the ``want`` flavour reproduces
    (exactly ``nn.LayerNorm`` for "torch", diffusers' ``FP32LayerNorm`` for "fp32"), else (None, why).
    A subclass may compute something else, and the other class rounds at other steps."""
    cls = type(module)
    expected = nn.LayerNorm if want == "torch" else fp32_layernorm_class()
    if expected is None:
        return None, "diffusers is not installed"
    if cls is not expected:
        return None, f"is {cls.__name__}; this site's expression is the op's only with {expected.__name__}"
    if want == "fp32" and (problem := diffusers_mismatch()) is not None:
        return None, problem
    shape, eps = module.normalized_shape, module.eps
    if len(shape) != 1:
        return None, f"normalizes over {len(shape)} dims {tuple(shape)}; the op normalizes the last dim only"
    if not is_eps(eps):
        return None, f"eps {eps!r} is not a finite number >= 0"
    affine = "weight and bias" if module.weight is not None and module.bias is not None else (
        "weight" if module.weight is not None else "no affine")
    return want, f"flavour={want} dim={shape[0]} eps={eps:g} {affine}"


def still_layernorm(norm: nn.Module, flavour: str) -> bool:
    """The norm found fusable at patch time still is, on this call: the same class, a usable eps, no
    hooks (on it or global) and no replaced forward."""
    cls = nn.LayerNorm if flavour == "torch" else fp32_layernorm_class()
    return type(norm) is cls and len(norm.normalized_shape) == 1 and is_eps(norm.eps) and hookless_now(norm)


def _affine(t: torch.Tensor | None, x: torch.Tensor, flavour: str) -> bool:
    if t is None:
        return True
    # FP32LayerNorm casts its weight and bias with .float() (exact from any float dtype).
    dtype_ok = t.dtype == x.dtype if flavour == "torch" else t.dtype in _FLOAT
    return dtype_ok and t.device == x.device and t.dim() == 1 and t.shape[0] == x.shape[-1]


def can_layernorm(norm: nn.Module, flavour: str, x: torch.Tensor) -> bool:
    """``norm`` called as the flavour calls it on ``x`` is the op's norm."""
    # Under autocast aten runs layer_norm in fp32 (and returns fp32); the written expression keeps that.
    return (
        x.dtype in _FLOAT
        and x.dim() >= 1
        and x.shape[-1] > 0
        and x.shape[-1] == norm.normalized_shape[0]
        and not torch.is_autocast_enabled(x.device.type)
        and _affine(norm.weight, x, flavour)
        and _affine(norm.bias, x, flavour)
    )


def can_index(x: torch.Tensor, index: torch.Tensor | None) -> bool:
    """``index`` selects per token of x ``[B, L, D]`` as Qwen-Image's ``torch.where`` does."""
    if index is None:
        return True
    return (
        isinstance(index, torch.Tensor)
        and index.dtype in _INDEX_DTYPES
        and x.dim() == 3
        and tuple(index.shape) == tuple(x.shape[:2])
        and index.device == x.device
    )


def can_table(t: object, x: torch.Tensor, dtype: torch.dtype, index: torch.Tensor | None) -> bool:
    """A modulation tensor of ``dtype`` on x's device that broadcasts to x, or with ``index`` a
    ``[2, B, D]`` table."""
    if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.device != x.device:
        return False
    if index is None:
        return _broadcasts(t, x.shape)
    return tuple(t.shape) == (2, x.shape[0], x.shape[-1])


def _mod_dtype(x: torch.Tensor, flavour: str) -> torch.dtype:
    return x.dtype if flavour == "torch" else torch.float32


def ln_modulate(
    norm: nn.Module, flavour: str | None, x: torch.Tensor, scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None, index: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """The flavour's ``norm(x) * (1 + scale) + shift`` (or the plain norm without scale and shift) as
    one ``layernorm_modulate`` call, or None when these inputs are not that op. ``flavour``: the norm's,
    found fusable at patch time (None: not routed)."""
    if flavour is None or not (still_layernorm(norm, flavour) and can_layernorm(norm, flavour, x)):
        return None
    if scale is not None:
        dtype = _mod_dtype(x, flavour)
        if not (can_index(x, index) and can_table(scale, x, dtype, index) and can_table(shift, x, dtype, index)):
            return None
    return fused(_LAYERNORM_MODULATE, "layernorm_modulate", norm, x, scale, shift, norm.weight, norm.bias, norm.eps,
                 flavour, index)


def add_ln(
    norm: nn.Module, flavour: str | None, x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor | None,
    scale: torch.Tensor | None = None, shift: torch.Tensor | None = None, index: torch.Tensor | None = None,
    gate_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(h, norm-modulate(h))`` with ``h`` the residual ``x + update`` (``gate`` None) or
    ``(x + update * gate).to(x.dtype)``, as one ``add_layernorm`` call; None when these inputs are not
    that op. ``gate_dtype``: the gate's dtype for this site (default x's; Wan's is float32)."""
    if flavour is None or not can_add(x, update):
        return None
    if gate is not None and not (can_index(x, index) and can_table(gate, x, gate_dtype or x.dtype, index)):
        return None
    if not (still_layernorm(norm, flavour) and can_layernorm(norm, flavour, x)):
        return None
    if scale is not None:
        dtype = _mod_dtype(x, flavour)
        if not (can_index(x, index) and can_table(scale, x, dtype, index) and can_table(shift, x, dtype, index)):
            return None
    return fused(_ADD_LAYERNORM, "add_layernorm", norm, x, update, gate, norm.weight, norm.bias, norm.eps, flavour,
                 scale, shift, index)


# -- which sites a block routes --------------------------------------------------------------------
@dataclass(frozen=True)
class Fold:
    """An ``add_layernorm`` site: the residual whose sum the norm ``norm`` reads, added from the output
    of ``residual`` (gated or not) as ``expression``."""

    residual: str
    gated: bool
    expression: str


@dataclass
class BlockSites:
    """What one block routes: each norm's flavour (None: as written), which folds run as one
    ``add_layernorm`` call, whether the gates run as ``gated_residual``; and the report entries."""

    flavours: dict[str, str | None]
    fold: dict[str, bool]
    gates: bool
    sites: list[Site]
    skipped: list[Skipped]


def block_sites(
    block: nn.Module, kinds: frozenset[str], want: str, norms: dict[str, str], folds: dict[str, Fold],
    gates: dict[str, str],
) -> BlockSites:
    """The sites of ``block``: ``norms`` (attribute -> the modulated expression it fuses), ``folds``
    (norm attribute -> the residual it reads) and ``gates`` (the module whose output each gated residual
    adds -> expression). A fold joins an ``add_layernorm`` call only where its norm is routed
    (``layernorm_modulate``) and, when gated, the gates too (``gated_residual``): excluding either kind
    keeps that part as written, and unfolded they run as their own sites."""
    flavours: dict[str, str | None] = dict.fromkeys(norms)
    sites: list[Site] = []
    skipped: list[Skipped] = []
    if "layernorm_modulate" in kinds:
        for name, expression in norms.items():
            norm = getattr(block, name)
            flavour, detail = layernorm_flavour(norm, want)
            if flavour is None:
                skipped.append(Skipped("layernorm_modulate", name, f"{name} {detail}"))
            elif not hookless(norm):
                why = "the norm has hooks or a wrapped forward, which a fused call would skip"
                skipped.append(Skipped("layernorm_modulate", name, why))
            else:
                flavours[name] = flavour
                sites.append(Site("layernorm_modulate", name, f"{expression} [{detail}]"))
    gated = "gated_residual" in kinds
    if gated:
        sites += [Site("gated_residual", name, expression) for name, expression in gates.items()]
    fold = dict.fromkeys(folds, False)
    if "add_layernorm" in kinds:
        for name, f in folds.items():
            if "layernorm_modulate" not in kinds:
                why = "folds into the norm's layernorm_modulate site: patch that kind too"
            elif flavours[name] is None:
                why = "its norm is not fused (see the layernorm_modulate entry)"
            elif f.gated and not gated:
                why = f"folds the gated residual of {f.residual}: patch gated_residual too"
            else:
                fold[name] = True
                sites.append(Site("add_layernorm", name, f"{f.expression} [flavour={flavours[name]}]"))
                continue
            skipped.append(Skipped("add_layernorm", name, why))
    return BlockSites(flavours, fold, gated, sites, skipped)
