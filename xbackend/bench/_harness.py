"""Timing that a reader can trust: rotated inputs larger than L2, medians of device events, the
``copy_`` of the same bytes in the same run as the roofline."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

L2_BYTES = 60 * 2**20  # H200; rotating 2x past it keeps every timed call out of cache


@dataclass
class Row:
    case: str
    variant: str
    us: float
    bytes_moved: int = 0
    flops: float = 0.0
    exact: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tbps(self) -> float:
        return self.bytes_moved / (self.us * 1e-6) / 1e12 if self.bytes_moved else 0.0

    @property
    def tflops(self) -> float:
        return self.flops / (self.us * 1e-6) / 1e12 if self.flops else 0.0


class Progress:
    """A one-line progress bar on stderr (no dependency)."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total, self.done, self.label, self.enabled = total, 0, label, enabled and sys.stderr.isatty()
        self.start = time.perf_counter()

    def step(self, what: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / max(1, self.total))
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {elapsed:5.1f}s {what[:40]:<40}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def rotations(bytes_per_set: int) -> int:
    return max(2, -(-2 * L2_BYTES // max(1, bytes_per_set)))


SLEEP_CYCLES_PER_US = 2_000  # torch.cuda._sleep counts SM clock cycles: ~1.98 GHz on an H200
MAX_SLEEP_US = 100_000.0  # past this a callable is host-bound, not slow to enqueue
REP_DEVICE_US = 200.0  # device time one timed rep aims at: event resolution (~0.5 µs) is then <= 0.25%


@dataclass
class _Timed:
    fn: Callable[..., Any]
    arg_sets: Sequence[tuple[Any, ...]]
    calls: int = 4
    sleep_us: float = 1000.0
    next_set: int = 0
    host_us: float = 0.0  # enqueueing one call, from the last rep
    times: list[float] = field(default_factory=list)

    def rep(self) -> None:
        """One timed rep: a GPU sleep long enough that every call below is enqueued before the GPU
        reaches it (checked: if the sleep ran out first, the rep is redone with twice the sleep)."""
        while True:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(self.sleep_us * SLEEP_CYCLES_PER_US))
            start.record()
            t0 = time.perf_counter()
            for _ in range(self.calls):
                self.fn(*self.arg_sets[self.next_set % len(self.arg_sets)])
                self.next_set += 1
            self.host_us = (time.perf_counter() - t0) * 1e6 / self.calls
            end.record()
            host_was_late = start.query()  # the GPU had already left the sleep: it may have idled
            end.synchronize()
            if not host_was_late:
                self.times.append(start.elapsed_time(end) * 1e3 / self.calls)
                return
            if self.sleep_us > MAX_SLEEP_US:
                raise RuntimeError(
                    f"bench: {getattr(self.fn, '__name__', self.fn)!r} cannot be queued ahead of the GPU "
                    f"({self.calls} calls took longer than a {self.sleep_us / 1e3:.0f} ms GPU sleep): it waits "
                    "for the GPU from the host (a sync, .item()); time it with time_host_inclusive instead"
                )
            self.sleep_us *= 2

    def warm_up(self, calls: int) -> None:
        for i in range(calls):
            self.fn(*self.arg_sets[i % len(self.arg_sets)])

    def median(self) -> float:
        return sorted(self.times)[len(self.times) // 2]


def time_rotated(fn: Callable[..., Any], arg_sets: Sequence[tuple[Any, ...]], *, warmup: int = 5, reps: int = 50,
                 calls_per_rep: int = 4) -> float:
    """Median device µs per call of ``fn(*args)``, cycling through ``arg_sets``.

    Each rep first queues a GPU sleep, so the host enqueues the timed calls while the GPU is still
    busy (``_Timed.rep`` checks that it was): the events then bracket device work only, not Python or
    launcher overhead (which ``time_host_inclusive`` reports separately).
    """
    timed = _Timed(fn, arg_sets, calls=calls_per_rep)
    timed.warm_up(warmup)
    torch.cuda.synchronize()
    for _ in range(reps):
        timed.rep()
    return timed.median()


def time_rotated_interleaved(
    fns_sets: Sequence[tuple[Callable[..., Any], Sequence[tuple[Any, ...]]]], *, reps: int = 50, warmup: int = 5
) -> list[float]:
    """``time_rotated`` of several callables, their reps interleaved (A, B, C, A, B, C, ...) so that a
    drift in clocks or temperature hits all alike and their ratios hold; median device µs per call each.

    Each callable gets enough back-to-back calls per rep to fill ~``REP_DEVICE_US`` of device time (4 to
    64), so a 3 µs kernel is timed over 64 launches, not 4, and a GPU sleep longer than the host takes to
    enqueue them (``_Timed.rep`` checks it and retries)."""
    timed = [_Timed(fn, sets) for fn, sets in fns_sets]
    for t in timed:
        t.warm_up(warmup)
    torch.cuda.synchronize()
    for t in timed:  # calibrate on one 4-call rep: device µs per call, host µs to enqueue one
        t.rep()
        t.calls = max(4, min(64, int(REP_DEVICE_US / max(t.times[0], 1e-3))))
        t.sleep_us = max(t.sleep_us, 2 * t.host_us * t.calls)
        t.times.clear()
    for _ in range(reps):
        for t in timed:
            t.rep()
    return [t.median() for t in timed]


def time_host_inclusive(fn: Callable[..., Any], args: tuple[Any, ...], *, calls: int = 200, bursts: int = 20) -> float:
    """µs per call for back-to-back calls including Python and launch overhead (small shapes).

    Under ``torch.no_grad()``, as diffusion pipelines call their models; bursts of ``calls`` from an
    idle GPU (short enough never to fill the launch queue), best of ``bursts``."""
    return time_host_inclusive_interleaved([(fn, args)], calls=calls, bursts=bursts)[0]


def time_host_inclusive_interleaved(
    calls_args: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]], *, calls: int = 200, bursts: int = 20
) -> list[float]:
    """``time_host_inclusive`` of several callables with their bursts interleaved (A, B, A, B, ...), so a
    drift in host speed (another process, clocks) hits all alike and their ratio holds; best of ``bursts``
    each."""
    best = [float("inf")] * len(calls_args)
    with torch.no_grad():
        for fn, args in calls_args:
            for _ in range(20):
                fn(*args)
        torch.cuda.synchronize()
        for _ in range(bursts):
            for i, (fn, args) in enumerate(calls_args):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(*args)
                torch.cuda.synchronize()
                best[i] = min(best[i], (time.perf_counter() - t0) / calls * 1e6)
    return best


