"""Qwen-Image (``QwenImageTransformer2DModel``) of diffusers 0.42.1, routed through xbackend.

``QwenImageTransformerBlock.forward`` (``diffusers/models/transformers/transformer_qwenimage.py``) is
mirrored operation for operation, fp16 ``clip`` lines included. Its ``_modulate(norm(x), mod, index)``
— ``x * (1 + scale) + shift`` with ``shift, scale, gate = mod.chunk(3, -1)`` as ``[B, 1, D]``, or with
``zero_cond_t``'s ``modulate_index`` a per-token ``torch.where`` between ``mod[:B]`` and ``mod[B:]`` —
is ``layernorm_modulate`` ("torch"), the two halves passed as its ``[2, B, D]`` index tables. The
attention residual ``x + gate1 * attn_output`` and ``img_norm2`` / ``txt_norm2`` reading it are one
``add_layernorm`` call (or ``gated_residual`` and ``layernorm_modulate`` apart), the MLP's
``x + gate2 * mlp_output`` is ``gated_residual``. A ``_modulate`` replaced on the class or the
instance runs as it is. The attention processor (its RoPE multiplies complex numbers) and the model's
``norm_out`` are diffusers' code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._common import Findings, PatchOptions, Skipped, diffusers_mismatch, gated, report_own_override
from ._layernorm import BlockSites, Fold, add_ln, block_sites, ln_modulate
from .ltx2_blocks import install_block

_NORMS = {
    "img_norm1": "_modulate(img_norm1(hidden_states), img_mod1, modulate_index)",
    "txt_norm1": "_modulate(txt_norm1(encoder_hidden_states), txt_mod1)",
    "img_norm2": "_modulate(img_norm2(hidden_states), img_mod2, modulate_index)",
    "txt_norm2": "_modulate(txt_norm2(encoder_hidden_states), txt_mod2)",
}
_FOLDS = {
    "img_norm2": Fold("attn", True, "h = hidden_states + img_gate1 * img_attn_output, then img_norm2's modulate"),
    "txt_norm2": Fold(
        "attn", True, "h = encoder_hidden_states + txt_gate1 * txt_attn_output, then txt_norm2's modulate"
    ),
}
_GATES = {
    "attn": "hidden_states + img_gate1 * img_attn_output; encoder_hidden_states + txt_gate1 * txt_attn_output",
    "img_mlp": "hidden_states + img_gate2 * img_mlp_output",
    "txt_mlp": "encoder_hidden_states + txt_gate2 * txt_mlp_output",
}


# (shift, scale, gate) as the ops take them: [B, 1, D] each, or [2, B, D] tables with an index.
Tables = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _stock_modulate(block: nn.Module, stock: Callable[..., Any]) -> bool:
    """The block's ``_modulate`` is diffusers' own, ``stock`` (not replaced on the class or the instance)."""
    return type(block)._modulate is stock and "_modulate" not in block.__dict__


def _tables(mod: torch.Tensor, index: Any, x: torch.Tensor) -> Tables | None:
    """``_modulate``'s shift, scale and gate in op form, or None where its shapes are not that."""
    shift, scale, gate = mod.chunk(3, dim=-1)
    if index is None:
        return shift.unsqueeze(1), scale.unsqueeze(1), gate.unsqueeze(1)
    # _modulate's halves mod[:B] and mod[B:] as tables 0 and 1, for an x of batch B
    if shift.dim() != 2 or x.dim() != 3 or shift.size(0) != 2 * x.shape[0]:
        return None
    return shift.unflatten(0, (2, -1)), scale.unflatten(0, (2, -1)), gate.unflatten(0, (2, -1))


def _selected(table: torch.Tensor, index: Any) -> torch.Tensor:
    """A table as ``_modulate`` returns it: itself, or its per-token ``torch.where`` selection."""
    if index is None:
        return table
    return torch.where(index.unsqueeze(-1) == 0, table[0].unsqueeze(1), table[1].unsqueeze(1))


class _Gate:
    """A gate ``_modulate`` returns: selected already, or still a table, selected only if needed (a
    folded residual reads the table)."""

    __slots__ = ("index", "table", "value_")

    def __init__(self, value: torch.Tensor | None, table: torch.Tensor | None = None, index: Any = None):
        self.value_, self.table, self.index = value, table, index

    def value(self) -> torch.Tensor:
        return self.value_ if self.value_ is not None else _selected(self.table, self.index)


def _modulate(block: nn.Module, stock: Callable[..., Any], norm: nn.Module, flavour: str | None, x: torch.Tensor,
              mod: torch.Tensor, index: Any) -> tuple[torch.Tensor, _Gate, Tables | None]:  # fmt: skip
    """``block._modulate(norm(x), mod, index)`` (the modulated x and its gate), with the tables when the
    fused path ran. ``stock``: diffusers' ``_modulate``."""
    if flavour is not None and _stock_modulate(block, stock):
        t = _tables(mod, index, x)
        if t is not None:
            y = ln_modulate(norm, flavour, x, t[1], t[0], index)
            if y is not None:
                return y, _Gate(None, t[2], index), t
    y, gate = block._modulate(norm(x), mod, index)
    return y, _Gate(gate), None


