"""Wan 2.x (``WanTransformer3DModel``) of diffusers 0.42.1, routed through xbackend.

``WanTransformerBlock.forward`` (``diffusers/models/transformers/transformer_wan.py``) is mirrored
operation for operation, in float32 where Wan computes in float32:

- ``(norm1(x.float()) * (1 + scale_msa) + shift_msa).type_as(x)``: ``layernorm_modulate`` ("fp32");
- ``(x.float() + attn1(...) * gate_msa).type_as(x)`` and the cross-attention's
  ``norm2(h.float()).type_as(h)`` reading it: one ``add_layernorm`` call (or ``gated_residual`` and
  ``layernorm_modulate`` apart); likewise ``x + attn2(...)`` with norm3's modulation;
- ``(x.float() + ffn(...).float() * c_gate_msa).type_as(x)``: ``gated_residual`` with its float32 gate.

Wan 2.2 ti2v's per-token ``temb`` ([B, L, 6, D]) gives [B, L, D] tables, the same ops. The
self-attention's interleaved RoPE (``WanAttnProcessor``'s ``apply_rotary_emb``) is ``rotary_embedding``
where Wan computes it in float32: cos and sin taken as Wan reads them (``cos[..., 0::2]`` and
``sin[..., 1::2]`` for both channels of a pair). With bf16 frequencies under a bf16 x Wan rotates in
bf16, and that call stays as written. The model's own ``norm_out`` and the I2V image embedder's norms
are diffusers' code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import _common
from ._common import (
    _FLOAT,
    DIFFUSERS_VERSION,
    Findings,
    PatchOptions,
    _broadcasts,
    diffusers_mismatch,
    fused,
    report_own_override,
    same_parameters,
)
from ._layernorm import BlockSites, Fold, add_ln, block_sites, ln_modulate
from .ltx2_blocks import install_block

_NORMS = {
    "norm1": "(norm1(x.float()) * (1 + scale_msa) + shift_msa).type_as(x)",
    "norm2": "norm2(h.float()).type_as(h)",
    "norm3": "(norm3(h.float()) * (1 + c_scale_msa) + c_shift_msa).type_as(h)",
}
_FOLDS = {
    "norm2": Fold("attn1", True, "h = (x.float() + attn1(...) * gate_msa).type_as(x), then norm2's"),
    "norm3": Fold("attn2", False, "h = x + attn2(...), then norm3's modulate"),
}
_GATES = {
    "attn1": "(x.float() + attn_output * gate_msa).type_as(x)",
    "ffn": "(x.float() + ff_output.float() * c_gate_msa).type_as(x)",
}


def _can_gate_fp32(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> bool:
    """``(x.float() + update * gate).type_as(x)`` with a float32 gate is the op's
    ``(x + update * gate).to(x.dtype)``: update of x's dtype promotes to float32 in both."""
    return (
        x.dtype in _FLOAT
        and x.dim() >= 1
        and update.dtype == x.dtype
        and update.device == x.device
        and update.shape == x.shape
        and gate.dtype == torch.float32
        and gate.device == x.device
        and _broadcasts(gate, x.shape)
    )


def _residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor, gates: bool, site: nn.Module) -> torch.Tensor:
    """Wan's ``(x.float() + update * gate).type_as(x)``, ``update`` the output of module ``site``."""
    if gates and _can_gate_fp32(x, update, gate):
        return fused(_common._GATED_RESIDUAL, "gated_residual", site, x, update, gate)
    return (x.float() + update * gate).type_as(x)


def _ff_residual(x: torch.Tensor, ff_output: torch.Tensor, gate: torch.Tensor, gates: bool,
                 site: nn.Module) -> torch.Tensor:  # fmt: skip
    """Wan's ``(x.float() + ff_output.float() * gate).type_as(x)``."""
    if gates and _can_gate_fp32(x, ff_output, gate):
        return fused(_common._GATED_RESIDUAL, "gated_residual", site, x, ff_output, gate)
    return (x.float() + ff_output.float() * gate).type_as(x)


def _modulated(norm: nn.Module, flavour: str | None, x: torch.Tensor, scale: torch.Tensor,
               shift: torch.Tensor) -> torch.Tensor:  # fmt: skip
    y = ln_modulate(norm, flavour, x, scale, shift)
    return (norm(x.float()) * (1 + scale) + shift).type_as(x) if y is None else y


