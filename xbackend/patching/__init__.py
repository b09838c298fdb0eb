"""Route a diffusers model's hot sites through xbackend without editing diffusers.

``report = xbackend.patch(model)`` changes module *instances*, never classes:

- ``torch.nn.RMSNorm`` (flavour "torch") and diffusers ``RMSNorm`` (flavour "diffusers") get a forward
  that calls ``get_op("rmsnorm")``; parameters and state_dict stay as they are.
- ``LTX2VideoTransformerBlock`` gets a forward that computes what diffusers 0.42.1 computes, with
  ``norm(x) * (1 + scale) + shift`` as ``rmsnorm_modulate`` and ``x + out * gate`` as
  ``gated_residual`` (``ltx2_blocks.py``). The DiffVAE's ``LTX2VideoVaeDiffusionNABlock`` and
  ``LTX2VideoVaeNABlock`` get one that also folds each residual add into the norm that reads its sum
  (``add_rmsnorm``; ``ltx2_vae_blocks.py``).
- ``LTX2Attention`` layers with interleaved RoPE get a processor that applies it with
  ``get_op("rotary_embedding")`` (otherwise diffusers' ``LTX2AudioVideoAttnProcessor``, transcribed).
- The DiffVAE's neighborhood attention runs ``get_op("neighborhood_attention")`` in place of diffusers'
  flex/NATTEN processor, with ``project_qkv``'s q/k norms, query scale and 3-D RoPE as one
  ``qk_norm_rope_3d`` call (``ltx2_attention.py``); its SwiGLU's ``silu(gate) * up`` is ``silu_mul``
  (``ltx2_mlp.py``), and its ``tiled_decode`` runs ``vae_tile_decode`` (``ltx2_diffvae.py``): on this
  rank alone, or with ``decode_group`` spread over that process group's ranks, which must all decode the
  same latent (checked on each call).
- ``WanTransformerBlock`` (Wan 2.x, ``wan.py``): its float32 ``FP32LayerNorm`` modulations as
  ``layernorm_modulate``, each residual with the norm reading its sum as ``add_layernorm``, the FFN's
  float32-gated residual as ``gated_residual``; the self-attention's RoPE as ``rotary_embedding`` where
  Wan computes it in float32.
- ``Flux2TransformerBlock`` and ``Flux2SingleTransformerBlock`` (Flux.2, ``flux2.py``): their
  ``nn.LayerNorm`` modulations, folded residual + norm, and gated residuals the same way, and
  ``Flux2SwiGLU`` as ``silu_mul``.
- ``QwenImageTransformerBlock`` (Qwen-Image, ``qwenimage.py``): the same sites, ``_modulate``'s
  per-token ``modulate_index`` form (``zero_cond_t``) included.

Each fused call first checks that the op is the same expression for these inputs (dtypes, devices,
shapes); when not, the model's own expression runs. Anything not recognised is left alone, patching
twice changes nothing, and ``xbackend.unpatch(model)`` removes every override. A patched model
deep-copies patched; pickled whole (``torch.save(model)``) it loads unpatched, ready to patch again.

Which module gets which patch is the table ``PATCHES``, keyed by the class's full name: patching a new
model family is a file with its patch functions and a row per class here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from . import flux2, ltx2_attention, ltx2_blocks, ltx2_diffvae, ltx2_mlp, ltx2_vae_blocks, qwenimage, wan
from ._common import (
    KINDS,
    Findings,
    Patch,
    PatchOptions,
    Site,
    Skipped,
    Unpatch,
    own_override,
    patch_rmsnorm,
    uninstall,
)

__all__ = ["KINDS", "PATCHES", "PatchReport", "Site", "Skipped", "patch", "unpatch"]

_LTX2 = "diffusers.models.transformers.transformer_ltx2"
_DIFFVAE = "diffusers.models.autoencoders.ltx2_diffusion_decoder"
_WAN = "diffusers.models.transformers.transformer_wan"
_FLUX2 = "diffusers.models.transformers.transformer_flux2"
_QWEN = "diffusers.models.transformers.transformer_qwenimage"

# "<module>.<qualname>" of a class -> (patch, unpatch). Exact classes only: a subclass may compute
# something else. unpatch is None where removing the module's own overrides (forward, tiled_decode),
# which `unpatch` does on every module, restores it; no diffusers import is needed to look a class up.
PATCHES: dict[str, tuple[Patch, Unpatch | None]] = {
    "torch.nn.modules.normalization.RMSNorm": (patch_rmsnorm, None),
    "diffusers.models.normalization.RMSNorm": (patch_rmsnorm, None),
    f"{_LTX2}.LTX2VideoTransformerBlock": (ltx2_blocks.patch_transformer_block, None),
    f"{_LTX2}.LTX2Attention": (ltx2_attention.patch_rope_processor, ltx2_attention.unpatch_rope_processor),
    f"{_DIFFVAE}.LTX2VideoVaeDiffusionNABlock": (ltx2_vae_blocks.patch_diffusion_block, None),
    f"{_DIFFVAE}.LTX2VideoVaeNABlock": (ltx2_vae_blocks.patch_na_block, None),
    f"{_DIFFVAE}.LTX2VideoVaeSwiGLU": (ltx2_mlp.patch_swiglu, None),
    f"{_DIFFVAE}.LTX2VideoVaeNeighborhoodAttention": (ltx2_attention.patch_na_processor, ltx2_attention.unpatch_na_processor),
    f"{_DIFFVAE}.LTX2VideoDiffusionDecoderModel": (ltx2_diffvae.patch_tiled_decode, None),
    f"{_WAN}.WanTransformerBlock": (wan.patch_block, None),
    f"{_WAN}.WanAttention": (wan.patch_rope_processor, wan.unpatch_rope_processor),
    f"{_FLUX2}.Flux2TransformerBlock": (flux2.patch_double_block, None),
    f"{_FLUX2}.Flux2SingleTransformerBlock": (flux2.patch_single_block, None),
    f"{_FLUX2}.Flux2SwiGLU": (flux2.patch_swiglu, None),
    f"{_QWEN}.QwenImageTransformerBlock": (qwenimage.patch_block, None),
}


@dataclass(frozen=True)
class PatchReport:
    """The sites a `patch` call routes through xbackend (``new=False``: already patched before it) and
    the recognised sites it left alone, with the reason; from `unpatch` (``action="unpatch"``), the
    sites it restored."""

    sites: tuple[Site, ...]
    skipped: tuple[Skipped, ...]
    action: str = "patch"

    def by_kind(self) -> dict[str, list[str]]:
        """Module paths per kind, in model order."""
        out: dict[str, list[str]] = {}
        for site in self.sites:
            out.setdefault(site.kind, []).append(site.path)
        return out

    def counts(self) -> dict[str, int]:
        return {kind: len(paths) for kind, paths in self.by_kind().items()}

    def __len__(self) -> int:
        return len(self.sites)

    def __str__(self) -> str:
        counts = ", ".join(f"{kind} {n}" for kind, n in self.counts().items()) or "none"
        if self.action == "unpatch":
            return f"xbackend unpatch: {len(self.sites)} sites restored ({counts})"
        fresh = sum(s.new for s in self.sites)
        lines = [f"xbackend patch: {len(self.sites)} sites ({counts}); {fresh} new, {len(self.sites) - fresh} already patched"]
        # Where a tiled decode runs (this rank, or a process group) changes what every rank gets back.
        lines += [f"  tiled_decode at {s.path or '<model>'}: {s.detail}" for s in self.sites if s.kind == "tiled_decode"]
        reasons: dict[tuple[str, str], list[str]] = {}
        for k in self.skipped:
            reasons.setdefault((k.kind, k.reason), []).append(k.path)
        for (kind, reason), paths in reasons.items():
            more = f" (+{len(paths) - 1} more)" if len(paths) > 1 else ""
            lines.append(f"  left alone: {kind} at {paths[0]}{more}: {reason}")
        return "\n".join(lines)

    def table(self) -> str:
        """Every site, one per line."""
        rows = [f"  {s.kind:<24} {s.path or '<model>':<48} {s.detail}" for s in self.sites]
        return "\n".join([str(self), *rows])

    def to_dict(self) -> dict[str, Any]:
        return {"sites": [s.__dict__ for s in self.sites], "skipped": [k.__dict__ for k in self.skipped]}


def _require_module(fn: str, model: object) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"xbackend.{fn}: argument 'model' expected a torch.nn.Module, got {type(model).__name__}")


def _kinds(kinds: Iterable[str] | None, arg: str = "kinds") -> frozenset[str]:
    if kinds is None:
        return frozenset(KINDS)
    chosen = frozenset([kinds] if isinstance(kinds, str) else kinds)
    unknown = sorted(chosen - set(KINDS))
    if unknown:
        raise ValueError(f"xbackend.patch: argument '{arg}' expected names from {', '.join(KINDS)}, got {unknown}")
    return chosen


def patch(model: nn.Module, *, kinds: Iterable[str] | None = None, only: Iterable[str] | None = None,
          exclude: Iterable[str] = (), decode_group: Any = None) -> PatchReport:
    """Route ``model``'s recognised hot sites through xbackend; returns what was patched.

    ``kinds`` (or its alias ``only``) limits the patch to some of ``KINDS`` (default: all);
    ``exclude`` leaves some out, e.g. ``patch(model, only=("neighborhood_attention",))`` or
    ``patch(model, exclude=("gated_residual",))`` to bisect a difference. To change it on a patched
    model, `unpatch` first: sites patched earlier stay as they are.

    ``decode_group``: where a patched DiffVAE ``tiled_decode`` decodes. None (default): on each rank
    alone, its own latent, also under torch.distributed (a data-parallel job). A
    ``torch.distributed.ProcessGroup`` (e.g. ``torch.distributed.group.WORLD``): its tiles spread over
    that group's ranks, which must all decode the same ``z`` with a generator in the same state and the
    same step count; each call checks that and raises ``xbackend.vae.InputMismatchError`` on every rank,
    naming the ranks that differ. The report says which. Leave ``"tiled_decode"`` out to keep
    diffusers' own decode.
    """
    if kinds is not None and only is not None:
        raise TypeError("xbackend.patch: give 'kinds' or its alias 'only', not both")
    chosen = _kinds(only, "only") if only is not None else _kinds(kinds)
    chosen -= _kinds(exclude, "exclude") if exclude else frozenset()
    _require_module("patch", model)
    options = PatchOptions(chosen, ltx2_diffvae.check_decode_group(decode_group))
    found = Findings()
    for path, module in model.named_modules():
        row = PATCHES.get(_class_name(module))
        if row is not None:
            row[0](module, path, found, options)
    return PatchReport(tuple(found.sites), tuple(found.skipped))


def unpatch(model: nn.Module) -> PatchReport:
    """Remove every override `patch` set on ``model``; returns the sites restored. Modules and
    processors are exactly the objects they were before, with their own class forwards."""
    _require_module("unpatch", model)
    found = Findings()
    for path, module in model.named_modules():
        for attr in ("forward", "tiled_decode"):
            tag = own_override(module, attr)
            if tag is not None:
                uninstall(module, attr)
                tag.report(path, found, new=False)
        row = PATCHES.get(_class_name(module))
        if row is not None and row[1] is not None:
            row[1](module, path, found)
    return PatchReport(tuple(found.sites), (), action="unpatch")


def _class_name(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"
