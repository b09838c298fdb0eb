"""vae_tile_decode when something goes wrong: a rank that hangs, a rank that dies, a rank that never calls it,
a decode_tile whose output does not fit the grid, a lead that would crop from the wrong end.

The distributed scenarios run in real processes (this file run as a script, one process per rank, gloo over
a TCPStore as torchrun sets it up), and every process must end by itself, returning from its main: a
process that only ends when killed is a failure, so no scenario uses os._exit or a kill to end a rank.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

# The group's own timeout is long, so only the op's `timeout` can end a wait on a hung peer.
GROUP_TIMEOUT_S = 120.0
OP_TIMEOUT_S = 3.0
# A dead rank with no `timeout` given: the group's own (20 s) applies, and must not be blamed.
DEAD_GROUP_TIMEOUT_S = 20.0
# Required: every process ends within the timeout plus this, counted from when it starts decoding.
EXIT_SLACK_S = 30.0
# Interpreter start, `import torch` and rendezvous of 3 processes on a 2-core machine.
START_S = 60.0

SCALE = (1, 2, 2)
TILE = (2, 4, 4)
STRIDE = (2, 4, 4)


# -- the ranks (this file run as a script) ------------------------------------------------------------------


def _latent() -> torch.Tensor:
    return torch.arange(2 * 2 * 4 * 12, dtype=torch.float32).reshape(1, 2, 2, 4, 12)


def _upsample(piece: torch.Tensor) -> torch.Tensor:
    return piece.repeat_interleave(SCALE[1], dim=-2).repeat_interleave(SCALE[2], dim=-1)


def _decode(rank: int, world: int, **kwargs: Any):
    from xbackend.vae import vae_tile_decode

    return vae_tile_decode(_latent(), tile=TILE, stride=STRIDE, scale=SCALE, **kwargs)


def _attempt(fn) -> dict[str, Any]:
    start = time.monotonic()
    try:
        fn()
        return {"kind": None, "message": "", "elapsed": time.monotonic() - start, "at": time.time()}
    except Exception as exc:
        return {"kind": type(exc).__name__, "message": str(exc), "elapsed": time.monotonic() - start, "at": time.time()}


def _hang_scenario(rank: int, world: int, out: Path) -> dict[str, Any]:
    """Rank 1 blocks inside decode_tile until the test releases it, i.e. after every other rank has ended."""
    release = out / "release"

    def decode_tile(piece: torch.Tensor, tile: Any) -> torch.Tensor:
        if rank == 1:
            deadline = time.monotonic() + 3 * GROUP_TIMEOUT_S
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
        return _upsample(piece)

    (out / f"ready{rank}").write_text(str(time.time()))
    return {"hang": _attempt(lambda: _decode(rank, world, decode_tile=decode_tile,
                                             timeout=datetime.timedelta(seconds=OP_TIMEOUT_S)))}


def _dead_scenario(rank: int, world: int, out: Path) -> dict[str, Any]:
    """First a tile of the wrong size on rank 1 (all ranks raise, the group stays usable), then rank 1 dies."""
    res: dict[str, Any] = {}

    def bad_tile(piece: torch.Tensor, tile: Any) -> torch.Tensor:
        up = _upsample(piece)
        return up[..., :-1] if rank == 1 else up

    res["bad"] = _attempt(lambda: _decode(rank, world, decode_tile=bad_tile))
    res["after_bad"] = _attempt(lambda: _decode(rank, world, decode_tile=lambda p, t: _upsample(p)))

    def dying_tile(piece: torch.Tensor, tile: Any) -> torch.Tensor:
        if rank == 1:
            # What a segfault or the OOM killer does: no Python cleanup, sockets closed by the kernel.
            (out / "result1.json").write_text(json.dumps(res))
            os.kill(os.getpid(), signal.SIGKILL)
        return _upsample(piece)

    res["dead"] = _attempt(lambda: _decode(rank, world, decode_tile=dying_tile))
    # What the error message tells the caller to do (here, before exiting).
    import torch.distributed as dist

    res["destroy"] = _attempt(dist.destroy_process_group)
    return res


def _alone_scenario(rank: int, world: int, out: Path) -> dict[str, Any]:
    """Rank 0 decodes over the group, rank 1 never calls the op (it waits for rank 0 to finish instead)."""
    done = out / "alone_done"
    if rank != 0:
        deadline = time.monotonic() + GROUP_TIMEOUT_S
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return {"alone": {"kind": None, "message": "", "elapsed": 0.0, "at": time.time()}}
    (out / "ready0").write_text(str(time.time()))
    res = _attempt(lambda: _decode(rank, world, decode_tile=lambda p, t: _upsample(p),
                                   timeout=datetime.timedelta(seconds=OP_TIMEOUT_S)))
    done.write_text("")
    return {"alone": res}


def _rank_main(scenario: str, rank: int, world: int, init: str, out: Path, group_timeout_s: float) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo", init_method=init, rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=group_timeout_s),
        )
        results = {"hang": _hang_scenario, "dead": _dead_scenario, "alone": _alone_scenario}[scenario](rank, world, out)
    except Exception:
        results = {"crash": traceback.format_exc()}
    (out / f"result{rank}.json").write_text(json.dumps(results))
    # Returning from here with the group still registered is the point: interpreter exit must not hang.


# -- launching them ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(scenario: str, world: int, out: Path, group_timeout_s: float) -> list[subprocess.Popen]:
    init = f"tcp://127.0.0.1:{_free_port()}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return [
        subprocess.Popen(
            [sys.executable, __file__, scenario, str(rank), str(world), init, str(out), str(group_timeout_s)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for rank in range(world)
    ]


def _wait_exit(proc: subprocess.Popen, deadline: float) -> float | None:
    """Wall-clock time at which `proc` ended, or None if it was still running at `deadline` (time.time())."""
    while time.time() < deadline:
        if proc.poll() is not None:
            return time.time()
        time.sleep(0.02)
    return time.time() if proc.poll() is not None else None


def _ready_at(out: Path, rank: int, launched: float) -> float:
    path = out / f"ready{rank}"
    while not path.exists() and time.time() < launched + START_S:
        time.sleep(0.05)
    return float(path.read_text()) if path.exists() else launched + START_S


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    """Kill what is left (a failed test must not leave ranks behind) and return each rank's output."""
    logs = []
    for p in procs:
        if p.poll() is None:
            p.kill()
        logs.append(p.communicate()[0] or "")
    return logs


