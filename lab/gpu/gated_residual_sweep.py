"""CUDA gated_residual launch knobs against torch.compile at the seed 001/004 shapes (issue 3:
"never slower than torch.compile").

    python3 lab/gpu/gated_residual_sweep.py [--out $OUT] [--rounds 3]

Per shape (bf16): torch.compile of ``x + update * gate``, the CUDA kernel's automatic choice, and its
knobs (flat path: ``packs_per_thread``; row tile: ``block_cols``, ``rows_per_thread``; both: ``load_hint``). Every config is
checked with torch.equal against eager first. Times are device medians with inputs rotated over
> 256 MB, all configs interleaved within a round; ratios to compile are taken within a round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gated_residual import TIMED, eager, gate_shape, input_sets

from xbackend.bench._harness import time_rotated_interleaved
from xbackend.kernels import cuda_gated_residual as cuda_gr

HINTS = [{"load_hint": h} for h in (1, 2)]  # plain, L1::evict_first
FULL_KNOBS = [{"packs_per_thread": p} for p in (1, 2, 4)] + HINTS
ROW_KNOBS = [{"block_cols": c} for c in (64, 128, 192, 256)] + [{"rows_per_thread": 2}, {"rows_per_thread": 4}] + HINTS


def timed_rounds(title: str, fns: dict[str, Callable], sets: list[tuple], exact: dict[str, bool], rounds: int) -> dict:
    """Every callable's reps interleaved within a round (the bench harness's ``time_rotated_interleaved``:
    device time of 4-64 back-to-back calls behind a GPU sleep, so compile's host-heavy wrapper does not
    leak into small shapes), printed as median µs and the per-round ratio to ``fns["compile"]``; returns
    the raw rounds and the exactness flags."""
    labels = list(fns)
    times = [dict(zip(labels, time_rotated_interleaved([(fns[k], sets) for k in labels], reps=30), strict=True))
             for _ in range(rounds)]
    print(f"\n{title}", flush=True)
    for label in fns:
        us = statistics.median(r[label] for r in times)
        ratio = " ".join(f"{r['compile'] / r[label]:5.3f}" for r in times)
        print(f"  {label:<22} {us:8.2f} us  x compile per round: {ratio}  exact={exact.get(label, '-')}", flush=True)
    return {"rounds": times, "exact": exact}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"))
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda").manual_seed(3)
    report: dict[str, dict] = {}
    for name, shape, form in TIMED:
        gshape = gate_shape(shape, form)
        sets = input_sets(shape, gshape, torch.bfloat16, gen)
        knobs = [{}] + (FULL_KNOBS if form == "full" else ROW_KNOBS)
        fns = {"compile": compiled}
        exact: dict[str, bool] = {}
        want = eager(*sets[0])
        compiled(*sets[0])
        for kw in knobs:
            label = " ".join(f"{k}={v}" for k, v in kw.items()) or "auto"
            fns[label] = lambda x, u, g, kw=kw: cuda_gr.gated_residual(x, u, g, **kw)
            exact[label] = bool(torch.equal(fns[label](*sets[0]), want))
        report[name] = timed_rounds(f"{name} {tuple(shape)} gate {tuple(gshape)}", fns, sets, exact, args.rounds)
        del sets
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "gated_residual_sweep.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
