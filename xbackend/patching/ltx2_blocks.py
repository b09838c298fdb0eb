"""The LTX-2 transformer block's forward of diffusers 0.42.1, routed through xbackend.

Mirrors, operation for operation, ``LTX2VideoTransformerBlock.forward``
(``diffusers/models/transformers/transformer_ltx2.py``): every value is computed the way
diffusers does, in the same order, except that ``norm(x) * (1 + scale) + shift`` goes to
``rmsnorm_modulate`` and ``x + out * gate`` to ``gated_residual`` where the fused op is the same
expression (checked per call; otherwise the expression runs as written). `patch` checks the installed
diffusers version and the forward signatures first and leaves these sites alone, with the reason in
its report, when they differ.
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
    Skipped,
    diffusers_mismatch,
    foreign_override,
    gated,
    hookless,
    install,
    mark,
    norm_modulate,
    report_own_override,
    rmsnorm_flavour,
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

    def residual(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor, site: nn.Module) -> torch.Tensor:
        # site: the module whose output `update` is, the path the report names this gate by
        return gated(x, update, gate, site) if gates else x + update * gate

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
        hidden_states = residual(hidden_states, self.attn1(**attn_kwargs), v_gate_msa, self.attn1)

        audio_mod = self.get_mod_params(self.audio_scale_shift_table, temb_audio, batch)
        a_shift_msa, a_scale_msa, a_gate_msa, a_shift_mlp, a_scale_mlp, a_gate_mlp = audio_mod[:6]
        x = norm_modulate(self.audio_norm1, f_audio_norm1, audio_hidden_states, a_scale_msa, a_shift_msa)
        attn_kwargs = _self_attention_kwargs(
            self, x, audio_rotary_emb, audio_self_attention_mask, perturbation_mask, all_perturbed
        )
        audio_hidden_states = residual(audio_hidden_states, self.audio_attn1(**attn_kwargs), a_gate_msa, self.audio_attn1)

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
        hidden_states = residual(hidden_states, out, v_gate_q, self.attn2) if self.video_cross_attn_adaln else hidden_states + out

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
            residual(audio_hidden_states, out, a_gate_q, self.audio_attn2) if self.audio_cross_attn_adaln else audio_hidden_states + out
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
                hidden_states = residual(hidden_states, out, a2v_gate, self.audio_to_video_attn)

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
                audio_hidden_states = residual(audio_hidden_states, out, v2a_gate, self.video_to_audio_attn)

        # Feed-forward.
        x = norm_modulate(self.norm3, f_norm3, hidden_states, v_scale_mlp, v_shift_mlp)
        hidden_states = residual(hidden_states, self.ff(x), v_gate_mlp, self.ff)
        x = norm_modulate(self.audio_norm3, f_audio_norm3, audio_hidden_states, a_scale_mlp, a_shift_mlp)
        audio_hidden_states = residual(audio_hidden_states, self.audio_ff(x), a_gate_mlp, self.audio_ff)
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


def fusable_norms(block: nn.Module, descriptions: dict[str, str], used: dict[str, bool], enabled: bool,
                  kind: str = "rmsnorm_modulate") -> tuple[dict[str, str | None], list[Site], list[Skipped]]:
    """Per norm of ``block`` that a fused op reads (``descriptions``: name -> the expression it fuses),
    its flavour where the fused op reproduces it, else None; the sites (of ``kind``) that fuse and the
    ones left as written."""
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
            skipped.append(Skipped(kind, name, detail))
        elif not hookless(norm):
            skipped.append(Skipped(kind, name, "the norm has hooks or a wrapped forward, which a fused call would skip"))
        else:
            flavours[name] = flavour
            sites.append(Site(kind, name, f"{expression} [flavour={flavour}]"))
    return flavours, sites, skipped


def _structure_problem(module: nn.Module, ours: Callable[..., Any]) -> str | None:
    if (problem := diffusers_mismatch()) is not None:
        return problem
    if not same_parameters(ours, type(module).forward):
        return f"{type(module).__name__}.forward has a different signature than diffusers {DIFFUSERS_VERSION}'s"
    if foreign_override(module, "forward"):
        return "forward is already replaced on this instance (a hook wrapper?); left alone"
    return None


def patch_transformer_block(block: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    kinds = options.kinds
    if report_own_override(block, "forward", path, found):
        return
    gates = "gated_residual" in kinds
    flavours, sites, skipped = fusable_norms(
        block, _TRANSFORMER_NORMS, _transformer_norms_used(block), "rmsnorm_modulate" in kinds
    )
    if gates:
        used = _transformer_gates_used(block)
        sites += [Site("gated_residual", name, expr) for name, expr in _TRANSFORMER_GATES.items() if used[name]]
    forward = transformer_block_forward(flavours, gates)
    install_block(block, path, found, forward, sites, skipped)


def install_block(
    block: nn.Module, path: str, found: Findings, forward: Callable[..., Any], sites: list[Site], skipped: list[Skipped]
) -> None:
    """Install ``forward`` on ``block`` when it routes any site and diffusers' forward is the one it mirrors."""
    problem = _structure_problem(block, forward)
    if problem is not None:
        for site in sites:
            found.skip(site.kind, f"{path}.{site.path}", problem)
        return
    tag = Mark(tuple(sites), tuple(skipped))
    if sites:  # nothing to route (every site skipped or not asked for): the block keeps its forward
        install(block, "forward", mark(forward, tag))
    tag.report(path, found, new=True)
