"""LTX-2 transformer blocks: xbackend.patch vs eager diffusers vs torch.compile, on one GPU.

    python3 benchmarks/patch_check.py [--layers 2] [--seqs 8160,32640] [--out $OUT] [--compile-patched] [--graphs] [--profile]
                                      [--variant ltx2.3 --rope-type split]

The real LTX-2 block (hidden 4096 = 32 x 128, audio 2048 = 32 x 64, bf16, random weights; nothing is
downloaded), `--layers` of them. One model forward captures the first block's inputs; each mode then
runs the block stack on them:

- eager: stock diffusers.
- patched: `xbackend.patch` (lossless tier). Its outputs must equal eager's bit for bit (torch.equal,
  every block's video and audio output).
- compile: `torch.compile` (inductor) of each stock block; the warm-up (first call) is reported apart.
- patched+compile (`--compile-patched`): the patched blocks compiled with fullgraph=True, xbackend ops as
  opaque custom-op nodes.
- `--graphs`: eager and patched stacks captured once as CUDA graphs and replayed (no host in the loop).
- `--profile`: torch.profiler tables (per-kernel GPU time, GPU busy time against wall) in patch_profile.txt.
- `--variant ltx2.3 --rope-type split`: LTX-2.3's blocks (adaLN cross-attention, gated attention, split
  RoPE: the q/k norms and split RoPE of self-attention become one qk_norm_rope).

Times are medians of triton.testing.do_bench (it clears the L2 between calls; every activation here is
larger than the H200's 60 MB L2 anyway: [1, 8160, 4096] bf16 is 67 MB). The bar it reports (`bar`): patched at
least 5% faster than eager and at least as fast as compile without its warm-up, bit-identical.
Writes $OUT/patch_check.json and prints a table last. Needs diffusers==0.42.1 on the machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# cuBLAS picks workspaces per stream; a fixed config keeps its reductions identical from call to call.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import xbackend  # noqa: E402

Block = torch.nn.Module
Outputs = list[tuple[torch.Tensor, torch.Tensor]]


def capture_block_inputs(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the model passes its first block (rotary embeddings, modulation, masks)."""
    captured: dict[str, Any] = {}
    handle = model.transformer_blocks[0].register_forward_pre_hook(
        lambda _m, _a, kwargs: captured.update(kwargs), with_kwargs=True
    )
    with torch.no_grad():
        model(**inputs)
    handle.remove()
    return captured


def run_stack(blocks: list[Block], kwargs: dict[str, Any]) -> Outputs:
    video, audio = kwargs["hidden_states"], kwargs["audio_hidden_states"]
    outs = []
    with torch.no_grad():
        for block in blocks:
            video, audio = block(**{**kwargs, "hidden_states": video, "audio_hidden_states": audio})
            outs.append((video, audio))
    return outs


