"""The DiffVAE's ``LTX2VideoDiffusionDecoderModel.tiled_decode`` (diffusers 0.42.1,
``diffusers/models/autoencoders/ltx2_diffusion_decoder.py``) through ``vae_tile_decode``
(``xbackend.adapters.diffusers_ltx2``): the same bits as diffusers' serial decode, its tiles spread
over a process group when torch.distributed is initialised."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..adapters.diffusers_ltx2 import tiled_decode_diffvae
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
)


# -- LTX2VideoDiffusionDecoderModel.tiled_decode ---------------------------------------------------------
def tiled_decode_forward(group: Any) -> Callable[..., Any]:
    def tiled_decode(
        self: nn.Module, z: torch.Tensor, generator: torch.Generator | None = None, num_inference_steps: int | None = None
    ) -> torch.Tensor:
        # Same bits as diffusers' serial tiled_decode; tiles spread over `group` (the default group when
        # torch.distributed is initialised), every rank gets the whole result.
        return tiled_decode_diffvae(self, z, generator, num_inference_steps, group=group)

    return tiled_decode


def patch_tiled_decode(model: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(model, "tiled_decode", path, found):
        return
    if "tiled_decode" not in options.kinds:
        return
    group = options.decode_group
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
