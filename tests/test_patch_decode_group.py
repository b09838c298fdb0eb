"""A patched DiffVAE's tiled_decode under torch.distributed (2 spawned gloo ranks, tiny decoder).

Without `decode_group` every rank decodes its own latent, alone: a data-parallel job (each rank its own
video) gets its own video back, and one rank may decode while the others do something else. With
`decode_group` the ranks decode one latent together, and a rank that passes a different latent, generator
state or step count makes every rank raise an error naming it, instead of mixing tiles of different
videos. One spawn runs every scenario: process start-up dominates on a 2-core machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("diffusers")

import torch.distributed as dist
from test_patching import build_diffvae
from test_vae_distributed import attempt, run_ranks

import xbackend
from xbackend.adapters.diffusers_ltx2 import set_diffvae_attention
from xbackend.vae import InputMismatchError

LATENT = (1, 8, 3, 3, 4)  # with test_patching's tiling: a 3x3x3 grid of tiles
TILES = 27
SOLO_WAIT_S = 60.0


def _z(seed: int) -> torch.Tensor:
    return torch.randn(LATENT, generator=torch.Generator().manual_seed(seed))


def _decode(model: torch.nn.Module, z: torch.Tensor, seed: int = 7, steps: int | None = None) -> torch.Tensor:
    with torch.no_grad():
        return model.decode(z, generator=torch.Generator().manual_seed(seed), num_inference_steps=steps).sample


def _count_tiles(model: torch.nn.Module) -> list[int]:
    """Counts the decoder's stage-4 calls (one per tile this rank decodes)."""
    decoder, count = model.decoder, [0]
    inner = decoder.forward_stage_4

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return inner(*args, **kwargs)

    decoder.forward_stage_4 = counted
    return count


def _tiles_for(count: list[int], fn) -> dict[str, Any]:
    before = count[0]
    res = attempt(fn)
    res["tiles"] = count[0] - before
    return res


def _worker(rank: int, world: int, state: dict, out_dir: str) -> dict[str, Any]:
    model = build_diffvae(state)
    set_diffvae_attention(model, xbackend.get_op("neighborhood_attention"))
    count = _count_tiles(model)
    own, shared = _z(100 + rank), _z(1)
    res: dict[str, Any] = {"stock_own": _decode(model, own), "stock_shared": _decode(model, shared)}

    # Default patch: each rank its own latent, decoded on this rank alone.
    res["default_report"] = str(xbackend.patch(model))
    res["default_own"] = _tiles_for(count, lambda: _decode(model, own))

    # Opt-in: the ranks decode one latent together.
    xbackend.unpatch(model)
    res["group_report"] = str(xbackend.patch(model, decode_group=dist.group.WORLD))
    res["group_same"] = _tiles_for(count, lambda: _decode(model, shared))
    res["group_differ"] = _tiles_for(count, lambda: _decode(model, own))
    res["group_seed_differ"] = _tiles_for(count, lambda: _decode(model, shared, seed=7 + rank))
    res["group_steps_differ"] = _tiles_for(count, lambda: _decode(model, shared, steps=None if rank == 0 else 2))
    res["group_after"] = _tiles_for(count, lambda: _decode(model, shared))

    # Last (before the fix this leaves the group unusable): rank 0 decodes while rank 1 only waits for it.
    xbackend.unpatch(model)
    xbackend.patch(model)
    done = Path(out_dir) / "solo_done"
    if rank == 0:
        res["solo"] = _tiles_for(count, lambda: _decode(model, own))
        done.write_text("")
    else:
        deadline = time.monotonic() + SOLO_WAIT_S
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return res


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("patch_decode_group")
    return run_ranks(_worker, 2, tmp, args=(build_diffvae().state_dict(), str(tmp)))


def test_default_patch_decodes_each_ranks_own_latent(ranks) -> None:
    for rank, res in enumerate(ranks):
        got = res["default_own"]
        assert got["error"] is None, (rank, got["error"])
        assert got["tiles"] == TILES, (rank, got["tiles"])  # every tile of its own latent, on this rank
        assert torch.equal(got["out"], res["stock_own"]), f"rank {rank}: not its own unpatched decode"
    assert not torch.equal(ranks[0]["stock_own"], ranks[1]["stock_own"])  # the two videos differ
    for res in ranks:
        assert "tiled_decode at <model>: serial, on this rank alone (no decode_group)" in res["default_report"]


def test_default_patch_one_rank_decoding_alone_does_not_block(ranks) -> None:
    solo = ranks[0]["solo"]
    assert solo["error"] is None, solo["error"]
    assert torch.equal(solo["out"], ranks[0]["stock_own"])
    assert solo["elapsed"] < SOLO_WAIT_S / 2, solo["elapsed"]


def test_decode_group_same_latent_spreads_tiles_and_equals_serial(ranks) -> None:
    for rank, res in enumerate(ranks):
        assert "over decode_group the default group (2 ranks: 0, 1)" in res["group_report"], res["group_report"]
        for key in ("group_same", "group_after"):  # the second after three refused calls: the group still works
            got = res[key]
            assert got["error"] is None, (rank, key, got["error"])
            assert torch.equal(got["out"], res["stock_shared"]), (rank, key)
    tiles = [res["group_same"]["tiles"] for res in ranks]
    assert sum(tiles) == TILES and min(tiles) > 0, tiles  # spread: each tile decoded once, on one rank


@pytest.mark.parametrize(
    ("key", "what"),
    [
        ("group_differ", "'z' (content)"),
        ("group_seed_differ", "'generator' (state)"),
        ("group_steps_differ", "'num_inference_steps' (value: 1 on rank 0, 2 on rank 1)"),
    ],
)
def test_decode_group_refuses_different_inputs_on_every_rank(ranks, key: str, what: str) -> None:
    for rank, res in enumerate(ranks):
        got = res[key]
        assert got["error"] is not None, f"rank {rank} decoded although the ranks' inputs differ"
        kind, message = got["error"]
        assert kind == InputMismatchError.__name__, (rank, got["error"])
        assert "rank 1 differs from rank 0 in " + what in message, (rank, message)
        assert "decode_group" in message, message  # says how to decode each rank's own latent
        assert got["tiles"] == 0, (rank, got["tiles"])  # refused before any tile was decoded
        assert got["elapsed"] < 10, (rank, got["elapsed"])
    assert ranks[0][key]["error"] == ranks[1][key]["error"]  # the same message on every rank
