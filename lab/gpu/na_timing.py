"""One NA call timed four ways on one machine, with the SM clock and board power sampled by
nvidia-smi during each: does ``do_bench``'s L2 flush, or the clock, move the number?

  do_bench         ``triton.testing.do_bench`` median (256 MB flush before each call, no sync)
  loop, flush      the same loop written out: flush, event, call, event; no sync between calls
  loop, no flush   the loop without the flush
  in a row         one event pair around 40 calls

    python3 lab/gpu/na_timing.py [--cases stage5,video]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from na_launch_parts import SHORT  # noqa: E402
from na_sol import CASES, args_of  # noqa: E402

from xbackend.kernels import na_triton as K  # noqa: E402

REPS = 40


def sampled(run):
    """``run()``'s result and the median SM clock (MHz) and power (W) while it ran."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "20"], stdout=subprocess.PIPE, text=True)
    try:
        out = run()
    finally:
        smi.terminate()
        text = smi.communicate()[0]
    rows = [line.split(",") for line in text.splitlines() if line.count(",") == 1]
    clocks = [float(r[0]) for r in rows if r[0].strip().replace(".", "").isdigit()]
    power = [float(r[1]) for r in rows if r[1].strip().replace(".", "").isdigit()]
    return out, (statistics.median(clocks) if clocks else float("nan")), (statistics.median(power) if power else float("nan"))


def loop(fn, flush: bool) -> float:
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPS)]
    torch.cuda.synchronize()
    for a, b in ev:
        if flush:
            cache.zero_()
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


def in_a_row(fn) -> float:
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(REPS):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / REPS


def _do_bench(fn) -> float:
    from triton.testing import do_bench

    return do_bench(fn, return_mode="median")


WAYS = [("do_bench", _do_bench), ("loop, flush", lambda fn: loop(fn, True)),
        ("loop, no flush", lambda fn: loop(fn, False)), ("in a row", in_a_row), ("do_bench again", _do_bench)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="stage5,video")
    a = ap.parse_args()

    by_name = {c.name: c for group in CASES.values() for c in group}
    for key in a.cases.split(","):
        case = by_name[SHORT[key]]
        args = args_of(case, torch.device("cuda"))

        def fn(args=args):
            return K.neighborhood_attention(*args)

        fn()
        print(f"\n{case.name} (us a call, SM MHz, W):")
        for name, how in WAYS:
            ms, mhz, watts = sampled(lambda how=how, fn=fn: how(fn))
            print(f"  {name:<16} {ms * 1e3:9.1f}  {mhz:6.0f} MHz  {watts:5.0f} W")
        del args
        fn = None  # the args it holds go with it
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
