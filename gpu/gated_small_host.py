"""Host-inclusive cost of the CUDA gated residual at the small seed shapes, per launch path.

    python3 gpu/gated_small_host.py

Best-of-20-bursts µs per call (``xbackend.bench._harness.time_host_inclusive``: 200 back-to-back calls
from an idle GPU, one sync) for one eager launch (``torch.add``), the eager expression, the kernel
directly (row tile with a broadcast gate, its block_cols knob, the flat path with a full gate) and
through ``xbackend.get_op``; plus device µs (``time_rotated``). Three rounds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import xbackend
from xbackend.bench._harness import time_host_inclusive, time_rotated
from xbackend.kernels import cuda_gated_residual as cuda_gr


def main() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, device="cuda", generator=gen).to(torch.bfloat16)

    op = xbackend.get_op("gated_residual")
    cases = {}
    for rows, d in ((512, 3072), (126, 2048)):
        x, u, gb, gf = rand(1, rows, d), rand(1, rows, d), rand(1, 1, d), rand(1, rows, d)
        cases[f"[1,{rows},{d}]"] = {
            "torch.add": (torch.add, (x, u)),
            "eager x+u*g bcast": (lambda x, u, g: x + u * g, (x, u, gb)),
            "cuda bcast": (cuda_gr.gated_residual, (x, u, gb)),
            "cuda bcast block_cols=256": (lambda x, u, g: cuda_gr.gated_residual(x, u, g, block_cols=256), (x, u, gb)),
            "cuda full": (cuda_gr.gated_residual, (x, u, gf)),
            "get_op bcast": (op, (x, u, gb)),
            "get_op full": (op, (x, u, gf)),
        }
    for k in range(3):
        print(f"round {k + 1}", flush=True)
        for shape, fns in cases.items():
            for name, (fn, args) in fns.items():
                host = time_host_inclusive(fn, args)
                dev = time_rotated(fn, [args], reps=30)
                print(f"  {shape:<14} {name:<28} host {host:6.2f} us  device {dev:6.2f} us", flush=True)


if __name__ == "__main__":
    main()
