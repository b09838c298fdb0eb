"""Host cost per call of xbackend's pointwise ops against eager PyTorch launches, on a CUDA GPU.

    python3 lab/gpu/host_overhead.py [--calls 200] [--cprofile] [--out $OUT]

For each shape and callable: ``calls`` back-to-back calls without synchronising. ``issue µs`` is the
host time per call (what the Python caller pays); ``wall µs`` includes the GPU draining the queue, so
on small shapes it shows whether the stream is host-bound. Triton kernels are timed twice: through
``DirectLaunch`` (the default) and through Triton's own ``kernel[grid](...)`` path, the pre-issue-6
behaviour, so the launcher's saving is measured, not assumed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import xbackend
from xbackend.kernels import triton_gated_residual as G
from xbackend.kernels import triton_rmsnorm as K

EPS = 1e-6


def host_us(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(host µs per call, wall µs per call): bursts of `calls` launches from an idle GPU, short enough
    never to fill the launch queue (which would make the host wait on the GPU), best of 20."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best_issue, best_wall = float("inf"), float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        best_issue = min(best_issue, (t1 - t0) / calls * 1e6)
        best_wall = min(best_wall, (t2 - t0) / calls * 1e6)
    return best_issue, best_wall


def rmsnorm_toggle(direct: bool) -> None:
    K._DIRECT = direct


def jit_path(launcher: object) -> Callable[[bool], None]:
    def toggle(direct: bool) -> None:
        launcher._direct = direct  # type: ignore[attr-defined]

    return toggle


Case = tuple[str, Callable[[], object], Callable[[bool], None] | None]


def make_cases(shape: list[int], dev: str, toggles: tuple[Callable[[bool], None], ...]) -> list[Case]:
    exact_toggle, fast_toggle, gr_toggle = toggles
    norm = xbackend.get_op("rmsnorm")
    modulate = xbackend.get_op("rmsnorm_modulate")
    gated = xbackend.get_op("gated_residual")
    d = shape[-1]
    x = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    u = torch.randn_like(x)
    w = torch.randn(d, device=dev, dtype=torch.bfloat16)
    gate = torch.randn(1, 1, d, device=dev, dtype=torch.bfloat16)
    sc = torch.randn(1, 1, d, device=dev, dtype=torch.bfloat16)
    cases: list[Case] = [
        ("eager torch.add (one launch)", lambda: torch.add(x, u), None),
        ("eager x + u * gate", lambda: x + u * gate, None),
        ("eager F.rms_norm", lambda: F.rms_norm(x, (d,), w, EPS), None),
        ("eager modulate (torch)", lambda: F.rms_norm(x, (d,), w, EPS) * (1 + sc) + sc, None),
        ("get_op gated_residual", lambda: gated(x, u, gate), None),
        ("get_op rmsnorm torch", lambda: norm(x, w, EPS, "torch"), None),
        ("get_op rmsnorm diffusers", lambda: norm(x, w, EPS, "diffusers"), None),
        ("get_op rmsnorm_modulate", lambda: modulate(x, sc, sc, w, EPS, "torch"), None),
        ("triton rmsnorm exact", lambda: K.rmsnorm(x, w, EPS, "torch", numerics=K.CUDA_NUMERICS), exact_toggle),
        ("triton modulate exact",
         lambda: K.rmsnorm_modulate(x, sc, sc, w, EPS, "torch", numerics=K.CUDA_NUMERICS), exact_toggle),
        ("triton rmsnorm fast", lambda: K.rmsnorm_fast(x, w, EPS, "torch"), fast_toggle),
        ("triton gated_residual", lambda: G.gated_residual(x, u, gate), gr_toggle),
    ]
    return cases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--cprofile", action="store_true", help="also profile the host side of one case (cProfile)")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"))
    args = p.parse_args()
    dev = "cuda"
    rows = []
    exact_toggle = fast_toggle = rmsnorm_toggle
    gr_toggle = jit_path(G._KERNEL)
    for shape in ([1, 126, 2048], [1, 512, 3072], [1, 8160, 4096]):
        cases = make_cases(shape, dev, (exact_toggle, fast_toggle, gr_toggle))
        with torch.inference_mode():
            for name, fn, toggle in cases:
                issue, wall = host_us(fn, args.calls)
                row = {"shape": shape, "case": name, "issue_us": issue, "wall_us": wall}
                if toggle is not None:
                    toggle(False)
                    row["jit_issue_us"], row["jit_wall_us"] = host_us(fn, args.calls)
                    toggle(True)
                    ref = fn()
                    toggle(False)
                    row["direct_equals_jit"] = bool(torch.equal(ref, fn()))
                    toggle(True)
                rows.append(row)
                jit = f"  (Triton's path: {row['jit_issue_us']:6.2f} / {row['jit_wall_us']:6.2f})" if toggle else ""
                print(f"{shape!s:>16} {name:<30} issue {issue:6.2f} µs  wall {wall:6.2f} µs{jit}", flush=True)
    if args.cprofile:
        import cProfile
        import pstats

        x = torch.randn(1, 126, 2048, device=dev, dtype=torch.bfloat16)
        w = torch.randn(2048, device=dev, dtype=torch.bfloat16)
        norm = xbackend.get_op("rmsnorm")
        with torch.inference_mode():
            norm(x, w, EPS, "torch")
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                norm(x, w, EPS, "torch")
            prof.disable()
            torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    print(xbackend.report())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "host_overhead.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