def _result(out: Path, rank: int, log: str) -> dict[str, Any]:
    path = out / f"result{rank}.json"
    assert path.exists(), f"rank {rank} wrote no result:\n{log}"
    res = json.loads(path.read_text())
    assert "crash" not in res, f"rank {rank} crashed:\n{res['crash']}"
    return res


# -- 1. a hung rank: everyone raises, every process ends by itself -----------------------------------------


@pytest.mark.parametrize("world", [2, 3])
def test_hung_rank_every_process_exits(tmp_path: Path, world: int) -> None:
    launched = time.time()
    procs = _launch("hang", world, tmp_path, GROUP_TIMEOUT_S)
    healthy = [r for r in range(world) if r != 1]
    try:
        exits: dict[int, float | None] = {}
        for r in healthy:
            exits[r] = _wait_exit(procs[r], _ready_at(tmp_path, r, launched) + OP_TIMEOUT_S + EXIT_SLACK_S)
        # Only now does the hung rank go on: its peers have ended, as when a rank is stuck for good.
        released = time.time()
        (tmp_path / "release").write_text("")
        exits[1] = _wait_exit(procs[1], released + OP_TIMEOUT_S + EXIT_SLACK_S)
    finally:
        logs = _finish(procs)
    stuck = [r for r, at in exits.items() if at is None]
    assert not stuck, f"ranks {stuck} still running {OP_TIMEOUT_S + EXIT_SLACK_S:g} s after decoding began:\n" + "\n".join(
        f"--- rank {r}:\n{logs[r][-3000:]}" for r in stuck
    )
    for r in range(world):
        assert procs[r].returncode == 0, f"rank {r} exit status {procs[r].returncode}:\n{logs[r][-3000:]}"
        res = _result(tmp_path, r, logs[r])["hang"]
        assert res["kind"] == "TileDecodeError", (r, res, logs[r][-3000:])
        if r != 1:
            assert "no answer from rank 1 within timeout=3 s" in res["message"], res["message"]
            assert "still decoding" in res["message"], res["message"]
            assert OP_TIMEOUT_S - 0.5 <= res["elapsed"] < OP_TIMEOUT_S + 5, res
        else:
            # Its peers gave up and ended; it hears so at once instead of waiting out a timeout.
            assert "connection closed" in res["message"], res["message"]
            assert res["at"] - released < OP_TIMEOUT_S, (res, released)


