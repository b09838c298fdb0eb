#!/usr/bin/env python3
"""Render docs/performance.md from benchmarks/runs.json and the raw outputs it names.

    python benchmarks/render.py            # rewrite docs/performance.md
    python benchmarks/render.py --check    # exit 1 when docs/performance.md differs from a fresh render

Every table in docs/performance.md is computed here from a raw output under lab/results/ (the JSON a
benchmark wrote, or its console output where it wrote no JSON); the command, hardware, versions and
date of each run come from benchmarks/runs.json. The hardware and torch version a raw output records
itself are checked against the manifest, so a mislabelled run fails to render. tests/test_docs.py runs
``--check``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "benchmarks" / "runs.json"
OUTPUT = ROOT / "docs" / "performance.md"

# Top-level variants of an `xbackend bench` case; an impl row is indented by two spaces.
_BASE_VARIANTS = ("copy_", "eager", "compile", "xbackend", "dense SDPA (cuDNN)")
_GLOG = re.compile(r"^[WIEF]\d{4} |^\*{5,}|^There are modules in ")


# -- raw data -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchRow:
    """One row of `xbackend bench` output (its --json rows or its console table)."""

    case: str
    variant: str  # stripped
    impl: bool  # an impl forced by name (indented in the console table)
    us: float
    tbps: float
    tflops: float
    exact: bool | None
    accuracy: str | None  # attention: the guard's tolerance verdict
    vs_one_launch: float | None  # host rows at small shapes


def bench_rows_from_json(data: list[dict[str, Any]] | dict[str, Any]) -> list[BenchRow]:
    """Rows of `xbackend bench --json` (a list: impl rows indented by two spaces), or of a plugin's
    bench report in the same row format (``{"env": ..., "rows": [...]}``: variants stripped, impls
    named ``backend:impl``, the measured accuracy in the row, as the Liger plugin's bench_liger.py writes)."""
    rows = []
    for r in data["rows"] if isinstance(data, dict) else data:
        extra = r.get("extra") or r
        variant = r["variant"]
        name = variant.strip()
        impl = variant.startswith("  ") or (name not in _BASE_VARIANTS and not name.startswith("host:"))
        accuracy = extra.get("accuracy")
        exact = r.get("exact")
        if exact is None and accuracy is not None and not str(accuracy).startswith("rel_fro"):
            exact = accuracy == "exact"
        rows.append(BenchRow(r["case"], name, impl, float(r["us"]), float(r.get("tbps") or 0.0),
                             float(r.get("tflops") or 0.0), exact, accuracy, extra.get("vs_one_launch")))  # fmt: skip
    return rows


_US = re.compile(r"\s(\d+\.\d)(?=\s|$)")


def bench_rows_from_text(text: str) -> tuple[str | None, list[BenchRow]]:
    """The rows of `xbackend bench`'s console table (``format_table``), and its first line
    (``<device> | torch <version>``) when there is one."""
    lines = text.splitlines()
    header = lines[0].strip() if lines and "| torch" in lines[0] else None
    rows = []
    for line in lines:
        if not line.strip() or line.startswith("case ") or "| torch" in line:
            continue
        m = _US.search(line)
        if m is None:
            continue
        head, rest = line[: m.start(1)].rstrip(), line[m.end(1) :]
        case, variant, impl = _split_case_variant(head)
        # the fixed-width columns after µs: TB/s, TFLOP/s, %copy, vs eager, vs compile, exact
        tb, tf, verdict = rest[1:7].strip(), rest[8:16].strip(), rest[44:].strip()
        exact = {"yes": True, "NO": False}.get(verdict)
        accuracy = verdict if verdict.startswith("rel_fro") or "tolerance" in verdict else None
        m1 = re.fullmatch(r"(\d+\.\d+)x of 1 launch", verdict)
        rows.append(BenchRow(case, variant, impl, float(m.group(1)), float(tb or 0.0), float(tf or 0.0), exact,
                             accuracy, float(m1.group(1)) if m1 else None))  # fmt: skip
    return header, rows


def _split_case_variant(head: str) -> tuple[str, str, bool]:
    """``f"{case:<40} {variant:<26}"`` (rstripped) back into case, variant and whether it is an impl row."""
    for marker in (" host: ", " dense SDPA (cuDNN)"):
        i = head.find(marker)
        if i >= 0:
            return head[:i].rstrip(), head[i + 1 :].strip(), False
    case_part, _, variant = head.rpartition(" ")
    case = case_part.rstrip()
    gap = len(head) - len(variant) - len(case)  # spaces between the case and the variant name
    pad = max(0, 40 - len(case))
    return case, variant, gap - pad - 1 == 2


def _read(path: str) -> str:
    return (ROOT / path).read_text(encoding="utf-8")


def _paths(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


# -- formatting -----------------------------------------------------------------------------------
def _x(v: float) -> str:
    return f"{v:.2f}×"


def _us(v: float) -> str:
    return f"{v:.1f}"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return out


def _yes(v: bool | None) -> str:
    return "—" if v is None else ("yes" if v else "no")


# -- renderers: one per kind of raw output ------------------------------------------------------------
def _check_header(run: dict[str, Any], device: str | None, torch_version: str | None, software: dict[str, str],
                  where: str) -> None:  # fmt: skip
    if device is not None and device not in run["hardware"]:
        raise ValueError(f"{run['id']}: {where} records device {device!r}, runs.json says {run['hardware']!r}")
    if torch_version is not None and torch_version != software["torch"]:
        raise ValueError(f"{run['id']}: {where} records torch {torch_version!r}, runs.json says {software['torch']!r}")


def _check_env(run: dict[str, Any], env: dict[str, Any], software: dict[str, str]) -> None:
    """A plugin report's own record of where it ran (device, torch, Triton) against runs.json."""
    _check_header(run, env.get("device"), env.get("torch"), software, run["data"])
    triton = str(env.get("triton", software["triton"]))
    if not (triton == software["triton"] or triton.startswith(software["triton"] + ".")):
        raise ValueError(f"{run['id']}: {run['data']} records Triton {triton!r}, runs.json says {software['triton']!r}")


def _load_bench(run: dict[str, Any], software: dict[str, str]) -> list[BenchRow]:
    text_path = _paths(run.get("text"))
    if text_path:
        header, text_rows = bench_rows_from_text(_read(text_path[0]))
        if header:
            device, _, torch_part = header.partition(" | torch ")
            _check_header(run, device.strip(), torch_part.strip(), software, text_path[0])
    if run.get("data"):
        data = json.loads(_read(run["data"]))
        if isinstance(data, dict) and "env" in data:
            _check_env(run, data["env"], software)
        rows = bench_rows_from_json(data)
    else:
        rows = text_rows
    if run.get("cases"):
        rows = [r for r in rows if any(c in r.case for c in run["cases"])]
    if not rows:
        raise ValueError(f"{run['id']}: no rows in {run.get('data') or text_path}")
    return rows


def _by_case(rows: list[BenchRow]) -> dict[str, list[BenchRow]]:
    cases: dict[str, list[BenchRow]] = {}
    for r in rows:
        cases.setdefault(r.case, []).append(r)
    return cases


def render_bench(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    return bench_table(_load_bench(run, software))


def bench_table(rows: list[BenchRow]) -> list[str]:
    """The markdown of one `xbackend bench` run: one row per case (attention: one per variant), and the
    host-inclusive rows of the small shapes when the run has them."""
    cases = _by_case(rows)
    if any(r.variant == "dense SDPA (cuDNN)" for r in rows):
        return _render_attention(cases)
    # The impls column says something where a case has several impls, or one that is not exact.
    show_impls = any(len([r for r in rs if r.impl]) > 1 or any(r.impl and r.exact is False for r in rs)
                     for rs in cases.values())  # fmt: skip
    out_rows = []
    for case, rs in cases.items():
        by = {r.variant: r for r in rs if not r.impl and not r.variant.startswith("host:")}
        copy_, eager, comp, xb = (by.get(k) for k in ("copy_", "eager", "compile", "xbackend"))
        row = [
            case,
            f"**{_us(xb.us)}**" if xb else "—",
            f"{100 * copy_.us / xb.us:.0f}%" if copy_ and xb else "—",
            _x(comp.us / xb.us) if comp and xb else "—",
            _x(eager.us / xb.us) if eager and xb else "—",
            f"{_yes(xb.exact) if xb else '—'} ({_yes(comp.exact) if comp else '—'})",
        ]
        if show_impls:
            row.append(", ".join(f"{r.variant} {_us(r.us)}{_accuracy_note(r)}" for r in rs if r.impl) or "—")
        out_rows.append(row)
    header = ["case", "xbackend µs", "% of copy_", "vs compile", "vs eager", "exact (compile)"]
    lines = _table(header + (["impls forced, µs"] if show_impls else []), out_rows)
    host = []
    for case, rs in cases.items():
        one = next((r for r in rs if r.variant == "host: 1 eager launch"), None)
        call = next((r for r in rs if r.variant == "host: xbackend call"), None)
        if one and call:
            ratio = call.vs_one_launch if call.vs_one_launch is not None else call.us / one.us
            host.append([case, _us(one.us), _us(call.us), _x(ratio)])
    if host:
        lines += ["", "Host-inclusive time per call at the small shapes (`no_grad`, bursts interleaved):", ""]
        lines += _table(["case", "one eager launch µs", "xbackend call µs", "xbackend / one launch"], host)
    return lines


def _accuracy_note(r: BenchRow) -> str:
    """How an impl row's output compares with the reference, when it is not bit-exact."""
    if r.exact is False:
        return f" ({r.accuracy})" if r.accuracy else " (not exact)"
    return ""


def _render_attention(cases: dict[str, list[BenchRow]]) -> list[str]:
    out = []
    for case, rs in cases.items():
        dense = next(r for r in rs if r.variant == "dense SDPA (cuDNN)")
        for r in rs:
            out.append([case, f"↳ {r.variant}" if r.impl else r.variant, f"{r.us / 1e3:.2f}",
                        f"{r.tflops:.1f}", _x(dense.us / r.us), r.accuracy or "—"])  # fmt: skip
    return _table(["case", "variant", "ms", "useful TFLOP/s", "vs dense SDPA", "accuracy (guard)"], out)


_DISPATCH = re.compile(r"^\s+(impl called directly|get_op\('(?P<op>\w+)'\)|overhead)\s+(?P<us>[\d.]+) µs/call")


def render_dispatch(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    rows = []
    for path in _paths(run["text"]):
        text = _read(path)
        # The output's first line records where it ran: "# xbackend bench dispatch; <host>, torch <version>, ..."
        recorded = re.search(r"\btorch (\S+?),", text.splitlines()[0])
        _check_header(run, None, recorded.group(1) if recorded else None, software, path)
        found = {}
        for line in text.splitlines():
            m = _DISPATCH.match(line)
            if m:
                found[m.group(1).split("(")[0]] = m.group("us")
                if m.group("op"):
                    found["op"] = m.group("op")
        keys = next((ln.split("keys:", 1)[1].split("(")[0].strip() for ln in text.splitlines() if "keys:" in ln), "—")
        rows.append([keys, found["impl called directly"], f"{found['get_op']} (`{found['op']}`)", found["overhead"]])
    return _table(["keys", "impl called directly µs", "get_op(...)(...) µs", "overhead µs"], rows)


def render_patch_check(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    def same(d: dict[str, Any]) -> str:
        return "bit-identical" if d["bit_identical"] else f"max {d['max_abs_diff']}"

    rows, commands = [], []
    for path in _paths(run["data"]):
        data = json.loads(_read(path))
        _check_header(run, data.get("device"), data.get("torch"), software, path)
        for r in data["rows"]:
            variant, rope = r.get("variant", "ltx2.0"), r.get("rope_type", "interleaved")
            label = f"{'LTX-2.3' if variant == 'ltx2.3' else 'LTX-2.0'} ({rope} RoPE), {r['seq']} tokens"
            pc = r.get("patched_compile_ms")
            rounds = " / ".join(f"{v:.3f}" for v in r["patched_vs_compile_rounds"])
            outputs = [same(r["patched"]), same(r["compile"])] + ([same(r["patched_compile"])] if pc is not None else [])
            rows.append([
                label,
                f"{r['eager_ms']:.2f}",
                f"**{r['patched_ms']:.2f}**",
                f"{r['compile_ms']:.2f} ({r['compile_warmup_s']:.1f} s)",
                f"{pc:.2f}" if pc is not None else "—",
                f"{r['compile_ms'] / r['patched_ms']:.3f}× ({rounds})",
                " / ".join(outputs),
            ])  # fmt: skip
            flags = [f"--layers {r['layers']}", f"--seqs {r['seq']}"] + (["--compile-patched"] if pc is not None else [])
            flags.append(f"--rounds {r['rounds']}")
            if (variant, rope) != ("ltx2.0", "interleaved"):
                flags += [f"--variant {variant}", f"--rope-type {rope}"]
            commands.append(flags)
    lines = _table(["blocks", "eager ms", "patched ms", "compile ms (warm-up)", "patched + compile ms",
                    "patched vs compile (rounds)", "vs eager: patched / compile / both"], rows)  # fmt: skip
    # The flags every row's run shares, then each row's own.
    common = [f for f in commands[0] if all(f in c for c in commands)]
    own = "; ".join(f"`{' '.join(f for f in c if f not in common)}`" for c in commands)
    return lines + ["", f"Medians of interleaved rounds in one process; flags `{' '.join(common)}`, and by row {own}."]


def render_example_table(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    lines = [ln for ln in _read(_paths(run["text"])[0]).splitlines() if not _GLOG.match(ln)]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("mode "))
    body = []
    for ln in lines[start + 1 :]:
        if not ln.strip():
            break
        body.append(re.split(r"\s{2,}", ln.strip()))
    header = re.split(r"\s{2,}", lines[start].strip())
    return _table(header, body)


def render_diffvae_decode(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    """benchmarks/diffvae_decode.py's JSON: decode time per patch mode, bit-identity to the
    attention-only mode, and where the CUDA time of the last profiled mode goes, by kernel family."""
    data = json.loads(_read(run["data"]))
    _check_header(run, data["device"], data["torch"], software, run["data"])
    modes = data["modes"]
    base = modes["attention only"]["seconds"]
    rows, before = [], {}
    for m, r in modes.items():
        grows = bool(before) and all(r["sites"].get(k) == n for k, n in before.items())
        sites = ", ".join(f"{k} {n}" for k, n in r["sites"].items() if not grows or k not in before)
        rows.append([f"`{m}`", f"+ {sites}" if grows else sites, f"{r['seconds']:.3f} s", _x(base / r["seconds"]),
                     r["vs attention only"]])  # fmt: skip
        before = r["sites"]
    out = _table(["patch", "sites (+: added to the row above)", "decode (median)", "vs attention only",
                  "output vs attention only"], rows)  # fmt: skip
    mode, prof = list(data["profiles"].items())[-1]
    total = prof["total_ms"]
    shares = sorted(((ms, fam) for fam, ms, _ in prof["rows"] if ms >= 0.05 * total), reverse=True)
    parts = ", ".join(f"{fam} {100 * ms / total:.0f}%" for ms, fam in shares)
    return [*out, "", f"CUDA time of one `{mode}` decode ({total:.0f} ms, `torch.profiler`) by kernel family: {parts}."]


def render_na_sol(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    """benchmarks/na_sol.py's JSON: each case against its speed of light (dense SDPA's rate per useful
    FLOP), with the share of the kernel's computed query-key pairs that are useful."""
    data = json.loads(_read(run["data"]))
    _check_header(run, data["device"], data["torch"], software, run["data"])
    rows = []
    for r in data["rows"]:
        c = r["case"]
        if run.get("cases") and not any(name in c["name"] for name in run["cases"]):
            continue
        shape = f"{'×'.join(map(str, c['spatial']))}, {c['heads']} × {c['dim']}, window {'×'.join(map(str, c['kernel']))}"
        if c.get("stride"):
            shape += f", stride {'×'.join(map(str, c['stride']))}"
        rows.append([f"{c['name']} ({shape})", f"`{r['impl']}`", f"{r['ms']:.3f} ms", f"{r['useful_tflops']:.0f}",
                     f"**{r['pct_sol']:.0f}%**",
                     f"{100 * r['triton_useful_of_computed']:.0f}%" if r["impl"].endswith("na_triton") else "–", f"{r['rel_err']:.4f}"])  # fmt: skip
    return _table(["case", "impl", "time", "useful TFLOP/s", "of SOL", "useful / computed pairs", "rel. error"], rows)


_TRANSFORMER_MODES = {"eager": "eager", "patched": "patched", "compile": "compile",
                      "patched_compile": "patched + compile"}  # fmt: skip


def render_transformer(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    """benchmarks/transformer_check.py's JSON, one table per family (data file): each mode of the whole
    model forward, its first call, its output against eager's; the bars, and the fresh-process first
    calls when the run has them."""
    out: list[str] = []
    for path in _paths(run["data"]):
        data = json.loads(_read(path))
        if data.get("schema_version") != 1:
            raise ValueError(f"{run['id']}: {path} has schema_version {data.get('schema_version')!r}, expected 1")
        _check_env(run, {k: data.get(k) for k in ("device", "torch", "triton")}, software)
        sites = ", ".join(f"{k} {n}" for k, n in data["patch"]["counts"].items()) or "none"
        out += [*([""] if out else []),
                f"**{data['title']}**{', tiny config' if data['smoke'] else ''}: `{data['model_class']}`, "
                f"{data['layers']} layers, {data['tokens']:,} tokens + {data['text_tokens']} text, {data['dtype']}, "
                f"{data['compile_backend']}; patched sites: {sites}.", ""]  # fmt: skip
        rows = []
        for r in data["rows"]:
            label = _TRANSFORMER_MODES[r["mode"]]
            if "fullgraph" in r:
                label += " (fullgraph)" if r["fullgraph"] else " (graph breaks)"
            if "error" in r:
                rows.append([label, "—", "—", "—", "—", f"error: {r['error'][:120]}"])
                continue
            ms = r.get("median_ms")
            rows.append([
                label,
                "—" if ms is None else f"**{ms:.2f}**" if r["mode"] == "patched" else f"{ms:.2f}",
                _x(r["vs_eager"]) if "vs_eager" in r else "—",
                _x(r["vs_compile"]) if "vs_compile" in r else "—",
                f"{r['first_call_s']:.1f}",
                "reference" if r["mode"] == "eager" else "bit-identical" if r["bit_identical"]
                else f"max {r['max_abs_diff']:.3g}",
            ])  # fmt: skip
        out += _table(["mode", "median ms", "vs eager", "vs compile", "first call s", "output vs eager"], rows)
        breaks = [r["fullgraph_error"] for r in data["rows"] if r.get("fullgraph_error")]
        if breaks:
            out += ["", f"Patched + compile is not one graph: `{breaks[0][:200]}`."]
        if "bars" in data:
            out += ["", "Bars: " + "; ".join(_transformer_bar(name, b) for name, b in data["bars"].items()) + "."]
        if "first_call" in data:
            out += ["", _transformer_first_call(data["first_call"])]
    return out


def _transformer_bar(name: str, bar: dict[str, Any]) -> str:
    label = {"patched_bit_identical": "patched bit-identical", "patched_vs_compile": "patched vs compile",
             "patched_compile_vs_compile": "patched + compile vs compile"}[name]  # fmt: skip
    value = bar["value"]
    shown = "" if isinstance(value, bool) or value is None else f" {_x(value)} (≥ {_x(bar['need'])})"
    return f"{label}{shown}: {'met' if bar['met'] else 'not met'}"


def _transformer_first_call(fc: dict[str, Any]) -> str:
    def total(label: str) -> str:
        r = fc.get(label, {})
        return f"{r['total_s']:.1f} s" if "total_s" in r else r.get("error", "not run")

    if "delta_s" not in fc:
        return f"First call in fresh processes: eager {total('eager')}, patched {total('patched')}: not met."
    return (f"First call in fresh processes (`--first-call`): eager {total('eager')}, patched {total('patched')} "
            f"with an empty Triton cache ({fc['delta_s']:+.1f} s; bar ≤ {fc['bar_s']:.0f} s: "
            f"{'met' if fc['met'] else 'not met'}), {total('patched_warm')} with the cache it filled.")  # fmt: skip


RENDERERS: dict[str, Callable[[dict[str, Any], dict[str, str]], list[str]]] = {
    "bench": render_bench,
    "dispatch": render_dispatch,
    "patch_check": render_patch_check,
    "example_table": render_example_table,
    "diffvae_decode": render_diffvae_decode,
    "na_sol": render_na_sol,
    "transformer": render_transformer,
}


# -- the page -----------------------------------------------------------------------------------
INTRO = """\
# Performance

<!-- Generated by `python benchmarks/render.py` from benchmarks/runs.json and the raw outputs under
lab/results/. Do not edit by hand: tests/test_docs.py fails when this page and the data disagree. -->

Under each title: the run's command, hardware, versions, date and raw file.

**Method** (`xbackend bench`): CUDA-event device time, inputs rotated through more than the L2; a
case's variants (`copy_` of the same bytes, eager, `torch.compile`, xbackend, each impl forced by name)
sampled in turn, 50 samples each (20 with `--quick`), medians. A sample is 4-64 back-to-back calls
queued behind a GPU sleep. `exact`: `torch.equal` to the reference. `% of copy_`: `copy_`'s time over
xbackend's.

**Reproducing**, on a GPU: `bash benchmarks/run_bench.sh` (the `xbackend bench` and `na_sol.py`
tables), `bash benchmarks/run_models.sh` (LTX-2 blocks); the rest as written. To publish, add the raw
output under `lab/results/<gpu>/` and its entry to `benchmarks/runs.json`, then run `python benchmarks/render.py`.

**Cases**: `[B,L,D]` is x's shape; gates `bcast` `[1,1,D]`, `full`, `token` `[B,L,1]`; `mod[...]`:
scale/shift; `hN`: N heads. Attention's useful FLOPs: 4 · tokens · window volume · head_dim · heads.
"""


def _provenance(run: dict[str, Any], software: dict[str, str]) -> str:
    """The table's one-line header: command, hardware, versions, date, and the raw output it is computed from."""
    raw = _paths(run.get("data")) or _paths(run.get("text"))
    return (f"`{run['command']}` · {run['hardware']} · torch {software['torch']}, Triton {software['triton']} · "
            f"{run['date']} · raw: {', '.join(f'`{p}`' for p in raw)}")  # fmt: skip


def render(manifest: dict[str, Any] | None = None) -> str:
    manifest = manifest if manifest is not None else json.loads(MANIFEST.read_text(encoding="utf-8"))
    out = [INTRO.rstrip("\n")]
    for run in manifest["runs"]:
        # A run on other software (a CPU run of the host-side bench) names its versions itself.
        software = {**manifest["software"], **run.get("software", {})}
        out += ["", f"## {run['title']}", "", _provenance(run, software), ""]
        out += RENDERERS[run["renderer"]](run, software)
        if run.get("note"):
            out += ["", run["note"]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/performance.md is not up to date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print(f"{OUTPUT.relative_to(ROOT)} is out of date: run python benchmarks/render.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
