"""The DiffVAE's ``LTX2VideoDiffusionDecoderModel.tiled_decode`` (diffusers 0.42.1,
``diffusers/models/autoencoders/ltx2_diffusion_decoder.py``) through ``vae_tile_decode``
(``xbackend.adapters.diffusers_ltx2``): the same bits as diffusers' serial decode.

Where the tiles are decoded is the caller's choice, made once at `patch` time (``decode_group``):

- None (the default): on this rank alone, whatever torch.distributed is doing. A data-parallel job, each
  rank decoding its own video, gets its own video, and one rank may decode while the others do not.
- a process group: spread over its ranks, which must then all decode the same ``z`` with a generator in
  the same state and the same step count. Each call checks that first (one all-gather of a few int64s,
  `xbackend.vae.require_same_on_ranks`) and raises InputMismatchError on every rank, naming the ranks
  that differ, instead of handing every rank a mix of tiles from different latents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..adapters.diffusers_ltx2 import tiled_decode_diffvae
from ..vae import LOCAL, require_same_on_ranks
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

_GROUP_ATTR = "_xbackend_decode_group"
_LABEL = "xbackend.patch tiled_decode (decode_group)"
_HINT = (
    "With decode_group the ranks decode one video together: every rank must pass the same z, a generator in "
    "the same state and the same num_inference_steps. To decode each rank's own video, patch without decode_group."
)


def check_decode_group(value: Any) -> Any:
    """`patch`'s ``decode_group`` argument, checked: None or a process group this rank belongs to."""
    expected = (
        "None (each rank decodes its own latent) or a torch.distributed.ProcessGroup this rank belongs to, "
        "e.g. torch.distributed.group.WORLD (the ranks decode one latent together)"
    )
    if value is None:
        return None
    if not dist.is_available():
        raise ValueError(f"xbackend.patch: argument 'decode_group' expected None (this torch has no torch.distributed), "
                         f"got {type(value).__name__}")
    if isinstance(value, dist.ProcessGroup):
        if not dist.is_initialized():
            raise ValueError(f"xbackend.patch: argument 'decode_group' expected {expected}, got a process group "
                             "while torch.distributed is not initialised")
        if dist.get_rank(value) < 0:
            raise ValueError(f"xbackend.patch: argument 'decode_group' expected {expected}, got a group without "
                             f"rank {dist.get_rank()}")
        return value
    got = type(value).__name__
    if isinstance(value, int) and not isinstance(value, bool) and value == dist.GroupMember.NON_GROUP_MEMBER:
        got = "GroupMember.NON_GROUP_MEMBER (what new_group returns on a rank outside the group: patch that rank "
        got += "without decode_group)"
    raise TypeError(f"xbackend.patch: argument 'decode_group' expected {expected}, got {got}")


def describe_decode(group: Any) -> str:
    """Where a patched tiled_decode decodes, for the patch report."""
    if group is None:
        return "serial, on this rank alone (no decode_group)"
    try:
        ranks = dist.get_process_group_ranks(group)
        name = "the default group" if group is dist.group.WORLD else f"group {group.group_name!r}"
    except Exception:
        return "parallel, over decode_group (a group torch.distributed no longer knows)"
    return (
        f"parallel, tiles over decode_group {name} ({len(ranks)} rank{'s' if len(ranks) > 1 else ''}: "
        f"{', '.join(map(str, ranks))}); "
        "every rank must decode the same z (checked on each call)"
    )


# -- LTX2VideoDiffusionDecoderModel.tiled_decode ---------------------------------------------------------
def tiled_decode_forward(group: Any) -> Callable[..., Any]:
    route = LOCAL if group is None else group

    def tiled_decode(
        self: nn.Module, z: torch.Tensor, generator: torch.Generator | None = None, num_inference_steps: int | None = None
    ) -> torch.Tensor:
        # Same bits as diffusers' serial tiled_decode, on this rank alone or over `group`.
        if group is not None:
            steps = num_inference_steps or self.decoder.default_num_inference_steps
            drawn_from = generator if generator is not None else _default_generator(z.device)
            items = {"z": z, "generator": drawn_from, "num_inference_steps": steps}
            require_same_on_ranks(group, items, device=z.device, label=_LABEL, hint=_HINT)
        return tiled_decode_diffvae(self, z, generator, num_inference_steps, group=route)

    setattr(tiled_decode, _GROUP_ATTR, group)
    return tiled_decode


def _default_generator(device: torch.device) -> torch.Generator | None:
    """The generator diffusers' randn_tensor draws from when given none: the device's default one."""
    if device.type == "cpu":
        return torch.default_generator
    if device.type == "cuda":
        return torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
    # Elsewhere the decode's own check still compares the noise drawn.
    return None


def patch_tiled_decode(model: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    group = options.decode_group
    installed = model.__dict__.get("tiled_decode")
    if report_own_override(model, "tiled_decode", path, found):
        if "tiled_decode" in options.kinds:
            before = getattr(getattr(installed, "__func__", None), _GROUP_ATTR, None)
            if before is not group:
                found.skip("tiled_decode", path, f"already patched to decode {describe_decode(before)}, not "
                           f"{describe_decode(group)}: unpatch first to change it")
        return
    if "tiled_decode" not in options.kinds:
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
    detail = f"{describe_decode(group)}; xbackend.adapters.diffusers_ltx2.tiled_decode_diffvae"
    tag = Mark((Site("tiled_decode", "", detail),))
    install(model, "tiled_decode", mark(fn, tag))
    tag.report(path, found, new=True)