def first_call(blocks: list[Block], kwargs: dict[str, Any]) -> tuple[Outputs, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    outs = run_stack(blocks, kwargs)
    torch.cuda.synchronize()
    return outs, time.perf_counter() - start


def bench_ms(blocks: list[Block], kwargs: dict[str, Any]) -> float:
    from triton.testing import do_bench

    return do_bench(lambda: run_stack(blocks, kwargs), warmup=100, rep=800, return_mode="median")


def graph_ms(blocks: list[Block], kwargs: dict[str, Any]) -> tuple[Outputs, float]:
    """The stack captured once in a CUDA graph, then replayed: what it costs with no host in the loop."""
    from triton.testing import do_bench

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run_stack(blocks, kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run_stack(blocks, kwargs)
    graph.replay()
    torch.cuda.synchronize()
    return outs, do_bench(graph.replay, warmup=200, rep=1500, return_mode="median")


def try_graph(row: dict[str, Any], name: str, blocks: list[Block], kwargs: dict[str, Any], ref: Outputs) -> None:
    try:
        outs, row[f"{name}_graph_ms"] = graph_ms(blocks, kwargs)
        row[f"{name}_graph"] = compare(outs, ref)
    except Exception as exc:  # a block that syncs the host cannot be captured: say so, keep going
        row[f"{name}_graph_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        torch.cuda.synchronize()


def profile(blocks: list[Block], kwargs: dict[str, Any], label: str, out: Path) -> dict[str, float]:
    """torch.profiler over 3 stack calls: per-kernel GPU time (top 20) and how busy the GPU was."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run_stack(blocks, kwargs)
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(3):
            run_stack(blocks, kwargs)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3 / 3
    events = prof.key_averages()
    kernel_ms = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA") / 1e3 / 3
    table = events.table(sort_by="self_cuda_time_total", row_limit=28, max_name_column_width=70)
    with (out / "patch_profile.txt").open("a") as f:
        f.write(f"== {label}: wall {wall_ms:.2f} ms/stack (profiled), GPU kernels {kernel_ms:.2f} ms/stack\n{table}\n")
    return {"profiled_wall_ms": wall_ms, "kernel_ms": kernel_ms}


def compare(outs: Outputs, ref: Outputs) -> dict[str, Any]:
    equal = all(
        torch.equal(a, b) for pair, ref_pair in zip(outs, ref, strict=True) for a, b in zip(pair, ref_pair, strict=True)
    )
    diff = max(
        (a.float() - b.float()).abs().max().item() for pair, ref_pair in zip(outs, ref, strict=True)
        for a, b in zip(pair, ref_pair, strict=True)
    )  # fmt: skip
    return {"bit_identical": equal, "max_abs_diff": diff}


def check_seq(
    seq: int, layers: int, compile_patched: bool, prof_out: Path | None, graphs: bool = False, rounds: int = 3,
    model_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Two identical models (same seed): one stays stock (eager, compiled), one is patched (eager,
    compiled with fullgraph). The modes are then timed in `rounds` interleaved rounds, so a drift of
    the GPU's clocks over the run hits every mode alike; each mode's time is its median over rounds."""
    import ltx2_transformer as example

    t0 = time.perf_counter()

    def note(what: str) -> None:  # progress on stderr: a run cut short by a timeout still says how far it got
        print(f"[seq {seq} +{time.perf_counter() - t0:6.1f} s] {what}", file=sys.stderr, flush=True)

    args = example.parse_args(["--device", "cuda", "--layers", str(layers), "--seq", str(seq), *model_args])
    model = example.build_model(args)
    kwargs = capture_block_inputs(model, example.make_inputs(args))
    stock = list(model.transformer_blocks)
    patched_model = example.build_model(args)
    report = xbackend.patch(patched_model)
    patched = list(patched_model.transformer_blocks)
    row: dict[str, Any] = {"seq": seq, "layers": layers, "hidden": args.hidden, "audio_seq": args.audio_seq,
                           "variant": args.variant, "rope_type": args.rope_type, "sites": report.counts(),
                           "rounds": rounds}  # fmt: skip

    note("models built, patched")
    ref, row["eager_first_s"] = first_call(stock, kwargs)
    outs, row["patched_first_s"] = first_call(patched, kwargs)
    row["patched"] = compare(outs, ref)
    modes: dict[str, list[Block]] = {"eager": stock, "patched": patched}
    torch._dynamo.reset()
    compiled = [torch.compile(b) for b in stock]
    outs, row["compile_warmup_s"] = first_call(compiled, kwargs)
    row["compile"] = compare(outs, ref)
    modes["compile"] = compiled
    note("compiled")
    if compile_patched:
        pc = [torch.compile(b, fullgraph=True) for b in patched]  # xbackend ops: opaque custom ops, no break
        outs, row["patched_compile_warmup_s"] = first_call(pc, kwargs)
        row["patched_compile"] = compare(outs, ref)
        modes["patched_compile"] = pc
        note("patched blocks compiled (fullgraph)")
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(rounds):
        for name, blocks in modes.items():
            times[name].append(bench_ms(blocks, kwargs))
        note(f"round: {', '.join(f'{n} {t[-1]:.2f} ms' for n, t in times.items())}")
    for name, ts in times.items():
        row[f"{name}_ms"] = statistics.median(ts)
        row[f"{name}_rounds_ms"] = ts
    row["patched_vs_compile_rounds"] = [c / p for c, p in zip(times["compile"], times["patched"], strict=True)]
    if graphs:
        try_graph(row, "eager", stock, kwargs, ref)
        try_graph(row, "patched", patched, kwargs, ref)
    if prof_out is not None:
        for name, blocks in modes.items():
            row[f"{name}_profile"] = profile(blocks, kwargs, f"{name} seq {seq}", prof_out)

    row["patched_speedup_vs_eager"] = row["eager_ms"] / row["patched_ms"]
    row["patched_speedup_vs_compile"] = row["compile_ms"] / row["patched_ms"]
    row["bar_met"] = (
        row["patched"]["bit_identical"]
        and row["patched_speedup_vs_eager"] >= 1.05
        and row["patched_speedup_vs_compile"] >= 1.0
    )
    del model, patched_model, stock, patched, modes, compiled, kwargs, ref, outs
    torch.cuda.empty_cache()
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'seq':>6} {'eager ms':>9} {'patched ms':>11} {'compile ms':>11} {'warm-up s':>10} "
            f"{'vs eager':>9} {'vs compile':>11} {'p+c ms':>8} {'e+graph':>8} {'p+graph':>8}  patched output        bar")  # fmt: skip
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['seq']:>6} error: {r['error']}")
            continue
        verdict = "bit-identical" if r["patched"]["bit_identical"] else f"DIFFERS {r['patched']['max_abs_diff']:.3g}"
        lines.append(
            f"{r['seq']:>6} {r['eager_ms']:>9.2f} {r['patched_ms']:>11.2f} {r['compile_ms']:>11.2f} "
            f"{r['compile_warmup_s']:>10.1f} {r['patched_speedup_vs_eager']:>8.3f}x {r['patched_speedup_vs_compile']:>10.3f}x "
            f"{r.get('patched_compile_ms', float('nan')):>8.2f} {r.get('eager_graph_ms', float('nan')):>8.2f} "
            f"{r.get('patched_graph_ms', float('nan')):>8.2f}  "
            f"{verdict:<21} {'met' if r['bar_met'] else 'NOT met'}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seqs", default="8160,32640")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"))
    p.add_argument("--compile-patched", action="store_true")
    p.add_argument("--profile", action="store_true", help="also write $OUT/patch_profile.txt (torch.profiler)")
    p.add_argument("--graphs", action="store_true", help="also time eager and patched stacks replayed as CUDA graphs")
    p.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per mode (median reported)")
    p.add_argument("--variant", choices=["ltx2.0", "ltx2.3"], default="ltx2.0")
    p.add_argument("--rope-type", choices=["interleaved", "split"], default="interleaved")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                              "torch": torch.__version__, "rows": []}  # fmt: skip
    if not torch.cuda.is_available() or importlib.util.find_spec("diffusers") is None:
        result["error"] = "needs a CUDA/ROCm GPU and diffusers==0.42.1"
        (out / "patch_check.json").write_text(json.dumps(result, indent=2))
        raise SystemExit(result["error"])
    import diffusers

    result["diffusers"] = diffusers.__version__
    for seq in (int(s) for s in args.seqs.split(",") if s):
        try:
            row = check_seq(
                seq, args.layers, args.compile_patched, out if args.profile else None, args.graphs, args.rounds,
                ("--variant", args.variant, "--rope-type", args.rope_type),
            )
        except Exception as exc:  # one failing size must not cost the others' numbers
            row = {"seq": seq, "error": f"{type(exc).__name__}: {exc}"}
            torch.cuda.empty_cache()
        result["rows"].append(row)
        (out / "patch_check.json").write_text(json.dumps(result, indent=2, default=str))
        print(json.dumps(row, default=str), flush=True)
    result["xbackend_report"] = xbackend.report().to_dict()
    (out / "patch_check.json").write_text(json.dumps(result, indent=2, default=str))
    print(table(result["rows"]))


if __name__ == "__main__":
    main()