def copy_fn(bytes_moved: int, device: torch.device) -> tuple[Callable[..., Any], list[tuple[Any, ...]]]:
    """A ``dst.copy_(src)`` that reads and writes ``bytes_moved`` bytes in total."""
    n = bytes_moved // 2
    sets = [(torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device))
            for _ in range(rotations(bytes_moved))]
    return (lambda dst, src: dst.copy_(src)), sets


def format_table(rows: Sequence[Row], *, baseline: dict[str, float] | None = None) -> str:
    """Group rows by case; columns: µs, TB/s or TFLOP/s, % of copy_, speedup vs eager and compile."""
    cases: dict[str, list[Row]] = {}
    for r in rows:
        cases.setdefault(r.case, []).append(r)
    lines = [f"{'case':<40} {'variant':<26} {'µs':>9} {'TB/s':>6} {'TFLOP/s':>8} {'%copy':>6} {'vs eager':>8} {'vs compile':>10} {'exact':>5}"]
    for case, rs in cases.items():
        by = {r.variant: r for r in rs}
        copy_us = by["copy_"].us if "copy_" in by else None
        for r in rs:
            pct = f"{100 * copy_us / r.us:5.0f}%" if copy_us and r.bytes_moved else ""
            base = by.get("eager") or by.get("dense SDPA (cuDNN)")  # attention: vs dense attention
            vs_eager = f"{base.us / r.us:7.2f}x" if base else ""
            vs_compile = f"{by['compile'].us / r.us:9.2f}x" if "compile" in by else ""
            exact = "" if r.exact is None else ("yes" if r.exact else "NO")
            if "accuracy" in r.extra:
                exact = r.extra["accuracy"]
            elif "vs_one_launch" in r.extra:
                exact = f"{r.extra['vs_one_launch']:.2f}x of 1 launch"
            tb = f"{r.tbps:6.2f}" if r.bytes_moved else ""
            tf = f"{r.tflops:8.1f}" if r.flops else ""
            lines.append(f"{case:<40} {r.variant:<26} {r.us:9.1f} {tb:>6} {tf:>8} {pct:>6} {vs_eager:>8} {vs_compile:>10} {exact:>5}")
    return "\n".join(lines)


def write_png(rows: Sequence[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r.case for r in rows))
    variants = list(dict.fromkeys(r.variant for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cases)), 4))
    width = 0.8 / max(1, len(variants))
    for j, v in enumerate(variants):
        xs, ys = [], []
        for i, c in enumerate(cases):
            r = next((r for r in rows if r.case == c and r.variant == v), None)
            if r is not None:
                xs.append(i + j * width)
                ys.append(r.us)
        ax.bar(xs, ys, width, label=v)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cases))], cases, rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("µs (lower is better)")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
