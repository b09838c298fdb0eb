"""LTX-2 sites of diffusers 0.42.1, routed through xbackend.

Mirrors, operation for operation, these diffusers 0.42.1 files:

- ``diffusers/models/transformers/transformer_ltx2.py``: ``LTX2VideoTransformerBlock.forward`` and
  ``LTX2AudioVideoAttnProcessor.__call__`` (interleaved and split RoPE through ``rotary_embedding``).
- ``diffusers/models/autoencoders/ltx2_diffusion_decoder.py``: ``LTX2VideoVaeDiffusionNABlock.forward``,
  the neighborhood-attention processors of ``LTX2VideoVaeNeighborhoodAttention``, and
  ``LTX2VideoDiffusionDecoderModel.tiled_decode`` (through ``xbackend.adapters.diffusers_ltx2``).

The block forwards below compute every value the way diffusers does, in the same order, except that
``norm(x) * (1 + scale) + shift`` goes to ``rmsnorm_modulate`` and ``x + out * gate`` to
``gated_residual`` where the fused op is the same expression (checked per call; otherwise the
expression runs as written). `patch` checks the installed diffusers version and the forward
signatures first and leaves these sites alone, with the reason in its report, when they differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._api import get_op
from ..adapters.diffusers_ltx2 import DiffVAENeighborhoodProcessor, tiled_decode_diffvae
from ._common import (
    DIFFUSERS_VERSION,
    Findings,
    Mark,
    Site,
    Skipped,
    diffusers_mismatch,
    foreign_override,
    gated,
    hookless,
    hookless_now,
    install,
    mark,
    norm_modulate,
    own_override,
    qk_fusion_flavour,
    qk_norm_rope,
    rmsnorm_flavour,
    rope_interleaved,
    rope_split,
    same_parameters,
)

# Norms of LTX2VideoTransformerBlock whose output is modulated, and what each modulation is.
_TRANSFORMER_NORMS = {
    "norm1": "norm1(hidden_states) * (1 + scale_msa) + shift_msa",
    "audio_norm1": "audio_norm1(audio_hidden_states) * (1 + audio_scale_msa) + audio_shift_msa",
    "norm2": "norm2(hidden_states) * (1 + scale_text_q) + shift_text_q",
    "audio_norm2": "audio_norm2(audio_hidden_states) * (1 + audio_scale_text_q) + audio_shift_text_q",
    "audio_to_video_norm": "audio_to_video_norm(hidden_states) * (1 + a2v/v2a scale) + shift (2 calls)",
    "video_to_audio_norm": "video_to_audio_norm(audio_hidden_states) * (1 + a2v/v2a scale) + shift (2 calls)",
    "norm3": "norm3(hidden_states) * (1 + scale_mlp) + shift_mlp",
    "audio_norm3": "audio_norm3(audio_hidden_states) * (1 + audio_scale_mlp) + audio_shift_mlp",
}
# The module whose output each gated residual adds, and the expression it replaces.
_TRANSFORMER_GATES = {
    "attn1": "hidden_states + attn_hidden_states * gate_msa",
    "audio_attn1": "audio_hidden_states + attn_audio_hidden_states * audio_gate_msa",
    "attn2": "hidden_states + (attn_hidden_states * gate_text_q)",
    "audio_attn2": "audio_hidden_states + (attn_audio_hidden_states * audio_gate_text_q)",
    "audio_to_video_attn": "hidden_states + a2v_gate * a2v_attn_hidden_states",
    "video_to_audio_attn": "audio_hidden_states + v2a_gate * v2a_attn_hidden_states",
    "ff": "hidden_states + ff_output * gate_mlp",
    "audio_ff": "audio_hidden_states + audio_ff_output * audio_gate_mlp",
}
_DIFFUSION_NORMS = {
    "norm1": "norm1(hidden_states) * (1 + scale_msa) + shift_msa",
    "norm2": "norm2(hidden_states) * (1 + scale_mlp) + shift_mlp",
}


# -- LTX2VideoTransformerBlock -----------------------------------------------------------------------
def _self_attention_kwargs(
    block: nn.Module, x: torch.Tensor, rotary: Any, mask: Any, perturbation_mask: Any, all_perturbed: Any
) -> dict[str, Any]:
    kwargs = {"hidden_states": x, "encoder_hidden_states": None, "query_rotary_emb": rotary, "attention_mask": mask}
    if block.perturbed_attn:
        kwargs["perturbation_mask"] = perturbation_mask
        kwargs["all_perturbed"] = all_perturbed
    return kwargs


def _prompt_scale_shift(
    block: nn.Module, table: torch.Tensor, temb_prompt: torch.Tensor | None, batch: int, like: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    # Without a prompt timestep embedding the K/V modulation is the static per-layer table.
    if temb_prompt is not None:
        return block.get_mod_params(table, temb_prompt, batch)
    return table[None, None].to(device=like.device, dtype=like.dtype).unbind(dim=2)


def _modulate_once(
    norm: nn.Module, flavour: str | None, normed: torch.Tensor | None, x: torch.Tensor,
    scale: torch.Tensor, shift: torch.Tensor,
) -> torch.Tensor:
    """A modulation of a norm output that diffusers computes once and modulates twice: fused, each call
    recomputes the norm inside the op (same bits); unfused, ``normed`` is that one shared output."""
    if normed is None:
        return norm_modulate(norm, flavour, x, scale, shift)
    return normed * (1 + scale) + shift


def transformer_block_forward(flavours: dict[str, str | None], gates: bool) -> Callable[..., Any]:
    """A forward for one LTX2VideoTransformerBlock. ``flavours[name]`` is the RMSNorm flavour of each
    modulated norm that may be fused (None keeps that modulation as written); ``gates`` routes the
    gated residuals."""
    f_norm1, f_audio_norm1, f_norm2, f_audio_norm2, f_a2v, f_v2a, f_norm3, f_audio_norm3 = (
        flavours[name] for name in _TRANSFORMER_NORMS
    )

    def residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated(x, update, gate) if gates else x + update * gate

    def forward(
        self: nn.Module,
        hidden_states: torch.Tensor,
        audio_hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        audio_encoder_hidden_states: torch.Tensor,
        temb: torch.Tensor,
        temb_audio: torch.Tensor,
        temb_ca_scale_shift: torch.Tensor,
        temb_ca_audio_scale_shift: torch.Tensor,
        temb_ca_gate: torch.Tensor,
        temb_ca_audio_gate: torch.Tensor,
        temb_prompt: torch.Tensor | None = None,
        temb_prompt_audio: torch.Tensor | None = None,
        video_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        audio_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        ca_video_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        ca_audio_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        audio_encoder_attention_mask: torch.Tensor | None = None,
        self_attention_mask: torch.Tensor | None = None,
        audio_self_attention_mask: torch.Tensor | None = None,
        a2v_cross_attention_mask: torch.Tensor | None = None,
        v2a_cross_attention_mask: torch.Tensor | None = None,
        use_a2v_cross_attention: bool = True,
        use_v2a_cross_attention: bool = True,
        perturbation_mask: torch.Tensor | None = None,
        all_perturbed: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = hidden_states.size(0)

        # Self-attention: video, then audio. Modulation rows 0-5 are (shift, scale, gate) for the
        # attention and for the MLP; rows 6-8 the text-query ones when cross-attention has adaLN.
        video_mod = self.get_mod_params(self.scale_shift_table, temb, batch)
        v_shift_msa, v_scale_msa, v_gate_msa, v_shift_mlp, v_scale_mlp, v_gate_mlp = video_mod[:6]
        x = norm_modulate(self.norm1, f_norm1, hidden_states, v_scale_msa, v_shift_msa)
        attn_kwargs = _self_attention_kwargs(
            self, x, video_rotary_emb, self_attention_mask, perturbation_mask, all_perturbed
        )
        hidden_states = residual(hidden_states, self.attn1(**attn_kwargs), v_gate_msa)

        audio_mod = self.get_mod_params(self.audio_scale_shift_table, temb_audio, batch)
        a_shift_msa, a_scale_msa, a_gate_msa, a_shift_mlp, a_scale_mlp, a_gate_mlp = audio_mod[:6]
        x = norm_modulate(self.audio_norm1, f_audio_norm1, audio_hidden_states, a_scale_msa, a_shift_msa)
        attn_kwargs = _self_attention_kwargs(
            self, x, audio_rotary_emb, audio_self_attention_mask, perturbation_mask, all_perturbed
        )
        audio_hidden_states = residual(audio_hidden_states, self.audio_attn1(**attn_kwargs), a_gate_msa)

        # Cross-attention to the prompt (queries: video or audio; keys/values: text).
        if self.cross_attn_adaln:
            kv_shift, kv_scale = _prompt_scale_shift(
                self, self.prompt_scale_shift_table, temb_prompt, batch, hidden_states
            )
            audio_kv_shift, audio_kv_scale = _prompt_scale_shift(
                self, self.audio_prompt_scale_shift_table, temb_prompt_audio, batch, audio_hidden_states
            )

        if self.video_cross_attn_adaln:
            v_shift_q, v_scale_q, v_gate_q = video_mod[6:9]
            x = norm_modulate(self.norm2, f_norm2, hidden_states, v_scale_q, v_shift_q)
        else:
            x = self.norm2(hidden_states)
        context = encoder_hidden_states * (1 + kv_scale) + kv_shift if self.cross_attn_adaln else encoder_hidden_states
        out = self.attn2(x, encoder_hidden_states=context, query_rotary_emb=None, attention_mask=encoder_attention_mask)
        hidden_states = residual(hidden_states, out, v_gate_q) if self.video_cross_attn_adaln else hidden_states + out

        if self.audio_cross_attn_adaln:
            a_shift_q, a_scale_q, a_gate_q = audio_mod[6:9]
            x = norm_modulate(self.audio_norm2, f_audio_norm2, audio_hidden_states, a_scale_q, a_shift_q)
        else:
            x = self.audio_norm2(audio_hidden_states)
        context = (
            audio_encoder_hidden_states * (1 + audio_kv_scale) + audio_kv_shift
            if self.cross_attn_adaln
            else audio_encoder_hidden_states
        )
        out = self.audio_attn2(
            x, encoder_hidden_states=context, query_rotary_emb=None, attention_mask=audio_encoder_attention_mask
        )
        audio_hidden_states = (
            residual(audio_hidden_states, out, a_gate_q) if self.audio_cross_attn_adaln else audio_hidden_states + out
        )

        # Audio-to-video and video-to-audio cross-attention. Both directions normalize the streams as
        # they are *before* either update, so keep those inputs.
        if use_a2v_cross_attention or use_v2a_cross_attention:
            video_in, audio_in = hidden_states, audio_hidden_states
            video_normed = None if f_a2v is not None else self.audio_to_video_norm(video_in)
            audio_normed = None if f_v2a is not None else self.video_to_audio_norm(audio_in)

            video_table = self.video_a2v_cross_attn_scale_shift_table
            v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift = self.get_mod_params(
                video_table[:4, :], temb_ca_scale_shift, batch
            )
            a2v_gate = self.get_mod_params(video_table[4:, :], temb_ca_gate, batch)[0].squeeze(2)
            audio_table = self.audio_a2v_cross_attn_scale_shift_table
            a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift = self.get_mod_params(
                audio_table[:4, :], temb_ca_audio_scale_shift, batch
            )
            v2a_gate = self.get_mod_params(audio_table[4:, :], temb_ca_audio_gate, batch)[0].squeeze(2)

            if use_a2v_cross_attention:
                q = _modulate_once(
                    self.audio_to_video_norm, f_a2v, video_normed, video_in,
                    v_a2v_scale.squeeze(2), v_a2v_shift.squeeze(2),
                )
                kv = _modulate_once(
                    self.video_to_audio_norm, f_v2a, audio_normed, audio_in,
                    a_a2v_scale.squeeze(2), a_a2v_shift.squeeze(2),
                )
                out = self.audio_to_video_attn(
                    q,
                    encoder_hidden_states=kv,
                    query_rotary_emb=ca_video_rotary_emb,
                    key_rotary_emb=ca_audio_rotary_emb,
                    attention_mask=a2v_cross_attention_mask,
                )
                # Written `hidden_states + a2v_gate * out` in diffusers: the one multiply commutes exactly.
                hidden_states = residual(hidden_states, out, a2v_gate)

            if use_v2a_cross_attention:
                kv = _modulate_once(
                    self.audio_to_video_norm, f_a2v, video_normed, video_in,
                    v_v2a_scale.squeeze(2), v_v2a_shift.squeeze(2),
                )
                q = _modulate_once(
                    self.video_to_audio_norm, f_v2a, audio_normed, audio_in,
                    a_v2a_scale.squeeze(2), a_v2a_shift.squeeze(2),
                )
                out = self.video_to_audio_attn(
                    q,
                    encoder_hidden_states=kv,
                    query_rotary_emb=ca_audio_rotary_emb,
                    key_rotary_emb=ca_video_rotary_emb,
                    attention_mask=v2a_cross_attention_mask,
                )
                audio_hidden_states = residual(audio_hidden_states, out, v2a_gate)

        # Feed-forward.
        x = norm_modulate(self.norm3, f_norm3, hidden_states, v_scale_mlp, v_shift_mlp)
        hidden_states = residual(hidden_states, self.ff(x), v_gate_mlp)
        x = norm_modulate(self.audio_norm3, f_audio_norm3, audio_hidden_states, a_scale_mlp, a_shift_mlp)
        audio_hidden_states = residual(audio_hidden_states, self.audio_ff(x), a_gate_mlp)
        return hidden_states, audio_hidden_states

    return forward


def _transformer_norms_used(block: nn.Module) -> dict[str, bool]:
    """Which modulated norms the block's configuration uses (norm2s are modulated only with adaLN)."""
    used = dict.fromkeys(_TRANSFORMER_NORMS, True)
    used["norm2"] = bool(block.video_cross_attn_adaln)
    used["audio_norm2"] = bool(block.audio_cross_attn_adaln)
    return used