# -- 2. a rank that never calls the op: the others' input check times out, naming it -------------------------


def test_rank_that_never_calls_is_named_at_the_input_check(tmp_path: Path) -> None:
    launched = time.time()
    procs = _launch("alone", 2, tmp_path, GROUP_TIMEOUT_S)
    try:
        exits = {r: _wait_exit(p, _ready_at(tmp_path, 0, launched) + OP_TIMEOUT_S + EXIT_SLACK_S) for r, p in enumerate(procs)}
    finally:
        logs = _finish(procs)
    stuck = [r for r, at in exits.items() if at is None]
    assert not stuck, f"ranks {stuck} did not end:\n" + "\n".join(f"--- rank {r}:\n{logs[r][-3000:]}" for r in stuck)
    for r in range(2):
        assert procs[r].returncode == 0, f"rank {r} exit status {procs[r].returncode}:\n{logs[r][-3000:]}"
    res = _result(tmp_path, 0, logs[0])["alone"]
    assert res["kind"] == "TileDecodeError", res
    assert "no answer from rank 1 within timeout=3 s in the input check all-gather" in res["message"], res["message"]
    assert "had not started this decode" in res["message"], res["message"]
    assert OP_TIMEOUT_S - 0.5 <= res["elapsed"] < OP_TIMEOUT_S + 5, res


# -- 3. + 4. a bad tile on one rank, then a dead rank ------------------------------------------------------


@pytest.mark.parametrize("world", [3])
def test_bad_tile_then_dead_rank(tmp_path: Path, world: int) -> None:
    launched = time.time()
    procs = _launch("dead", world, tmp_path, DEAD_GROUP_TIMEOUT_S)
    try:
        exits = {r: _wait_exit(p, launched + START_S + DEAD_GROUP_TIMEOUT_S + EXIT_SLACK_S) for r, p in enumerate(procs)}
    finally:
        logs = _finish(procs)
    stuck = [r for r, at in exits.items() if at is None]
    assert not stuck, f"ranks {stuck} did not end:\n" + "\n".join(f"--- rank {r}:\n{logs[r][-3000:]}" for r in stuck)
    assert procs[1].returncode == -signal.SIGKILL, logs[1][-3000:]
    # One launch covers two problems; collect both kinds of mismatch so a failure shows each of them.
    wrong: list[str] = []

    def expect(ok: bool, what: str, got: Any) -> None:
        if not ok:
            wrong.append(f"{what}: {got!r}")

    for r in range(world):
        res = _result(tmp_path, r, logs[r])
        bad = res["bad"]
        if r == 1:
            expect(bad["kind"] == "ValueError", "rank 1 raises ValueError for its bad tile", bad)
            expect(bad["message"].startswith("vae_tile_decode: argument 'decode_tile' expected "), "format", bad)
            expect("got shape [1, 2, 2, 8, 7]" in bad["message"], "rank 1 names the shape it got", bad)
        else:
            expect(bad["kind"] == "TileDecodeError", f"rank {r} raises for rank 1's bad tile", bad)
            expect("rank(s) [1]" in bad["message"] and "argument 'decode_tile'" in bad["message"], "names it", bad)
        expect(res["after_bad"]["kind"] is None, f"rank {r}: the group stays usable after an agreed failure", res)
        if r == 1:
            continue
        expect(procs[r].returncode == 0, f"rank {r} exits normally", logs[r][-3000:])
        dead = res["dead"]
        expect(dead["kind"] == "TileDecodeError", f"rank {r} raises for the dead rank", dead)
        # The connection dropped at once: the message must say so, not blame a timeout it never waited out.
        expect(dead["elapsed"] < 5, f"rank {r} raises at once", dead)
        for text in ("rank 1's connection closed", "exited or crashed"):
            expect(text in dead["message"], f"rank {r}'s message says {text!r}", dead["message"])
        expect("within" not in dead["message"], f"rank {r}'s message blames no timeout", dead["message"])
        expect(res["destroy"]["kind"] is None, f"rank {r} destroys the group afterwards", res["destroy"])
    assert not wrong, "\n".join(wrong)


