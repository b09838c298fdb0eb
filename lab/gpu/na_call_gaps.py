"""Why a ``na_triton`` call takes longer than its kernels: calls in a row, timed per call on the host
and on the GPU, the idle GPU time between calls (profiler), a CUDA graph of the call replayed in a
row (no host work), and the host's hottest functions (cProfile).

    python3 lab/gpu/na_call_gaps.py [--cases stage5,small3d] [--triton-launch]

``--triton-launch`` sends every launch through Triton's own ``kernel[grid](...)`` path instead of
``DirectLaunch`` (the comparison for the host time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from na_launch_parts import SHORT  # noqa: E402
from na_sol import CASES, args_of  # noqa: E402

from xbackend.kernels import na_triton as K  # noqa: E402

CALLS = 30


def in_a_row(fn) -> tuple[float, list[float]]:
    """GPU ms a call over CALLS calls in a row, and each call's host ms."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    host = []
    a.record()
    for _ in range(CALLS):
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e3)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / CALLS, host


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="stage5,small3d")
    ap.add_argument("--triton-launch", action="store_true")
    a = ap.parse_args()
    if a.triton_launch:
        from xbackend.kernels import _triton_launch

        _triton_launch.hooked = lambda: True  # DirectLaunch's test for "take Triton's path"
    by_name = {c.name: c for group in CASES.values() for c in group}
    for key in a.cases.split(","):
        case = by_name[SHORT[key]]
        args = args_of(case, torch.device("cuda"))

        def fn(args=args):
            return K.neighborhood_attention(*args)

        for _ in range(3):
            fn()
        gpu, host = in_a_row(fn)
        print(f"\n{case.name}: {CALLS} calls in a row {gpu * 1e3:8.1f} us a call on the GPU; host us a call: "
              f"first {host[0] * 1e3:.0f}, median {statistics.median(host) * 1e3:.0f}, max {max(host) * 1e3:.0f}")
        print("  host us per call in order:", " ".join(f"{h * 1e3:.0f}" for h in host))

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                fn()
            torch.cuda.synchronize()
        kernels = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda ev: ev.time_range.start)
        idle = [n.time_range.start - p.time_range.end for p, n in itertools.pairwise(kernels)]
        per_call = len(kernels) // CALLS
        by_pos = [statistics.median(idle[i::per_call]) for i in range(per_call)]
        print("  median GPU idle after each kernel of a call (us):",
              " ".join(f"{kernels[i].name[:18]}={g:.1f}" for i, g in enumerate(by_pos)))

        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
            gg, _ = in_a_row(graph.replay)
            print(f"  CUDA graph of the call, {CALLS} replays in a row: {gg * 1e3:8.1f} us a call")
        except Exception as e:  # report, then go on to the host profile
            print(f"  CUDA graph capture failed: {type(e).__name__}: {str(e)[:200]}")
        torch.cuda.synchronize()

        torch.cuda._sleep(100_000_000)  # the GPU busy past the profiled loop: no wait on the host
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(CALLS):
            fn()
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
        print("  host profile of", CALLS, "calls (GPU asleep), by own time:")
        print("\n".join("    " + line for line in s.getvalue().splitlines()[6:30] if line.strip()))
        del args, fn, graph
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
