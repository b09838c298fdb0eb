"""Flux.2 (``Flux2Transformer2DModel``) of diffusers 0.42.1, routed through xbackend.

``Flux2TransformerBlock.forward`` and ``Flux2SingleTransformerBlock.forward``
(``diffusers/models/transformers/transformer_flux2.py``) are mirrored operation for operation, fp16
``clip`` lines included:

- ``(1 + scale) * norm(x) + shift`` of an ``nn.LayerNorm``: ``layernorm_modulate`` ("torch");
- the double block's ``x + gate_msa * attn_output`` and ``norm2(h) * (1 + scale_mlp) + shift_mlp``
  reading it (each stream): one ``add_layernorm`` call (or ``gated_residual`` and
  ``layernorm_modulate`` apart);
- ``x + gate * out`` of the MLP (double) and of the parallel attention + MLP (single): ``gated_residual``;
- ``Flux2SwiGLU``'s ``silu(x[..., :D/2]) * x[..., D/2:]``: ``silu_mul``, exactly the op's
  ``F.silu(gate) * up`` on the two halves (strided views of one projection).

The attention processors, RoPE included, and the model's ``norm_out`` are diffusers' code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._common import (
    DIFFUSERS_VERSION,
    Findings,
    Mark,
    PatchOptions,
    Site,
    can_silu_mul,
    clone,
    diffusers_mismatch,
    foreign_override,
    gated,
    hookless_now,
    install,
    mark,
    report_own_override,
    same_parameters,
    silu_mul,
)
from ._layernorm import BlockSites, Fold, add_ln, block_sites, ln_modulate
from .ltx2_blocks import install_block

_DOUBLE_NORMS = {
    "norm1": "(1 + scale_msa) * norm1(hidden_states) + shift_msa",
    "norm1_context": "(1 + c_scale_msa) * norm1_context(encoder_hidden_states) + c_shift_msa",
    "norm2": "norm2(hidden_states) * (1 + scale_mlp) + shift_mlp",
    "norm2_context": "norm2_context(encoder_hidden_states) * (1 + c_scale_mlp) + c_shift_mlp",
}
_DOUBLE_FOLDS = {
    "norm2": Fold("attn", True, "h = hidden_states + gate_msa * attn_output, then norm2's modulate"),
    "norm2_context": Fold(
        "attn", True, "h = encoder_hidden_states + c_gate_msa * context_attn_output, then norm2_context's modulate"
    ),
}
_DOUBLE_GATES = {
    "attn": "hidden_states + gate_msa * attn_output; encoder_hidden_states + c_gate_msa * context_attn_output",
    "ff": "hidden_states + gate_mlp * ff_output",
    "ff_context": "encoder_hidden_states + c_gate_mlp * context_ff_output",
}
_SINGLE_NORMS = {"norm": "(1 + mod_scale) * norm(hidden_states) + mod_shift"}
_SINGLE_GATES = {"attn": "hidden_states + mod_gate * attn_output"}
def _first(norm: nn.Module, flavour: str | None, x: torch.Tensor, scale: torch.Tensor,
           shift: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """``(1 + scale) * norm(x) + shift``."""
    y = ln_modulate(norm, flavour, x, scale, shift)
    return (1 + scale) * norm(x) + shift if y is None else y


def _residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor, gates: bool, site: nn.Module) -> torch.Tensor:
    """``x + gate * update``, ``update`` the output of module ``site`` (one multiply commutes exactly:
    the op's ``x + update * gate``)."""
    return gated(x, update, gate, site) if gates else x + gate * update


def _residual_norm(
    norm: nn.Module, flavour: str | None, fold: bool, gates: bool, site: nn.Module, x: torch.Tensor,
    update: torch.Tensor, gate: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + gate * update``, then ``norm(h) * (1 + scale) + shift``."""
    folded = add_ln(norm, flavour, x, update, gate, scale, shift) if fold else None
    if folded is not None:
        return folded
    h = _residual(x, update, gate, gates, site)
    y = ln_modulate(norm, flavour, h, scale, shift)
    return h, norm(h) * (1 + scale) + shift if y is None else y


def double_block_forward(sites: BlockSites, flux2: Any) -> Callable[..., Any]:
    """A forward for one Flux2TransformerBlock routing ``sites``; ``flux2`` is diffusers'
    transformer_flux2 module (imported here, not in the forward torch.compile traces), whose
    ``Flux2Modulation.split`` the forward calls as diffusers' does."""
    f1, f1c, f2, f2c = (sites.flavours[n] for n in _DOUBLE_NORMS)
    fold2, fold2c, gates = sites.fold["norm2"], sites.fold["norm2_context"], sites.gates

    def forward(
        self: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        temb_mod_img: torch.Tensor,
        temb_mod_txt: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        joint_attention_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        joint_attention_kwargs = joint_attention_kwargs or {}
        split = flux2.Flux2Modulation.split
        (shift_msa, scale_msa, gate_msa), (shift_mlp, scale_mlp, gate_mlp) = split(temb_mod_img, 2)
        (c_shift_msa, c_scale_msa, c_gate_msa), (c_shift_mlp, c_scale_mlp, c_gate_mlp) = split(temb_mod_txt, 2)

        norm_hidden_states = _first(self.norm1, f1, hidden_states, scale_msa, shift_msa)
        norm_encoder_hidden_states = _first(self.norm1_context, f1c, encoder_hidden_states, c_scale_msa, c_shift_msa)
        attn_output, context_attn_output = self.attn(
            hidden_states=norm_hidden_states,
            encoder_hidden_states=norm_encoder_hidden_states,
            image_rotary_emb=image_rotary_emb,
            **joint_attention_kwargs,
        )

        # Image stream: the gated attention residual, norm2 reading its sum, the MLP's gated residual.
        hidden_states, norm_hidden_states = _residual_norm(
            self.norm2, f2, fold2, gates, self.attn, hidden_states, attn_output, gate_msa, scale_mlp, shift_mlp
        )
        ff_output = self.ff(norm_hidden_states)
        hidden_states = _residual(hidden_states, ff_output, gate_mlp, gates, self.ff)

        # Text stream, the same.
        encoder_hidden_states, norm_encoder_hidden_states = _residual_norm(
            self.norm2_context, f2c, fold2c, gates, self.attn, encoder_hidden_states, context_attn_output,
            c_gate_msa, c_scale_mlp, c_shift_mlp,
        )  # fmt: skip
        context_ff_output = self.ff_context(norm_encoder_hidden_states)
        encoder_hidden_states = _residual(encoder_hidden_states, context_ff_output, c_gate_mlp, gates, self.ff_context)
        if encoder_hidden_states.dtype == torch.float16:
            encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
        return encoder_hidden_states, hidden_states

    return forward


def single_block_forward(sites: BlockSites, flux2: Any) -> Callable[..., Any]:
    """A forward for one Flux2SingleTransformerBlock routing ``sites`` (``flux2``: as in
    `double_block_forward`)."""
    f_norm, gates = sites.flavours["norm"], sites.gates

    def forward(
        self: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None,
        temb_mod: torch.Tensor,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        joint_attention_kwargs: dict[str, Any] | None = None,
        split_hidden_states: bool = False,
        text_seq_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Without encoder_hidden_states, hidden_states already holds the text tokens first.
        if encoder_hidden_states is not None:
            text_seq_len = encoder_hidden_states.shape[1]
            hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        mod_shift, mod_scale, mod_gate = flux2.Flux2Modulation.split(temb_mod, 1)[0]
        norm_hidden_states = _first(self.norm, f_norm, hidden_states, mod_scale, mod_shift)
        joint_attention_kwargs = joint_attention_kwargs or {}
        attn_output = self.attn(
            hidden_states=norm_hidden_states,
            image_rotary_emb=image_rotary_emb,
            **joint_attention_kwargs,
        )
        hidden_states = _residual(hidden_states, attn_output, mod_gate, gates, self.attn)
        if hidden_states.dtype == torch.float16:
            hidden_states = hidden_states.clip(-65504, 65504)
        if split_hidden_states:
            encoder_hidden_states, hidden_states = hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]
            return encoder_hidden_states, hidden_states
        return hidden_states

    return forward


def patch_double_block(block: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(block, "forward", path, found):
        return
    sites = block_sites(block, options.kinds, "torch", _DOUBLE_NORMS, _DOUBLE_FOLDS, _DOUBLE_GATES)
    install_block(block, path, found, double_block_forward(sites, _flux2_module()), sites.sites, sites.skipped)


def patch_single_block(block: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(block, "forward", path, found):
        return
    sites = block_sites(block, options.kinds, "torch", _SINGLE_NORMS, {}, _SINGLE_GATES)
    install_block(block, path, found, single_block_forward(sites, _flux2_module()), sites.sites, sites.skipped)


def _flux2_module() -> Any:
    from diffusers.models.transformers import transformer_flux2

    return transformer_flux2


# -- Flux2SwiGLU ---------------------------------------------------------------------------------------
def _stock_gate_fn(fn: nn.Module) -> bool:
    """``gate_fn`` is still an out-of-place ``nn.SiLU`` that nothing hooks: ``F.silu``."""
    return type(fn) is nn.SiLU and not fn.inplace and hookless_now(fn)


def swiglu_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    gate, up = x[..., :half], x[..., half:]
    if _stock_gate_fn(self.gate_fn) and can_silu_mul(gate, up):
        return silu_mul(gate, up, self)
    return self.gate_fn(gate) * up


def patch_swiglu(module: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(module, "forward", path, found):
        return
    if "silu_mul" not in options.kinds:
        return
    problem = diffusers_mismatch()
    if problem is None:
        if not same_parameters(swiglu_forward, type(module).forward):
            problem = f"forward has a different signature than diffusers {DIFFUSERS_VERSION}'s"
        elif foreign_override(module, "forward"):
            problem = "forward is already replaced on this instance (a hook wrapper?); left alone"
        elif not _stock_gate_fn(module.gate_fn):
            problem = f"gate_fn is {type(module.gate_fn).__name__} (in place or hooked?), not F.silu"
    if problem is not None:
        found.skip("silu_mul", path, problem)
        return
    tag = Mark((Site("silu_mul", "", "gate_fn(x[..., :D/2]) * x[..., D/2:] fused"),))
    install(module, "forward", mark(clone(swiglu_forward), tag))
    tag.report(path, found, new=True)
