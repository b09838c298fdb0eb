"""Issue 3 experiment: CUDA C++ RMSNorm in PyTorch's exact order (lab/gpu/rmsnorm_cuda_src/rmsnorm.cu), both
flavours, two schedules: one warp per row with the row in registers (16-byte loads, no barrier), and
a staged kernel whose rows arrive in shared memory by bulk copy (cp.async.bulk + mbarrier) several
rows ahead. On an H200: build time, bit-exactness against the reference over shapes/dtypes/flavours/
schedules, and speed at [1, 32640, 4096] bf16 against copy_, eager, torch.compile and the production
Triton kernel, all in one process. Neither schedule beat the Triton kernel (notes/rmsnorm.md, in the git history), so
neither is registered; kept to reproduce that finding.

    python3 lab/gpu/rmsnorm_cuda.py [--out $OUT] [--skip-exact]

Times: median device µs over inputs rotated past L2 (xbackend.bench._harness.time_rotated, the
method of `xbackend bench`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from xbackend.bench._harness import rotations, time_rotated
from xbackend.kernels import triton_rmsnorm
from xbackend.kernels._cuda_build import JitExtension
from xbackend.ops.rmsnorm import reference

EPS = 1e-6


MAX_D = 6144  # rmsnorm.cuh kMaxD: the longest row one warp keeps in registers

_EXT = JitExtension("xbackend_rmsnorm_experiment", ("rmsnorm_binding.cpp", "rmsnorm.cu"), "cuda rmsnorm",
                    source_dir=Path(__file__).resolve().parent / "rmsnorm_cuda_src")


def cuda_supports(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    """Why the CUDA kernels cannot take these inputs (the binding checks the same), or None."""
    reason = triton_rmsnorm.supports_rmsnorm(x, weight, eps, flavour, numerics=triton_rmsnorm.CUDA_NUMERICS)
    if reason:
        return reason
    d = x.shape[-1]
    if d % (16 // x.element_size()) or d > MAX_D:
        return "D must split into 16-byte loads and be <= 6144"
    if flavour == "diffusers" and (d < 128 or x.numel() // d < 16):
        return "diffusers: aten's mean has a one-warp order only for D >= 128 and >= 16 rows"
    return None


def cuda_rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str, *,
                 warps_per_block: int = 0, smem_bytes: int = 0, max_blocks: int = 0, stages: int = 0,
                 load_hint: int = 0) -> torch.Tensor:
    """The register kernel (``stages=0``, ``warps_per_block`` rows per block; ``smem_bytes`` of unused
    shared memory caps blocks per SM, ``max_blocks`` makes warps stride over rows) or the staged one
    (``stages`` bulk-copied row buffers per warp); ``load_hint`` picks the register kernel's load cache
    path (0 __ldg, 1 .cg, 2 .cs, 3 L1::no_allocate)."""
    mod = _EXT.module or _EXT.load()
    d = x.shape[-1]
    factor = triton_rmsnorm._mean_factor(x.numel() // d, d) if flavour == "diffusers" else 0.0
    return mod.rmsnorm(x, weight, eps, flavour, factor, warps_per_block, smem_bytes, max_blocks, stages, load_hint)


def exactness() -> list[dict]:
    rows_out = []
    g = torch.Generator(device="cuda").manual_seed(0)
    for flavour in ("torch", "diffusers"):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            for d in (256, 1000, 2048, 3072, 4096, 4608, 5120, 6144):
                for m in (16, 17, 4099) if flavour == "diffusers" else (1, 3, 17, 4099):
                    if d % (16 // torch.empty((), dtype=dtype).element_size()):
                        continue
                    x = (torch.randn(m, d, device="cuda", generator=g) * 3).to(dtype)
                    for has_w in (True, False):
                        w = (1 + 0.5 * torch.randn(d, device="cuda", generator=g)).to(dtype) if has_w else None
                        if cuda_supports(x, w, EPS, flavour) is not None:
                            continue
                        ref = reference(x, w, EPS, flavour)
                        for kw in ({"warps_per_block": 1}, {"warps_per_block": 4}, {"warps_per_block": 8},
                                   {"warps_per_block": 2, "stages": 2}, {"warps_per_block": 1, "stages": 3,
                                                                         "max_blocks": 5}):
                            got = cuda_rmsnorm(x, w, EPS, flavour, **kw)
                            bad = int((got != ref).sum())
                            rows_out.append(dict(flavour=flavour, dtype=str(dtype)[6:], d=d, m=m, w=has_w,
                                                 **kw, mismatches=bad))
    return rows_out


def _smem_for(blocks_per_sm: int) -> int:
    """Dynamic shared memory that leaves room for only ``blocks_per_sm`` blocks on an SM."""
    props = torch.cuda.get_device_properties(0)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", 233472)
    return max(0, (per_sm // blocks_per_sm - 1024 - 127) // 128 * 128)


def speed() -> dict[str, float]:
    shape = (1, 32640, 4096)
    x0 = torch.randn(shape, device="cuda").to(torch.bfloat16)
    n = rotations(2 * x0.numel() * 2)
    xs = [torch.randn(shape, device="cuda").to(torch.bfloat16) for _ in range(n)]
    outs = [torch.empty_like(x) for x in xs]
    w = (1 + 0.5 * torch.randn(shape[-1], device="cuda")).to(torch.bfloat16)
    sets = [(x,) for x in xs]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res: dict[str, float] = {}

    def t(fn, arg_sets=sets) -> float:
        return time_rotated(fn, arg_sets, reps=100)

    res["copy_"] = t(lambda o, x: o.copy_(x), list(zip(outs, xs, strict=True)))
    ref = F.rms_norm(xs[0], (shape[-1],), w, EPS)
    compiled = torch.compile(lambda x: F.rms_norm(x, (shape[-1],), w, EPS))
    compiled(xs[0])
    res["torch eager"] = t(lambda x: F.rms_norm(x, (shape[-1],), w, EPS))
    res["torch compile"] = t(compiled)
    # "triton": the production kernel as it was measured against these schedules (1 row, 4 warps);
    # "triton tuned": its default since (2 rows, 8 warps at D=4096 bf16).
    res["torch triton"] = t(lambda x: triton_rmsnorm.rmsnorm(x, w, EPS, "torch", rows_per_program=1, num_warps=4))
    res["torch triton tuned"] = t(lambda x: triton_rmsnorm.rmsnorm(x, w, EPS, "torch"))
    configs: list[tuple[str, dict]] = [(f"warps={wp}", {"warps_per_block": wp}) for wp in (1, 2, 4, 8)]
    # Residency capped by unused shared memory, and warps striding over rows: how much in-flight data
    # the register kernel needs.
    for wp, caps in ((1, (4, 6, 8, 10, 12, 16)), (2, (2, 3, 4, 6)), (4, (2, 3))):
        configs += [(f"warps={wp} {nb} blocks/SM", {"warps_per_block": wp, "smem_bytes": _smem_for(nb)}) for nb in caps]
    configs += [(f"warps=1 persistent {nb}/SM", {"warps_per_block": 1, "max_blocks": sms * nb}) for nb in (4, 8, 16)]
    configs += [(f"warps=4 persistent {nb}/SM", {"warps_per_block": 4, "max_blocks": sms * nb}) for nb in (1, 2, 4)]
    for wp, st, nb in ((1, 4, 6), (1, 8, 3), (1, 3, 8), (1, 2, 12), (2, 3, 4), (2, 4, 3), (2, 6, 2), (2, 2, 6),
                       (4, 3, 2), (4, 6, 1), (4, 2, 3), (8, 3, 1), (4, 4, 1), (2, 2, 4), (4, 2, 2), (1, 4, 5)):
        configs.append((f"staged warps={wp} stages={st} {nb} blocks/SM",
                        {"warps_per_block": wp, "stages": st, "max_blocks": sms * nb}))
    configs.append(("staged warps=4 stages=2 not persistent", {"warps_per_block": 4, "stages": 2}))
    configs.append(("staged warps=1 stages=2 not persistent", {"warps_per_block": 1, "stages": 2}))
    for name, kw in configs:
        try:
            ok = torch.equal(cuda_rmsnorm(xs[0], w, EPS, "torch", **kw), ref)
            res[f"torch cuda {name}" + ("" if ok else " NOT EXACT")] = t(
                lambda x, kw=kw: cuda_rmsnorm(x, w, EPS, "torch", **kw))
        except RuntimeError as exc:
            print(f"torch cuda {name}: {exc}", flush=True)
    best = min((k for k in res if k.startswith("torch cuda") and "NOT" not in k), key=res.__getitem__)
    best_kw = dict(configs)[best.removeprefix("torch cuda ")]
    for round_ in range(2):  # interleaved re-timing of the contenders: clocks drift
        for name, fn in (("torch compile", compiled),
                         ("torch triton", lambda x: triton_rmsnorm.rmsnorm(x, w, EPS, "torch", rows_per_program=1,
                                                                           num_warps=4)),
                         (best, lambda x: cuda_rmsnorm(x, w, EPS, "torch", **best_kw))):
            res[f"{name} (round {round_ + 2})"] = t(fn)
    dref = lambda x: reference(x, w, EPS, "diffusers")  # noqa: E731
    dcomp = torch.compile(dref)
    dcomp(xs[0])
    res["diffusers compile"] = t(dcomp)
    res["diffusers triton"] = t(lambda x: triton_rmsnorm.rmsnorm(x, w, EPS, "diffusers"))
    dbest = ("", float("inf"))
    for name, kw in configs:
        if "stages" not in kw and name != "warps=1":
            continue
        try:
            us = t(lambda x, kw=kw: cuda_rmsnorm(x, w, EPS, "diffusers", **kw))
        except RuntimeError as exc:
            print(f"diffusers cuda {name}: {exc}", flush=True)
            continue
        res[f"diffusers cuda {name}"] = us
        if us < dbest[1]:
            dbest = (name, us)
    dkw = dict(configs)[dbest[0]]
    ok = torch.equal(cuda_rmsnorm(xs[0], w, EPS, "diffusers", **dkw), dref(xs[0]))
    for round_ in range(2):
        res[f"diffusers compile (round {round_ + 2})"] = t(dcomp)
        res[f"diffusers triton (round {round_ + 2})"] = t(lambda x: triton_rmsnorm.rmsnorm(x, w, EPS, "diffusers"))
        res[f"diffusers cuda {dbest[0]}{'' if ok else ' NOT EXACT'} (round {round_ + 2})"] = t(
            lambda x: cuda_rmsnorm(x, w, EPS, "diffusers", **dkw))
    return res


def _bar_inputs() -> tuple[tuple[int, int, int], list, torch.Tensor, list, list]:
    """[1, 32640, 4096] bf16 inputs rotated past L2, a weight, the timing arg sets and outputs for copy_."""
    shape = (1, 32640, 4096)
    xs = [torch.randn(shape, device="cuda").to(torch.bfloat16) for _ in range(rotations(2 * 32640 * 4096 * 2))]
    w = (1 + 0.5 * torch.randn(shape[-1], device="cuda")).to(torch.bfloat16)
    return shape, xs, w, [(x,) for x in xs], [torch.empty_like(x) for x in xs]


def hints() -> dict[str, float]:
    """Cache paths for the row loads: the Triton kernel's ``stream`` modes and the CUDA register
    kernel's ``load_hint``, torch and diffusers flavours, three interleaved rounds."""
    shape, xs, w, sets, outs = _bar_inputs()
    num = triton_rmsnorm.CUDA_NUMERICS
    res: dict[str, float] = {}
    cands: dict[str, object] = {}
    for fl in ("torch", "diffusers"):
        ref_fn = (lambda x: F.rms_norm(x, (shape[-1],), w, EPS)) if fl == "torch" else (
            lambda x: reference(x, w, EPS, "diffusers"))
        comp = torch.compile(ref_fn)
        comp(xs[0])
        cands[f"{fl} compile"] = comp
        for stream in (0, 2, 3):
            for r, nw in ((1, 4), (2, 8)):
                cands[f"{fl} triton stream={stream} R={r} warps={nw}"] = (
                    lambda x, fl=fl, st=stream, r=r, nw=nw: triton_rmsnorm._launch_exact(
                        x, w, None, None, EPS, fl, num, r, nw, None, None, st))
        if fl == "torch":
            for hint in (0, 1, 2, 3):
                cands[f"torch cuda warps=1 load_hint={hint}"] = (
                    lambda x, h=hint: cuda_rmsnorm(x, w, EPS, "torch", warps_per_block=1, load_hint=h))
        ref = ref_fn(xs[0])
        for name, fn in cands.items():
            if name.startswith(fl) and "compile" not in name and not torch.equal(fn(xs[0]), ref):
                print(f"{name}: NOT EXACT", flush=True)
    res["copy_"] = time_rotated(lambda o, x: o.copy_(x), list(zip(outs, xs, strict=True)), reps=100)
    for round_ in range(3):
        for name, fn in cands.items():
            res[f"{name} (round {round_ + 1})"] = time_rotated(fn, sets, reps=100)
    return res


