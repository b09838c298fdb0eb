"""The DiffVAE stage-5 tile through get_op("neighborhood_attention"), na_sm90's shift launch against
na_triton's own (XBACKEND_NA_SM90=0), interleaved: each round times both with do_bench (median), in
alternating order. Prints every round, the medians and the useful TFLOP/s of each.

    python3 lab/gpu/na_sm90_rounds.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import na_sol

import xbackend
from xbackend._runtime import Runtime, set_runtime
from xbackend.kernels import na_sm90


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    case = next(c for c in na_sol.CASES["plain"] if c.name == "DiffVAE stage-5 tile")
    args = na_sol.args_of(case, torch.device("cuda"))
    op = xbackend.get_op("neighborhood_attention")
    flops = 4 * case.dim * case.heads * case.batch * na_sol.useful_pairs(case)
    outs, times, runtimes = {}, {"1": [], "0": []}, {}
    for switch in ("1", "0"):
        # A Runtime reads the switch once (the first call that asks), so each value gets its own.
        os.environ[na_sm90.SWITCH] = switch
        set_runtime(runtimes.setdefault(switch, Runtime()))
        outs[switch] = op(*args).float()
        print(f"impl events ({na_sm90.SWITCH}={switch}):",
              "; ".join(f"{e.impl} {e.status}" for e in xbackend.report().events))
    diff = float((outs["1"] - outs["0"]).norm() / outs["0"].norm())
    print(f"na_sm90 against na_triton's shift launch: relative difference {diff:.2e}")
    for r in range(a.rounds):
        order = ("1", "0") if r % 2 == 0 else ("0", "1")
        for switch in order:
            set_runtime(runtimes[switch])
            times[switch].append(float(do_bench(lambda: op(*args), return_mode="median")))
        print(f"round {r}: na_sm90 {times['1'][-1]:.3f} ms  na_triton {times['0'][-1]:.3f} ms", flush=True)
    for switch, name in (("1", "na_sm90"), ("0", "na_triton")):
        t = times[switch]
        med = statistics.median(t)
        print(f"{name:<10} median {med:.3f} ms ({min(t):.3f}-{max(t):.3f}), {flops / med / 1e9:.0f} useful TFLOP/s "
              f"({flops / max(t) / 1e9:.0f}-{flops / min(t) / 1e9:.0f})")


if __name__ == "__main__":
    main()
