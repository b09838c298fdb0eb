#!/usr/bin/env python3
"""Liger-Kernel's impls against xbackend's: precision classification and device-time benchmark.

    python bench_liger.py --classify [--json PATH]   # per impl x dtype: exact, or max ulp; the tier it admits
    python bench_liger.py [--json PATH]              # µs, TB/s, % of copy_, x vs eager and torch.compile
    python bench_liger.py --dry-run [--classify]     # tiny shapes, any device (CPU: the Triton interpreter)

``--classify`` runs every liger impl directly on a catalogue of shapes (DiT shapes on a GPU) against
the op's reference, for bf16, fp16 and fp32, and reports per case and per impl x dtype: bit-exact or
not, the largest ulp distance, how many elements differ and by more than one ulp, the relative
Frobenius error, whether the registered contract holds, and the quality tier the measurement admits
("lossless": exact; "high": <= 1 ulp; else "fast"). On CPU the interpreter truncates fp32 -> bf16 and
computes bf16 arithmetic on raw bits: only fp16/fp32 there say anything about rounding.

The benchmark times, interleaved in one run (``xbackend.bench``'s harness: rotated inputs past L2,
medians of CUDA events): ``copy_`` of the same bytes, eager (the op's reference), ``torch.compile``
of it, xbackend's default dispatch (lossless) and each eligible builtin impl forced (quality
"fast"), liger's impl as registered, and for RoPE liger's in-place kernel alone (no copy: not a
conformant call, the floor the wrapper adds its copy to).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the plugin, installed or not

from xbackend_liger import impl, interpreter, plugin

import xbackend
from xbackend._precision import compare, ulp_distance
from xbackend.ops import OPS

BF16, F16, F32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = (BF16, F16, F32)
OPS_COVERED = ("rmsnorm", "rmsnorm_modulate", "rotary_embedding", "qk_norm_rope")
IMPLS = {(i.op, i.name): i for i in plugin.IMPLS}
Make = Callable[[torch.device, torch.dtype, torch.Generator], tuple[Any, ...]]


@dataclass(frozen=True)
class Shape:
    """One input of the catalogue: the liger impl it is for and how to build its arguments."""

    op: str
    impl: str
    name: str
    make: Make
    bytes_moved: int = 0  # fewest bytes a kernel must read + write (bf16 x; for the bench)


def _r(shape: tuple[int, ...], dev: torch.device, dt: torch.dtype, g: torch.Generator, scale: float = 1.0,
       offset: float = 0.0) -> torch.Tensor:  # fmt: skip
    return (torch.randn(shape, generator=g, device=dev, dtype=F32) * scale + offset).to(dt)


def _freqs(shape: tuple[int, ...], dev: torch.device, g: torch.Generator, dt: torch.dtype = F32) -> tuple[torch.Tensor, torch.Tensor]:
    angle = torch.rand(shape, generator=g, device=dev, dtype=F32) * 6.3
    return angle.cos().to(dt), angle.sin().to(dt)


# -- the catalogue -------------------------------------------------------------------------------
def rmsnorm_shape(rows: int, d: int, flavour: str, weight: bool = True, batch: int = 1) -> Shape:
    name = "liger" if flavour == "torch" else "liger_diffusers"

    def make(dev: torch.device, dt: torch.dtype, g: torch.Generator) -> tuple[Any, ...]:
        w = _r((d,), dev, dt, g, 0.3, 1.0) if weight else None
        return (_r((batch, rows, d), dev, dt, g), w, 1e-6, flavour)

    return Shape("rmsnorm", name, f"rmsnorm {flavour} [{batch},{rows},{d}]{'' if weight else ' no weight'}", make,
                 bytes_moved=2 * batch * rows * d * 2 + (d * 2 if weight else 0))  # fmt: skip


def modulate_shape(shape: tuple[int, ...], mod: tuple[int, ...], flavour: str, weight: bool) -> Shape:
    d = shape[-1]

    def make(dev: torch.device, dt: torch.dtype, g: torch.Generator) -> tuple[Any, ...]:
        return (_r(shape, dev, dt, g), _r(mod, dev, dt, g, 0.1), _r(mod, dev, dt, g, 0.1),
                _r((d,), dev, dt, g, 0.3, 1.0) if weight else None, 1e-6, flavour)  # fmt: skip

    n, m = math.prod(shape), math.prod(mod)
    return Shape("rmsnorm_modulate", "liger", f"modulate {flavour} {list(shape)} mod{list(mod)}{' w' if weight else ''}",
                 make, bytes_moved=(2 * n + 2 * m + (d if weight else 0)) * 2)  # fmt: skip


def rope_head_split(rows: int, heads: int, head_dim: int, freq_dtype: torch.dtype = F32) -> Shape:
    """LTX-2.3: x [1, T, H*D] against cos/sin [1, H, T, D/2]."""
    d, half = heads * head_dim, head_dim // 2

    def make(dev: torch.device, dt: torch.dtype, g: torch.Generator) -> tuple[Any, ...]:
        cos, sin = _freqs((1, heads, rows, half), dev, g, freq_dtype)
        return (_r((1, rows, d), dev, dt, g), cos, sin, "split")

    fb = torch.finfo(freq_dtype).bits // 8
    return Shape("rotary_embedding", "liger", f"rope split [1,{rows},{d}] h{heads} {_dt(freq_dtype)} freqs", make,
                 bytes_moved=rows * d * (2 * 2 + fb))  # fmt: skip


def rope_heads_first(heads: int, rows: int, head_dim: int) -> Shape:
    """HF layout: x [1, H, T, D] against cos/sin [1, 1, T, D/2] (shared by the heads)."""
    half = head_dim // 2

    def make(dev: torch.device, dt: torch.dtype, g: torch.Generator) -> tuple[Any, ...]:
        cos, sin = _freqs((1, 1, rows, half), dev, g)
        return (_r((1, heads, rows, head_dim), dev, dt, g), cos, sin, "split")

    return Shape("rotary_embedding", "liger", f"rope split [1,{heads},{rows},{head_dim}] freqs [1,1,T,D/2]", make,
                 bytes_moved=heads * rows * head_dim * 2 * 2 + 2 * rows * half * 4)  # fmt: skip


def qk_shape(rows: int, heads: int, head_dim: int, flavour: str) -> Shape:
    d, half = heads * head_dim, head_dim // 2

    def make(dev: torch.device, dt: torch.dtype, g: torch.Generator) -> tuple[Any, ...]:
        cos, sin = _freqs((1, heads, rows, half), dev, g)
        w1, w2 = _r((d,), dev, dt, g, 0.3, 1.0), _r((d,), dev, dt, g, 0.3, 1.0)
        return (_r((1, rows, d), dev, dt, g), _r((1, rows, d), dev, dt, g), w1, w2, cos, sin, 1e-6, flavour, "split")

    return Shape("qk_norm_rope", "liger", f"q/k norm+rope {flavour} split [1,{rows},{d}] h{heads}", make,
                 bytes_moved=rows * d * (4 * 2 + 4) + 2 * d * 2)  # fmt: skip


def catalogue(small: bool) -> list[Shape]:
    """DiT shapes (LTX-2 video [1, 32640, 4096], FLUX-class [1, 4096, 3072]) or, ``small``, a few
    hundred rows of the same layouts for the interpreter."""
    if small:
        return [
            *(rmsnorm_shape(64, 256, f) for f in ("torch", "diffusers")),
            rmsnorm_shape(33, 1000, "torch", weight=False, batch=2),
            modulate_shape((2, 64, 256), (2, 1, 256), "torch", False),
            modulate_shape((1, 64, 256), (1, 1, 256), "diffusers", True),
            rope_head_split(32, 2, 64),
            rope_heads_first(2, 32, 64),
            qk_shape(32, 2, 64, "torch"),
            qk_shape(32, 2, 64, "diffusers"),
        ]
    return [
        rmsnorm_shape(4096, 3072, "torch"), rmsnorm_shape(32640, 4096, "torch"),
        rmsnorm_shape(4096, 3072, "diffusers"), rmsnorm_shape(32640, 4096, "diffusers"),
        rmsnorm_shape(4096, 3072, "torch", weight=False), rmsnorm_shape(4096, 3072, "diffusers", weight=False),
        rmsnorm_shape(77, 4096, "torch", batch=4), rmsnorm_shape(1024, 1000, "diffusers", batch=2),
        modulate_shape((1, 32640, 4096), (1, 1, 4096), "torch", False),
        modulate_shape((1, 32640, 4096), (1, 1, 4096), "diffusers", False),
        modulate_shape((1, 4096, 3072), (1, 1, 3072), "torch", True),
        modulate_shape((2, 4096, 3072), (2, 1, 3072), "diffusers", True),
        modulate_shape((1, 16, 48, 80, 512), (1, 1, 1, 1, 512), "torch", True),
        rope_head_split(32640, 32, 128), rope_head_split(4096, 24, 128), rope_head_split(4096, 24, 128, BF16),
        rope_heads_first(24, 4096, 128),
        qk_shape(32640, 32, 128, "torch"), qk_shape(4096, 24, 128, "torch"), qk_shape(4096, 24, 128, "diffusers"),
    ]  # fmt: skip


def bench_shapes(small: bool) -> list[Shape]:
    if small:
        return [rmsnorm_shape(64, 256, "torch"), rmsnorm_shape(64, 256, "diffusers"),
                modulate_shape((1, 64, 256), (1, 1, 256), "torch", False), rope_head_split(32, 2, 64),
                qk_shape(32, 2, 64, "torch")]  # fmt: skip
    return [
        rmsnorm_shape(32640, 4096, "torch"), rmsnorm_shape(32640, 4096, "diffusers"),
        rmsnorm_shape(4096, 3072, "torch"), rmsnorm_shape(4096, 3072, "diffusers"),
        modulate_shape((1, 32640, 4096), (1, 1, 4096), "diffusers", False),
        modulate_shape((1, 32640, 4096), (1, 1, 4096), "torch", False),
        modulate_shape((1, 4096, 3072), (1, 1, 3072), "torch", True),
        rope_head_split(32640, 32, 128), rope_heads_first(24, 4096, 128),
        qk_shape(32640, 32, 128, "torch"), qk_shape(4096, 24, 128, "torch"),
    ]  # fmt: skip


# -- comparison ----------------------------------------------------------------------------------
def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _outputs(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def measure(out: Any, ref: Any) -> dict[str, Any]:
    """Bits, ulp and relative Frobenius distance of ``out`` from ``ref`` (several outputs: the worst)."""
    worst, n_diff, n_gt1, numel, rel, specials = 0, 0, 0, 0, 0.0, True
    for o, r in zip(_outputs(out), _outputs(ref), strict=True):
        numel += r.numel()
        if r.numel() == 0:
            continue
        o, r = o.contiguous(), r.contiguous()
        same = o.view(_int_view(o.dtype)) == r.view(_int_view(r.dtype))
        same |= o.isnan() & r.isnan()
        n_diff += int((~same).sum())
        specials &= bool((o.isnan() == r.isnan()).all() and (o.isinf() == r.isinf()).all())
        finite = o.isfinite() & r.isfinite()
        dist = ulp_distance(o[finite], r[finite]) if bool(finite.any()) else torch.zeros(1, dtype=torch.int64)
        worst = max(worst, int(dist.max()) if dist.numel() else 0)
        n_gt1 += int((dist > 1).sum())
        o32, r32 = o[finite].float(), r[finite].float()
        denom = float(r32.norm())
        rel = max(rel, float((o32 - r32).norm()) / (denom if denom > 0 else 1.0))
    return {"exact": n_diff == 0, "max_ulp": worst, "differ": n_diff, "over_1_ulp": n_gt1, "numel": numel,
            "frac_differ": n_diff / max(1, numel), "rel_fro": rel, "specials_match": specials}  # fmt: skip


def _int_view(dtype: torch.dtype) -> torch.dtype:
    return {BF16: torch.int16, F16: torch.int16, F32: torch.int32}[dtype]


def tier_of(exact: bool, max_ulp: int) -> str:
    return "lossless" if exact else ("high" if max_ulp <= 1 else "fast")


def suggested_contract(exact: bool, max_ulp: int, rel_fro: float) -> str:
    """The tightest contract the measurement supports: exact, ulp(n) for a few ulp, else a relative
    Frobenius bound with a factor of two of headroom."""
    if exact:
        return "exact"
    if max_ulp <= 4:
        return f"ulp({max_ulp})"
    bound = next((b for b in (1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2) if 2 * rel_fro <= b), 2 * rel_fro)
    return f"tolerance({bound:g})"


# -- --classify ----------------------------------------------------------------------------------
def classify(device: torch.device, small: bool, ops: list[str], log: Callable[[str], None],
             write: Callable[[dict[str, Any]], None]) -> dict[str, Any]:  # fmt: skip
    cpu = device.type == "cpu"
    results: list[dict[str, Any]] = []
    report: dict[str, Any] = {"env": environment(device), "kind": "classify", "results": results, "summary": []}
    log(f"{'impl':<28} {'dtype':<8} {'case':<52} {'exact':>5} {'max ulp':>7} {'differ':>8} {'>1ulp':>7} "
        f"{'rel_fro':>9}  contract")  # fmt: skip
    for shape in (s for s in catalogue(small) if s.op in ops):
        i = IMPLS[(shape.op, shape.impl)]
        spec = OPS[shape.op]
        for dtype in DTYPES:
            g = torch.Generator(device=device).manual_seed(zlib.crc32(shape.name.encode()))
            args = spec.bind(*shape.make(device, dtype, g))
            spec.check(*args)
            label = f"{shape.op}:{shape.impl}"
            row: dict[str, Any] = {"impl": label, "dtype": _dt(dtype), "case": shape.name,
                                   "registered_dtype": dtype in i.dtypes, "contract": str(i.precision)}  # fmt: skip
            reason = i.resolved("supports")(*args)
            if reason is not None and dtype in i.dtypes:
                row["unsupported"] = reason
                results.append(row)
                log(f"{label:<28} {_dt(dtype):<8} {shape.name:<52} unsupported: {reason}")
                continue
            try:
                out = i.resolved("fn")(*args)
                ref = spec.reference(*args)
            except Exception as e:  # a failure is a result too
                row["error"] = f"{type(e).__name__}: {e}"
                results.append(row)
                log(f"{label:<28} {_dt(dtype):<8} {shape.name:<52} ERROR {row['error']}")
                continue
            if device.type == "cuda":
                torch.cuda.synchronize()
            m = measure(out, ref)
            problem = compare(out, ref, i.precision)
            row.update(m, meets_contract=problem is None, contract_problem=problem)
            if cpu:
                row["note"] = "CPU interpreter" + (": bf16 is not evidence" if dtype == BF16 else "")
            results.append(row)
            flag = "" if row["registered_dtype"] else " (dtype not registered)"
            log(f"{label:<28} {_dt(dtype):<8} {shape.name:<52} {'yes' if m['exact'] else 'no':>5} {m['max_ulp']:>7} "
                f"{m['differ']:>8} {m['over_1_ulp']:>7} {m['rel_fro']:>9.2e}  {i.precision}: "
                f"{'holds' if problem is None else 'FAILS'}{flag}")  # fmt: skip
            del out, ref, args
            write(report)
    report["summary"] = summarize(results)
    log("")
    log(f"{'impl':<28} {'dtype':<8} {'cases':>5} {'exact':>5} {'max ulp':>7} {'max rel_fro':>11}  {'admits':<8} "
        f"{'registered':<24} {'holds':>5}  suggested")  # fmt: skip
    for s in report["summary"]:
        reg = s["contract"] if s["registered_dtype"] else "(dtype not registered)"
        log(f"{s['impl']:<28} {s['dtype']:<8} {s['cases']:>5} {'yes' if s['exact'] else 'no':>5} {s['max_ulp']:>7} "
            f"{s['max_rel_fro']:>11.2e}  {s['tier']:<8} {reg:<24} {'yes' if s['holds'] else 'NO':>5}  "
            f"{s['suggested']}{'  [CPU interpreter]' if cpu else ''}")  # fmt: skip
    write(report)
    return report


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        if "max_ulp" in r:
            groups.setdefault((r["impl"], r["dtype"]), []).append(r)
    out = []
    for (name, dtype), rows in groups.items():
        exact = all(r["exact"] for r in rows)
        worst = max(r["max_ulp"] for r in rows)
        rel = max(r["rel_fro"] for r in rows)
        out.append({"impl": name, "dtype": dtype, "cases": len(rows), "exact": exact, "max_ulp": worst,
                    "max_rel_fro": rel, "tier": tier_of(exact, worst), "contract": rows[0]["contract"],
                    "registered_dtype": rows[0]["registered_dtype"], "holds": all(r["meets_contract"] for r in rows),
                    "suggested": suggested_contract(exact, worst, rel)})  # fmt: skip
    return out


# -- the benchmark -------------------------------------------------------------------------------
def _raw_rope(args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...]] | None:
    """liger's in-place rope kernel alone on a prepared buffer (timing only: it rotates the buffer on
    every call), for the split-layout rotary cases."""
    x, cos, sin, _ = args
    if impl._is_head_split(x, cos):
        b, h, t, r = cos.shape
        buf = x.reshape(b, t, h, 2 * r).permute(0, 2, 1, 3).contiguous()
        rows = impl._Rows(b, h * t, 1, 2 * r, cos.float().reshape(b, h * t, r).contiguous(),
                          sin.float().reshape(b, h * t, r).contiguous(), b)  # fmt: skip
    else:
        buf = x.contiguous().clone()
        rows = impl._broadcast_rows(tuple(x.shape[:-1]), cos, sin, x.shape[-1])
    return (lambda q: impl._launch_rope(q, None, rows)), (buf,)


def bench(device: torch.device, small: bool, ops: list[str], reps: int, use_compile: bool,
          log: Callable[[str], None], write: Callable[[dict[str, Any]], None]) -> dict[str, Any]:  # fmt: skip
    from xbackend.bench._harness import Row, copy_fn, format_table, rotations, time_rotated_interleaved

    gpu = device.type == "cuda"
    rows: list[Row] = []
    report: dict[str, Any] = {"env": environment(device), "kind": "bench", "rows": []}
    for shape in (s for s in bench_shapes(small) if s.op in ops):
        try:
            rows += bench_case(shape, device, reps, use_compile, gpu, Row, copy_fn, rotations, time_rotated_interleaved)
        except Exception as e:  # one broken case must not lose the others
            log(f"bench: {shape.name} failed: {type(e).__name__}: {e}")
        report["rows"] = [_row_dict(r, rows) for r in rows]
        write(report)
    head = f"{torch.cuda.get_device_name(device) if gpu else 'CPU (dry run: host µs of one call, not device time)'}"
    log(f"{head} | torch {torch.__version__} | liger-kernel {impl.version()}")
    log(format_table(rows))
    return report


def bench_case(shape: Shape, device: torch.device, reps: int, use_compile: bool, gpu: bool, Row: Any, copy_fn: Any,
               rotations: Any, time_rotated_interleaved: Any) -> list[Any]:  # fmt: skip
    from xbackend._policy import use

    spec, op = OPS[shape.op], xbackend.get_op(shape.op)
    liger = IMPLS[(shape.op, shape.impl)]
    g = torch.Generator(device=device).manual_seed(0)
    first = spec.bind(*shape.make(device, BF16, g))
    n_sets = rotations(shape.bytes_moved) if gpu else 1
    sets = [first] + [spec.bind(*shape.make(device, BF16, g)) for _ in range(n_sets - 1)]
    ref = spec.reference(*first)
    variants: list[tuple[str, Callable[..., Any], list[Any], Any]] = []  # name, fn, arg sets, output

    def add(name: str, fn: Callable[..., Any], arg_sets: list[Any] = sets, out: Any = None) -> None:
        variants.append((name, fn, arg_sets, out))

    if shape.bytes_moved:
        copy, copy_sets = copy_fn(shape.bytes_moved, device) if gpu else _cpu_copy(shape.bytes_moved)
        add("copy_", copy, copy_sets)
    add("eager", spec.reference, out=ref)
    if use_compile:
        compiled = torch.compile(spec.reference, dynamic=False, **({} if gpu else {"backend": "eager"}))
        add("compile", compiled, out=compiled(*first))
    add("xbackend", op, out=op(*first))
    with xbackend.quality("fast"):
        plan = xbackend.plan(shape.op, device, args=first)
    for r in plan.rows:
        if r.reason is None and r.backend not in ("liger", "xbackend"):
            def pinned(*a: Any, _name: str = r.qualname) -> Any:
                with xbackend.quality("fast"), use(**{shape.op: _name}):
                    return op(*a)

            add(f"  {r.qualname}", pinned, out=pinned(*first))
    reason = liger.resolved("supports")(*first)
    if reason is None and impl.available() is None:
        fn = liger.resolved("fn")
        add(f"liger:{liger.name}", fn, out=fn(*first))
        if shape.op == "rotary_embedding":
            raw_sets = [_raw_rope(a) for a in sets]
            add("  liger kernel only (in place)", raw_sets[0][0], [s[1] for s in raw_sets])
    fns = [(fn, arg_sets) for _, fn, arg_sets, _ in variants]
    if gpu:
        times = time_rotated_interleaved(fns, reps=reps)
    else:
        times = [_host_us(fn, arg_sets[0]) for fn, arg_sets in fns]
    out_rows = []
    for (name, _, _, out), us in zip(variants, times, strict=True):
        extra = {}
        if out is not None:
            m = measure(out, ref)
            extra["accuracy"] = "exact" if m["exact"] else f"{m['max_ulp']}ulp"
            extra["rel_fro"] = m["rel_fro"]
        out_rows.append(Row(shape.name, name, us, shape.bytes_moved, 0.0, None, extra))
    return out_rows


def _cpu_copy(bytes_moved: int) -> tuple[Callable[..., Any], list[tuple[Any, ...]]]:
    n = bytes_moved // 2
    return (lambda dst, src: dst.copy_(src)), [(torch.empty(n, dtype=torch.uint8), torch.empty(n, dtype=torch.uint8))]


def _host_us(fn: Callable[..., Any], args: tuple[Any, ...]) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return (time.perf_counter() - t0) * 1e6


def _row_dict(r: Any, rows: list[Any]) -> dict[str, Any]:
    same = {x.variant: x for x in rows if x.case == r.case}
    d = {"case": r.case, "variant": r.variant.strip(), "us": r.us, "bytes_moved": r.bytes_moved, "tbps": r.tbps,
         **r.extra}  # fmt: skip
    if "copy_" in same and r.us:
        d["pct_of_copy"] = 100 * same["copy_"].us / r.us
    for base in ("eager", "compile"):
        if base in same and r.us:
            d[f"x_vs_{base}"] = same[base].us / r.us
    return d


# -- common --------------------------------------------------------------------------------------
def environment(device: torch.device) -> dict[str, Any]:
    import triton

    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": triton.__version__, "liger_kernel": impl.version(),
            "liger_available": impl.available(), "python": platform.python_version(),
            "interpreter": interpreter.interpreting()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classify", action="store_true", help="precision classification instead of timing")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (rewritten after every case)")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on whatever device there is (CPU: interpreter)")
    p.add_argument("--ops", default=",".join(OPS_COVERED), help=f"comma-separated subset of {','.join(OPS_COVERED)}")
    p.add_argument("--reps", type=int, default=30, help="timed reps per variant (GPU)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile variant")
    args = p.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS_COVERED))
    if unknown:
        p.error(f"unknown op(s) {unknown}; liger covers {', '.join(OPS_COVERED)}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.dry_run:
        p.error("no GPU here: the DiT shapes need one (--dry-run runs tiny shapes through the interpreter)")
    reason = impl.available()
    if reason is not None:
        print(f"liger-kernel unavailable: {reason}", flush=True)
        if args.classify:
            return 2

    def log(line: str) -> None:
        print(line, flush=True)

    def write(report: dict[str, Any]) -> None:
        if args.json:
            tmp = f"{args.json}.tmp"
            with open(tmp, "w") as f:
                json.dump(report, f, indent=2, default=str)
            os.replace(tmp, args.json)

    small = args.dry_run
    with interpreter.bridge(), torch.inference_mode():
        if args.classify:
            classify(device, small, ops, log, write)
        else:
            bench(device, small, ops, 3 if small else args.reps, not args.no_compile, log, write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
