"""A whole diffusers transformer (Wan 2.2, Flux.2, Qwen-Image, LTX-2): eager vs xbackend.patch vs
torch.compile vs patched + compile, on one GPU.

    python3 benchmarks/transformer_check.py --family wan|flux2|qwen|ltx2 [--layers 2] [--rounds 3] [--out $OUT]
    python3 benchmarks/transformer_check.py --family wan --first-call   # first forward, fresh processes
    python3 benchmarks/transformer_check.py --family wan --smoke        # tiny config on the CPU: checks the script

The family's real-size config with random weights (nothing is downloaded; benchmarks/transformer_families.py
lists the sizes), bf16, ``--layers`` blocks (Flux.2: that many double-stream and single-stream blocks),
the inputs its pipeline passes at the family's reference resolution. Two identical models (one a
deepcopy of the other): one stays stock, one is patched. The modes, each a call of the whole model forward:

- eager: stock diffusers.
- patched: ``xbackend.patch`` at the default quality (lossless).
- compile: ``torch.compile(model)`` (inductor) of the stock model.
- patched+compile: ``torch.compile`` of the patched model with fullgraph=True; where the model cannot
  be captured whole, again without fullgraph, and the row says why (``fullgraph_error``).

Per mode: the median per call (``triton.testing.do_bench``, medians of ``--rounds`` interleaved rounds, so a
drift of the GPU clocks hits every mode alike; on the CPU, ``time.perf_counter``), the first call (the first
forward of that mode in this process, synchronized; compile's includes compiling), the peak GPU memory of
that first call (both models' weights included), and ``bit_identical``: torch.equal of every output to eager's.

``--first-call`` runs the first forward of eager and of patched each in a fresh process with an empty
``TRITON_CACHE_DIR`` (Triton compiles every kernel it launches; the extensions xbackend builds once per
machine stay in ``XBACKEND_CACHE_DIR``), then patched again reusing that Triton cache, and reports the
patched process's ``xbackend.patch`` + first forward minus eager's first forward (the bar: at most 2 s).

Writes $OUT/transformer_<family>.json (``--first-call`` adds its ``first_call`` to it) and prints a table
last. The bars: patched bit-identical to eager, patched at least as fast as compile, patched + compile at
least as fast as compile. Needs diffusers==0.42.1.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# cuBLAS picks workspaces per stream; a fixed config keeps its reductions identical from call to call.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transformer_families as families

import xbackend

SCHEMA_VERSION = 1
MODES = ("eager", "patched", "compile", "patched_compile")
FIRST_CALL_BAR_S = 2.0
Outputs = tuple[torch.Tensor, ...]


# -- one process: the four modes -----------------------------------------------------------------
def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _call(fn: Callable[..., Any], inputs: dict[str, Any]) -> Callable[[], Outputs]:
    def run() -> Outputs:
        with torch.no_grad():
            out = fn(**inputs)
        return tuple(out) if isinstance(out, (tuple, list)) else (out,)

    return run


def first_call(run: Callable[[], Outputs], device: str) -> tuple[Outputs, float, float | None]:
    """(outputs, seconds, peak GB allocated during the call) of one synchronized call."""
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    start = time.perf_counter()
    out = run()
    _sync(device)
    seconds = time.perf_counter() - start
    return out, seconds, (torch.cuda.max_memory_allocated() / 1e9 if cuda else None)


def bench_ms(run: Callable[[], Outputs], device: str, rep_ms: int, cpu_repeats: int = 3) -> float:
    if device.startswith("cuda"):
        from triton.testing import do_bench

        return do_bench(run, warmup=100, rep=rep_ms, return_mode="median")
    times = []
    for _ in range(cpu_repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def compare(out: Outputs, ref: Outputs) -> dict[str, Any]:
    if len(out) != len(ref) or any(a.shape != b.shape for a, b in zip(out, ref, strict=True)):
        return {"bit_identical": False, "max_abs_diff": None}
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(out, ref, strict=True))
    return {"bit_identical": all(torch.equal(a, b) for a, b in zip(out, ref, strict=True)), "max_abs_diff": diff}


def _free(device: str) -> None:
    """Give the caching allocator's blocks of a failed mode back, so the next mode has the memory."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _graph_breaks() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def _error(exc: BaseException) -> str:
    """The exception in one line: dynamo's explanation and hint follow its first line."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return f"{type(exc).__name__}: {text[:600]}"


def header(family: str, *, tiny: bool, layers: int, dtype: torch.dtype, device: str) -> dict[str, Any]:
    """What a result records about where and on what it ran; the model is built on the meta device."""
    import diffusers
    import triton

    meta = families.build(family, tiny=tiny, layers=layers, device="meta", dtype=dtype)
    params = sum(p.numel() for p in meta.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in meta.parameters())
    fam, sizes = families.FAMILY[family], families.sizes(family, tiny=tiny)
    hardware = torch.cuda.get_device_name() if device.startswith("cuda") else f"cpu ({platform.machine()})"
    return {
        "schema_version": SCHEMA_VERSION, "family": family, "title": fam.title, "model_class": fam.model_class,
        "smoke": tiny, "device": hardware, "torch": torch.__version__, "triton": triton.__version__,
        "diffusers": diffusers.__version__, "date": datetime.date.today().isoformat(),
        "dtype": str(dtype).removeprefix("torch."), "layers": layers,
        "config": {k: v for k, v in meta.config.items() if not k.startswith("_")},
        "sizes": sizes.what, "tokens": families.tokens(family, tiny=tiny), "text_tokens": sizes.text,
        "params": params, "weights_gb": weight_bytes / 1e9, "argv": sys.argv[1:],
    }  # fmt: skip


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def check_modes(family: str, *, tiny: bool, layers: int, device: str, dtype: torch.dtype, rounds: int,
                backend: str, rep_ms: int, out: Path) -> dict[str, Any]:  # fmt: skip
    t0 = time.perf_counter()

    def note(what: str) -> None:  # progress on stderr: a run cut short by a timeout still says how far it got
        print(f"[{family} +{time.perf_counter() - t0:6.1f} s] {what}", file=sys.stderr, flush=True)

    result = header(family, tiny=tiny, layers=layers, dtype=dtype, device=device)
    model = families.build(family, tiny=tiny, layers=layers, device=device, dtype=dtype)
    inputs = families.make_inputs(family, model, tiny=tiny, device=device, dtype=dtype)
    patched_model = copy.deepcopy(model)
    start = time.perf_counter()
    report = xbackend.patch(patched_model)
    result.update(
        inputs=families.describe_inputs(inputs), compile_backend=backend, rounds=rounds,
        timer="triton.testing.do_bench median (L2 cleared per call)" if device.startswith("cuda")
        else "time.perf_counter median of 3 calls",
        patch={"counts": report.counts(), "sites": len(report), "summary": str(report),
               "seconds": time.perf_counter() - start},
        rows=[],
    )  # fmt: skip
    _write(out, result)
    note(f"models built; {report}".splitlines()[0])
    calls: dict[str, Callable[[], Outputs]] = {}
    ref: Outputs = ()

    def add(mode: str, fn: Callable[..., Any], **extra: Any) -> None:
        nonlocal ref
        run = _call(fn, inputs)
        breaks = _graph_breaks()
        outs, seconds, peak = first_call(run, device)
        row = {"mode": mode, "first_call_s": seconds, "peak_gb": peak, **extra}
        if mode == "eager":
            ref = outs
        row.update(compare(outs, ref))
        if mode.endswith("compile"):
            row["graph_breaks"] = _graph_breaks() - breaks
        result["rows"].append(row)
        calls[mode] = run
        _write(out, result)
        note(f"{mode}: first call {seconds:.2f} s, bit_identical {row['bit_identical']}")

    add("eager", model)
    for mode, make in (("patched", lambda: (patched_model, {})),
                       ("compile", lambda: (torch.compile(model, backend=backend), {}))):  # fmt: skip
        try:
            fn, extra = make()
            add(mode, fn, **extra)
        except Exception as exc:  # one failing mode must not cost the others' numbers
            result["rows"].append({"mode": mode, "error": _error(exc)})
            _write(out, result)
            _free(device)
    try:
        add("patched_compile", torch.compile(patched_model, backend=backend, fullgraph=True), fullgraph=True)
    except Exception as exc:  # the model does not trace whole: compile it with graph breaks, and say why
        fullgraph_error = _error(exc)
        _free(device)
        try:
            add("patched_compile", torch.compile(patched_model, backend=backend), fullgraph=False,
                fullgraph_error=fullgraph_error)  # fmt: skip
        except Exception as exc2:
            result["rows"].append(
                {"mode": "patched_compile", "error": _error(exc2), "fullgraph_error": fullgraph_error}
            )
            _free(device)
    rows = {r["mode"]: r for r in result["rows"]}
    times: dict[str, list[float]] = {mode: [] for mode in calls}
    for _ in range(rounds):
        for mode, run in list(calls.items()):
            try:
                times[mode].append(bench_ms(run, device, rep_ms))
            except Exception as exc:  # e.g. out of memory under do_bench's L2 flush buffer: the others go on
                rows[mode]["error"] = f"timing: {_error(exc)}"
                del calls[mode], times[mode]
                _free(device)
        note("round: " + ", ".join(f"{m} {t[-1]:.2f} ms" for m, t in times.items()))
    for mode, ts in times.items():
        rows[mode].update(median_ms=statistics.median(ts), rounds_ms=ts)
    for row in rows.values():
        if "median_ms" in row:
            row["vs_eager"] = rows["eager"]["median_ms"] / row["median_ms"]
            if "median_ms" in rows.get("compile", {}):
                row["vs_compile"] = rows["compile"]["median_ms"] / row["median_ms"]
    result["bars"] = bars(rows)
    result["xbackend_report"] = impls_used()
    _write(out, result)
    return result


def impls_used() -> list[dict[str, Any]]:
    """``xbackend.report()``'s events, each distinct (op, input key, impl, status, detail) once, counted."""
    seen: dict[tuple[str, ...], dict[str, Any]] = {}
    for event in xbackend.report().to_dict():
        key = tuple(str(event.get(k, "")) for k in ("op", "key", "impl", "status", "detail"))
        seen.setdefault(key, {**event, "count": 0})["count"] += 1
    return list(seen.values())


