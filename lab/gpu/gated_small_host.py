"""Host-inclusive cost of the CUDA gated residual at the small seed shapes, per launch path.

    python3 lab/gpu/gated_small_host.py [--rounds 3]

Best-of-20-bursts µs per call (``xbackend.bench._harness.time_host_inclusive_interleaved``: 200
back-to-back calls from an idle GPU, one sync, every path's bursts interleaved) and the ratio to one
eager launch (``torch.add``): the eager expression, the Python wrapper ``cuda_gated_residual.gated_residual``,
the extension's C function (``entry()``, what the CUDA plugin's impl caches), ``xbackend.get_op``, and,
when ``lab/gpu/gated_residual_src/prev/`` holds an earlier binding (pybind11, returns error strings), that one
built beside it for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import xbackend
from xbackend.bench._harness import time_host_inclusive_interleaved
from xbackend.kernels import cuda_gated_residual as cuda_gr
from xbackend.kernels._cuda_build import JitExtension

PREV = Path(__file__).resolve().parent / "gated_residual_src" / "prev"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)

    op = xbackend.get_op("gated_residual")
    prev = None
    if (PREV / "gated_residual_binding.cpp").exists():
        prev = JitExtension("xbackend_gr_prev", ("gated_residual_binding.cpp", "gated_residual.cu"),
                            "previous gated_residual binding", source_dir=PREV).load()
    cases = {}
    for rows, d in ((512, 3072), (126, 2048)):
        x, u, gb, gf = rand(1, rows, d), rand(1, rows, d), rand(1, 1, d), rand(1, rows, d)
        cuda_gr.gated_residual(x, u, gb)  # build before entry() is read
        paths = {
            "torch.add (1 launch)": (torch.add, (x, u)),
            "eager x+u*g bcast": (lambda x, u, g: x + u * g, (x, u, gb)),
            "wrapper bcast": (cuda_gr.gated_residual, (x, u, gb)),
            "C entry bcast": (cuda_gr.entry(), (x, u, gb)),
            "C entry full": (cuda_gr.entry(), (x, u, gf)),
            "get_op bcast": (op, (x, u, gb)),
            "get_op full": (op, (x, u, gf)),
        }
        if prev is not None:
            paths["prev pybind bcast"] = (prev.gated_residual, (x, u, gb))
        for name, (fn, a) in paths.items():
            if len(a) == 3:  # every gated residual path, checked bit for bit before it is timed
                assert torch.equal(fn(*a), x + u * a[2]), name
        cases[f"[1,{rows},{d}]"] = paths
    for k in range(args.rounds):
        print(f"round {k + 1}", flush=True)
        for shape, paths in cases.items():
            times = time_host_inclusive_interleaved(list(paths.values()))
            one = times[0]
            for name, us in zip(paths, times, strict=True):
                print(f"  {shape:<14} {name:<22} host {us:6.2f} us  {us / one:5.2f}x of 1 launch", flush=True)


if __name__ == "__main__":
    main()
