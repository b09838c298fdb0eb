"""The DiffVAE's block forwards of diffusers 0.42.1, routed through xbackend.

Mirror, operation for operation, ``LTX2VideoVaeDiffusionNABlock.forward`` (the stage-5 block) and
``LTX2VideoVaeNABlock.forward`` (the deterministic stages) in
``diffusers/models/autoencoders/ltx2_diffusion_decoder.py``. Both are pre-norm blocks whose residuals
are ungated: ``h = h + f(norm(h))``. A residual add whose sum the next norm reads runs with that norm
as one ``add_rmsnorm`` call (kind ``add_rmsnorm``, where the norm is routed too: ``rmsnorm`` for the
deterministic blocks, ``rmsnorm_modulate`` for the stage-5 one), and ``norm(x) * (1 + scale) + shift``
as ``rmsnorm_modulate``; each only where the fused op is the same expression for the call's inputs
(otherwise the expression runs as written). A block's last add, ``h + mlp(...)``, is read by the next
block or stage, outside this forward, and stays an add.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ._common import (
    Findings,
    Mark,
    PatchOptions,
    Site,
    Skipped,
    add_norm,
    norm_modulate,
    report_own_override,
)
from .ltx2_blocks import fusable_norms, install_block

_DIFFUSION_NORMS = {
    "norm1": "norm1(hidden_states) * (1 + scale_msa) + shift_msa",
    "norm2": "norm2(hidden_states) * (1 + scale_mlp) + shift_mlp",
}
# The residual add the deterministic block's norm2 reads, folded into it.
_NA_ADDS = {"norm2": "hidden_states + attn(norm1(hidden_states)), then norm2"}
# The residual add each norm of a stage-5 block reads, folded into it.
_DIFFUSION_ADDS = {
    "norm1": "hidden_states + context_proj(latent_context), then norm1's modulate",
    "norm2": "hidden_states + attn(...), then norm2's modulate",
}


# -- LTX2VideoVaeDiffusionNABlock (the stage-5 block) -----------------------------------------------
def diffusion_block_forward(flavours: dict[str, str | None], fold: bool) -> Callable[..., Any]:
    """A forward for one LTX2VideoVaeDiffusionNABlock. ``flavours``: each modulated norm's flavour
    where it fuses (None: as written); ``fold``: the residual adds before them join their norm."""
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
        if fold:
            hidden_states, x = add_norm(
                self.norm1, f_norm1, hidden_states, self.context_proj(latent_context), scale_msa, shift_msa
            )
            hidden_states, x = add_norm(self.norm2, f_norm2, hidden_states, self.attn(x, block_mask), scale_mlp, shift_mlp)
            return hidden_states + self.mlp(x)
        hidden_states = hidden_states + self.context_proj(latent_context)
        x = norm_modulate(self.norm1, f_norm1, hidden_states, scale_msa, shift_msa)
        hidden_states = hidden_states + self.attn(x, block_mask)
        x = norm_modulate(self.norm2, f_norm2, hidden_states, scale_mlp, shift_mlp)
        return hidden_states + self.mlp(x)

    return forward


def patch_diffusion_block(block: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(block, "forward", path, found):
        return
    if "rmsnorm_modulate" not in options.kinds:
        if "add_rmsnorm" in options.kinds:
            for name in _DIFFUSION_ADDS:
                found.skip("add_rmsnorm", f"{path}.{name}", "folds into the norm's rmsnorm_modulate site: patch that kind too")
        return
    fold = "add_rmsnorm" in options.kinds
    if block.num_mod_params != 7:
        for kind in ("rmsnorm_modulate", "add_rmsnorm") if fold else ("rmsnorm_modulate",):
            for name in _DIFFUSION_NORMS:
                found.skip(kind, f"{path}.{name}", f"num_mod_params={block.num_mod_params}; diffusers unpacks 7")
        return
    flavours, sites, skipped = fusable_norms(block, _DIFFUSION_NORMS, dict.fromkeys(_DIFFUSION_NORMS, True), True)
    if fold:
        for name, expr in _DIFFUSION_ADDS.items():
            if flavours[name] is not None:
                sites.append(Site("add_rmsnorm", name, f"{expr} [flavour={flavours[name]}]"))
            else:
                skipped.append(Skipped("add_rmsnorm", name, "its norm is not fused (see the rmsnorm_modulate entry)"))
    install_block(block, path, found, diffusion_block_forward(flavours, fold), sites, skipped)


# -- LTX2VideoVaeNABlock (the deterministic stages' block) ------------------------------------------
def na_block_forward(flavour: str) -> Callable[..., Any]:
    """A forward for one LTX2VideoVaeNABlock whose ``norm2`` (of flavour ``flavour``) takes the attention's
    residual add; ``norm1`` is called as the module it is (patched as an ``rmsnorm`` site or not)."""

    def forward(self: nn.Module, hidden_states: torch.Tensor, block_mask: Any = None) -> torch.Tensor:
        hidden_states, x = add_norm(self.norm2, flavour, hidden_states, self.attn(self.norm1(hidden_states), block_mask))
        return hidden_states + self.mlp(x)

    return forward


def patch_na_block(block: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(block, "forward", path, found):
        return
    if "add_rmsnorm" not in options.kinds:
        return
    if "rmsnorm" not in options.kinds:
        found.skip("add_rmsnorm", f"{path}.norm2", "folds into the norm's rmsnorm site: patch that kind too")
        return
    flavours, sites, skipped = fusable_norms(block, _NA_ADDS, dict.fromkeys(_NA_ADDS, True), True, kind="add_rmsnorm")
    if not sites:  # norm2 does not fuse: the block keeps its forward
        Mark((), tuple(skipped)).report(path, found, new=True)
        return
    install_block(block, path, found, na_block_forward(flavours["norm2"]), sites, skipped)