def maxnreg() -> dict[str, float]:
    """The Triton kernels with a register cap (ncu: 48 registers hold the production torch-flavour
    kernel to 10 blocks = 62.5% occupancy), three interleaved rounds against torch.compile."""
    shape, xs, w, sets, outs = _bar_inputs()
    num = triton_rmsnorm.CUDA_NUMERICS
    res: dict[str, float] = {"copy_": time_rotated(lambda o, x: o.copy_(x), list(zip(outs, xs, strict=True)), reps=100)}
    cands: dict[str, tuple] = {}
    refs = {}
    for fl in ("torch", "diffusers"):
        ref_fn = (lambda x: F.rms_norm(x, (shape[-1],), w, EPS)) if fl == "torch" else (
            lambda x: reference(x, w, EPS, "diffusers"))
        comp = torch.compile(ref_fn)
        comp(xs[0])
        refs[fl] = ref_fn(xs[0])
        cands[f"{fl} compile"] = (None, comp)
        for cap in (None, 40, 32):
            for r, nw in ((1, 4), (2, 8)) if fl == "torch" else ((None, None),):  # (1, 4): before the tuning
                cands[f"{fl} triton maxnreg={cap} R={r} warps={nw}"] = (cap, (
                    lambda x, fl=fl, r=r, nw=nw: triton_rmsnorm._launch_exact(
                        x, w, None, None, EPS, fl, num, r, nw, None, None, False)))
    for name, (cap, fn) in cands.items():
        if "triton" in name:
            triton_rmsnorm._MAXNREG = cap
            triton_rmsnorm._LAUNCHES.clear()
            fl = name.split()[0]
            if not torch.equal(fn(xs[0]), refs[fl]):
                print(f"{name}: NOT EXACT", flush=True)
    for round_ in range(3):
        for name, (cap, fn) in cands.items():
            triton_rmsnorm._MAXNREG = cap
            triton_rmsnorm._LAUNCHES.clear()
            fn(xs[0])
            res[f"{name} (round {round_ + 1})"] = time_rotated(fn, sets, reps=100)
    triton_rmsnorm._MAXNREG = None
    triton_rmsnorm._LAUNCHES.clear()
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"))
    p.add_argument("--skip-exact", action="store_true")
    p.add_argument("--hints", action="store_true", help="only the cache-path sweep (hints())")
    p.add_argument("--maxnreg", action="store_true", help="only the register-cap sweep (maxnreg())")
    args = p.parse_args()
    if not args.maxnreg:  # that sweep runs the Triton kernels only
        t0 = time.perf_counter()
        reason = _EXT.available()
        print(f"build: {time.perf_counter() - t0:.1f} s, available: {reason or 'yes'}", flush=True)
        if reason:
            print(_EXT.failure_detail)
            return
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if args.hints or args.maxnreg:
        sp = hints() if args.hints else maxnreg()
        for name, us in sp.items():
            fl = name.split()[0]
            comp = sp.get(f"{fl} compile" + name[name.index(" (round"):] if " (round" in name else "")
            extra = f"  {comp / us:5.3f}x compile" if comp else ""
            print(f"{name:<58} {us:8.1f} us  {sp['copy_'] / us * 100:5.1f}% of copy_{extra}", flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, f"rmsnorm_{'hints' if args.hints else 'maxnreg'}.json").write_text(json.dumps(sp, indent=1))
        return
    if not args.skip_exact:
        ex = exactness()
        bad = [r for r in ex if r["mismatches"]]
        print(f"exactness: {len(ex)} cases, {len(bad)} with mismatches", flush=True)
        for r in bad[:40]:
            print("  MISMATCH", r)
        result["exact"] = ex
    sp = speed()
    result["speed"] = sp
    for name, us in sp.items():
        fl = name.split()[0]
        rnd = name[name.index(" (round"):] if " (round" in name else ""
        comp = sp.get(f"{fl} compile{rnd}")  # the compile timing of the same round
        extra = f"  {comp / us:5.3f}x compile" if comp else ""
        print(f"{name:<34} {us:8.1f} us  {sp['copy_'] / us * 100:5.1f}% of copy_{extra}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "rmsnorm_cuda.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