def _transformer_gates_used(block: nn.Module) -> dict[str, bool]:
    used = dict.fromkeys(_TRANSFORMER_GATES, True)
    used["attn2"] = bool(block.video_cross_attn_adaln)
    used["audio_attn2"] = bool(block.audio_cross_attn_adaln)
    return used


def _fusable_norms(block: nn.Module, descriptions: dict[str, str], used: dict[str, bool], enabled: bool) -> tuple[
    dict[str, str | None], list[Site], list[Skipped]
]:
    flavours: dict[str, str | None] = {}
    sites: list[Site] = []
    skipped: list[Skipped] = []
    for name, expression in descriptions.items():
        flavours[name] = None
        if not used[name] or not enabled:
            continue
        norm = getattr(block, name)
        flavour, detail = rmsnorm_flavour(norm)
        if flavour is None:
            skipped.append(Skipped("rmsnorm_modulate", name, detail))
        elif not hookless(norm):
            skipped.append(Skipped("rmsnorm_modulate", name, "the norm has hooks or a wrapped forward, which a fused call would skip"))
        else:
            flavours[name] = flavour
            sites.append(Site("rmsnorm_modulate", name, f"{expression} [flavour={flavour}]"))
    return flavours, sites, skipped


def _structure_problem(module: nn.Module, ours: Callable[..., Any]) -> str | None:
    if (problem := diffusers_mismatch()) is not None:
        return problem
    if not same_parameters(ours, type(module).forward):
        return f"{type(module).__name__}.forward has a different signature than diffusers {DIFFUSERS_VERSION}'s"
    if foreign_override(module, "forward"):
        return "forward is already replaced on this instance (a hook wrapper?); left alone"
    return None


