#!/usr/bin/env python3
"""Bit-exactness and speed of xbackend/kernels/triton_rmsnorm.py on a CUDA GPU.

1. Diagnostics: the per-row statistic of the exact kernel (rstd for "torch", mean of squares for
   "diffusers") against aten's own (``_fused_rms_norm``'s rstd; ``x.float().pow(2).mean(-1)``),
   under alternative readings of the aten sources (thread count, shuffle order, x/y order), so an
   order bug shows up as "hypothesis B matches, A does not".
2. Exactness: mismatching elements and max ULP of every kernel against the eager reference, for
   each shape / flavour / dtype / broadcast form (>= 16M elements per shape, random inputs).
3. Speed at [1, 32640, 4096] bf16: kernels vs eager vs torch.compile vs ``copy_`` of the same bytes,
   triton.testing.do_bench medians over rotating buffers larger than L2.

Usage: PYTHONUNBUFFERED=1 python3 lab/gpu/rmsnorm_exact.py [--quick] [--budget SECONDS]
Writes rmsnorm_exact.json to $OUT when set. Kernel compiles are pre-warmed by worker processes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DRY = "--dry-cpu" in sys.argv  # smoke-test this script on a CPU: interpreter, tiny shapes, no timings
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("triton_rmsnorm", ROOT / "xbackend/kernels/triton_rmsnorm.py")
K = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(K)

EPS = 1e-6
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
DT_NAME = {BF16: "bf16", FP16: "fp16", FP32: "fp32"}
DEVICE = "cpu" if DRY else "cuda"
TARGET_ELEMS = 1 << 12 if DRY else 1 << 24  # >= 16M elements per shape on the GPU
DIAG_ROWS = 8 if DRY else 4096
T0 = time.time()


def _sync() -> None:
    if not DRY:
        torch.cuda.synchronize()


def _device_name() -> str:
    return "cpu (dry run)" if DRY else torch.cuda.get_device_name()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------
# References and comparisons
# --------------------------------------------------------------------------------------------------


def ref_rmsnorm(x, w, eps, flavour):
    if flavour == "torch":
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    v = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(v + eps)
    if w is not None:
        if w.dtype in (torch.float16, torch.bfloat16):
            h = h.to(w.dtype)
        return h * w
    return h.to(x.dtype)


def ref_modulate(x, scale, shift, w, eps, flavour):
    return ref_rmsnorm(x, w, eps, flavour) * (1 + scale) + shift


def _ordered(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.float32:
        i, mag = t.view(torch.int32).to(torch.int64), 0x7FFFFFFF
    else:
        i, mag = t.view(torch.int16).to(torch.int64), 0x7FFF
    return torch.where(i < 0, -(i & mag), i)


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[int, int]:
    """(mismatching elements, max ULP distance)."""
    assert out.dtype == ref.dtype and out.shape == ref.shape, (out.dtype, ref.dtype, out.shape, ref.shape)
    d = (_ordered(out) - _ordered(ref)).abs()
    return int((d != 0).sum()), int(d.max()) if d.numel() else 0


# --------------------------------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------------------------------

D_TORCH = [64, 256, 1000, 2048, 3072, 4096, 4608, 5120]
D_DIFF = [64, 65, 256, 1000, 2048, 3072, 4096, 4608, 5120, 8192]


def rows_for(d: int) -> int:
    return -(-TARGET_ELEMS // d)


def exact_cases(quick: bool) -> list[dict]:
    cases = []
    for fl, ds in (("torch", D_TORCH), ("diffusers", D_DIFF)):
        for d in ds:
            cases.append(dict(kind="rms", fl=fl, shape=(rows_for(d), d), dt=BF16, w=True))
        for d in (1000, 4096):
            cases.append(dict(kind="rms", fl=fl, shape=(rows_for(d), d), dt=BF16, w=False))
        for dt in (FP16, FP32):
            for d in (256, 3072, 4096) + ((65,) if fl == "diffusers" else ()):
                cases.append(dict(kind="rms", fl=fl, shape=(rows_for(d), d), dt=dt, w=True))
        cases.append(dict(kind="rms", fl=fl, shape=(rows_for(4096), 4096), dt=FP32, w=False))
        # rmsnorm_modulate, each broadcast form (x [B, L, D] or the DiffVAE's 5-D)
        for form in ("b1d", "bld", "d", "11d"):
            cases.append(dict(kind="mod", fl=fl, shape=(4, 1024, 4096), dt=BF16, w=True, form=form))
        cases.append(dict(kind="mod", fl=fl, shape=(4, 8, 32, 32, 128), dt=BF16, w=True, form="b1111d"))
        cases.append(dict(kind="mod", fl=fl, shape=(2, 2730, 3072), dt=BF16, w=True, form="b1d"))
        cases.append(dict(kind="mod", fl=fl, shape=(4, 1024, 4096), dt=FP32, w=True, form="b1d"))
        cases.append(dict(kind="mod", fl=fl, shape=(4, 1024, 4096), dt=FP16, w=False, form="b1d"))
    # the diffusers reduce config depends on the row count below 16 rows
    for shape in ((1, 4096), (3, 4096), (8, 1000), (1, 65), (5, 256)):
        cases.append(dict(kind="rms", fl="diffusers", shape=shape, dt=BF16, w=True))
    # the same arithmetic in another tile arrangement (layouts must never change a bit)
    for fl in ("torch", "diffusers"):
        for d in (1000, 3072, 4096):
            cases.append(dict(kind="rms", fl=fl, shape=(rows_for(d), d), dt=BF16, w=True, arr=2))
        cases.append(dict(kind="mod", fl=fl, shape=(4, 1024, 4096), dt=BF16, w=True, form="b1d", arr=2))
        cases.append(dict(kind="mod", fl=fl, shape=(4, 1024, 4096), dt=FP32, w=True, form="b1d", arr=2))
    # approximate kernels
    for fl in ("torch", "diffusers"):
        for d in (1000, 3072, 4096):
            cases.append(dict(kind="rms_fast", fl=fl, shape=(rows_for(d), d), dt=BF16, w=True))
        cases.append(dict(kind="mod_fast", fl=fl, shape=(4, 1024, 4096), dt=BF16, w=True, form="b1d"))
    if quick:
        cases = [c for c in cases if c["shape"][-1] in (1000, 4096) and c["dt"] == BF16][:8]
    if DRY:  # keep D (it picks the kernel), shrink the rows
        for c in cases:
            c["shape"] = tuple(min(n, 2) for n in c["shape"][:-1]) + c["shape"][-1:]
    return cases


def form_shape(shape: tuple[int, ...], form: str) -> tuple[int, ...]:
    d = shape[-1]
    return {
        "b1d": (shape[0], 1, d),
        "bld": shape,
        "d": (d,),
        "11d": (1, 1, d),
        "b1111d": (shape[0], 1, 1, 1, d),
    }[form]


def make_inputs(case: dict, seed: int):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    shape, dt = case["shape"], case["dt"]
    x = torch.randn(shape, generator=g, device=DEVICE).to(dt)
    w = (1 + 0.5 * torch.randn(shape[-1], generator=g, device=DEVICE)).to(dt) if case["w"] else None
    sc = sh = None
    if case["kind"].startswith("mod"):
        ss = form_shape(shape, case["form"])
        sc = (0.3 * torch.randn(ss, generator=g, device=DEVICE)).to(dt)
        sh = torch.randn(ss, generator=g, device=DEVICE).to(dt)
    return x, w, sc, sh


def run_ours(case: dict, x, w, sc, sh):
    fl, kind = case["fl"], case["kind"]
    if "arr" in case:
        nw = 2 if fl == "torch" else 4
        return K._launch_exact(x, w, sc, sh, EPS, fl, K.default_numerics(), 1, nw, None, case["arr"], False)
    if kind == "rms":
        return K.rmsnorm(x, w, EPS, fl)
    if kind == "mod":
        return K.rmsnorm_modulate(x, sc, sh, w, EPS, fl)
    if kind == "rms_fast":
        return K.rmsnorm_fast(x, w, EPS, fl)
    return K.rmsnorm_modulate_fast(x, sc, sh, w, EPS, fl)


def case_name(c: dict) -> str:
    extra = f" {c['form']}" if "form" in c else ""
    extra += f" arr={c['arr']}" if "arr" in c else ""
    return f"{c['kind']:8s} {c['fl']:9s} {DT_NAME[c['dt']]} {'w' if c['w'] else '-'} {list(c['shape'])}{extra}"


# --------------------------------------------------------------------------------------------------
# Diagnostics: per-row statistics under alternative readings of the aten sources
# --------------------------------------------------------------------------------------------------


TORCH_HYPS = (128, 256, 512)
MEAN_SHAPES = tuple(
    (min(m, DIAG_ROWS), d)
    for m, d in ((4096, 1000), (4096, 4096), (65536, 64), (65536, 65), (2048, 8192), (1, 4096), (3, 4096), (8, 1000))
)


def mean_hyps() -> dict:
    base = K.default_numerics()
    return {
        "dec,x-first": base._replace(mean_shfl_increasing=False, mean_x_first=True),
        "inc,x-first": base._replace(mean_shfl_increasing=True, mean_x_first=True),
        "dec,y-first": base._replace(mean_shfl_increasing=False, mean_x_first=False),
    }


def diag_inputs_torch(d: int):
    g = torch.Generator(device=DEVICE).manual_seed(d)
    x = torch.randn(DIAG_ROWS, d, generator=g, device=DEVICE).to(BF16)
    return x, torch.randn(d, generator=g, device=DEVICE).to(BF16)


def diag_inputs_mean(m: int, d: int):
    g = torch.Generator(device=DEVICE).manual_seed(d + m)
    return torch.randn(m, d, generator=g, device=DEVICE).to(BF16)


def diag_calls() -> list:
    """(description, thunk running one diagnostic kernel) pairs; the thunk returns (out, stat)."""
    calls = []
    base = K.default_numerics()
    for d in (1000, 4096):
        for threads in TORCH_HYPS:
            num = base._replace(torch_threads=threads)
            calls.append(
                (
                    ("torch", d, threads),
                    lambda d=d, num=num: K.rmsnorm_stats(*diag_inputs_torch(d), EPS, "torch", numerics=num),
                )
            )
    for m, d in MEAN_SHAPES:
        for name, num in mean_hyps().items():
            if name == "dec,y-first" and d != 8192:
                continue
            calls.append(
                (
                    ("diffusers", m, d, name),
                    lambda m=m, d=d, num=num: K.rmsnorm_stats(
                        diag_inputs_mean(m, d), None, EPS, "diffusers", numerics=num
                    ),
                )
            )
    return calls


def run_diag(results: list) -> None:
    has_fused = hasattr(torch.ops.aten, "_fused_rms_norm")
    if not has_fused:
        log("torch.ops.aten._fused_rms_norm missing: torch-flavour rstd compared by output only")
    for key, thunk in diag_calls():
        y, st = thunk()
        if key[0] == "torch":
            _, d, threads = key
            x, w = diag_inputs_torch(d)
            y_ref = ref_rmsnorm(x, w, EPS, "torch")
            rows = -1
            if has_fused:
                rows = int((st != torch.ops.aten._fused_rms_norm(x, [d], w, EPS)[1].reshape(-1)).sum())
            mism, ulp = compare(y, y_ref)
            results.append(
                dict(
                    flavour="torch",
                    m=x.shape[0],
                    d=d,
                    hypothesis=f"threads={threads}",
                    stat_rows=rows,
                    out_mismatch=mism,
                    out_max_ulp=ulp,
                )
            )
        else:
            _, m, d, name = key
            x = diag_inputs_mean(m, d)
            rows = int((st != x.to(torch.float32).pow(2).mean(-1)).sum())
            mism, ulp = compare(y, ref_rmsnorm(x, None, EPS, "diffusers"))
            results.append(
                dict(
                    flavour="diffusers",
                    m=m,
                    d=d,
                    hypothesis=name,
                    stat_rows=rows,
                    out_mismatch=mism,
                    out_max_ulp=ulp,
                    config=str(K._mean_config(m, d, 32)),
                )
            )
        r = results[-1]
        log(
            f"diag {r['flavour']} [{r['m']},{r['d']}] {r['hypothesis']}: stat rows {r['stat_rows']}, "
            f"out mismatch {r['out_mismatch']} max ulp {r['out_max_ulp']}"
        )


# --------------------------------------------------------------------------------------------------
# Exactness
# --------------------------------------------------------------------------------------------------


def run_exact(cases: list[dict], results: list, deadline: float) -> None:
    for i, c in enumerate(cases):
        if time.time() > deadline:
            log(f"time budget: skipping {len(cases) - i} remaining exactness cases")
            results.append(dict(case="(skipped)", n=len(cases) - i))
            return
        x, w, sc, sh = make_inputs(c, seed=1000 + i)
        reason = None
        if c["kind"] == "rms":
            reason = K.supports_rmsnorm(x, w, EPS, c["fl"])
        elif c["kind"] == "mod":
            reason = K.supports_rmsnorm_modulate(x, sc, sh, w, EPS, c["fl"])
        if reason:
            results.append(dict(case=case_name(c), unsupported=reason))
            log(f"{case_name(c)}: unsupported ({reason})")
            continue
        ref = ref_rmsnorm(x, w, EPS, c["fl"]) if sc is None else ref_modulate(x, sc, sh, w, EPS, c["fl"])
        out = run_ours(c, x, w, sc, sh)
        mism, ulp = compare(out, ref)
        results.append(dict(case=case_name(c), elements=out.numel(), mismatch=mism, max_ulp=ulp))
        log(f"{case_name(c)}: mismatch {mism}/{out.numel()} max ulp {ulp}")


def warm_worker(index: int, count: int, quick: bool, variants: bool) -> None:
    """Compile every count-th kernel the main process will run (fills Triton's on-disk cache)."""
    calls = [(str(k), t) for k, t in diag_calls()]
    for i, c in enumerate(exact_cases(quick)):
        calls.append((case_name(c), lambda c=c, i=i: run_ours(c, *make_inputs(c, seed=1000 + i))))
    calls += bench_calls(variants)
    for j, (name, thunk) in enumerate(calls):
        if j % count != index:
            continue
        try:
            thunk()
        except Exception as e:  # unsupported cases raise; the main process reports them
            print(f"warm {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    _sync()


# --------------------------------------------------------------------------------------------------
# Speed
# --------------------------------------------------------------------------------------------------

BENCH_SHAPE = (1, 16, 256) if DRY else (1, 32640, 4096)
# (rows per program, num_warps, tile arrangement, streaming hints) tried beside the default
VARIANTS = {
    "torch": ((1, 4, 0, True), (1, 2, 2, False), (1, 2, 2, True), (2, 4, 2, False), (1, 2, 0, False)),
    "diffusers": ((1, 4, 0, True), (1, 4, 2, False), (1, 4, 2, True), (1, 8, 2, False), (2, 8, 2, False)),
}
_BENCH_INPUTS: dict = {}


def _rotating(make, n: int):
    bufs = [make(i) for i in range(n)]
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % n
        return bufs[state["i"]]

    return nxt


def bench(fn, warmup: int = 25, rep: int = 150) -> float:
    if DRY:
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    import triton.testing

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3  # us


def bench_inputs() -> dict:
    if not _BENCH_INPUTS:
        d = BENCH_SHAPE[-1]
        _BENCH_INPUTS.update(
            xs=_rotating(lambda i: torch.randn(BENCH_SHAPE, device=DEVICE).to(BF16), 3),
            outs=_rotating(lambda i: torch.empty(BENCH_SHAPE, device=DEVICE, dtype=BF16), 3),
            w=(1 + 0.5 * torch.randn(d, device=DEVICE)).to(BF16),
            sc=(0.3 * torch.randn(1, 1, d, device=DEVICE)).to(BF16),
            sh=torch.randn(1, 1, d, device=DEVICE).to(BF16),
        )
    return _BENCH_INPUTS


def bench_calls(variants: bool) -> list:
    """(name, thunk) for every Triton kernel timed at the bench shape."""

    def mk(fl, mod, fast, cfg):
        def thunk():
            b = bench_inputs()
            sc, sh = (b["sc"], b["sh"]) if mod else (None, None)
            if fast:
                if mod:
                    return K.rmsnorm_modulate_fast(b["xs"](), sc, sh, b["w"], EPS, fl)
                return K.rmsnorm_fast(b["xs"](), b["w"], EPS, fl)
            r, nw, arr, stream = cfg or (None, None, None, False)
            return K._launch_exact(b["xs"](), b["w"], sc, sh, EPS, fl, K.default_numerics(), r, nw, None, arr, stream)

        return thunk

    calls = []
    for fl in K.FLAVOURS:
        for mod in (False, True):
            g = f"{'modulate' if mod else 'rmsnorm'}/{fl}"
            calls.append((f"triton exact {g}", mk(fl, mod, False, None)))
            for cfg in VARIANTS[fl] if variants else ():
                name = f"triton exact {g} R={cfg[0]} nw={cfg[1]} arr={cfg[2]} stream={int(cfg[3])}"
                calls.append((name, mk(fl, mod, False, cfg)))
            calls.append((f"triton fast {g}", mk(fl, mod, True, None)))
    return calls


def compiled_refs():
    rms = {fl: torch.compile(lambda x, w, fl=fl: ref_rmsnorm(x, w, EPS, fl)) for fl in K.FLAVOURS}
    mod = {fl: torch.compile(lambda x, s, t, w, fl=fl: ref_modulate(x, s, t, w, EPS, fl)) for fl in K.FLAVOURS}
    return rms, mod


def compile_worker(which: int) -> None:
    """Warm Inductor's caches for one compiled reference (runs beside the kernel warm-up)."""
    b = bench_inputs()
    rms, mod = compiled_refs()
    fl = K.FLAVOURS[which % 2]
    if which < 2:
        rms[fl](b["xs"](), b["w"])
    else:
        mod[fl](b["xs"](), b["sc"], b["sh"], b["w"])
    _sync()


def run_bench(results: dict, variants: bool) -> None:
    b = bench_inputs()
    xs, outs, w, sc, sh = b["xs"], b["outs"], b["w"], b["sc"], b["sh"]
    nbytes = 2 * xs().numel() * 2  # read x, write out (bf16)
    rows = []

    def add(name, us, group):
        rows.append(dict(name=name, group=group, us=us, tbs=nbytes / us / 1e6))
        log(f"bench {name}: {us:.1f} us")

    add("copy_", bench(lambda: outs().copy_(xs())), "copy")
    rms_c, mod_c = compiled_refs()
    kernels = dict(bench_calls(variants))
    for fl in K.FLAVOURS:
        for mod in (False, True):
            g = f"{'modulate' if mod else 'rmsnorm'}/{fl}"
            if mod:
                eager = lambda fl=fl: ref_modulate(xs(), sc, sh, w, EPS, fl)  # noqa: E731
                comp = lambda fl=fl: mod_c[fl](xs(), sc, sh, w)  # noqa: E731
            else:
                eager = lambda fl=fl: ref_rmsnorm(xs(), w, EPS, fl)  # noqa: E731
                comp = lambda fl=fl: rms_c[fl](xs(), w)  # noqa: E731
            add(f"eager {g}", bench(eager), g)
            try:
                comp()
                add(f"compile {g}", bench(comp), g)
            except Exception as e:
                log(f"compile {g} failed: {e}")
            for name, thunk in kernels.items():
                if name.endswith(f" {g}") or f" {g} " in name:
                    try:
                        add(name, bench(thunk), g)
                    except Exception as e:
                        log(f"{name} failed: {str(e)[:200]}")
    copy_us = rows[0]["us"]
    for r in rows:
        grp = [q for q in rows if q["group"] == r["group"]]
        eager = next((q["us"] for q in grp if q["name"].startswith("eager")), None)
        comp = next((q["us"] for q in grp if q["name"].startswith("compile")), None)
        r["pct_copy"] = 100 * copy_us / r["us"]
        r["vs_eager"] = eager / r["us"] if eager else None
        r["vs_compile"] = comp / r["us"] if comp else None
    results["bench"] = rows


def print_tables(res: dict) -> None:
    print("\n== diagnostics (rows whose statistic differs from aten's) ==")
    for r in res["diag"]:
        stat = r["stat_rows"]
        print(
            f"{r['flavour']:9s} [{r['m']},{r['d']}] {r['hypothesis']:12s} stat rows {stat:6d}  "
            f"out mismatch {r['out_mismatch']:8d}  max ulp {r['out_max_ulp']}"
        )
    print("\n== exactness ==")
    for r in res["exact"]:
        if "unsupported" in r:
            print(f"{r['case']}: unsupported: {r['unsupported']}")
        elif "mismatch" in r:
            print(f"{r['case']}: {r['mismatch']}/{r['elements']} mismatching, max ulp {r['max_ulp']}")
        else:
            print(r)
    if "bench" in res:
        print(f"\n== speed {list(BENCH_SHAPE)} bf16 (median us, rotating buffers) ==")
        print(f"{'kernel':58s} {'us':>8s} {'TB/s':>6s} {'%copy':>6s} {'xeager':>7s} {'xcomp':>6s}")
        for r in res["bench"]:
            ve = f"{r['vs_eager']:.2f}" if r["vs_eager"] else "-"
            vc = f"{r['vs_compile']:.2f}" if r["vs_compile"] else "-"
            print(f"{r['name']:58s} {r['us']:8.1f} {r['tbs']:6.2f} {r['pct_copy']:6.1f} {ve:>7s} {vc:>6s}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget", type=float, default=175.0, help="seconds before exactness cases are skipped")
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--dry-cpu", action="store_true", help="smoke-test on a CPU (interpreter, tiny shapes)")
    ap.add_argument("--warm", type=str, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--compile-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    variants = not args.no_variants
    if args.warm:
        i, n = (int(v) for v in args.warm.split("/"))
        warm_worker(i, n, args.quick, variants)
        return
    if args.compile_worker is not None:
        compile_worker(args.compile_worker)
        return

    log(f"torch {torch.__version__}, {_device_name()}, numerics {K.default_numerics()}")
    me = [sys.executable, str(Path(__file__).resolve())] + (["--quick"] if args.quick else [])
    me += ["--no-variants"] if not variants else []
    me += ["--dry-cpu"] if DRY else []
    comp = [subprocess.Popen(me + ["--compile-worker", str(i)]) for i in range(4)]
    warm = [subprocess.Popen(me + ["--warm", f"{i}/{args.workers}"]) for i in range(args.workers)]
    res: dict = {"torch": torch.__version__, "device": _device_name(), "diag": [], "exact": []}
    out_dir = os.environ.get("OUT")

    def dump() -> None:
        if out_dir:
            Path(out_dir, "rmsnorm_exact.json").write_text(json.dumps(res, indent=1, default=str))

    for p in warm:
        p.wait()
    log("kernel caches warm")
    run_diag(res["diag"])
    dump()
    for p in comp:
        p.wait()
    log("inductor caches warm")
    run_bench(res, variants)
    dump()
    run_exact(exact_cases(args.quick), res["exact"], T0 + args.budget)
    dump()
    print_tables(res)


if __name__ == "__main__":
    main()
