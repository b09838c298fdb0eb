"""LTX-2 attention processors of diffusers 0.42.1, routed through xbackend.

``XbackendLTX2AttnProcessor`` stands in for ``LTX2AudioVideoAttnProcessor``
(``diffusers/models/transformers/transformer_ltx2.py``), transcribed, with the RoPE of queries and keys
(interleaved or split) through ``rotary_embedding`` or, with the q/k norms, ``qk_norm_rope``.
``XbackendNeighborhoodProcessor`` stands in for the flex and NATTEN processors of the DiffVAE's
``LTX2VideoVaeNeighborhoodAttention`` (``diffusers/models/autoencoders/ltx2_diffusion_decoder.py``),
through ``neighborhood_attention``. Each keeps the processor it replaced, which `unpatch` restores.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .._api import get_op
from ..adapters.diffusers_ltx2 import DiffVAENeighborhoodProcessor
from ..ops.qk_norm_rope_3d import rope_dim_split
from ._common import (
    DIFFUSERS_VERSION,
    Findings,
    PatchOptions,
    can_rmsnorm,
    diffusers_mismatch,
    foreign_override,
    hookless_now,
    is_eps,
    ours_or_stock,
    qk_fusion_flavour,
    qk_norm_rope,
    rope_interleaved,
    rope_split,
    same_parameters,
)
from ._sites import fused

# -- the DiffVAE's neighborhood attention --------------------------------------------------------------
_QK_NORM_ROPE_3D = get_op("qk_norm_rope_3d")


class XbackendNeighborhoodProcessor(DiffVAENeighborhoodProcessor):
    """Stands in for diffusers' flex or NATTEN processor on one attention layer, running
    ``get_op("neighborhood_attention")`` with the same window (``clamp(i - k//2, 0, L - k)`` per axis,
    no dilation, not causal) and ``scale=1.0`` (the query is pre-scaled by ``head_dim**-0.5`` in
    ``project_qkv``). With ``prelude`` (the q/k norms' flavour, found at patch time for the modules in
    ``approved``: norm_q, norm_k, rope), ``project_qkv``'s norms, query scale and 3-D RoPE run as one
    ``qk_norm_rope_3d`` call whenever the layer is still diffusers' expression for the call's inputs
    (``_prelude_is_stock``; else ``project_qkv`` runs). Keeps the processor it replaced for `unpatch`.
    Not being the flex processor, it also keeps the decoder from building a flex block mask."""

    def __init__(self, original: Any, prelude: str | None = None, approved: tuple[nn.Module, ...] = ()):
        super().__init__(get_op("neighborhood_attention"))
        self.original = original
        self.prelude = prelude
        self.approved = approved

    def __reduce__(self) -> tuple[Any, ...]:
        # The op object holds torch.library handles that cannot be copied; rebuild it instead, so a
        # patched model still deep-copies (and pickles) like a stock one. The approved modules travel
        # through the copy's memo, so they name the copy's own modules.
        return (type(self), (self.original, self.prelude, self.approved))

    def project_qkv(self, attn: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.prelude is None or not _prelude_is_stock(attn, self.approved, hidden_states):
            return attn.project_qkv(hidden_states)
        batch, frames, height, width, _ = hidden_states.shape
        shape = (batch, frames, height, width, attn.heads, attn.head_dim)
        query = attn.to_q(hidden_states).view(shape)
        key = attn.to_k(hidden_states).view(shape)
        value = attn.to_v(hidden_states).view(shape)
        wq, wk = attn.norm_q.weight, attn.norm_k.weight
        if not (can_rmsnorm(query, wq) and can_rmsnorm(key, wk) and key.dtype == query.dtype):
            query, key = attn.norm_q(query), attn.norm_k(key)
            query = query * attn.scale
            return attn.rope(query), attn.rope(key), value
        query, key = fused(_QK_NORM_ROPE_3D, "qk_norm_rope_3d", attn, query, key, wq, wk, attn.norm_q.eps, attn.scale,
                           attn.rope.base, self.prelude)
        return query, key, value

    def __call__(self, attn: Any, hidden_states: torch.Tensor, block_mask: Any = None) -> torch.Tensor:
        # The adapter's call, with the op named as this layer's site (xbackend.attribute switches it there).
        batch, frames, height, width, channels = hidden_states.shape
        query, key, value = self.project_qkv(attn, hidden_states)
        # The query already carries head_dim**-0.5 (diffusers scales it before the rotary embedding).
        out = fused(self.attention, "neighborhood_attention", attn, query, key, value, tuple(attn.kernel_size), 1, False, 1.0)
        return attn.to_out[0](out.reshape(batch, frames, height, width, channels))


# diffusers computes the RoPE frequencies in fp32 instead of float64 on these device types
# (maybe_adjust_dtype_for_device); the op's reference is the float64 one.
_PRELUDE_DEVICES = ("cuda", "cpu")
_ROPE_METHODS = ("forward", "_inv_freqs", "_rotate_axis")
_STOCK: dict[str, Any] = {}


def _stock_functions() -> dict[str, Any]:
    """diffusers' own project_qkv and RoPE methods, as imported (a class-level monkeypatch differs)."""
    if not _STOCK:
        from diffusers.models.autoencoders import ltx2_diffusion_decoder as dd

        _STOCK["project_qkv"] = dd.LTX2VideoVaeNeighborhoodAttention.__dict__["project_qkv"]
        _STOCK["rope_class"] = dd.LTX2VideoVaeRotaryPosEmbed3D
        for name in _ROPE_METHODS:
            _STOCK[name] = dd.LTX2VideoVaeRotaryPosEmbed3D.__dict__[name]
    return _STOCK


def _number(x: object, positive: bool = False) -> bool:
    return type(x) in (int, float) and math.isfinite(x) and (x > 0 or not positive)


def _prelude_is_stock(attn: nn.Module, approved: tuple[nn.Module, ...], x: torch.Tensor) -> bool:
    """The layer's prelude is still what diffusers' ``project_qkv`` computes and what the op takes: the
    norms and RoPE approved at patch time, none hooked or with a replaced method (on the instance or
    the class), the RoPE's chunks diffusers' split, eps, scale and base numbers the op accepts, no
    autocast (aten runs rms_norm in fp32 under it), a device whose RoPE frequencies diffusers builds
    in float64."""
    rope = attn.rope
    stock = _stock_functions()
    return (
        len(approved) == 3
        and attn.norm_q is approved[0]
        and attn.norm_k is approved[1]
        and rope is approved[2]
        and type(rope) is stock["rope_class"]
        and type(attn).__dict__.get("project_qkv") is stock["project_qkv"]
        and all(type(rope).__dict__.get(n) is stock[n] and n not in rope.__dict__ for n in _ROPE_METHODS)
        and ours_or_stock(attn, "project_qkv")
        and hookless_now(attn.norm_q)
        and hookless_now(attn.norm_k)
        and hookless_now(rope)
        and tuple(rope.rope_dim_split) == rope_dim_split(attn.head_dim)
        and is_eps(attn.norm_q.eps)
        and attn.norm_q.eps == attn.norm_k.eps
        and _number(attn.scale)
        and _number(rope.base, positive=True)
        and x.device.type in _PRELUDE_DEVICES
        and not torch.is_autocast_enabled(x.device.type)
    )


def _stock_processors() -> tuple[type, ...]:
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import (
        LTX2VideoVaeNeighborhoodAttnProcessor,
        LTX2VideoVaeNeighborhoodNattenProcessor,
    )

    return (LTX2VideoVaeNeighborhoodAttnProcessor, LTX2VideoVaeNeighborhoodNattenProcessor)


def _prelude_flavour(attn: nn.Module) -> tuple[str | None, str]:
    """(the q/k norms' flavour, detail) when ``project_qkv``'s prelude can run as ``qk_norm_rope_3d``."""
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeRotaryPosEmbed3D

    if type(attn.rope) is not LTX2VideoVaeRotaryPosEmbed3D:
        return None, f"rope is {type(attn.rope).__name__}, not diffusers' LTX2VideoVaeRotaryPosEmbed3D"
    if foreign_override(attn, "project_qkv"):
        return None, "project_qkv is replaced on the instance"
    replaced = [n for n in _ROPE_METHODS if n in attn.rope.__dict__]
    if replaced:
        return None, f"rope.{replaced[0]} is replaced on the instance"
    flavour, detail = qk_fusion_flavour(attn.norm_q, attn.norm_k)
    if flavour is None:
        return None, detail
    return flavour, f"q/k RMSNorm ({flavour}) + query scale {attn.scale:g} + 3-D RoPE fused"


def patch_na_processor(attn: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    processor = attn.processor
    detail = f"kernel_size={tuple(attn.kernel_size)} heads={attn.heads} head_dim={attn.head_dim} scale=1.0 (query pre-scaled)"
    if isinstance(processor, XbackendNeighborhoodProcessor):
        found.add("neighborhood_attention", path, detail, new=False)
        if processor.prelude is not None:
            found.add("qk_norm_rope_3d", path, f"q/k norms ({processor.prelude}) + scale + 3-D RoPE", new=False)
        return
    if "neighborhood_attention" not in options.kinds:
        if "qk_norm_rope_3d" in options.kinds:
            found.skip("qk_norm_rope_3d", path, "runs in xbackend's neighborhood-attention processor: patch that kind too")
        return
    if (problem := diffusers_mismatch()) is not None:
        found.skip("neighborhood_attention", path, problem)
    elif type(processor) not in _stock_processors():
        found.skip("neighborhood_attention", path, f"processor {type(processor).__name__} is not one of diffusers' own")
    elif getattr(processor, "_parallel_config", None) is not None:
        found.skip("neighborhood_attention", path, "context-parallel attention is configured on the processor")
    else:
        prelude = None
        if "qk_norm_rope_3d" in options.kinds:
            prelude, why = _prelude_flavour(attn)
            if prelude is None:
                found.skip("qk_norm_rope_3d", path, why)
            else:
                found.add("qk_norm_rope_3d", path, why)
        approved = (attn.norm_q, attn.norm_k, attn.rope) if prelude is not None else ()
        attn.set_processor(XbackendNeighborhoodProcessor(processor, prelude, approved))
        found.add("neighborhood_attention", path, f"{detail}; was {type(processor).__name__}")


def unpatch_na_processor(attn: nn.Module, path: str, found: Findings) -> None:
    processor = attn.processor
    if isinstance(processor, XbackendNeighborhoodProcessor):
        attn.set_processor(processor.original)
        if processor.prelude is not None:
            found.add("qk_norm_rope_3d", path, "restored project_qkv's prelude")
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
            fused = qk_norm_rope(attn.norm_q, attn.norm_k, self.qk_flavour, query, key, query_rotary_emb, attn.rope_type, attn)
        if fused is not None:
            query, key = fused
        else:
            query = attn.norm_q(query)
            key = attn.norm_k(key)

        if query_rotary_emb is not None and fused is None:
            key_emb = key_rotary_emb if key_rotary_emb is not None else query_rotary_emb
            if attn.rope_type == "interleaved":
                query = rope_interleaved(query, query_rotary_emb, apply_interleaved_rotary_emb, attn)
                key = rope_interleaved(key, key_emb, apply_interleaved_rotary_emb, attn)
            elif attn.rope_type == "split":
                query = rope_split(query, query_rotary_emb, apply_split_rotary_emb, attn)
                key = rope_split(key, key_emb, apply_split_rotary_emb, attn)

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


def patch_rope_processor(attn: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    kinds = options.kinds
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