def patch_transformer_block(block: nn.Module, path: str, found: Findings, kinds: frozenset[str]) -> None:
    existing = own_override(block, "forward")
    if existing is not None:
        existing.report(path, found, new=False)
        return
    gates = "gated_residual" in kinds
    flavours, sites, skipped = _fusable_norms(
        block, _TRANSFORMER_NORMS, _transformer_norms_used(block), "rmsnorm_modulate" in kinds
    )
    if gates:
        used = _transformer_gates_used(block)
        sites += [Site("gated_residual", name, expr) for name, expr in _TRANSFORMER_GATES.items() if used[name]]
    forward = transformer_block_forward(flavours, gates)
    _install_block(block, path, found, forward, sites, skipped)


def _install_block(
    block: nn.Module, path: str, found: Findings, forward: Callable[..., Any], sites: list[Site], skipped: list[Skipped]
) -> None:
    problem = _structure_problem(block, forward)
    if problem is not None:
        for site in sites:
            found.skip(site.kind, f"{path}.{site.path}", problem)
        return
    tag = Mark(tuple(sites), tuple(skipped))
    if sites:  # nothing to route (every site skipped or not asked for): the block keeps its forward
        install(block, "forward", mark(forward, tag))
    tag.report(path, found, new=True)


# -- LTX2VideoVaeDiffusionNABlock (the DiffVAE's stage-5 block) ------------------------------------------
def diffusion_block_forward(flavours: dict[str, str | None]) -> Callable[..., Any]:
    """A forward for one LTX2VideoVaeDiffusionNABlock; its residuals are ungated, so only the two
    adaLN modulations can fuse."""
    f_norm1, f_norm2 = flavours["norm1"], flavours["norm2"]

    def forward(
        self: nn.Module,
        hidden_states: torch.Tensor,
        latent_context: torch.Tensor,
        modulation: tuple[torch.Tensor, ...],
        block_mask: Any = None,
    ) -> torch.Tensor:
        # Shared adaLN chunks plus this block's own table; chunks 2, 5 and 6 (gates) go unused.
        mods = [modulation[i] + self.scale_shift_table[i].view(1, 1, 1, 1, -1) for i in range(self.num_mod_params)]
        scale_msa, shift_msa, _, scale_mlp, shift_mlp, _, _ = mods
        hidden_states = hidden_states + self.context_proj(latent_context)
        x = norm_modulate(self.norm1, f_norm1, hidden_states, scale_msa, shift_msa)
        hidden_states = hidden_states + self.attn(x, block_mask)
        x = norm_modulate(self.norm2, f_norm2, hidden_states, scale_mlp, shift_mlp)
        return hidden_states + self.mlp(x)

    return forward