def block_forward(sites: BlockSites) -> Callable[..., Any]:
    """A forward for one WanTransformerBlock routing ``sites``."""
    f_norm1, f_norm2, f_norm3 = (sites.flavours.get(n) for n in _NORMS)
    fold2, fold3, gates = sites.fold.get("norm2", False), sites.fold.get("norm3", False), sites.gates

    def forward(
        self: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        temb: torch.Tensor,
        rotary_emb: torch.Tensor,
    ) -> torch.Tensor:
        if temb.ndim == 4:
            # temb: batch_size, seq_len, 6, inner_dim (wan2.2 ti2v)
            shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (
                self.scale_shift_table.unsqueeze(0) + temb.float()
            ).chunk(6, dim=2)
            shift_msa = shift_msa.squeeze(2)
            scale_msa = scale_msa.squeeze(2)
            gate_msa = gate_msa.squeeze(2)
            c_shift_msa = c_shift_msa.squeeze(2)
            c_scale_msa = c_scale_msa.squeeze(2)
            c_gate_msa = c_gate_msa.squeeze(2)
        else:
            shift_msa, scale_msa, gate_msa, c_shift_msa, c_scale_msa, c_gate_msa = (
                self.scale_shift_table + temb.float()
            ).chunk(6, dim=1)

        # 1. Self-attention
        norm_hidden_states = _modulated(self.norm1, f_norm1, hidden_states, scale_msa, shift_msa)
        attn_output = self.attn1(norm_hidden_states, None, None, rotary_emb)

        # 2. Cross-attention: norm2 reads the gated residual's rounded sum.
        folded = None
        if fold2:
            folded = add_ln(self.norm2, f_norm2, hidden_states, attn_output, gate_msa, gate_dtype=torch.float32)
        if folded is not None:
            hidden_states, norm_hidden_states = folded
        else:
            hidden_states = _residual(hidden_states, attn_output, gate_msa, gates, self.attn1)
            norm_hidden_states = ln_modulate(self.norm2, f_norm2, hidden_states)
            if norm_hidden_states is None:
                norm_hidden_states = self.norm2(hidden_states.float()).type_as(hidden_states)
        attn_output = self.attn2(norm_hidden_states, encoder_hidden_states, None, None)

        # 3. Feed-forward: norm3 reads the plain residual's sum.
        folded = None
        if fold3:
            folded = add_ln(self.norm3, f_norm3, hidden_states, attn_output, None, c_scale_msa, c_shift_msa)
        if folded is not None:
            hidden_states, norm_hidden_states = folded
        else:
            hidden_states = hidden_states + attn_output
            norm_hidden_states = _modulated(self.norm3, f_norm3, hidden_states, c_scale_msa, c_shift_msa)
        ff_output = self.ffn(norm_hidden_states)
        return _ff_residual(hidden_states, ff_output, c_gate_msa, gates, self.ffn)

    return forward


