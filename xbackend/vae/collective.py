"""The collectives of a distributed tile decode, made so that a peer which hangs or dies ends in an error on
every rank, names what happened, and leaves processes that can exit.

What torch.distributed does on its own, and what this module adds (torch 2.13, gloo measured here):

- gloo runs each collective on a worker thread, bounded by the backend's timeout (the group's, fixed when
  the group was made). `Work.wait(timeout)` only stops the caller waiting: the collective stays pending,
  and at interpreter exit `~ProcessGroupGloo` joins its thread, so the process hangs until the peer
  answers or the group's timeout runs out. `ProcessGroup.abort()`, `_abort_process_group` and
  `destroy_process_group` do not end that pending collective either. So gloo is not aborted: the
  exchange sets the gloo backend's timeout to `timeout` for its own collectives (restored afterwards),
  so they end by themselves at the deadline and the thread is free. A gloo collective that times out
  also closes its connections, so a peer that arrives late is told at once instead of waiting out its
  own timeout.
- A failed collective's Work handle is kept for the life of the process: if the backend's worker thread
  dropped the last reference during interpreter shutdown, freeing the tensors would end that thread
  inside a destructor and abort the process (std::terminate).
- NCCL (and any other backend): a collective that timed out keeps its kernel running until the
  communicator is aborted, so on failure the exchange aborts the group's non-gloo backends
  (`Backend.abort()`, ncclCommAbort for NCCL). On NCCL `wait()` without a timeout does not block the
  host, so the status all-reduce, each send/receive and the last broadcast wait with one (`timeout`,
  else the group's). NCCL's watchdog acts on its own at the group's timeout (by default it ends the
  process): a `timeout` shorter than the group's lets the exchange raise first.
- Who failed: each rank notes in the group's store where it is in this call (at the input check,
  decoding, or at the exchange); after a failure the others read it to name the ranks that never
  arrived. The store is a courtesy: when it is unreachable (its host rank died) the message names no rank.

After a failed collective the group is unusable on every rank: destroy it (`dist.destroy_process_group`)
and create a new one, or exit. A failure the ranks agree on (one rank's decode raised, and every rank
took part in the status all-reduce) leaves the group usable; that path never calls `fail`.
"""

from __future__ import annotations

import datetime
import time
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from .tiling import OP_NAME

# Key in the group's store under which a rank notes "<call>:<stage>" (stage: one of _STAGES).
_KEY = "xbackend/vae_tile_decode/rank{}"
# The stages of one call, in order, and the collective each one ends in (None: no collective).
_STAGES = {"check": "input check", "decoding": None, "exchange": "tile exchange"}
# Calls of vae_tile_decode per group in this process; every rank of a group counts the same calls.
_CALLS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# A gloo collective is bounded by its own timeout; waiting this much longer returns gloo's own error.
_GLOO_WAIT_SLACK_S = 5.0
# After a peer's connection closed, how long to let ranks still decoding reach the exchange, so that the
# one that never arrives can be named.
_ARRIVAL_GRACE_S = 2.0
# Failed collectives' Work handles, kept for the life of the process (see GroupLink._failed).
_FAILED_WORK: list[Any] = []
_CLOSED = ("connection closed", "connection reset", "broken pipe", "socket closed", "remote process exited")
_TIMED_OUT = ("timed out", "timeout", "timing out")


class TileDecodeError(RuntimeError):
    """A rank's decode succeeded but the distributed decode failed: another rank's decode raised, or a
    peer hung or died. In the second case the group is unusable (see the module docstring)."""


def _seconds(td: datetime.timedelta) -> str:
    return f"{td.total_seconds():g} s"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