def patch_diffusion_block(block: nn.Module, path: str, found: Findings, kinds: frozenset[str]) -> None:
    existing = own_override(block, "forward")
    if existing is not None:
        existing.report(path, found, new=False)
        return
    if "rmsnorm_modulate" not in kinds:
        return
    if block.num_mod_params != 7:
        for name in _DIFFUSION_NORMS:
            found.skip("rmsnorm_modulate", f"{path}.{name}", f"num_mod_params={block.num_mod_params}; diffusers unpacks 7")
        return
    flavours, sites, skipped = _fusable_norms(block, _DIFFUSION_NORMS, dict.fromkeys(_DIFFUSION_NORMS, True), True)
    _install_block(block, path, found, diffusion_block_forward(flavours), sites, skipped)


# -- the DiffVAE's neighborhood attention --------------------------------------------------------------
class XbackendNeighborhoodProcessor(DiffVAENeighborhoodProcessor):
    """Stands in for diffusers' flex or NATTEN processor on one attention layer, running
    ``get_op("neighborhood_attention")`` with the same window (``clamp(i - k//2, 0, L - k)`` per axis,
    no dilation, not causal) and ``scale=1.0`` (the query is pre-scaled by ``head_dim**-0.5`` in
    ``project_qkv``). Keeps the processor it replaced for `unpatch`. Not being the flex processor, it
    also keeps the decoder from building a flex block mask."""

    def __init__(self, original: Any):
        super().__init__(get_op("neighborhood_attention"))
        self.original = original

    def __reduce__(self) -> tuple[Any, ...]:
        # The op object holds torch.library handles that cannot be copied; rebuild it instead, so a
        # patched model still deep-copies (and pickles) like a stock one.
        return (type(self), (self.original,))


