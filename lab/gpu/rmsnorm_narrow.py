"""Launch schedules of the exact RMSNorm / RMSNorm + modulate on narrow rows (D 64..2048), four op kinds.

    python3 lab/gpu/rmsnorm_narrow.py [--out $OUT] [--budget-s 200] [--jobs 12] [--d 64,256] [--kinds modulate-torch]
    python3 lab/gpu/rmsnorm_narrow.py --dry-run                       # the grid only (any machine)
    TRITON_INTERPRET=1 python3 lab/gpu/rmsnorm_narrow.py --interpret  # tiny shapes on CPU, fake timer

Cases (bf16, weight [D], modulation [1, .., 1, D]): [2^26 / D, D] rows (256 MB moved) for every D, the
DiffVAE's 5-D activations [1, 40, 96, 96, 256], [1, 20, 48, 48, 512], [1, 16, 48, 80, 512] and its
per-head norms [1, 40, 96, 96, 4, 64]; op kinds rmsnorm-torch, rmsnorm-diffusers, modulate-torch,
modulate-diffusers. Per (case, kind): ``copy_`` of the same bytes, the default launch and a grid of
schedules, only the knobs that leave each row's arithmetic alone (``xbackend.kernels.rmsnorm.launch``):
rows per program (powers of two to 64), num_warps 1/2/4/8, the tile arrangement ([A, R, K, B] or the
16-byte-vector [A*B, R, K]), for torch-flavour rows of one loop step (D <= 512) ``trim`` (only the
emulated threads that hold elements) and for the modulate ``flat_mod`` (the [1, .., 1, D] scale and shift
loaded once per program). The grid is pruned to 8-64 tile elements per thread (the default is 32). Every
schedule's output is compared with eager (the op's reference) by torch.equal.

Kernels are compiled first by ``--jobs`` worker processes (each launches every schedule once on
uninitialised inputs, filling Triton's on-disk cache), then timed in this process with the bench
harness's ``time_rotated_interleaved`` (device time behind a GPU sleep, inputs rotated past L2, every
schedule of a case interleaved), then the best few per (D, kind) and the default again with twice the
reps (the confirm round, which decides). The end: the best schedule per (D, kind), the one with the
highest lowest % of copy_ over that D's shapes among schedules exact on all of them, as a dict literal
for ``schedule_table`` in backends/cuda/launch.py, and every row in $OUT/rmsnorm_narrow.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import xbackend_cuda.launch as nvidia

from xbackend.bench._harness import copy_fn, rotations
from xbackend.kernels.rmsnorm import launch as L
from xbackend.ops.rmsnorm import reference as rmsnorm_reference
from xbackend.ops.rmsnorm_modulate import reference as modulate_reference

NUM = nvidia.NUMERICS
# Production's PDL, no table: every candidate sets rows and warps itself, the default row is Schedule().
TRAITS = L.LaunchTraits(pdl_min_major=nvidia.LAUNCH.pdl_min_major)
EPS = 1e-6
DTYPE = torch.bfloat16
ITEMSIZE = 2
PRIORITY = (256, 64, 512, 1000, 128, 768, 1024, 2048)  # the slowest first, in case the budget runs out
ROW_ELEMENTS = 1 << 26  # 2-D cases: [2^26 / D, D], 128 MB read and 128 MB written
SHAPES_ND = [(1, 40, 96, 96, 4, 64), (1, 40, 96, 96, 256), (1, 20, 48, 48, 512), (1, 16, 48, 80, 512)]
ROWS = (1, 2, 4, 8, 16, 32, 64)
WARPS = (1, 2, 4, 8)
PER_THREAD = (8, 16, 32)  # tile elements per thread (the default is 32), and 64 at 4 warps
MERGED_AT = ((16, 2), (16, 4), (32, 4))  # (elements per thread, warps) also tried with ARR_MERGED
DEFAULT = L.Schedule()


# --------------------------------------------------------------------------------------------------
# The grid
# --------------------------------------------------------------------------------------------------


def kind_of(kind: str) -> tuple[str, bool]:
    """op kind -> (flavour, modulate)"""
    op, flavour = kind.split("-")
    return flavour, op == "modulate"


def candidates(d: int, flavour: str, modulate: bool) -> list[L.Schedule]:
    """Schedules tried for rows of D (the same for every shape of that D, so they compare across shapes).
    The modulate's all load the [1, .., 1, D] scale and shift once per program (flat_mod), which only
    removes loads; the default (per-row loads) is timed beside them, and the default with flat_mod."""
    flat = True if modulate else None
    out: list[L.Schedule] = [L.Schedule(flat_mod=True)] if modulate else []
    tiles = [(None, L.exact_schedule(4096, d, flavour, NUM, DEFAULT).tile)]
    trimmed = L.exact_schedule(4096, d, flavour, NUM, L.Schedule(trim=True)).tile
    if trimmed != tiles[0][1]:
        tiles.append((True, trimmed))
    for trim, tile in tiles:
        per_row = tile.k * tile.a * tile.b
        wasteful = len(tiles) > 1 and trim is None  # most lanes masked: only the default's neighbours
        grid = [(32, 4), (32, 8)] if wasteful else [(e, w) for w in WARPS for e in PER_THREAD] + [(64, 4)]
        for e, w in grid:
            r, rem = divmod(e * 32 * w, per_row)
            if rem or r not in ROWS:
                continue
            # the arrangement always explicit: the default's rule (default_arrangement) depends on R
            out.append(L.Schedule(r, w, L.ARR_ARKB, trim, flat))
            if not wasteful and (e, w) in MERGED_AT:
                out.append(L.Schedule(r, w, L.ARR_MERGED, trim, flat))
    return out


def label(s: L.Schedule) -> str:
    if s == DEFAULT:
        return "default"
    if s.rows_per_program is None:
        return "default flat" if s.flat_mod else repr(s)
    arr = "merged" if s.arrangement == L.ARR_MERGED else "arkb"
    return f"R={s.rows_per_program} w={s.num_warps} {arr}{' trim' if s.trim else ''}{' flat' if s.flat_mod else ''}"


def as_code(s: L.Schedule) -> str:
    parts = [f"{f}={v}" for f, v in zip(s._fields[:2], s[:2], strict=True) if v is not None]
    if s.arrangement is not None:  # as measured, even where the default would pick the same
        parts.append("arrangement=rms.ARR_MERGED" if s.arrangement == L.ARR_MERGED else "arrangement=rms.ARR_ARKB")
    parts += [f"{f}=True" for f in ("trim", "flat_mod") if getattr(s, f)]
    return f"rms.Schedule({', '.join(parts)})"


def meta_inputs(shape: tuple[int, ...], modulate: bool, device: str = "meta") -> tuple:
    x = torch.empty(shape, dtype=DTYPE, device=device)
    w = torch.empty(shape[-1], dtype=DTYPE, device=device)
    s = torch.empty((1,) * (len(shape) - 1) + (shape[-1],), dtype=DTYPE, device=device) if modulate else None
    return x, w, s


def plan_of(shape: tuple[int, ...], kind: str, schedule: L.Schedule) -> L.LaunchPlan:
    flavour, modulate = kind_of(kind)
    x, w, s = meta_inputs(shape, modulate)
    return L.plan(L.Variant(True, NUM, TRAITS, schedule), x, w, s, s, EPS, flavour, False)


def effective(lp: L.LaunchPlan) -> tuple:
    return lp.grid, lp.consts, lp.options["num_warps"]


def grid_for(shapes: list[tuple[int, ...]], kind: str) -> list[L.Schedule]:
    """The default, then the candidates whose launch differs from it (on the first shape)."""
    d = shapes[0][-1]
    seen = {effective(plan_of(shapes[0], kind, DEFAULT))}
    out = [DEFAULT]
    for s in candidates(d, *kind_of(kind)):
        key = effective(plan_of(shapes[0], kind, s))
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def shapes_by_d(ds: list[int], tiny: bool) -> dict[int, list[tuple[int, ...]]]:
    out: dict[int, list[tuple[int, ...]]] = {}
    for d in ds:
        shapes = [(ROW_ELEMENTS // d, d)] + [s for s in SHAPES_ND if s[-1] == d]
        if tiny:  # the interpreter: the same layouts, a few rows (partly masked programs included)
            shapes = [(6, d)] + [(1, 2, 2 + i, 1, *s[4:]) for i, s in enumerate(shapes[1:])]
        out[d] = shapes
    return out


def moved(shape: tuple[int, ...], modulate: bool) -> int:
    d = shape[-1]
    return (2 * math.prod(shape) + d + (2 * d if modulate else 0)) * ITEMSIZE


def dry_run(groups: dict[int, list], kinds: list[str]) -> None:
    kernels = timed = 0
    for d, shapes in groups.items():
        for kind in kinds:
            grid = grid_for(shapes, kind)
            kernels += len(grid)
            timed += len(grid) * len(shapes)
            print(f"D={d} {kind}: {len(grid)} schedules x {len(shapes)} shapes {[list(s) for s in shapes]}")
            for s in grid:
                lp = plan_of(shapes[0], kind, s)
                c = lp.consts
                per_thread = c.R * c.K * c.A * c.B // (32 * lp.options["num_warps"])
                print(
                    f"    {label(s):<26} R={c.R:<2} warps={lp.options['num_warps']} tile[K={c.K} A={c.A} B={c.B}] "
                    f"arr={c.ARR} flat={int(c.MOD_FLAT)} {per_thread:>2} elements/thread, grid {lp.grid[0]} at {list(shapes[0])}"
                )
    print(f"{kernels} kernels to compile (one per schedule and (D, kind)), {timed} (case, kind, schedule) timings")


# --------------------------------------------------------------------------------------------------
# Compiling in worker processes
# --------------------------------------------------------------------------------------------------


def _warm(tasks: list[tuple], device: str) -> list[tuple]:
    """In a worker: launch each (shape, kind, schedule) once on uninitialised inputs (fills Triton's cache)."""
    done = []
    for shape, kind, fields in tasks:
        flavour, modulate = kind_of(kind)
        t0 = time.perf_counter()
        try:
            x, w, s = meta_inputs(shape, modulate, device)
            L.Launcher(L.Variant(True, NUM, TRAITS, L.Schedule(*fields)))(x, w, s, s, EPS, flavour)
            if device == "cuda":
                torch.cuda.synchronize()
            err = None
        except Exception as exc:  # reported; the main process skips it
            err = f"{type(exc).__name__}: {str(exc)[:160]}"
        done.append((shape, kind, fields, err, time.perf_counter() - t0))
    return done


def precompile(
    plan: list[tuple[list, str, list[L.Schedule]]], jobs: int, budget_s: float, device: str = "cuda"
) -> dict:
    """Compile every (shape, kind, schedule) in ``jobs`` processes; returns {(shape, kind, fields): error}
    (informational: the main process tries those again, a worker may fail for its own reasons)."""
    tasks = [[(shape, kind, tuple(s)) for shape in shapes] for shapes, kind, grid in plan for s in grid]
    chunks = [list(itertools.chain(*tasks[i : i + 3])) for i in range(0, len(tasks), 3)]
    errors: dict[tuple, str] = {}
    t0 = time.perf_counter()
    n = 0
    try:
        with mp.get_context("spawn").Pool(jobs) as pool:
            pool.apply_async(_warm, ([], device)).get(timeout=60)  # workers start (else Pool respawns forever)
            pending = [pool.apply_async(_warm, (c, device)) for c in chunks]
            for p in pending:
                left = budget_s - (time.perf_counter() - t0)
                if left <= 0:
                    raise mp.TimeoutError(f"compile budget of {budget_s:.0f} s spent")
                for shape, kind, fields, err, _ in p.get(timeout=left):
                    n += 1
                    if err:
                        errors[(shape, kind, fields)] = err
            pool.terminate()
    except Exception as exc:  # a timeout or a pool that did not start: the rest compiles on first call
        print(f"precompile stopped: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    print(
        f"precompiled {n} launches ({len(tasks)} kernels) in {time.perf_counter() - t0:.1f} s with {jobs} "
        f"processes, {len(errors)} failed",
        flush=True,
    )
    return errors


# --------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------


def cpu_timer(fns_sets: list[tuple[Callable, list]], reps: int) -> list[float]:
    """--interpret: wall µs of one call each (exercises the code path; the numbers mean nothing)."""
    out = []
    for fn, sets in fns_sets:
        t0 = time.perf_counter()
        fn(*sets[0])
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def gpu_timer(fns_sets: list[tuple[Callable, list]], reps: int) -> list[float]:
    from xbackend.bench._harness import time_rotated_interleaved

    return time_rotated_interleaved(fns_sets, reps=reps)


def make_sets(shape: tuple[int, ...], device: str, gen: torch.Generator) -> list[tuple]:
    """Rotated input sets (x, scale, shift, weight) past twice L2."""
    d = shape[-1]
    mod = (1,) * (len(shape) - 1) + (d,)

    def r(s, scale=1.0, offset=0.0):
        return (offset + scale * torch.randn(s, device=device, generator=gen)).to(DTYPE)

    n = rotations(moved(shape, True)) if device == "cuda" else 1
    return [(r(shape), r(mod, 0.1), r(mod, 0.1), r(d, 0.5, 1.0)) for _ in range(n)]


def runner(kind: str, schedule: L.Schedule) -> Callable:
    flavour, modulate = kind_of(kind)
    run = L.Launcher(L.Variant(True, NUM, TRAITS, schedule))
    if modulate:
        return lambda x, s, t, w: run(x, w, s, t, EPS, flavour)
    return lambda x, s, t, w: run(x, w, None, None, EPS, flavour)


def reference(kind: str, x, s, t, w) -> torch.Tensor:
    flavour, modulate = kind_of(kind)
    return modulate_reference(x, s, t, w, EPS, flavour) if modulate else rmsnorm_reference(x, w, EPS, flavour)


def case_name(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def time_case(shape, kind, grid, sets, timer, reps, interpret) -> dict[str, dict]:
    """Every schedule of ``grid`` once for exactness, then all interleaved with copy_: {label: row}."""
    _, modulate = kind_of(kind)
    nbytes = moved(shape, modulate)
    want = None if interpret else reference(kind, *sets[0])
    rows: dict[str, dict] = {}
    fns: list[tuple[str, Callable]] = []
    for s in grid:
        name = label(s)
        fn = runner(kind, s)
        t0 = time.perf_counter()
        try:
            out = fn(*sets[0])
        except Exception as exc:  # a schedule that does not compile is a result
            rows[name] = {"schedule": list(s), "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
            continue
        first_s = time.perf_counter() - t0
        if want is None:  # the interpreter truncates casts: compare with the default launch instead
            want = out
        rows[name] = {"schedule": list(s), "exact": bool(torch.equal(out, want)), "first_call_s": round(first_s, 3)}
        del out
        fns.append((name, fn))
    copy, copy_sets = copy_fn(nbytes, sets[0][0].device)
    times = timer([(copy, copy_sets)] + [(fn, sets) for _, fn in fns], reps)
    copy_us = times[0]
    for (name, _), us in zip(fns, times[1:], strict=True):
        rows[name].update(us=us, tbps=nbytes / us / 1e6, pct=100 * copy_us / us, copy_us=copy_us)
    return rows


def print_rows(shape, kind, rows: dict[str, dict], tag: str = "") -> None:
    for name, r in rows.items():
        if "error" in r:
            print(f"{case_name(shape):<22} {kind:<18} {name:<26} {tag}error: {r['error']}", flush=True)
        else:
            print(
                f"{case_name(shape):<22} {kind:<18} {name:<26} {tag}{r['us']:8.2f} us {r['tbps']:5.2f} TB/s "
                f"{r['pct']:5.1f}% of copy_ exact={'yes' if r['exact'] else 'NO'}",
                flush=True,
            )


def score(results: dict[str, dict[str, dict]], name: str) -> float | None:
    """Lowest % of copy_ over the shapes; None unless timed and exact on every one."""
    pcts = []
    for rows in results.values():
        r = rows.get(name)
        if r is None or "pct" not in r or not r["exact"]:
            return None
        pcts.append(r["pct"])
    return min(pcts) if pcts else None


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def table_literal(best: dict[tuple[str, int], dict], ranges: bool, min_gain: float) -> str:
    """The dict for ``rms.schedule_table``: measured winners at least ``min_gain`` points of copy_ above the
    default, then the vendor's other existing entries."""
    lines = ["{"]
    measured = sorted({d for _, d in best})
    keys = set()
    for (kind, d), b in sorted(best.items(), key=lambda kv: (L.OPS.index(kv[0][0]), kv[0][1])):
        lo = ([1] + [m + 1 for m in measured])[measured.index(d)]
        key = f"({lo}, {d})" if ranges else str(d)
        note = f"# {b['pct']:.1f}% of copy_ (default {b['default_pct']:.1f}%), lowest over {b['shapes']}: {b['label']}"
        if b["schedule"] == DEFAULT or not b["pct"] >= b["default_pct"] + min_gain:
            lines.append(f'    # ("{kind}", {key}, {ITEMSIZE}): keep the default. {note[2:]}')
            continue
        lines += [f"    {note}", f'    ("{kind}", {key}, {ITEMSIZE}): {as_code(b["schedule"])},']
        keys.add((kind, d))
    for e in nvidia.LAUNCH.schedules:
        if (e.op, e.d_max) not in keys or e.d_min != e.d_max:
            key = str(e.d_min) if e.d_min == e.d_max else f"({e.d_min}, {e.d_max})"
            lines += ["    # existing entry", f'    ("{e.op}", {key}, {e.itemsize}): {as_code(e.schedule)},']
    lines.append("}")
    return "\n".join(lines)


def sweep_one(shapes, kind, grid, sets_of, timer, args, start, best, report) -> None:
    """One (D, kind): every schedule on each of the D's shapes, the confirm round, the pick into ``best``."""
    d = shapes[0][-1]
    device = "cpu" if args.interpret else "cuda"
    gen = torch.Generator(device=device).manual_seed(d)
    results: dict[str, dict[str, dict]] = {}
    for shape in shapes:
        sets = sets_of.setdefault((shape, d), make_sets(shape, device, gen))
        results[case_name(shape)] = rows = time_case(shape, kind, grid, sets, timer, args.reps, args.interpret)
        print_rows(shape, kind, rows)
    ranked = sorted(
        (n for n in results[case_name(shapes[0])] if score(results, n) is not None),
        key=lambda n: -score(results, n),
    )
    finalists = list(dict.fromkeys(ranked[: args.top] + ["default"]))
    final = {label(s): s for s in grid if label(s) in finalists}
    confirmed: dict[str, dict[str, dict]] = {}
    if len(final) > 1 and time.perf_counter() - start < args.budget_s:
        for shape in shapes:
            rows = time_case(
                shape, kind, list(final.values()), sets_of[(shape, d)], timer, 2 * args.reps, args.interpret
            )
            confirmed[case_name(shape)] = rows
            print_rows(shape, kind, rows, tag="confirm ")
    decided = confirmed or results
    pick = max((n for n in final if score(decided, n) is not None), key=lambda n: score(decided, n), default=None)
    if pick is not None:
        b = {
            "schedule": final[pick],
            "label": pick,
            "pct": score(decided, pick),
            "default_pct": score(decided, "default") or float("nan"),
            "shapes": ", ".join(case_name(s) for s in shapes),
        }
        best[(kind, d)] = b
        print(f"==> D={d} {kind}: {pick}: {b['pct']:.1f}% of copy_ (default {b['default_pct']:.1f}%)", flush=True)
    for stage, res in (("main", results), ("confirm", confirmed)):
        for case, rows in res.items():
            for name, r in rows.items():
                report["rows"].append({"stage": stage, "d": d, "kind": kind, "case": case, "label": name, **r})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT"))
    p.add_argument("--d", default=",".join(map(str, PRIORITY)), help="row lengths, in this order")
    p.add_argument("--kinds", default=",".join(L.OPS))
    p.add_argument("--reps", type=int, default=20, help="timed reps per schedule (the confirm round: twice)")
    p.add_argument("--top", type=int, default=3, help="schedules per (D, kind) in the confirm round")
    p.add_argument("--budget-s", type=float, default=200.0, help="no new (D, kind) after this many seconds")
    p.add_argument("--jobs", type=int, default=max(0, min(12, (os.cpu_count() or 2) - 2)))
    p.add_argument("--compile-budget-s", type=float, default=100.0)
    p.add_argument("--ranges", action="store_true", help="key the table by D ranges up to each measured D")
    p.add_argument("--min-gain", type=float, default=1.0, help="points of copy_ over the default for an entry")
    p.add_argument("--dry-run", action="store_true", help="print the grid and exit")
    p.add_argument("--interpret", action="store_true", help="TRITON_INTERPRET=1 on CPU: tiny shapes, fake timer")
    args = p.parse_args()
    start = time.perf_counter()
    ds = [int(v) for v in args.d.split(",")]
    kinds = args.kinds.split(",")
    assert all(k in L.OPS for k in kinds), kinds
    groups = shapes_by_d(ds, args.interpret)
    if args.dry_run:
        dry_run(groups, kinds)
        return
    if args.interpret and os.environ.get("TRITON_INTERPRET") != "1":
        sys.exit("--interpret needs TRITON_INTERPRET=1 in the environment (set before triton is imported)")
    device = "cpu" if args.interpret else "cuda"
    timer = cpu_timer if args.interpret else gpu_timer
    work = [(groups[d], kind, grid_for(groups[d], kind)) for d in ds for kind in kinds]
    if device == "cuda":
        print(
            f"{torch.cuda.get_device_name()} torch {torch.__version__} triton {__import__('triton').__version__}",
            flush=True,
        )
    if args.jobs > 0 and device == "cuda":
        for (shape, kind, fields), err in precompile(work, args.jobs, args.compile_budget_s).items():
            print(f"precompile {case_name(shape)} {kind} {label(L.Schedule(*fields))}: {err}", flush=True)
    report: dict = {"rows": [], "best": {}, "skipped": []}
    best: dict[tuple[str, int], dict] = {}
    sets_of: dict[tuple, list] = {}
    for shapes, kind, grid in work:
        d = shapes[0][-1]
        if time.perf_counter() - start > args.budget_s:
            print(f"budget spent: D={d} {kind} skipped", flush=True)
            report["skipped"].append([d, kind])
            continue
        for k in [k for k in sets_of if k[-1] != d]:
            del sets_of[k]  # one D's inputs at a time
        try:
            sweep_one(shapes, kind, grid, sets_of, timer, args, start, best, report)
        except Exception as exc:  # one (D, kind) failing leaves the others' results
            print(f"D={d} {kind} failed: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            report["skipped"].append([d, kind, f"{type(exc).__name__}: {str(exc)[:300]}"])
    print("\nbest per (D, kind), lowest % of copy_ over the D's shapes (confirm round):")
    for (kind, d), b in sorted(best.items(), key=lambda kv: (kv[0][1], L.OPS.index(kv[0][0]))):
        print(f"  D={d:<5} {kind:<18} {b['label']:<26} {b['pct']:5.1f}%  (default {b['default_pct']:5.1f}%)")
    literal = table_literal(best, args.ranges, args.min_gain)
    print("\n# backends/cuda/launch.py: LaunchTraits(schedules=rms.schedule_table(...)), 2-byte elements:")
    print(literal)
    slow = [r for r in report["rows"] if r.get("first_call_s", 0) > 0.25]
    print(f"\n{len(slow)} first calls over 0.25 s (compiled here: the precompile missed them)", flush=True)
    print(f"{time.perf_counter() - start:.0f} s in all", flush=True)
    report["best"] = {f"{k} {d}": {**b, "schedule": list(b["schedule"])} for (k, d), b in best.items()}
    report["literal"] = literal
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "rmsnorm_narrow.json").write_text(json.dumps(report, indent=1))
        print(f"wrote {Path(args.out, 'rmsnorm_narrow.json')}")


if __name__ == "__main__":
    main()
