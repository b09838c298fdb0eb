"""gated_residual on a GPU: bit-exactness of the Triton and CUDA C++ kernels, then timings.

    PYTHONUNBUFFERED=1 python3 lab/gpu/gated_residual.py [--out DIR] [--budget-s 170]

1. builds the CUDA extension (in a background thread while the Triton checks run);
2. checks that no fp32 multiply-add was contracted into an FMA (Triton PTX, CUDA SASS);
3. exactness: torch.equal and the mismatch count against eager ``x + update * gate`` over the seed
   shapes (001: LTX-2.3 / Ideogram 4 / FLUX.2; 004: LTX-2 block, hidden 4096 and 2048) in every
   gate form and dtype, plus B > 1, [1,1,D], per-token, 5-D, odd D and misaligned inputs;
4. device timings (triton.testing.do_bench, median, input sets rotated over > 60 MB) of eager,
   torch.compile, Triton, CUDA and a ``copy_`` moving the same bytes (read x, update, gate + write
   out); then host-inclusive timings of the small shapes (1000 back-to-back calls, one sync)
   against one eager kernel launch (``torch.add`` of the same shape);
5. small launch-config sweeps for both kernels on the large shapes.

Results go to $OUT/gated_residual.json (or --out), rewritten after every section, so a run cut
short still leaves what it measured.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch._dynamo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import triton
from triton.testing import do_bench

from xbackend.kernels import cuda_gated_residual as cuda_gr
from xbackend.kernels import triton_gated_residual as triton_gr

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ROTATE_BYTES = 256 * 2**20  # rotate input sets over this many bytes (H200 L2: 60 MB)

# Seed 001 (names as in its benchmark) and seed 004 (LTX-2 block, hidden 4096 / 2048).
SEED_SHAPES = {
    "ltx2_s32640_c4096": (1, 32640, 4096),
    "ltx2_s8160_c4096": (1, 8160, 4096),
    "ideogram4_s4096_c4608": (1, 4096, 4608),
    "flux2_s4608_c3072": (1, 4608, 3072),
    "flux2_s4096_c3072": (1, 4096, 3072),
    "flux2_s512_c3072": (1, 512, 3072),
    "ltx2_s126_c2048": (1, 126, 2048),
    "ltx2_audio_s8160_c2048": (1, 8160, 2048),
    "ltx2_audio_s32640_c2048": (1, 32640, 2048),
}
EXTRA_CASES = {
    "b2_bcast_s4080_c4096": ((2, 4080, 4096), (2, 1, 4096)),
    "b4_ones_s126_c2048": ((4, 126, 2048), (1, 1, 2048)),
    "b2_token_s4080_c3072": ((2, 4080, 3072), (2, 4080, 1)),
    "odd_bcast_c1001": ((3, 77, 1001), (3, 1, 1001)),
    "odd_full_c1001": ((3, 77, 1001), (3, 77, 1001)),
    "odd_token_c1001": ((3, 77, 1001), (3, 77, 1)),
    "rows127_bcast_c3072": ((1, 127, 3072), (1, 1, 3072)),
    "diffvae_5d_c512": ((2, 5, 16, 16, 512), (2, 1, 1, 1, 512)),
    "tiny_c5": ((3, 7, 5), (3, 7, 5)),
    "flat_tail_4097": ((4097,), (4097,)),
}
TIMED = [  # (name, shape, gate form)
    ("ltx2_bcast_s32640_c4096", (1, 32640, 4096), "bcast"),
    ("ltx2_full_s8160_c4096", (1, 8160, 4096), "full"),
    ("ideogram4_bcast_s4096_c4608", (1, 4096, 4608), "bcast"),
    ("flux2_bcast_s4608_c3072", (1, 4608, 3072), "bcast"),
    ("flux2_bcast_s4096_c3072", (1, 4096, 3072), "bcast"),
    ("flux2_bcast_s512_c3072", (1, 512, 3072), "bcast"),
    ("ltx2_full_s126_c2048", (1, 126, 2048), "full"),
    ("ltx2_bcast_s8160_c4096", (1, 8160, 4096), "bcast"),
    ("ltx2_token_s32640_c4096", (1, 32640, 4096), "per_token"),
    ("b2_bcast_s4080_c4096", (2, 4080, 4096), "bcast"),
]
SMALL = ["flux2_bcast_s512_c3072", "ltx2_full_s126_c2048"]


def gate_shape(shape: tuple[int, ...], form: str) -> tuple[int, ...]:
    if form == "full":
        return shape
    if form == "bcast":
        return (shape[0], *[1] * (len(shape) - 2), shape[-1])
    return (*shape[:-1], 1)


def eager(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x + update * gate


class Report:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict = {}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def rand(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, device="cuda", generator=gen, dtype=torch.float32).to(dtype)


# ------------------------------------------------------------------------------------- checks


def fma_checks() -> dict:
    """fp32 FMA contraction would break exactness: count FMAs in the generated code."""
    out: dict = {}
    x = torch.randn(64, 1024, device="cuda")
    _, handle = triton_gr._launch(x, x, x[:1], triton_gr._plan(x, x, x[:1], None, None, 4))
    ptx = handle.asm["ptx"]
    out["triton_fp32_ptx_fma"] = len(re.findall(r"\bfma\.rn\.f32", ptx))
    out["triton_fp32_ptx_mul_rn"] = len(re.findall(r"\bmul\.rn\.f32", ptx))
    mod = cuda_gr.EXTENSION.module  # built by the runs above, or None
    cuobjdump = shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    if mod is not None and Path(cuobjdump).exists():
        sass = subprocess.run([cuobjdump, "-sass", mod.__file__], capture_output=True, text=True).stdout
        out["cuda_sass_ffma"] = sass.count("FFMA")
        out["cuda_sass_ldg128"] = sass.count("LDG.E.128")
    return out


def exact_case(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor, kernels: dict) -> dict:
    ref = eager(x, update, gate)
    row: dict = {}
    for name, kernel in kernels.items():
        reason = kernel.supports(x, update, gate)
        if reason is not None:
            row[name] = f"unsupported: {reason}"
            continue
        try:
            got = kernel.gated_residual(x, update, gate)
            row[name] = int((got != ref).sum()) if got.shape == ref.shape else "wrong shape"
        except Exception as exc:  # report, keep checking the rest
            row[name] = f"error: {type(exc).__name__}: {str(exc)[:200]}"
    return row


def exactness(kernels: dict, deadline: float) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict] = []
    cases = [(n, s, gate_shape(s, f), f) for n, s in SEED_SHAPES.items() for f in ("bcast", "full", "per_token")]
    cases += [(n, s, g, "extra") for n, (s, g) in EXTRA_CASES.items()]
    for (name, shape, gshape, form), (dname, dtype) in itertools.product(cases, DTYPES.items()):
        if time.monotonic() > deadline:
            rows.append({"case": "stopped: time budget"})
            break
        x, update, gate = rand(shape, dtype, gen), rand(shape, dtype, gen), rand(gshape, dtype, gen)
        rows.append({"case": name, "form": form, "dtype": dname, "shape": shape, "gate": gshape,
                     **exact_case(x, update, gate, kernels)})
        del x, update, gate
    # Misaligned (storage offset 1 element) and a gate sliced from a [B, 6, D] modulation tensor.
    for dname, dtype in DTYPES.items():
        n = 2 * 300 * 1024
        x, update = (rand((n + 1,), dtype, gen)[1:].view(2, 300, 1024) for _ in range(2))
        gate = rand((2 * 1024 + 1,), dtype, gen)[1:].view(2, 1, 1024)
        rows.append({"case": "misaligned", "form": "bcast", "dtype": dname, **exact_case(x, update, gate, kernels)})
        gate = rand((2, 6, 1024), dtype, gen)[:, 4:5]
        rows.append({"case": "chunked_gate", "form": "bcast", "dtype": dname, **exact_case(x, update, gate, kernels)})
    return rows


# ------------------------------------------------------------------------------------- timing


def input_sets(shape, gshape, dtype, gen, min_bytes: int = ROTATE_BYTES) -> list[tuple[torch.Tensor, ...]]:
    elem = torch.empty((), dtype=dtype).element_size()
    per_set = (2 * math.prod(shape) + math.prod(gshape)) * elem
    count = max(2, min(64, math.ceil(min_bytes / per_set)))
    return [(rand(shape, dtype, gen), rand(shape, dtype, gen), rand(gshape, dtype, gen)) for _ in range(count)]


def rotating(fn: Callable, sets: list[tuple]) -> Callable[[], object]:
    it = itertools.cycle(sets)
    return lambda: fn(*next(it))


def bench(fn: Callable, sets: list[tuple]) -> float:
    """Median device time in µs."""
    return do_bench(rotating(fn, sets), warmup=25, rep=150, return_mode="median") * 1e3


def host_inclusive(fn: Callable, sets: list[tuple], calls: int = 1000) -> float:
    """Wall time per call in µs for back-to-back calls (host overhead and device time overlap)."""
    seq = [sets[i % len(sets)] for i in range(calls)]
    for args in seq[:100]:
        fn(*args)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for args in seq:
        fn(*args)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def timings(deadline: float, compiled: Callable) -> tuple[list[dict], list[dict]]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    dtype = torch.bfloat16
    table: list[dict] = []
    small: list[dict] = []
    for name, shape, form in TIMED:
        if time.monotonic() > deadline:
            table.append({"workload": name, "note": "stopped: time budget"})
            break
        gshape = gate_shape(shape, form)
        sets = input_sets(shape, gshape, dtype, gen)
        nbytes = (2 * math.prod(shape) + math.prod(gshape) + math.prod(shape)) * 2
        copy_numel = nbytes // 4  # copy_ reads and writes this many bf16 elements: nbytes in all
        copy_sets = [(torch.empty(copy_numel, device="cuda", dtype=dtype), rand((copy_numel,), dtype, gen))
                     for _ in range(max(2, math.ceil(ROTATE_BYTES / nbytes)))]
        compiled(*sets[0])
        row = {"workload": name, "shape": shape, "gate": gshape, "bytes": nbytes,
               "compile_exact": bool(torch.equal(compiled(*sets[0]), eager(*sets[0])))}
        row["eager_us"] = bench(eager, sets)
        row["compile_us"] = bench(compiled, sets)
        row["triton_us"] = bench(triton_gr.gated_residual, sets)
        row["cuda_us"] = bench(cuda_gr.gated_residual, sets)
        row["copy_us"] = bench(lambda dst, src: dst.copy_(src), copy_sets)
        for key in ("eager", "compile", "triton", "cuda", "copy"):
            us = row[f"{key}_us"]
            row[f"{key}_tbs"] = nbytes / us / 1e6
            row[f"{key}_pct_copy"] = 100 * row["copy_us"] / us
        table.append(row)
        print(fmt_row(row), flush=True)
        if name in SMALL:
            xs = [(s[0], s[1]) for s in sets]
            entry = {"workload": name,
                     "torch_add_host_us": host_inclusive(torch.add, xs),
                     "eager_expr_host_us": host_inclusive(eager, sets),
                     "triton_host_us": host_inclusive(triton_gr.gated_residual, sets),
                     "cuda_host_us": host_inclusive(cuda_gr.gated_residual, sets)}
            entry["cuda_vs_one_launch"] = entry["cuda_host_us"] / entry["torch_add_host_us"]
            entry["triton_vs_one_launch"] = entry["triton_host_us"] / entry["torch_add_host_us"]
            small.append(entry)
        del sets, copy_sets
        torch.cuda.empty_cache()
    return table, small


def sweeps(deadline: float) -> list[dict]:
    gen = torch.Generator(device="cuda").manual_seed(2)
    out: list[dict] = []
    for name, shape, form in TIMED[:5] + TIMED[8:9]:
        gshape = gate_shape(shape, form)
        sets = input_sets(shape, gshape, torch.bfloat16, gen)
        for rpt in (1, 2, 4, 8):
            if time.monotonic() > deadline:
                return out
            fn = lambda x, u, g, r=rpt: cuda_gr.gated_residual(x, u, g, rows_per_thread=r)  # noqa: E731
            out.append({"workload": name, "kernel": "cuda", "rows_per_thread": rpt, "us": bench(fn, sets)})
        for bd, br, nw in [(1024, 4, 4), (1024, 2, 4), (1024, 4, 8), (2048, 2, 8), (2048, 1, 4), (4096, 1, 8),
                           (1024, 1, 4), (512, 4, 4)]:
            if time.monotonic() > deadline:
                return out
            fn = lambda x, u, g, c=(bd, br, nw): triton_gr.gated_residual(  # noqa: E731
                x, u, g, block_d=c[0], block_rows=c[1], num_warps=c[2])
            out.append({"workload": name, "kernel": "triton", "block_d": bd, "block_rows": br, "num_warps": nw,
                        "us": bench(fn, sets)})
        del sets
        torch.cuda.empty_cache()
    return out


def fmt_row(row: dict) -> str:
    if "eager_us" not in row:
        return f"{row['workload']:<28} {row.get('note', '')}"
    cells = [f"{row['workload']:<28}"]
    for key in ("eager", "compile", "triton", "cuda", "copy"):
        cells.append(f"{row[f'{key}_us']:8.1f}")
    cells.append(f"{row['triton_tbs']:5.2f} {row['cuda_tbs']:5.2f} {row['copy_tbs']:5.2f}")
    cells.append(f"{row['triton_pct_copy']:6.1f}% {row['cuda_pct_copy']:6.1f}%")
    return " ".join(cells)


HEADER = (f"{'workload (bf16)':<28} {'eager':>8} {'compile':>8} {'triton':>8} {'cuda':>8} {'copy':>8}"
          "  TB/s: tri  cuda  copy   %copy: tri    cuda")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "out"))
    parser.add_argument("--budget-s", type=float, default=170.0)
    parser.add_argument("--skip-timing", action="store_true")
    args = parser.parse_args()
    start = time.monotonic()
    deadline = start + args.budget_s
    report = Report(Path(args.out) / "gated_residual.json")
    props = torch.cuda.get_device_properties(0)
    report.data["env"] = {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
                          "triton": triton.__version__, "cuda": torch.version.cuda}
    print(report.data["env"], flush=True)

    build: dict = {}

    def build_cuda() -> None:
        t0 = time.monotonic()
        build["reason"] = cuda_gr.available()
        build["seconds"] = time.monotonic() - t0
        if build["reason"] is not None:
            build["log_tail"] = (cuda_gr.build_log() or "")[-4000:]

    builder = threading.Thread(target=build_cuda)
    builder.start()
    t0 = time.monotonic()
    triton_rows = exactness({"triton": triton_gr}, deadline)
    report.data["exact_triton_seconds"] = time.monotonic() - t0
    builder.join()
    report.data["cuda_build"] = build
    print("cuda build:", build, flush=True)
    cuda_rows = exactness({"cuda": cuda_gr}, deadline) if build["reason"] is None else []
    merged = []
    for i, row in enumerate(triton_rows):
        merged.append({**row, **({"cuda": cuda_rows[i].get("cuda")} if i < len(cuda_rows) else {})})
    report.data["exactness"] = merged
    report.data["fma"] = fma_checks()
    report.save()
    bad = [r for r in merged if r.get("triton") != 0 or r.get("cuda") != 0]
    print(f"exactness: {len(merged)} cases, {len(bad)} with a mismatch or error", flush=True)
    for r in bad[:20]:
        print("  ", r, flush=True)
    print("fma:", report.data["fma"], flush=True)
    if args.skip_timing or build["reason"] is not None:
        return

    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    compiled = torch.compile(eager, dynamic=False)
    print(HEADER, flush=True)
    table, small = timings(deadline - 25, compiled)
    report.data["timing_bf16"] = table
    report.data["host_inclusive_small"] = small
    report.save()
    report.data["sweeps"] = sweeps(deadline)
    report.save()

    print("\nsweeps (µs):")
    for r in report.data["sweeps"]:
        cfg = {k: v for k, v in r.items() if k not in ("workload", "us")}
        print(f"  {r['workload']:<28} {cfg} {r['us']:.1f}")
    print("\nhost-inclusive small shapes (µs per call, 1000 calls):")
    for r in small:
        print(f"  {r['workload']:<26} torch.add {r['torch_add_host_us']:.2f}  eager expr {r['eager_expr_host_us']:.2f}"
              f"  triton {r['triton_host_us']:.2f}  cuda {r['cuda_host_us']:.2f}"
              f"  cuda/add {r['cuda_vs_one_launch']:.2f}x")
    print("\n" + HEADER)
    for row in table:
        print(fmt_row(row))
    print(f"total {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
