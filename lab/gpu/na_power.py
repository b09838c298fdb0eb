"""Whether the H200 holds its clock through a stream of neighborhood-attention calls: the DiffVAE
stage-5 tile called back to back for a few seconds, then the same calls each after a 1 ms GPU sleep,
with ``nvidia-smi`` sampling the SM clock, power and the clock-event reasons every 100 ms.

    python3 lab/gpu/na_power.py [--seconds 4]

Per phase: the call time from CUDA events around each call, the median of each batch of 20 (first,
median and last batch), and the samples taken during the phase (SM clock MHz, power W, active clock-event reasons as
nvidia-smi prints them).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from na_sol import CASES, args_of  # noqa: E402

from xbackend.kernels import na_triton as K  # noqa: E402

QUERY = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def phase(fn, seconds: float, sleep_cycles: int) -> list[float]:
    """Batches of 20 calls until ``seconds`` pass, events around each call (after its sleep); the
    median ms of a call in each batch."""
    out = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(20)]
        for start, stop in events:
            if sleep_cycles:
                torch.cuda._sleep(sleep_cycles)
            start.record()
            fn()
            stop.record()
        events[-1][1].synchronize()
        times = sorted(start.elapsed_time(stop) for start, stop in events)
        out.append(times[len(times) // 2])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    a = ap.parse_args()
    case = next(c for c in CASES["plain"] if c.name == "DiffVAE stage-5 tile")
    args = args_of(case, torch.device("cuda"))
    fn = lambda: K.neighborhood_attention(*args)  # noqa: E731
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    # About 1 ms of GPU sleep a call: torch.cuda._sleep counts cycles, the SM clock is about 1.98 GHz.
    sleep_cycles = 1_980_000
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader", "-lms", "100"],
                           stdout=subprocess.PIPE, text=True)
    time.sleep(1.0)  # idle samples first
    marks = [("idle", time.time())]
    back = phase(fn, a.seconds, 0)
    marks.append(("back to back", time.time()))
    slept = phase(fn, a.seconds, sleep_cycles)
    marks.append(("1 ms sleep before each call", time.time()))
    time.sleep(0.5)
    smi.terminate()
    samples = smi.stdout.read().strip().splitlines()
    for label, ms in (("back to back", back), ("1 ms sleep before each call", slept)):
        srt = sorted(ms)
        print(f"{label}: {len(ms)} batches of 20 calls, ms a call: first {ms[0]:.3f}  median {srt[len(srt) // 2]:.3f}"
              f"  last {ms[-1]:.3f}  min {srt[0]:.3f}  max {srt[-1]:.3f}")
    print("\nnvidia-smi samples (" + QUERY + "); phase ends at:", [(m, time.strftime('%H:%M:%S', time.localtime(t)))
                                                                 for m, t in marks])
    for line in samples:
        print("  " + line)


if __name__ == "__main__":
    main()
