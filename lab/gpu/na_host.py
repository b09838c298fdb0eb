"""Host time of one neighborhood-attention call and where it goes: the DiffVAE stage-5 tile through
``xbackend.get_op`` and through ``na_triton.neighborhood_attention`` directly. (``get_op`` resolves to
the builtin CUDA backend only where xbackend is installed, so its entry points are registered: on a
bare checkout it runs the reference.)

    python3 lab/gpu/na_host.py [--calls 20] [--top 30]

Per path: wall time of a call followed by a synchronize (median, max) and the guard events it left
in ``xbackend.report()``; host time a call with the GPU kept busy (a sleep kernel ahead of the calls,
so enqueueing never waits on it); cProfile over ten calls, by cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from na_sol import CASES, args_of  # noqa: E402

import xbackend  # noqa: E402
from xbackend.kernels import na_triton as K  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    case = next(c for c in CASES["plain"] if c.name == "DiffVAE stage-5 tile")
    args = args_of(case, torch.device("cuda"))
    op = xbackend.get_op("neighborhood_attention")
    paths = {"get_op": lambda: op(*args), "na_triton": lambda: K.neighborhood_attention(*args)}
    for fn in paths.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    for name, fn in paths.items():
        seen = len(xbackend.report().events)
        walls = []
        for _ in range(a.calls):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t0)
        walls.sort()
        events = xbackend.report().events[seen:]
        print(f"{name}: call + synchronize, median {walls[len(walls) // 2] * 1e6:9.1f} us, max {walls[-1] * 1e6:9.1f} us"
              f" ({a.calls} calls); report events meanwhile: {len(events)}"
              f" {[(e.impl, e.status) for e in events[:3]]}", flush=True)
    for name, fn in paths.items():
        torch.cuda._sleep(int(2e8))  # about 0.1 s of GPU time ahead of the calls
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn()
        host = (time.perf_counter() - t0) / a.calls * 1e6
        torch.cuda.synchronize()
        print(f"{name}: host {host:9.1f} us a call, GPU busy ({a.calls} calls)", flush=True)
    for name, fn in paths.items():
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(min(a.calls, 10)):
            fn()
        torch.cuda.synchronize()
        prof.disable()
        print(f"\n{name}: cProfile, {min(a.calls, 10)} calls, by cumulative time")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(a.top)


if __name__ == "__main__":
    main()
