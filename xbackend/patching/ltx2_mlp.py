"""The DiffVAE's ``LTX2VideoVaeSwiGLU.forward`` (diffusers 0.42.1,
``diffusers/models/autoencoders/ltx2_diffusion_decoder.py``) with ``silu(w_gate(x)) * w_up(x)`` as one
``silu_mul`` call: the same projections over the same token tiles as diffusers (a matmul over another
tile could round differently), the same bits. Where the two projections are not that op's inputs
(dtypes, shapes, devices differ) the expression runs as written."""

from __future__ import annotations

import math
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
    diffusers_mismatch,
    foreign_override,
    install,
    mark,
    report_own_override,
    same_parameters,
    silu_mul,
)


def swiglu_forward(module: Any) -> Callable[..., Any]:
    """The forward, reading diffusers' tile size from ``module`` (its decoder module) on every call, as
    diffusers' own forward does."""

    def forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        # diffusers' tiling: tokens in tiles of `_SWIGLU_TILE_SIZE`, each tile's MLP on its own
        tile_size = module._SWIGLU_TILE_SIZE
        batch_size, *token_dims, channels = hidden_states.shape
        num_tokens = math.prod(token_dims)
        if num_tokens <= tile_size:
            return self.w_down(silu_mul(self.w_gate(hidden_states), self.w_up(hidden_states), self))
        flat = hidden_states.reshape(batch_size, num_tokens, channels)
        out = torch.empty_like(flat)
        for start in range(0, num_tokens, tile_size):
            tile = flat[:, start : start + tile_size]
            out[:, start : start + tile_size] = self.w_down(silu_mul(self.w_gate(tile), self.w_up(tile), self))
        return out.reshape(hidden_states.shape)

    return forward


def patch_swiglu(mlp: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(mlp, "forward", path, found):
        return
    if "silu_mul" not in options.kinds:
        return
    problem = diffusers_mismatch()
    if problem is None:
        from diffusers.models.autoencoders import ltx2_diffusion_decoder as dd

        tile_size = getattr(dd, "_SWIGLU_TILE_SIZE", None)
        fn = swiglu_forward(dd)
        if not isinstance(tile_size, int) or tile_size < 1:
            problem = "diffusers' _SWIGLU_TILE_SIZE is missing"
        elif not same_parameters(fn, type(mlp).forward):
            problem = f"forward has a different signature than diffusers {DIFFUSERS_VERSION}'s"
        elif foreign_override(mlp, "forward"):
            problem = "forward is already replaced on this instance; left alone"
    if problem is not None:
        found.skip("silu_mul", path, problem)
        return
    tag = Mark((Site("silu_mul", "", f"silu(w_gate(x)) * w_up(x) fused, tiles of {tile_size} tokens"),))
    install(mlp, "forward", mark(fn, tag))
    tag.report(path, found, new=True)