class GroupLink:
    """The collectives of one vae_tile_decode call on one group, with a deadline and failure reports.

    `with link:` spans each stage's collectives: inside it gloo's collectives carry the call's `timeout`.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        rank: int,
        world: int,
        device: torch.device,
        timeout: datetime.timedelta | None,
    ):
        self.group = group
        self.rank = rank
        self.world = world
        self.device = device
        self.pg = group if group is not None else dist.group.WORLD
        self.backend = _backend(self.pg, device)
        gloo = getattr(dist, "ProcessGroupGloo", None)
        self.is_gloo = gloo is not None and isinstance(self.backend, gloo)
        self.group_timeout = _backend_timeout(self.backend)
        self.op_timeout = timeout
        self.timeout = timeout if timeout is not None else self.group_timeout
        self.store = _group_store(self.pg)
        self.call = _CALLS.get(self.pg, 0) + 1
        _CALLS[self.pg] = self.call
        self._saved_timeout: datetime.timedelta | None = None
        self._pending: tuple[str, Any, float] | None = None
        self.stage = "check"

    # -- progress notes in the store ---------------------------------------------------------------------

    def note(self, stage: str) -> None:
        """Tell the other ranks (through the group's store) that this rank reached `stage` of this call."""
        self.stage = stage
        if self.store is None:
            return
        try:
            self.store.set(_KEY.format(self.rank), f"{self.call}:{stage}")
        except Exception:
            # Only failure messages read the notes; a store that is gone must not fail a decode.
            self.store = None

    def _stages(self) -> dict[int, str] | None:
        """Each other rank's stage in this call (one of _STAGES, "not started", "ahead"), or None."""
        if self.store is None:
            return None
        stages: dict[int, str] = {}
        try:
            for r in range(self.world):
                if r == self.rank:
                    continue
                key = _KEY.format(r)
                if not self.store.check([key]):
                    stages[r] = "not started"
                    continue
                call, _, stage = self.store.get(key).decode().partition(":")
                stages[r] = stage if int(call) == self.call else ("not started" if int(call) < self.call else "ahead")
        except Exception:
            return None
        return stages

    # -- the deadline ------------------------------------------------------------------------------------

    def __enter__(self) -> GroupLink:
        if self.is_gloo and self.op_timeout is not None and self.op_timeout != self.group_timeout:
            try:
                self.backend.set_timeout(self.op_timeout)
                self._saved_timeout = self.group_timeout
            except Exception:
                self._saved_timeout = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._saved_timeout is not None:
            try:
                self.backend.set_timeout(self._saved_timeout)
            except Exception:
                pass
            self._saved_timeout = None

    def _wait_s(self) -> datetime.timedelta | None:
        if self.timeout is None:
            return None
        if self.is_gloo:
            return self.timeout + datetime.timedelta(seconds=_GLOO_WAIT_SLACK_S)
        return self.timeout

    # -- collectives -------------------------------------------------------------------------------------

    def run(
        self, what: str, start_op: Callable[[], Any], own_error: BaseException | None = None, *, deferred: bool = False
    ) -> None:
        """Issue one async collective and wait for it; on failure abort and raise on this rank.

        `deferred` (broadcasts, all on one stream): on a backend whose plain `wait()` only orders streams
        (NCCL), skip the host-blocking wait and let `finish()` wait on the last one instead; a broadcast
        cannot complete before those queued ahead of it, so one bounded wait covers them all.
        """
        start = time.monotonic()
        work = None
        try:
            work = start_op()
            if deferred and not self.is_gloo:
                work.wait()
                self._pending = (what, work, start)
                return
            self._wait(work)
        except Exception as exc:
            self._failed(exc, what, work, start, own_error)

    def finish(self) -> None:
        """Wait, bounded, for the last deferred collective."""
        if self._pending is None:
            return
        what, work, start = self._pending
        self._pending = None
        try:
            self._wait(work)
        except Exception as exc:
            self._failed(exc, what, work, start, None)

    def _wait(self, work: Any) -> None:
        wait = self._wait_s()
        if wait is None:
            work.wait()
        else:
            work.wait(wait)

    def _failed(
        self, exc: BaseException, what: str, work: Any, start: float, own_error: BaseException | None
    ) -> NoReturn:
        elapsed = time.monotonic() - start
        if work is not None:
            # The backend's worker thread still holds this work for a moment after reporting the error.
            # Were its reference the last, it would free our tensors there, which takes the GIL; during
            # interpreter shutdown that ends the thread inside a C++ destructor: std::terminate, the
            # process aborts. Keeping ours makes the main thread free the work, at exit at the latest;
            # the pause lets the worker let go first.
            _FAILED_WORK.append(work)
            time.sleep(0.05)
        self.fail(exc, what, elapsed, own_error)

    def all_reduce(self, tensor: torch.Tensor, own_error: BaseException | None = None) -> None:
        self.run(
            "status all-reduce",
            lambda: dist.all_reduce(tensor, group=self.group, async_op=True),
            own_error,
        )

    def all_gather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> None:
        self.run(
            "input check all-gather",
            lambda: dist.all_gather(outputs, tensor, group=self.group, async_op=True),
        )

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.run(
            f"broadcast of a tile from rank {src}",
            lambda: dist.broadcast(tensor, group=self.group, group_src=src, async_op=True),
            deferred=True,
        )

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.run(f"send of a tile to rank {dst}", lambda: dist.isend(tensor, group=self.group, group_dst=dst))

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self.run(f"receive of a tile from rank {src}", lambda: dist.irecv(tensor, group=self.group, group_src=src))

    # -- failure -------------------------------------------------------------------------------------------

    def fail(
        self, exc: BaseException, what: str, elapsed: float, own_error: BaseException | None = None
    ) -> NoReturn:
        """Abort what needs aborting and raise: `own_error` (this rank's decode failed too) or a TileDecodeError."""
        aborted = self._abort()
        cause = _cause(exc, elapsed, self.timeout)
        stages = self._stages()
        if cause == "closed":
            stages = self._await_arrivals(stages)
        detail = self._describe(cause, what, elapsed, stages)
        after = (
            f"The group is unusable now ({aborted}): destroy it (torch.distributed.destroy_process_group) and "
            "create a new one, or exit."
        )
        if own_error is not None:
            if hasattr(own_error, "add_note"):
                own_error.add_note(f"{OP_NAME}: the {what} failed as well: {detail}. {after}")
            raise own_error from exc
        raise TileDecodeError(
            f"op {OP_NAME!r}: rank {self.rank}: {detail}. {after} ({type(exc).__name__}: {_first_line(exc)})"
        ) from exc

    def _abort(self) -> str:
        """Abort the group's non-gloo backends (see the module docstring for why gloo is left alone)."""
        aborted = []
        for backend in _backends(self.pg, self.backend):
            gloo = getattr(dist, "ProcessGroupGloo", None)
            if gloo is not None and isinstance(backend, gloo):
                continue
            try:
                backend.abort()
                aborted.append(type(backend).__name__)
            except Exception:
                pass
        if aborted:
            return f"{', '.join(dict.fromkeys(aborted))} aborted"
        return "gloo closes its connections on a failed collective"

    def _await_arrivals(self, stages: dict[int, str] | None) -> dict[int, str] | None:
        # Ranks still decoding a little slower than this one would be taken for the dead one: give them a
        # moment to reach this collective while more than one rank is missing.
        deadline = time.monotonic() + _ARRIVAL_GRACE_S
        while stages is not None and len(_missing(stages, self.stage)) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
            stages = self._stages()
        return stages

    def _describe(self, cause: str, what: str, elapsed: float, stages: dict[int, str] | None) -> str:
        if self.op_timeout is not None:
            waited = f"timeout={_seconds(self.op_timeout)}"
        elif self.group_timeout is not None:
            waited = f"the group's timeout of {_seconds(self.group_timeout)}"
        else:
            waited = "the group's timeout"
        missing = None if stages is None else _missing(stages, self.stage)
        place = _STAGES.get(self.stage) or "exchange"
        if cause == "timeout":
            if missing:
                why = "; ".join(f"rank {r} {_STAGE_WHY[stages[r]]}" for r in missing)  # type: ignore[index]
                return (
                    f"no answer from {_ranks(missing)} within {waited} in the {what} ({why}); if it is only "
                    "slow, pass a longer `timeout`"
                )
            if missing == []:
                return (
                    f"no answer within {waited} in the {what} although every rank had reached it (a peer hung or "
                    "died inside it, or the network dropped)"
                )
            return f"no answer from a peer within {waited} in the {what} (a rank hung, died, or left the collective order)"
        if cause == "closed":
            if missing and len(missing) == 1:
                return (
                    f"{_ranks(missing)}'s connection closed after {elapsed:.1f} s, before it reached the {place}: "
                    "its process exited or crashed (see its own log)"
                )
            if missing:
                return (
                    f"the connection to one of {_ranks(missing)} closed after {elapsed:.1f} s in the {what}; none of "
                    f"them reached the {place}: one exited or crashed (see their logs)"
                )
            if missing == []:
                return (
                    f"a peer's connection closed after {elapsed:.1f} s in the {what}; every rank had reached the "
                    f"{place}, so a peer gave up waiting for this rank (its own timeout) or exited"
                )
            return (
                f"a peer's connection closed after {elapsed:.1f} s in the {what}: the peer exited or crashed, or "
                "gave up waiting for this rank (its own timeout)"
            )
        return f"the {what} failed after {elapsed:.1f} s"


_STAGE_WHY = {
    "check": "was at the input check",
    "decoding": "was still decoding its tiles: hung or slow in decode_tile",
    "not started": "had not started this decode: still busy before it, or calling collectives in another order",
    "exchange": "had reached the exchange",
    "ahead": "was in a later call already: the ranks call vae_tile_decode (or other collectives) in different orders",
}


def _missing(stages: dict[int, str], at: str) -> list[int]:
    """The ranks that had not reached stage `at` of this call (a later call counts as missing)."""
    order = list(_STAGES)
    return [r for r, stage in sorted(stages.items()) if stage not in order or order.index(stage) < order.index(at)]


def _cause(exc: BaseException, elapsed: float, timeout: datetime.timedelta | None) -> str:
    """"closed" (a peer's connection dropped), "timeout", or "error", from the message and the time taken."""
    text = str(exc).lower()
    if any(s in text for s in _CLOSED):
        return "closed"
    if any(s in text for s in _TIMED_OUT):
        return "timeout"
    if timeout is not None and elapsed >= 0.9 * timeout.total_seconds():
        return "timeout"
    return "error"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:500] if lines else ""


def _backend(pg: Any, device: torch.device) -> Any:
    try:
        return pg._get_backend(device)
    except Exception:
        return None


def _backends(pg: Any, fallback: Any) -> list[Any]:
    found = []
    for device_type in getattr(pg, "_device_types", []):
        backend = _backend(pg, torch.device(device_type))
        if backend is not None and all(backend is not b for b in found):
            found.append(backend)
    return found or ([fallback] if fallback is not None else [])


def _backend_timeout(backend: Any) -> datetime.timedelta | None:
    try:
        timeout = backend.options._timeout
    except Exception:
        return None
    return timeout if isinstance(timeout, datetime.timedelta) else None


def _group_store(pg: Any) -> Any:
    try:
        return pg.get_group_store()
    except Exception:
        return None