def _residual_modulate(
    block: nn.Module, stock: Callable[..., Any], norm: nn.Module, flavour: str | None, fold: bool, gates: bool,
    x: torch.Tensor, update: torch.Tensor, gate1: _Gate, tables1: Tables | None, mod1: torch.Tensor,
    mod2: torch.Tensor, index: Any,
) -> tuple[torch.Tensor, torch.Tensor, _Gate]:
    """``h = x + gate1 * update``, then ``block._modulate(norm(h), mod2, index)``."""
    if fold and _stock_modulate(block, stock):
        t1 = tables1 if tables1 is not None else _tables(mod1, index, x)
        t2 = _tables(mod2, index, x)
        if t1 is not None and t2 is not None:
            folded = add_ln(norm, flavour, x, update, t1[2], t2[1], t2[0], index)
            if folded is not None:
                return folded[0], folded[1], _Gate(None, t2[2], index)
    gate = gate1.value()
    h = gated(x, update, gate, block.attn) if gates else x + gate * update
    y, gate2, _ = _modulate(block, stock, norm, flavour, h, mod2, index)
    return h, y, gate2


def block_forward(sites: BlockSites, stock: Callable[..., Any]) -> Callable[..., Any]:
    """A forward for one QwenImageTransformerBlock routing ``sites``; ``stock`` is diffusers'
    ``_modulate`` (resolved here, not in the forward torch.compile traces)."""
    f_img1, f_txt1, f_img2, f_txt2 = (sites.flavours[n] for n in _NORMS)
    fold_img, fold_txt, gates = sites.fold["img_norm2"], sites.fold["txt_norm2"], sites.gates

    def residual(x: torch.Tensor, update: torch.Tensor, gate: _Gate, site: nn.Module) -> torch.Tensor:
        g = gate.value()
        return gated(x, update, g, site) if gates else x + g * update

    def forward(
        self: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_hidden_states_mask: torch.Tensor,
        temb: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        joint_attention_kwargs: dict[str, Any] | None = None,
        modulate_index: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        img_mod_params = self.img_mod(temb)  # [B, 6*dim]
        if self.zero_cond_t:
            temb = torch.chunk(temb, 2, dim=0)[0]
        txt_mod_params = self.txt_mod(temb)  # [B, 6*dim]
        img_mod1, img_mod2 = img_mod_params.chunk(2, dim=-1)  # Each [B, 3*dim]
        txt_mod1, txt_mod2 = txt_mod_params.chunk(2, dim=-1)  # Each [B, 3*dim]

        img_modulated, img_gate1, img_t1 = _modulate(
            self, stock, self.img_norm1, f_img1, hidden_states, img_mod1, modulate_index
        )
        txt_modulated, txt_gate1, txt_t1 = _modulate(
            self, stock, self.txt_norm1, f_txt1, encoder_hidden_states, txt_mod1, None
        )

        joint_attention_kwargs = joint_attention_kwargs or {}
        attn_output = self.attn(
            hidden_states=img_modulated,
            encoder_hidden_states=txt_modulated,
            encoder_hidden_states_mask=encoder_hidden_states_mask,
            image_rotary_emb=image_rotary_emb,
            **joint_attention_kwargs,
        )
        img_attn_output, txt_attn_output = attn_output

        # Each stream: the gated attention residual, norm2 reading its sum, the MLP's gated residual
        # (modules called in diffusers' order; the text residual, plain arithmetic, moves after img_mlp).
        hidden_states, img_modulated2, img_gate2 = _residual_modulate(
            self, stock, self.img_norm2, f_img2, fold_img, gates, hidden_states, img_attn_output, img_gate1, img_t1,
            img_mod1, img_mod2, modulate_index,
        )  # fmt: skip
        hidden_states = residual(hidden_states, self.img_mlp(img_modulated2), img_gate2, self.img_mlp)
        encoder_hidden_states, txt_modulated2, txt_gate2 = _residual_modulate(
            self, stock, self.txt_norm2, f_txt2, fold_txt, gates, encoder_hidden_states, txt_attn_output, txt_gate1,
            txt_t1, txt_mod1, txt_mod2, None,
        )  # fmt: skip
        encoder_hidden_states = residual(encoder_hidden_states, self.txt_mlp(txt_modulated2), txt_gate2, self.txt_mlp)

        # Clip to prevent overflow for fp16
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states

    return forward


def patch_block(block: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(block, "forward", path, found):
        return
    sites = block_sites(block, options.kinds, "torch", _NORMS, _FOLDS, _GATES)
    stock = _diffusers_modulate()
    if stock is None and diffusers_mismatch() is None:  # the norm sites run _modulate as it is: none fuses
        why = "QwenImageTransformerBlock._modulate is not diffusers' own (replaced on the class)"
        moved = [s for s in sites.sites if s.kind in ("layernorm_modulate", "add_layernorm")]
        sites.sites[:] = [s for s in sites.sites if s not in moved]
        sites.skipped += [Skipped(s.kind, s.path, why) for s in moved]
    install_block(block, path, found, block_forward(sites, stock), sites.sites, sites.skipped)


def _diffusers_modulate() -> Callable[..., Any] | None:
    """diffusers' ``QwenImageTransformerBlock._modulate`` as the class holds it, or None where the
    installed diffusers is not the one mirrored (`install_block` then reports that) or the class holds
    another function."""
    if diffusers_mismatch() is not None:
        return None
    from diffusers.models.transformers import transformer_qwenimage as tq

    fn = tq.QwenImageTransformerBlock.__dict__.get("_modulate")
    own = (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)) == (
        tq.__name__, "QwenImageTransformerBlock._modulate")
    return fn if own else None