def bars(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The bars this benchmark reports; a mode that failed or was not timed fails its bar."""
    p, pc = rows.get("patched", {}), rows.get("patched_compile", {})
    speed = p.get("vs_compile")
    both = pc.get("vs_compile")
    return {
        "patched_bit_identical": {"value": p.get("bit_identical"), "met": p.get("bit_identical") is True},
        "patched_vs_compile": {"value": speed, "need": 1.0, "met": speed is not None and speed >= 1.0},
        "patched_compile_vs_compile": {"value": both, "need": 1.0, "met": both is not None and both >= 1.0},
    }


# -- the first forward in fresh processes ---------------------------------------------------------
def child(family: str, mode: str, *, tiny: bool, layers: int, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """In a fresh process: build, then time (patch +) the first forward and a second one."""
    model = families.build(family, tiny=tiny, layers=layers, device=device, dtype=dtype)
    run = _call(model, families.make_inputs(family, model, tiny=tiny, device=device, dtype=dtype))
    _sync(device)
    patch_s, sites = 0.0, 0
    if mode == "patched":
        start = time.perf_counter()
        sites = len(xbackend.patch(model))
        patch_s = time.perf_counter() - start
    _, forward_s, _ = first_call(run, device)
    _, second_s, _ = first_call(run, device)
    return {"mode": mode, "patch_s": patch_s, "first_forward_s": forward_s, "total_s": patch_s + forward_s,
            "second_forward_s": second_s, "sites": sites}  # fmt: skip


def first_calls(family: str, *, tiny: bool, layers: int, dtype: torch.dtype, timeout: int) -> dict[str, Any]:
    """eager, patched (empty Triton cache) and patched again (the cache the first patched run filled),
    each in a fresh process."""
    out: dict[str, Any] = {"bar_s": FIRST_CALL_BAR_S, "triton_cache": "an empty TRITON_CACHE_DIR per run; "
                           "patched_warm reuses the one patched filled"}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="xbackend-first-call-") as tmp:
        for label, mode, cache in (("eager", "eager", "eager"), ("patched", "patched", "patched"),
                                   ("patched_warm", "patched", "patched")):  # fmt: skip
            dest = Path(tmp) / f"{label}.json"
            cmd = [sys.executable, __file__, "--family", family, "--layers", str(layers), "--child", mode,
                   "--child-out", str(dest), "--dtype", str(dtype).removeprefix("torch.")] + (["--smoke"] if tiny else [])  # fmt: skip
            env = {**os.environ, "TRITON_CACHE_DIR": str(Path(tmp) / f"triton-{cache}")}
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                out[label] = {"mode": mode, "error": f"timed out after {timeout} s"}
                continue
            if proc.returncode != 0 or not dest.exists():
                out[label] = {"mode": mode, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
                continue
            out[label] = json.loads(dest.read_text())
            print(f"[{family}] {label}: {json.dumps(out[label])}", file=sys.stderr, flush=True)
    if "total_s" in out.get("eager", {}) and "total_s" in out.get("patched", {}):
        out["delta_s"] = out["patched"]["total_s"] - out["eager"]["total_s"]
        out["met"] = out["delta_s"] <= FIRST_CALL_BAR_S
        if "total_s" in out.get("patched_warm", {}):
            out["delta_warm_s"] = out["patched_warm"]["total_s"] - out["eager"]["total_s"]
    else:
        out["met"] = False
    return out


# -- output ---------------------------------------------------------------------------------------
LABELS = {"eager": "eager", "patched": "patched", "compile": "compile", "patched_compile": "patched+compile"}


def table(result: dict[str, Any]) -> str:
    title = result["title"] + (", tiny config" if result["smoke"] else "")
    lines = [f"{title} ({result['model_class']}), {result['layers']} layers, {result['tokens']} tokens + "
             f"{result['text_tokens']} text, {result['dtype']} on {result['device']}; {result['patch']['summary'].splitlines()[0]}",
             f"{'mode':<28} {'median ms':>10} {'vs eager':>9} {'vs compile':>11} {'first call s':>13} {'peak GB':>8}  bit-identical"]  # fmt: skip
    for r in result["rows"]:
        label = LABELS[r["mode"]] + ("" if "fullgraph" not in r else " (fullgraph)" if r["fullgraph"] else " (breaks)")
        if "error" in r:
            lines.append(f"{label:<28} error: {r['error']}")
            continue
        same = "yes" if r["bit_identical"] else f"no (max {r['max_abs_diff']:.3g})"

        def num(key: str, fmt: str, width: int, suffix: str = "", r: dict[str, Any] = r) -> str:
            return f"{format(r[key], fmt) + suffix:>{width}}" if r.get(key) is not None else f"{'-':>{width}}"

        lines.append(f"{label:<28} {num('median_ms', '.2f', 10)} {num('vs_eager', '.3f', 9, 'x')} "
                     f"{num('vs_compile', '.3f', 11, 'x')} {num('first_call_s', '.2f', 13)} {num('peak_gb', '.1f', 8)}  {same}")  # fmt: skip
    for r in result["rows"]:
        if r.get("fullgraph_error"):
            lines.append(f"patched+compile without fullgraph: {r['fullgraph_error']}")
    if "bars" in result:
        lines.append("bars: " + "; ".join(f"{name} {_bar_value(b)} {'met' if b['met'] else 'NOT met'}"
                                           for name, b in result["bars"].items()))  # fmt: skip
    if "first_call" in result:
        lines.append(first_call_line(result["first_call"]))
    return "\n".join(lines)


def _bar_value(bar: dict[str, Any]) -> str:
    v = bar["value"]
    return "-" if v is None else str(v) if isinstance(v, bool) else f"{v:.3f}x"


def first_call_line(fc: dict[str, Any]) -> str:
    parts = []
    for label in ("eager", "patched", "patched_warm"):
        r = fc.get(label, {})
        parts.append(f"{label} {r['total_s']:.2f} s" if "total_s" in r else f"{label} {r.get('error', 'not run')}")
    verdict = (f"patched - eager {fc['delta_s']:+.2f} s (bar <= {fc['bar_s']:.0f} s: {'met' if fc['met'] else 'NOT met'})"
               if "delta_s" in fc else "bar NOT met (a run failed)")  # fmt: skip
    return f"first call, fresh processes: {', '.join(parts)}; {verdict}"


# The keys (and their types) every result carries; a timed row carries ROW_TIMED too.
SCHEMA: dict[str, type | tuple[type, ...]] = {
    "schema_version": int, "family": str, "title": str, "model_class": str, "smoke": bool, "device": str,
    "torch": str, "triton": str, "diffusers": str, "date": str, "dtype": str, "layers": int, "config": dict,
    "sizes": str, "tokens": int, "text_tokens": int, "params": int, "weights_gb": float, "inputs": dict,
    "compile_backend": str, "rounds": int, "timer": str, "patch": dict, "rows": list, "bars": dict,
    "xbackend_report": list, "argv": list,
}  # fmt: skip
ROW_TIMED: dict[str, type | tuple[type, ...]] = {
    "mode": str, "first_call_s": float, "peak_gb": (float, type(None)), "bit_identical": bool,
    "max_abs_diff": (float, type(None)), "median_ms": float, "rounds_ms": list, "vs_eager": float,
}  # fmt: skip


def check_schema(data: dict[str, Any]) -> list[str]:
    """What is missing or mistyped in a result (empty when it is whole)."""
    problems = [f"{k}: missing" for k in SCHEMA if k not in data]
    problems += [f"{k}: expected {t}, got {type(data[k]).__name__}" for k, t in SCHEMA.items()
                 if k in data and not isinstance(data[k], t)]  # fmt: skip
    modes = [r.get("mode") for r in data.get("rows", [])]
    if modes != list(MODES):
        problems.append(f"rows: expected modes {list(MODES)}, got {modes}")
    for r in data.get("rows", []):
        if "error" in r:
            problems.append(f"row {r.get('mode')}: {r['error']}")
            continue
        problems += [f"row {r['mode']}: {k} missing or not {t}" for k, t in ROW_TIMED.items()
                     if not isinstance(r.get(k), t)]  # fmt: skip
        if r["mode"] != "eager" and not isinstance(r.get("vs_compile"), float):
            problems.append(f"row {r['mode']}: vs_compile missing")
    if "patch" in data and not isinstance(data["patch"].get("counts"), dict):
        problems.append("patch.counts: missing")
    if set(data.get("bars", {})) != {"patched_bit_identical", "patched_vs_compile", "patched_compile_vs_compile"}:
        problems.append(f"bars: got {sorted(data.get('bars', {}))}")
    if "first_call" in data:
        fc = data["first_call"]
        problems += [f"first_call.{k}: missing" for k in ("eager", "patched", "patched_warm", "delta_s", "met")
                     if k not in fc]  # fmt: skip
    return problems


# -- command line ---------------------------------------------------------------------------------
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
          "fp16": torch.float16, "float16": torch.float16}  # fmt: skip


def _merge_first_call(path: Path, head: dict[str, Any], fc: dict[str, Any]) -> dict[str, Any]:
    """Add ``first_call`` to the family's result when it describes the same run (family, config, sizes,
    dtype, device), else start a result with the header alone."""
    same = ("family", "config", "tokens", "text_tokens", "dtype", "device", "layers", "smoke")
    old = json.loads(path.read_text()) if path.exists() else {}
    base = old if all(json.dumps(old.get(k), default=str) == json.dumps(head[k], default=str) for k in same) else head
    return {**base, "first_call": fc}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", required=True, choices=families.FAMILIES)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds per mode, medians (default 3; --smoke 1)")
    p.add_argument("--rep-ms", type=int, default=800, help="do_bench's rep per round, ms")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bf16 (--smoke: fp32)")
    p.add_argument("--compile-backend", default=None, help="default: inductor (--smoke: aot_eager)")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"), help="directory of the JSON")
    p.add_argument("--first-call", action="store_true", help="first forward of eager and patched, fresh processes")
    p.add_argument("--timeout", type=int, default=300, help="--first-call: seconds per process")
    p.add_argument("--smoke", action="store_true", help="the tiny config on the CPU; checks the JSON's schema")
    p.add_argument("--child", choices=["eager", "patched"], help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()  # not the `.to(dtype)` advice meant for from_pretrained
    tiny = args.smoke
    dtype = DTYPES[args.dtype or ("fp32" if tiny else "bf16")]
    device = "cpu" if tiny else "cuda"
    if not tiny and not torch.cuda.is_available():
        raise SystemExit("transformer_check: needs a CUDA/ROCm GPU (--smoke runs the tiny config on the CPU)")
    if args.child:
        result = child(args.family, args.child, tiny=tiny, layers=args.layers, device=device, dtype=dtype)
        Path(args.child_out).write_text(json.dumps(result))
        return 0
    suffix = "" if dtype == (torch.float32 if tiny else torch.bfloat16) else f"_{str(dtype).removeprefix('torch.')}"
    path = Path(args.out) / f"transformer_{args.family}{suffix}.json"
    if args.first_call:
        # A `timeout` around this process sends SIGTERM: exit through Python, so subprocess.run kills the
        # child it waits on instead of leaving it on the GPU.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        fc = first_calls(args.family, tiny=tiny, layers=args.layers, dtype=dtype, timeout=args.timeout)
        head = header(args.family, tiny=tiny, layers=args.layers, dtype=dtype, device=device)
        _write(path, _merge_first_call(path, head, fc))
        print(first_call_line(fc))
        return 0 if "delta_s" in fc else 1  # the exit status says whether it measured; the bar is in the JSON
    backend = args.compile_backend or ("aot_eager" if tiny else "inductor")
    rounds = args.rounds or (1 if tiny else 3)
    result = check_modes(args.family, tiny=tiny, layers=args.layers, device=device, dtype=dtype, rounds=rounds,
                         backend=backend, rep_ms=args.rep_ms, out=path)  # fmt: skip
    print(table(result))
    if tiny:
        problems = check_schema(result)
        for problem in problems:
            print(f"schema: {problem}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