def patch_block(block: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(block, "forward", path, found):
        return
    norms, folds = dict(_NORMS), dict(_FOLDS)
    if isinstance(block.norm2, nn.Identity):  # cross_attn_norm=False: no norm, a gated residual alone
        del norms["norm2"], folds["norm2"]
    sites = block_sites(block, options.kinds, "fp32", norms, folds, _GATES)
    install_block(block, path, found, block_forward(sites), sites.sites, sites.skipped)


# -- WanAttention: the self-attention's RoPE -----------------------------------------------------------
_WAN: list[Any] = []


def _wan_module() -> Any:
    """diffusers' transformer_wan module, whose projection helpers and attention dispatcher the
    processor calls as diffusers' does. Imported by `patch_rope_processor`, so the call torch.compile
    traces only reads it (a processor unpickled in a new process imports it on its first call)."""
    if not _WAN:
        from diffusers.models.transformers import transformer_wan

        _WAN.append(transformer_wan)
    return _WAN[0]


def _wan_rope(hidden_states: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """``apply_rotary_emb`` of diffusers' ``WanAttnProcessor``, as written."""
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


def _can_rope(x: torch.Tensor, cos: object, sin: object) -> bool:
    """Wan's RoPE of ``x`` [B, S, H, D] is the interleaved op's: products and sums in float32 (x and the
    frequencies promote to float32), cos and sin [.., D] broadcasting to x, x contiguous (Wan's output
    takes x's strides; the op's is contiguous)."""
    return (
        isinstance(cos, torch.Tensor)
        and isinstance(sin, torch.Tensor)
        and x.dtype in _FLOAT
        and x.dim() >= 1
        and x.shape[-1] % 2 == 0
        and x.is_contiguous()
        and cos.dtype in _FLOAT
        and sin.dtype in _FLOAT
        and torch.promote_types(x.dtype, cos.dtype) == torch.float32
        and torch.promote_types(x.dtype, sin.dtype) == torch.float32
        and cos.shape == sin.shape
        and cos.shape[-1] == x.shape[-1]
        and cos.device == x.device
        and sin.device == x.device
        and _broadcasts(cos, x.shape)
    )


def _pairs(t: torch.Tensor) -> torch.Tensor:
    """Each value twice, for both channels of a pair: ``[a, b] -> [a, a, b, b]``."""
    return torch.stack((t, t), dim=-1).flatten(-2)


def _rotate(attn: nn.Module, query: torch.Tensor, key: torch.Tensor, freqs_cos: torch.Tensor,
            freqs_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Wan's RoPE of query and key. The op reads cos[c] and sin[c] for channel c; Wan reads cos[2i] and
    sin[2i+1] for both channels of pair i, so the op gets those, paired. Its even channel
    ``x[2i]*cos + (-x[2i+1])*sin`` is Wan's ``x1*cos - x2*sin`` (negation is exact), its odd one Wan's
    sum in the other order (addition commutes)."""
    if _can_rope(query, freqs_cos, freqs_sin) and _can_rope(key, freqs_cos, freqs_sin):
        cos, sin = _pairs(freqs_cos[..., 0::2]), _pairs(freqs_sin[..., 1::2])
        rope = _common._ROTARY
        return (fused(rope, "rotary_embedding", attn, query, cos, sin, "interleaved"),
                fused(rope, "rotary_embedding", attn, key, cos, sin, "interleaved"))
    return _wan_rope(query, freqs_cos, freqs_sin), _wan_rope(key, freqs_cos, freqs_sin)


class XbackendWanAttnProcessor:
    """Stands in for diffusers' ``WanAttnProcessor`` on one self-attention ``WanAttention``: the same
    computation, transcribed, with the RoPE of query and key through `_rotate`. Keeps the processor it
    replaced for `unpatch`."""

    _attention_backend = None
    _parallel_config = None

    def __init__(self, original: Any):
        self.original = original
        self._attention_backend = getattr(original, "_attention_backend", None)
        self._parallel_config = getattr(original, "_parallel_config", None)

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        tw = _wan_module()
        encoder_hidden_states_img = None
        if attn.add_k_proj is not None:
            # 512 is the context length of the text encoder, hardcoded for now
            image_context_length = encoder_hidden_states.shape[1] - 512
            encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
            encoder_hidden_states = encoder_hidden_states[:, image_context_length:]

        query, key, value = tw._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        if rotary_emb is not None:
            query, key = _rotate(attn, query, key, *rotary_emb)

        # I2V task
        hidden_states_img = None
        if encoder_hidden_states_img is not None:
            key_img, value_img = tw._get_added_kv_projections(attn, encoder_hidden_states_img)
            key_img = attn.norm_added_k(key_img)
            key_img = key_img.unflatten(2, (attn.heads, -1))
            value_img = value_img.unflatten(2, (attn.heads, -1))
            hidden_states_img = tw.dispatch_attention_fn(
                query, key_img, value_img, attn_mask=None, dropout_p=0.0, is_causal=False,
                backend=self._attention_backend, parallel_config=None,
            )  # fmt: skip
            hidden_states_img = hidden_states_img.flatten(2, 3)
            hidden_states_img = hidden_states_img.type_as(query)

        hidden_states = tw.dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend,
            parallel_config=(self._parallel_config if encoder_hidden_states is None else None),
        )  # fmt: skip
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.type_as(query)
        if hidden_states_img is not None:
            hidden_states = hidden_states + hidden_states_img
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


def patch_rope_processor(attn: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    processor = attn.processor
    if isinstance(processor, XbackendWanAttnProcessor):
        found.add("rotary_embedding", path, f"heads={attn.heads}; was {type(processor.original).__name__}", new=False)
        return
    # Cross-attention gets no rotary embedding from the block: no RoPE site.
    if "rotary_embedding" not in options.kinds or attn.is_cross_attention:
        return
    WanAttnProcessor = _wan_module().WanAttnProcessor

    if (problem := diffusers_mismatch()) is not None:
        found.skip("rotary_embedding", path, problem)
    elif type(processor) is not WanAttnProcessor:
        found.skip("rotary_embedding", path, f"processor {type(processor).__name__} is not WanAttnProcessor")
    elif not same_parameters(XbackendWanAttnProcessor.__call__, WanAttnProcessor.__call__):
        found.skip("rotary_embedding", path, f"WanAttnProcessor differs from diffusers {DIFFUSERS_VERSION}'s")
    elif getattr(processor, "_parallel_config", None) is not None:
        found.skip("rotary_embedding", path, "context-parallel attention is configured on the processor")
    else:
        attn.set_processor(XbackendWanAttnProcessor(processor))
        found.add("rotary_embedding", path, f"heads={attn.heads}; interleaved RoPE where Wan computes it in "
                                            f"float32; was {type(processor).__name__}")  # fmt: skip


def unpatch_rope_processor(attn: nn.Module, path: str, found: Findings) -> None:
    processor = attn.processor
    if isinstance(processor, XbackendWanAttnProcessor):
        # set_attention_backend / enable_parallelism after patch() set them on our processor.
        processor.original._attention_backend = processor._attention_backend
        processor.original._parallel_config = processor._parallel_config
        attn.set_processor(processor.original)
        found.add("rotary_embedding", path, f"restored {type(processor.original).__name__}")