def _stock_processors() -> tuple[type, ...]:
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import (
        LTX2VideoVaeNeighborhoodAttnProcessor,
        LTX2VideoVaeNeighborhoodNattenProcessor,
    )

    return (LTX2VideoVaeNeighborhoodAttnProcessor, LTX2VideoVaeNeighborhoodNattenProcessor)


def patch_na_processor(attn: nn.Module, path: str, found: Findings, kinds: frozenset[str]) -> None:
    processor = attn.processor
    detail = f"kernel_size={tuple(attn.kernel_size)} heads={attn.heads} head_dim={attn.head_dim} scale=1.0 (query pre-scaled)"
    if isinstance(processor, XbackendNeighborhoodProcessor):
        found.add("neighborhood_attention", path, detail, new=False)
        return
    if "neighborhood_attention" not in kinds:
        return
    if (problem := diffusers_mismatch()) is not None:
        found.skip("neighborhood_attention", path, problem)
    elif type(processor) not in _stock_processors():
        found.skip("neighborhood_attention", path, f"processor {type(processor).__name__} is not one of diffusers' own")
    elif getattr(processor, "_parallel_config", None) is not None:
        found.skip("neighborhood_attention", path, "context-parallel attention is configured on the processor")
    else:
        attn.set_processor(XbackendNeighborhoodProcessor(processor))
        found.add("neighborhood_attention", path, f"{detail}; was {type(processor).__name__}")


