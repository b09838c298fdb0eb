"""qk_norm_rope at LTX-2's video self-attention [1, 32640, 4096] bf16, fp32 cos/sin: launch configs of
the fused kernel against the four separate xbackend kernels and torch.compile of the reference.

    python3 lab/gpu/qk_norm_rope_sweep.py [--out $OUT]

Times are do_bench medians over 3 rotating input sets (each set ~2.1 GB, far above the 60 MB L2), in one
process; every variant's outputs are checked with torch.equal against the eager reference.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from xbackend.kernels import triton_qk_norm_rope as K
from xbackend.kernels import triton_rmsnorm, triton_rotary
from xbackend.ops.qk_norm_rope import reference

SHAPE = (1, 32640, 4096)
EPS = 1e-6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"))
    args = p.parse_args()
    g = torch.Generator("cuda").manual_seed(0)
    d = SHAPE[-1]

    def inputs() -> tuple:
        angle = torch.rand(SHAPE, generator=g, device="cuda") * 6.3
        q = (torch.randn(SHAPE, generator=g, device="cuda") * 3).to(torch.bfloat16)
        k = torch.randn(SHAPE, generator=g, device="cuda").to(torch.bfloat16)
        w = [(1 + 0.3 * torch.randn(d, generator=g, device="cuda")).to(torch.bfloat16) for _ in range(2)]
        return (q, k, *w, angle.cos(), angle.sin())

    sets = [inputs() for _ in range(3)]
    state = {"i": 0}

    def bench(fn) -> float:
        def step() -> None:
            state["i"] = (state["i"] + 1) % 3
            fn(*sets[state["i"]])

        return do_bench(step, warmup=30, rep=400, return_mode="median") * 1e3

    nbytes = SHAPE[1] * d * (4 * 2 + 2 * 4)
    src = torch.empty(nbytes // 8, dtype=torch.float32, device="cuda")  # copy_ reads and writes nbytes / 2
    dst = torch.empty_like(src)
    rows: dict[str, object] = {"copy_": do_bench(lambda: dst.copy_(src), rep=400, return_mode="median") * 1e3}
    ref = reference(*sets[0], EPS, "torch", "interleaved")

    def separate(q, k, wq, wk, c, s):
        return (triton_rotary.rotary_embedding(triton_rmsnorm.rmsnorm(q, wq, EPS, "torch"), c, s),
                triton_rotary.rotary_embedding(triton_rmsnorm.rmsnorm(k, wk, EPS, "torch"), c, s))

    compiled = torch.compile(lambda q, k, wq, wk, c, s: reference(q, k, wq, wk, c, s, EPS, "torch", "interleaved"))
    variants = {"eager reference": lambda *a: reference(*a, EPS, "torch", "interleaved"), "torch.compile": compiled,
                "4 separate xbackend kernels": separate}
    for warps in (4, 8, 16):
        variants[f"fused, {warps} warps"] = lambda *a, w=warps: K.qk_norm_rope(*a, EPS, "torch", num_warps=w)
    for name, fn in variants.items():
        try:
            out = fn(*sets[0])
            exact = all(torch.equal(o, r) for o, r in zip(out, ref, strict=True))
            rows[name] = bench(fn)
            rows[name + " :: bit-exact"] = exact
        except Exception as exc:  # report, keep going
            rows[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
    base = rows["copy_"]
    comp = rows.get("torch.compile")
    for name, v in rows.items():
        if isinstance(v, float):
            extra = f"  {comp / v:5.3f}x compile" if isinstance(comp, float) else ""
            print(f"{name:<58} {v:8.1f} us  {nbytes / v / 1e6:5.2f} TB/s  {base / v * 100:5.1f}% of copy_{extra}")
        else:
            print(f"{name:<58} {v}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "qk_norm_rope_sweep.json").write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
