"""neighborhood_attention on a GPU: accuracy of each impl vs the fp32 reference, then timings.

    PYTHONUNBUFFERED=1 python3 lab/gpu/neighborhood_attention.py [--out DIR] [--budget-s 220]
        [--sections acc,bar,cudnn,flex,small,tiled] [--sweep 1|2] [--flex-wide] [--tag T]

1. accuracy (rel. Frobenius error vs fp32, bf16 and fp16 inputs) of na_triton, na_flex (compiled)
   and na_tiled_sdpa: full check on small 1D/2D/3D shapes with odd sizes, dilation and causal axes;
   sampled queries (reference.attend_fp32 over 1024 random queries) at the two bar shapes;
2. timings (triton.testing.do_bench, median) at the bar shapes:
     A: (30, 48, 80) tokens, 24 heads x 128, window (18, 24, 24)
     B: DiffVAE stage-5 tile (40, 96, 96), 4 heads x 64, window 11^3
   for na_triton (default config and, with --sweep, other tile shapes), na_flex (torch.compile'd
   flex, tile-permuted) and dense cuDNN SDPA over the same tokens. Each q/k/v is >= 189 MB
   (over 3x the 60 MB L2), so the inputs are not rotated.
   useful TFLOP/s = 4 * tokens * window volume * head_dim * heads / time  (batch 1).

Results go to $OUT/neighborhood_attention.json (or --out), rewritten after every section, so a run
cut short still leaves what it measured. A short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from triton.testing import do_bench

from xbackend.kernels import na_flex, na_tiled_sdpa, na_triton
from xbackend.kernels.na_triton import NAConfig
from xbackend.ops.neighborhood_attention import attend_fp32

BARS = {
    "A_30x48x80_h24_d128_w18x24x24": dict(spatial=(30, 48, 80), heads=24, dim=128, kernel=(18, 24, 24)),
    "B_diffvae_40x96x96_h4_d64_w11": dict(spatial=(40, 96, 96), heads=4, dim=64, kernel=(11, 11, 11)),
}
SMALL = [
    ((257,), (17,), (1,), (False,)),
    ((200,), (9,), (4,), (True,)),
    ((33, 47), (7, 9), (1, 2), (False, True)),
    ((13, 12, 17), (3, 5, 7), (1, 1, 1), (False, False, False)),
    ((13, 12, 17), (13, 12, 17), (1, 1, 1), (False, False, False)),
    ((21, 30, 22), (5, 7, 3), (2, 3, 1), (True, False, False)),
    ((16, 20, 24), (4, 6, 5), (1, 2, 3), (False, True, False)),
]
SWEEP = {
    "A_30x48x80_h24_d128_w18x24x24": [
        NAConfig((2, 8, 8), (1, 2, 32), 8, 2),
        NAConfig((4, 4, 8), (1, 2, 32), 8, 2),
        NAConfig((2, 4, 8), (1, 2, 32), 4, 2),
        NAConfig((2, 4, 8), (1, 2, 32), 4, 3),
        NAConfig((4, 4, 4), (1, 2, 32), 4, 3),
        NAConfig((2, 4, 8), (1, 4, 32), 4, 2),
        NAConfig((2, 8, 8), (1, 4, 32), 8, 2),
    ],
    "B_diffvae_40x96x96_h4_d64_w11": [
        NAConfig((4, 4, 4), (2, 2, 16), 4, 3),
        NAConfig((4, 4, 4), (1, 4, 16), 4, 3),
        NAConfig((4, 4, 4), (2, 4, 8), 4, 3),
        NAConfig((4, 4, 4), (1, 2, 32), 4, 3),
        NAConfig((4, 4, 8), (2, 2, 16), 8, 3),
        NAConfig((4, 4, 8), (1, 4, 16), 8, 3),
        NAConfig((2, 4, 8), (2, 2, 16), 4, 3),
        NAConfig((4, 4, 4), (2, 2, 32), 4, 3),
        NAConfig((4, 4, 4), (2, 2, 16), 4, 2),
    ],
}
# Second round around the first round's winners (notes/na.md, in the git history).
SWEEP2 = {
    "A_30x48x80_h24_d128_w18x24x24": [
        NAConfig((2, 4, 8), (1, 2, 32), 4, 4),
        NAConfig((2, 4, 8), (2, 1, 32), 4, 3),
        NAConfig((1, 8, 8), (1, 2, 32), 4, 3),
        NAConfig((2, 8, 8), (1, 4, 32), 8, 2),
    ],
    "B_diffvae_40x96x96_h4_d64_w11": [
        NAConfig((4, 4, 4), (2, 2, 16), 4, 2),
        NAConfig((4, 4, 4), (2, 2, 16), 4, 4),
        NAConfig((4, 4, 4), (1, 4, 16), 4, 2),
    ],
}
# (tile, wide index tables): None = na_flex.choose_tile's pick. Run 3 measured compact == wide, and
# (2, 8, 8) / (4, 4, 8); the cost model now picks (8, 4, 4) / (8, 2, 8) for these bars (unmeasured).
FLEX_RUNS = {
    "A_30x48x80_h24_d128_w18x24x24": [(None, False), ((2, 8, 8), False)],
    "B_diffvae_40x96x96_h4_d64_w11": [(None, False), ((4, 4, 8), False)],
}


class Run:
    def __init__(self, out: Path, budget_s: float, tag: str = "") -> None:
        self.t0 = time.time()
        self.budget_s = budget_s
        self.path = out / f"neighborhood_attention{'_' + tag if tag else ''}.json"
        self.res: dict = {
            "device": torch.cuda.get_device_name(),
            "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__,
            "accuracy": [],
            "timing": [],
            "errors": [],
        }
        out.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.budget_s - (time.time() - self.t0)

    def save(self) -> None:
        self.path.write_text(json.dumps(self.res, indent=1, default=str))

    def error(self, where: str, exc: BaseException) -> None:
        msg = f"{where}: {type(exc).__name__}: {exc}"
        print("ERROR", msg, flush=True)
        traceback.print_exc()
        self.res["errors"].append(msg)
        self.save()


def rand_qkv(spatial, heads, dim, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (1, *spatial, heads, dim)
    return [torch.randn(shape, device="cuda", dtype=dtype, generator=g) for _ in range(3)]


def rel_fro(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm())


def useful_flops(spatial, heads, dim, kernel) -> float:
    return 4.0 * math.prod(spatial) * math.prod(kernel) * dim * heads


IMPLS = {
    "na_triton": lambda q, k, v, ks, d, c: na_triton.neighborhood_attention(q, k, v, ks, d, c, None),
    "na_flex": lambda q, k, v, ks, d, c: na_flex.neighborhood_attention(q, k, v, ks, d, c, None),
    "na_tiled_sdpa": lambda q, k, v, ks, d, c: na_tiled_sdpa.neighborhood_attention(q, k, v, ks, d, c, None),
}


def accuracy_small(run: Run, impls: list[str], cases=SMALL, dtypes=(torch.bfloat16, torch.float16)) -> None:
    for spatial, ks, dil, causal in cases:
        for dtype in dtypes:
            q, k, v = rand_qkv(spatial, 3, 64, dtype, seed=len(spatial))
            ref = attend_fp32(q, k, v, ks, dil, causal, None).reshape(q.shape)
            for name in impls:
                if run.left() < 20:
                    return
                try:
                    out = IMPLS[name](q, k, v, ks, dil, causal)
                    torch.cuda.synchronize()
                    err = rel_fro(out, ref)
                except Exception as exc:
                    run.error(f"acc {name} {spatial}", exc)
                    continue
                run.res["accuracy"].append(dict(impl=name, shape=spatial, kernel=ks, dilation=dil,
                                                causal=causal, dtype=str(dtype), rel_fro=err, ok=err < 5e-3))
                print(f"acc {name:14s} {spatial!s:16s} k={ks} d={dil} c={causal} {dtype} err={err:.2e}",
                      flush=True)
            run.save()


def sampled_accuracy(run: Run, bar: str, impl: str, out: torch.Tensor, q, k, v, kernel) -> None:
    n = math.prod(q.shape[1:-2])
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:1024].sort().values.cuda()
    dims = (1,) * len(kernel)
    causal = (False,) * len(kernel)
    ref = attend_fp32(q, k, v, kernel, dims, causal, None, query_index=idx)
    got = out.reshape(1, n, q.shape[-2], q.shape[-1])[:, idx]
    err = rel_fro(got, ref)
    run.res["accuracy"].append(dict(impl=impl, shape=bar, sampled=1024, dtype=str(q.dtype), rel_fro=err,
                                    ok=err < 5e-3))
    print(f"acc {impl:14s} {bar} sampled err={err:.2e}", flush=True)


def bench(fn, rep_ms: float = 400) -> float:
    return do_bench(fn, warmup=50, rep=rep_ms, return_mode="median")


def time_row(run: Run, bar: str, impl: str, ms: float, extra: dict | None = None) -> None:
    cfg = BARS[bar]
    flops = useful_flops(cfg["spatial"], cfg["heads"], cfg["dim"], cfg["kernel"])
    row = dict(bar=bar, impl=impl, ms=ms, useful_tflops=flops / ms / 1e9, **(extra or {}))
    run.res["timing"].append(row)
    run.save()
    print(f"time {bar:34s} {impl:40s} {ms:9.3f} ms {row['useful_tflops']:7.1f} TFLOP/s", flush=True)


def bars_triton(run: Run, sweep: str) -> None:
    for bar, cfg in BARS.items():
        q, k, v = rand_qkv(cfg["spatial"], cfg["heads"], cfg["dim"], torch.bfloat16)
        ks, n = cfg["kernel"], len(cfg["kernel"])
        dil, causal = (1,) * n, (False,) * n
        default = na_triton.choose_config(cfg["spatial"], ks, dil, cfg["dim"])
        extra = {"": [], "1": SWEEP[bar], "2": SWEEP2[bar]}[sweep]
        configs = [default] + [c for c in extra if c != default]
        for i, c in enumerate(configs):
            if run.left() < 30:
                return
            try:
                out = na_triton.neighborhood_attention(q, k, v, ks, dil, causal, None, config=c)
                torch.cuda.synchronize()
                if i == 0:
                    sampled_accuracy(run, bar, "na_triton", out, q, k, v, ks)
                ms = bench(partial(na_triton.neighborhood_attention, q, k, v, ks, dil, causal, None, config=c))
            except Exception as exc:
                run.error(f"triton {bar} {c}", exc)
                continue
            label = f"na_triton{' (default)' if i == 0 else ''} q{c.q_tile} kv{c.kv_tile} w{c.num_warps}s{c.num_stages}"
            time_row(run, bar, label, ms, dict(config=str(c)))
        del q, k, v, out
        torch.cuda.empty_cache()


def bars_cudnn(run: Run) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for bar, cfg in BARS.items():
        if run.left() < 20:
            return
        q, k, v = rand_qkv(cfg["spatial"], cfg["heads"], cfg["dim"], torch.bfloat16)
        b, h, d = 1, cfg["heads"], cfg["dim"]
        qt, kt, vt = (t.reshape(b, -1, h, d).transpose(1, 2) for t in (q, k, v))
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt)
                ms = bench(partial(F.scaled_dot_product_attention, qt, kt, vt), rep_ms=1500)
        except Exception as exc:
            run.error(f"cudnn {bar}", exc)
            continue
        tokens = math.prod(cfg["spatial"])
        dense_tflops = 4.0 * tokens * tokens * d * h / ms / 1e9
        time_row(run, bar, "dense cuDNN SDPA", ms, dict(dense_tflops=dense_tflops))
        del q, k, v, qt, kt, vt
        torch.cuda.empty_cache()


def bars_flex(run: Run, force_wide: bool) -> None:
    for bar, cfg in BARS.items():
        q, k, v = rand_qkv(cfg["spatial"], cfg["heads"], cfg["dim"], torch.bfloat16)
        ks, n = cfg["kernel"], len(cfg["kernel"])
        dil, causal = (1,) * n, (False,) * n
        for j, (tile, wide) in enumerate(FLEX_RUNS[bar]):
            wide = wide or force_wide
            if run.left() < 45:
                return
            call = partial(na_flex.neighborhood_attention, q, k, v, ks, dil, causal, None, tile=tile,
                           wide_indices=wide)
            try:
                t0 = time.time()
                torch.cuda.reset_peak_memory_stats()
                out = call()
                torch.cuda.synchronize()
                first_s = time.time() - t0
                peak = torch.cuda.max_memory_allocated() / 2**30
                if j == 0:
                    sampled_accuracy(run, bar, "na_flex", out, q, k, v, ks)
                ms = bench(call)
            except Exception as exc:  # record and continue
                run.error(f"flex {bar} {tile} wide={wide}", exc)
                continue
            used = tile or na_flex.choose_tile(cfg["spatial"], ks, dil)
            time_row(run, bar, f"na_flex compiled tile{used}{' wide' if wide else ''}", ms,
                     dict(first_call_s=first_s, peak_gib=peak))
        del q, k, v
        torch.cuda.empty_cache()


def tiled_timing(run: Run) -> None:
    bar = "B_diffvae_40x96x96_h4_d64_w11"
    cfg = BARS[bar]
    if run.left() < 30:
        return
    q, k, v = rand_qkv(cfg["spatial"], cfg["heads"], cfg["dim"], torch.bfloat16)
    ks = cfg["kernel"]
    try:
        torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        out = na_tiled_sdpa.neighborhood_attention(q, k, v, ks, (1, 1, 1), (False,) * 3, None)
        torch.cuda.synchronize()
        ms = (time.time() - t0) * 1e3
        peak = torch.cuda.max_memory_allocated() / 2**30
        sampled_accuracy(run, bar, "na_tiled_sdpa", out, q, k, v, ks)
    except Exception as exc:
        run.error("tiled", exc)
        return
    time_row(run, bar, "na_tiled_sdpa (one call, host timer)", ms, dict(peak_gib=peak))


def summary(run: Run) -> None:
    print("\n=== accuracy (rel Frobenius vs fp32 reference; bar 5e-3) ===")
    worst: dict[str, float] = {}
    for r in run.res["accuracy"]:
        worst[r["impl"]] = max(worst.get(r["impl"], 0.0), r["rel_fro"])
    for impl, e in worst.items():
        n = sum(1 for r in run.res["accuracy"] if r["impl"] == impl)
        print(f"{impl:14s} cases={n:3d} worst={e:.2e} {'OK' if e < 5e-3 else 'FAIL'}")
    print("\n=== timing (median ms, useful TFLOP/s) ===")
    for bar in BARS:
        rows = [r for r in run.res["timing"] if r["bar"] == bar]
        if not rows:
            continue
        print(bar)
        for r in rows:
            print(f"  {r['impl']:58s} {r['ms']:9.3f} ms {r['useful_tflops']:7.1f}")
        tri = [r for r in rows if r["impl"].startswith("na_triton")]
        best = min(tri, key=lambda r: r["ms"]) if tri else None
        cud = next((r for r in rows if r["impl"].startswith("dense cuDNN")), None)
        flx = [r for r in rows if r["impl"].startswith("na_flex")]
        if best and cud:
            print(f"  best triton vs dense cuDNN: {cud['ms'] / best['ms']:.2f}x")
        if best and flx:
            print(f"  best triton vs best flex:   {min(r['ms'] for r in flx) / best['ms']:.2f}x")
    for e in run.res["errors"]:
        print("ERROR", e)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--budget-s", type=float, default=220)
    p.add_argument("--sections", default="acc,bar,cudnn,flex,small,tiled")
    p.add_argument("--sweep", default="", choices=["", "1", "2"], help="extra na_triton configs (round 1 or 2)")
    p.add_argument("--flex-wide", action="store_true", help="flex block index tables one column per KV block")
    p.add_argument("--tag", default="", help="suffix of the JSON file name")
    a = p.parse_args()
    run = Run(Path(a.out), a.budget_s, a.tag)
    sections = a.sections.split(",")
    print(run.res["device"], run.res["capability"], run.res["torch"], flush=True)
    if "acc" in sections:
        accuracy_small(run, ["na_triton"])
    if "bar" in sections:
        bars_triton(run, a.sweep)
    if "cudnn" in sections:
        bars_cudnn(run)
    if "flex" in sections:
        bars_flex(run, a.flex_wide)
    if "small" in sections:
        # Each new shape or dtype recompiles flex (~15 s): two mixed cases, bf16 only.
        accuracy_small(run, ["na_flex", "na_tiled_sdpa"], [SMALL[2], SMALL[5]], (torch.bfloat16,))
    if "tiled" in sections:
        tiled_timing(run)
    run.res["elapsed_s"] = time.time() - run.t0
    run.save()
    summary(run)


if __name__ == "__main__":
    main()