def unpatch_na_processor(attn: nn.Module, path: str, found: Findings) -> None:
    processor = attn.processor
    if isinstance(processor, XbackendNeighborhoodProcessor):
        attn.set_processor(processor.original)
        found.add("neighborhood_attention", path, f"restored {type(processor.original).__name__}")


# -- LTX2Attention: RoPE of queries and keys -----------------------------------------------------------
_LTX2_ATTENTION_FUNCTIONS: tuple[Callable[..., Any], ...] | None = None


def _ltx2_attention_functions() -> tuple[Callable[..., Any], ...]:
    """diffusers' attention dispatcher and LTX-2 RoPE functions, imported once (not on every call)."""
    global _LTX2_ATTENTION_FUNCTIONS
    if _LTX2_ATTENTION_FUNCTIONS is None:
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_ltx2 import apply_interleaved_rotary_emb, apply_split_rotary_emb

        _LTX2_ATTENTION_FUNCTIONS = (dispatch_attention_fn, apply_interleaved_rotary_emb, apply_split_rotary_emb)
    return _LTX2_ATTENTION_FUNCTIONS


class XbackendLTX2AttnProcessor:
    """Stands in for diffusers' ``LTX2AudioVideoAttnProcessor`` on one ``LTX2Attention``: the same
    computation, with the RoPE of the query and key as ``get_op("rotary_embedding")`` (one pass instead
    of eight eager kernels, bit-identical; interleaved for LTX-2.0, split for LTX-2.3). Where query and
    key share their frequencies and shape (self-attention) and ``qk_flavour`` names the norms' flavour,
    ``norm_q``, ``norm_k`` and both RoPEs are one ``qk_norm_rope`` call, in either RoPE layout. Keeps the
    processor it replaced for `unpatch`."""

    _attention_backend = None
    _parallel_config = None

    def __init__(
        self,
        original: Any,
        qk_flavour: str | None = None,
        qk_norms: tuple[nn.Module, nn.Module] | None = None,
        qk_detail: str = "q/k norms not fused",
    ):
        self.original = original
        self.qk_flavour = qk_flavour
        self.qk_norms = qk_norms  # the norms qk_flavour was found for: replaced ones are not fused
        self.qk_detail = qk_detail  # for the report
        self._attention_backend = getattr(original, "_attention_backend", None)
        self._parallel_config = getattr(original, "_parallel_config", None)

    def __call__(
        self,
        attn: nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        query_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        dispatch_attention_fn, apply_interleaved_rotary_emb, apply_split_rotary_emb = _ltx2_attention_functions()
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        if attn.to_gate_logits is not None:
            gate_logits = attn.to_gate_logits(hidden_states)

        query = attn.to_q(hidden_states)
        key = attn.to_k(encoder_hidden_states)
        value = attn.to_v(encoder_hidden_states)
        fused = None
        if (
            self.qk_flavour is not None
            and query_rotary_emb is not None
            and attn.rope_type in ("interleaved", "split")
            # element-wise: dynamo cannot trace `is` between two tuples
            and (key_rotary_emb is None or (key_rotary_emb[0] is query_rotary_emb[0] and key_rotary_emb[1] is query_rotary_emb[1]))
            and self.qk_norms == (attn.norm_q, attn.norm_k)
            and hookless_now(attn.norm_q)
            and hookless_now(attn.norm_k)
        ):
            fused = qk_norm_rope(attn.norm_q, attn.norm_k, self.qk_flavour, query, key, query_rotary_emb, attn.rope_type)
        if fused is not None:
            query, key = fused
        else:
            query = attn.norm_q(query)
            key = attn.norm_k(key)

        if query_rotary_emb is not None and fused is None:
            key_emb = key_rotary_emb if key_rotary_emb is not None else query_rotary_emb
            if attn.rope_type == "interleaved":
                query = rope_interleaved(query, query_rotary_emb, apply_interleaved_rotary_emb)
                key = rope_interleaved(key, key_emb, apply_interleaved_rotary_emb)
            elif attn.rope_type == "split":
                query = rope_split(query, query_rotary_emb, apply_split_rotary_emb)
                key = rope_split(key, key_emb, apply_split_rotary_emb)

        query = query.unflatten(2, (attn.heads, -1))
        key = key.unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        hidden_states = dispatch_attention_fn(
            query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )  # fmt: skip
        hidden_states = hidden_states.flatten(2, 3)
        hidden_states = hidden_states.to(query.dtype)
        if attn.to_gate_logits is not None:
            hidden_states = hidden_states.unflatten(2, (attn.heads, -1))
            gates = 2.0 * torch.sigmoid(gate_logits)
            hidden_states = hidden_states * gates.unsqueeze(-1)
            hidden_states = hidden_states.flatten(2, 3)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states


def patch_rope_processor(attn: nn.Module, path: str, found: Findings, kinds: frozenset[str]) -> None:
    processor = attn.processor
    detail = f"rope_type={attn.rope_type} heads={attn.heads}"
    if isinstance(processor, XbackendLTX2AttnProcessor):
        found.add("rotary_embedding", path, f"{detail}; {processor.qk_detail}; was {type(processor.original).__name__}", new=False)
        return
    if "rotary_embedding" not in kinds:
        return
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoAttnProcessor

    if (problem := diffusers_mismatch()) is not None:
        found.skip("rotary_embedding", path, problem)
    elif type(processor) is not LTX2AudioVideoAttnProcessor:
        found.skip("rotary_embedding", path, f"processor {type(processor).__name__} is not LTX2AudioVideoAttnProcessor")
    elif not same_parameters(XbackendLTX2AttnProcessor.__call__, LTX2AudioVideoAttnProcessor.__call__):
        found.skip("rotary_embedding", path, f"LTX2AudioVideoAttnProcessor differs from diffusers {DIFFUSERS_VERSION}'s")
    elif getattr(processor, "_parallel_config", None) is not None:
        found.skip("rotary_embedding", path, "context-parallel attention is configured on the processor")
    elif attn.rope_type not in ("interleaved", "split"):
        found.skip("rotary_embedding", path, f"rope_type={attn.rope_type!r}: only interleaved and split RoPE are routed")
    else:
        qk_flavour, qk_detail = (
            qk_fusion_flavour(attn.norm_q, attn.norm_k) if "rmsnorm" in kinds else (None, "q/k norms: rmsnorm not patched")
        )
        attn.set_processor(XbackendLTX2AttnProcessor(processor, qk_flavour, (attn.norm_q, attn.norm_k), qk_detail))
        found.add("rotary_embedding", path, f"{detail}; {qk_detail}; was {type(processor).__name__}")


def unpatch_rope_processor(attn: nn.Module, path: str, found: Findings) -> None:
    processor = attn.processor
    if isinstance(processor, XbackendLTX2AttnProcessor):
        # set_attention_backend / enable_parallelism after patch() set them on our processor.
        processor.original._attention_backend = processor._attention_backend
        processor.original._parallel_config = processor._parallel_config
        attn.set_processor(processor.original)
        found.add("rotary_embedding", path, f"restored {type(processor.original).__name__}")


# -- LTX2VideoDiffusionDecoderModel.tiled_decode ---------------------------------------------------------
def tiled_decode_forward(group: Any) -> Callable[..., Any]:
    def tiled_decode(
        self: nn.Module, z: torch.Tensor, generator: torch.Generator | None = None, num_inference_steps: int | None = None
    ) -> torch.Tensor:
        # Same bits as diffusers' serial tiled_decode; tiles spread over `group` (the default group when
        # torch.distributed is initialised), every rank gets the whole result.
        return tiled_decode_diffvae(self, z, generator, num_inference_steps, group=group)

    return tiled_decode


def patch_tiled_decode(model: nn.Module, path: str, found: Findings, kinds: frozenset[str], group: Any) -> None:
    existing = own_override(model, "tiled_decode")
    if existing is not None:
        existing.report(path, found, new=False)
        return
    if "tiled_decode" not in kinds:
        return
    fn = tiled_decode_forward(group)
    problem = diffusers_mismatch()
    if problem is None and not same_parameters(fn, type(model).tiled_decode):
        problem = f"tiled_decode has a different signature than diffusers {DIFFUSERS_VERSION}'s"
    if problem is None and foreign_override(model, "tiled_decode"):
        problem = "tiled_decode is already replaced on this instance; left alone"
    if problem is not None:
        found.skip("tiled_decode", path, problem)
        return
    where = "the default process group when torch.distributed is initialised" if group is None else "the given group"
    tag = Mark((Site("tiled_decode", "", f"xbackend.adapters.diffusers_ltx2.tiled_decode_diffvae over {where}"),))
    install(model, "tiled_decode", mark(fn, tag))
    tag.report(path, found, new=True)


# -- which class goes to which patch -----------------------------------------------------------------------
def classes() -> dict[str, type]:
    """The diffusers classes this module patches, by role; empty when diffusers is not installed."""
    try:
        from diffusers.models.autoencoders.ltx2_diffusion_decoder import (
            LTX2VideoDiffusionDecoderModel,
            LTX2VideoVaeDiffusionNABlock,
            LTX2VideoVaeNeighborhoodAttention,
        )
        from diffusers.models.transformers.transformer_ltx2 import LTX2Attention, LTX2VideoTransformerBlock
    except ImportError:
        return {}
    return {
        "transformer_block": LTX2VideoTransformerBlock,
        "transformer_attention": LTX2Attention,
        "diffusion_block": LTX2VideoVaeDiffusionNABlock,
        "na_attention": LTX2VideoVaeNeighborhoodAttention,
        "diffvae": LTX2VideoDiffusionDecoderModel,
    }
