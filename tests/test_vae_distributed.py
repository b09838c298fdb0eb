"""vae_tile_decode over gloo process groups (spawned CPU processes): equal to the serial decode on 2 and
3 ranks, delivery to one rank, failure on one rank raising on all, a hung rank timing the others out.

One spawn of 3 ranks runs every scenario (a 2-rank subgroup covers world size 2): process start-up and
`import torch` dominate the cost on a 2-core machine, so each scenario does not get its own processes.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from xbackend.vae import LOCAL, InputMismatchError, Tile, TileDecodeError, vae_tile_decode

GROUP_TIMEOUT = datetime.timedelta(seconds=30)
HANG_TIMEOUT = datetime.timedelta(seconds=2)
HANG_SLEEP_S = 5.0


# -- spawning ranks (also used by test_diffusers_ltx2_adapters) ----------------------------------------------


def _rank_entry(worker: Callable[..., dict], rank: int, world: int, init: str, out_dir: str, args: tuple) -> None:
    # One thread per rank: the ranks share 2 cores, and the serial reference also runs on one thread.
    torch.set_num_threads(1)
    results: dict[str, Any]
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world, timeout=GROUP_TIMEOUT)
        results = worker(rank, world, *args)
    except Exception:
        results = {"__crash__": traceback.format_exc()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    # Returning ends the process normally, also after the hung-rank scenario left its group unusable.


def run_ranks(worker: Callable[..., dict], world: int, tmp_path: Path, args: tuple = (), limit_s: float = 240):
    """Run `worker(rank, world, *args) -> dict` on `world` spawned gloo ranks; return each rank's dict."""
    ctx = mp.get_context("spawn")
    init = f"file://{tmp_path / 'store'}"
    procs = [
        ctx.Process(target=_rank_entry, args=(worker, rank, world, init, str(tmp_path), args)) for rank in range(world)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + limit_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    hung = [rank for rank, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not hung, f"ranks {hung} still running after {limit_s} s"
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
    for rank, res in enumerate(results):
        assert "__crash__" not in res, f"rank {rank} crashed:\n{res['__crash__']}"
    return results


def attempt(fn: Callable[[], Any]) -> dict[str, Any]:
    """Run one scenario; record its output or its exception, and how long it took."""
    start = time.monotonic()
    try:
        return {"out": fn(), "error": None, "elapsed": time.monotonic() - start}
    except Exception as exc:
        return {"out": None, "error": (type(exc).__name__, str(exc)), "elapsed": time.monotonic() - start}


# -- a toy decoder that draws noise, and the scenarios ------------------------------------------------------

SCALE = (2, 2, 3)
TILE = (3, 3, 4)
STRIDE = (2, 2, 3)
MIN_REMNANT = (2, 1, 2)


def _latent(channels_last: bool = False, seed: int = 11) -> torch.Tensor:
    latent = torch.randn(1, 2, 7, 6, 11, generator=torch.Generator().manual_seed(seed))
    return latent.permute(0, 2, 3, 4, 1).contiguous() if channels_last else latent


def _decoder(
    dtype: torch.dtype,
    channels_last: bool,
    fail_rank: int | None = None,
    sleep_rank: int | None = None,
    noise_seed: int = 5,
):
    gen = torch.Generator().manual_seed(noise_seed)
    slept: list[int] = []

    def draw(tile: Tile) -> torch.Tensor:
        shape = (1, 2, *(n * s for n, s in zip(tile.size, SCALE, strict=True)))
        return torch.randn(shape, generator=gen).to(dtype)

    def decode(piece: torch.Tensor, tile: Tile, noise: torch.Tensor) -> torch.Tensor:
        rank = dist.get_rank() if dist.is_initialized() else None
        if rank is not None and rank == fail_rank:
            raise ValueError(f"boom on rank {rank}")
        if rank is not None and rank == sleep_rank and not slept:
            slept.append(rank)
            time.sleep(HANG_SLEEP_S)
        out = piece.permute(0, 4, 1, 2, 3) if channels_last else piece
        for dim, s in zip((2, 3, 4), SCALE, strict=True):
            out = out.repeat_interleave(s, dim=dim)
        return torch.tanh(out.to(dtype) * 1.5) + noise * 0.25

    return decode, draw


def _decode(dtype=torch.float32, channels_last=False, **kwargs) -> torch.Tensor | None:
    fail_rank, sleep_rank = kwargs.pop("fail_rank", None), kwargs.pop("sleep_rank", None)
    decode, draw = _decoder(dtype, channels_last, fail_rank, sleep_rank, kwargs.pop("noise_seed", 5))
    latent = _latent(channels_last, kwargs.pop("seed", 11))
    return vae_tile_decode(
        latent,
        decode,
        tile=TILE,
        stride=kwargs.pop("stride", STRIDE),
        scale=SCALE,
        min_remnant=MIN_REMNANT,
        axes=(1, 2, 3) if channels_last else (2, 3, 4),
        draw_noise=draw,
        **kwargs,
    )


def _worker(rank: int, world: int) -> dict[str, Any]:
    res: dict[str, Any] = {}
    pair = dist.new_group([0, 1])  # every rank must take part in creating it
    res["world"] = attempt(lambda: _decode())
    res["world_bf16_channels_last_dst2"] = attempt(
        lambda: _decode(torch.bfloat16, channels_last=True, dst=2, progress=True)
    )
    if rank in (0, 1):
        res["pair"] = attempt(lambda: _decode(group=pair))
        res["pair_dst1"] = attempt(lambda: _decode(torch.bfloat16, group=pair, dst=1))
    # Fewer tiles than ranks: rank 2 owns nothing and still receives.
    res["two_tiles"] = attempt(
        lambda: vae_tile_decode(
            torch.arange(12.0).reshape(1, 1, 1, 2, 6),
            lambda piece, tile: piece * (tile.index + 1),
            tile=(1, 2, 4),
            stride=(1, 2, 2),
            scale=(1, 1, 1),
            min_remnant=(1, 1, 3),
        )
    )
    res["fail"] = attempt(lambda: _decode(fail_rank=1))
    res["after_fail"] = attempt(lambda: _decode())
    # Inputs that differ between ranks: refused on every rank before any tile is sent, the group stays usable.
    res["latent_differs"] = attempt(lambda: _decode(seed=12 if rank == 2 else 11))
    res["stride_differs"] = attempt(lambda: _decode(stride=(1, 2, 3) if rank == 1 else STRIDE))
    res["noise_differs"] = attempt(lambda: _decode(noise_seed=6 if rank == 1 else 5))
    res["after_differs"] = attempt(lambda: _decode())
    # LOCAL: each rank its own latent, alone; rank 0 decodes once more while the others go on.
    res["local"] = attempt(lambda: _decode(seed=20 + rank, group=LOCAL))
    if rank == 0:
        res["local_alone"] = attempt(lambda: _decode(seed=20, group=LOCAL))
    dist.barrier()
    # Last: a timed-out group is unusable afterwards.
    hang_group = dist.new_group(list(range(world)), timeout=HANG_TIMEOUT)
    res["hang"] = attempt(lambda: _decode(group=hang_group, sleep_rank=1))
    return res


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict[str, Any]]:
    return run_ranks(_worker, 3, tmp_path_factory.mktemp("vae_dist"))


def _serial(dtype=torch.float32, channels_last=False) -> torch.Tensor:
    out = _decode(dtype, channels_last)
    assert out is not None
    return out


def test_three_ranks_equal_serial(ranks):
    expected = _serial()
    for rank, res in enumerate(ranks):
        assert res["world"]["error"] is None, res["world"]["error"]
        assert torch.equal(res["world"]["out"], expected), f"rank {rank}"


def test_two_rank_subgroup_equal_serial(ranks):
    expected = _serial()
    for rank in (0, 1):
        assert torch.equal(ranks[rank]["pair"]["out"], expected), f"rank {rank}"
    assert "pair" not in ranks[2]


def test_delivery_to_dst_only(ranks):
    expected = _serial(torch.bfloat16)
    assert ranks[0]["pair_dst1"]["out"] is None and ranks[0]["pair_dst1"]["error"] is None
    assert torch.equal(ranks[1]["pair_dst1"]["out"], expected)

    expected_cl = _serial(torch.bfloat16, channels_last=True)
    assert expected_cl.dtype == torch.bfloat16
    assert [r["world_bf16_channels_last_dst2"]["out"] is None for r in ranks] == [True, True, False]
    assert torch.equal(ranks[2]["world_bf16_channels_last_dst2"]["out"], expected_cl)


def test_rank_without_tiles_still_receives(ranks):
    row = torch.arange(12.0).reshape(1, 1, 1, 2, 6)
    # Tiles w 0..4 (x1) and 2..6 (x2, the 6 - 4 = 2 remnant merged), blended over 2 columns.
    expected = torch.cat([row[..., :2], row[..., 2:4] * 2, row[..., 4:] * 2], dim=-1)
    expected[..., 2] = row[..., 2] * 1.0 + 0.0 * row[..., 2] * 2
    expected[..., 3] = row[..., 3] * 0.5 + row[..., 3] * 2 * 0.5
    for res in ranks:
        torch.testing.assert_close(res["two_tiles"]["out"], expected, atol=0, rtol=0)


def test_failure_on_one_rank_raises_on_all(ranks):
    for rank, res in enumerate(ranks):
        kind, message = res["fail"]["error"]
        if rank == 1:
            assert (kind, message) == ("ValueError", "boom on rank 1")
        else:
            assert kind == TileDecodeError.__name__
            assert "rank(s) [1]" in message and "boom on rank 1" in message
        assert res["fail"]["elapsed"] < 20
        # The failure is agreed on in a collective, so the group stays usable.
        assert res["after_fail"]["error"] is None


@pytest.mark.parametrize(
    ("key", "what"),
    [
        ("latent_differs", "rank 2 differs from ranks 0, 1 in 'latent' (content)"),
        ("stride_differs", "rank 1 differs from ranks 0, 2 in 'stride' (value: (2, 2, 3) on ranks 0, 2, (1, 2, 3) on rank 1)"),
        ("noise_differs", "rank 1 differs from ranks 0, 2 in 'draw_noise' (the noise it returned"),
    ],
)
def test_inputs_that_differ_between_ranks_raise_on_all(ranks, key, what):
    for rank, res in enumerate(ranks):
        assert res[key]["error"] is not None, f"rank {rank} decoded although the ranks' inputs differ"
        kind, message = res[key]["error"]
        assert kind == InputMismatchError.__name__, (rank, res[key]["error"])
        assert message.startswith("op 'vae_tile_decode': "), message
        assert what in message, (rank, message)
        assert res[key]["error"] == ranks[0][key]["error"]  # every rank says the same
        assert res[key]["elapsed"] < 20
        assert res["after_differs"]["error"] is None, res["after_differs"]["error"]


def test_local_group_decodes_each_ranks_own_latent_alone(ranks):
    for rank, res in enumerate(ranks):
        assert res["local"]["error"] is None, res["local"]["error"]
        assert torch.equal(res["local"]["out"], _decode(seed=20 + rank)), f"rank {rank}"
    assert torch.equal(ranks[0]["local_alone"]["out"], _decode(seed=20))
    assert "local_alone" not in ranks[1]


def test_hung_rank_times_out_everywhere(ranks):
    for rank, res in enumerate(ranks):
        assert res["hang"]["error"] is not None, f"rank {rank} did not raise"
        if rank != 1:
            # Raised after the group timeout, long before the hung rank woke up.
            kind, message = res["hang"]["error"]
            assert kind == TileDecodeError.__name__, res["hang"]
            assert "no answer from rank 1 within the group's timeout of 2 s" in message, message
            assert res["hang"]["elapsed"] < HANG_SLEEP_S, (rank, res["hang"])


# -- world sizes 4 and 8 (gloo, CPU) give the serial bits -------------------------------------------------


def _wide_worker(rank: int, world: int) -> dict[str, Any]:
    four = dist.new_group([0, 1, 2, 3])  # every rank takes part in creating it
    res = {"eight": attempt(lambda: _decode())}
    res["four"] = attempt(lambda: _decode(group=four)) if rank < 4 else None
    return res


def test_four_and_eight_ranks_equal_serial(tmp_path: Path) -> None:
    expected = _decode()
    results = run_ranks(_wide_worker, 8, tmp_path)
    for rank, res in enumerate(results):
        assert res["eight"]["error"] is None, res["eight"]["error"]
        assert torch.equal(res["eight"]["out"], expected), f"8 ranks: rank {rank}"
        if rank < 4:
            assert res["four"]["error"] is None, res["four"]["error"]
            assert torch.equal(res["four"]["out"], expected), f"4 ranks: rank {rank}"