# -- 5. decode_tile output and lead checks, one process ----------------------------------------------------


def _serial(decode_tile, **kwargs: Any) -> torch.Tensor:
    from xbackend.vae import vae_tile_decode

    return vae_tile_decode(_latent(), decode_tile, **{"tile": TILE, "stride": STRIDE, "scale": SCALE, **kwargs})


def test_decode_tile_wrong_spatial_size_names_tile_and_shapes() -> None:
    with pytest.raises(ValueError) as info:
        _serial(lambda p, t: _upsample(p)[..., :-1])
    message = str(info.value)
    assert message.startswith("vae_tile_decode: argument 'decode_tile' expected "), message
    # Tile 0 at grid position (0, 0, 0): H, W of 4 * 2 = 8 each; the decoder returned one column short.
    assert "tile 0 at grid (0, 0, 0)" in message and "H, W = (8, 8)" in message, message
    assert "got shape [1, 2, 2, 8, 7]" in message, message


def test_decode_tile_ignoring_scale_is_refused() -> None:
    with pytest.raises(ValueError, match=r"argument 'decode_tile' expected .*H, W = \(8, 8\).*got shape \[1, 2, 2, 4, 4\]"):
        _serial(lambda p, t: p.clone())


def test_decode_tile_wrong_ndim_is_refused() -> None:
    with pytest.raises(ValueError, match=r"argument 'decode_tile' expected .*5 dims.*got shape \[2, 2, 8, 8\]"):
        _serial(lambda p, t: _upsample(p)[0])


def test_decode_tile_not_a_tensor_is_refused() -> None:
    with pytest.raises(TypeError, match=r"^vae_tile_decode: argument 'decode_tile' expected .*tensor.*got NoneType"):
        _serial(lambda p, t: None)


def test_decode_tile_too_short_to_keep_its_stride_is_refused() -> None:
    # Temporal length is free (causal decoders return fewer frames), but a non-last tile must hold what it keeps:
    # the first of two temporal tiles keeps stride * scale = 3 frames and this decoder returns 2.
    from xbackend.vae import vae_tile_decode

    with pytest.raises(ValueError, match=r"argument 'decode_tile' expected .*T >= 3.*got shape \[1, 2, 2, 8, 8\]"):
        vae_tile_decode(
            torch.zeros(1, 2, 4, 4, 4), lambda p, t: _upsample(p)[:, :, :2], tile=(3, 4, 4), stride=(3, 4, 4), scale=SCALE
        )


@pytest.mark.parametrize("lead", [(-2, 0, 0), (-5, 0, 0), (0, -8, 0), (0, 0, -9)])
def test_lead_cropping_past_the_stride_is_refused(lead: tuple[int, int, int]) -> None:
    # The first tile keeps stride * scale + lead samples: 2 on t, 8 on h and w; zero or fewer is no tile at all.
    with pytest.raises(ValueError) as info:
        _serial(lambda p, t: _upsample(p), lead=lead)
    message = str(info.value)
    assert message.startswith("vae_tile_decode: argument 'lead' expected "), message
    assert f"got {lead}" in message, message


def test_lead_within_the_stride_still_works() -> None:
    # A causal decoder's first frame group one frame short (DiffVAE: lead=-1) stays allowed.
    out = _serial(lambda p, t: _upsample(p), lead=(-1, 0, 0))
    assert out.shape == (1, 2, 2, 8, 24)


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5]), float(sys.argv[6]))
