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
import statistics
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
    out_rows = []
    for case, rs in cases.items():
        by = {r.variant: r for r in rs if not r.impl and not r.variant.startswith("host:")}
        copy_, eager, comp, xb = (by.get(k) for k in ("copy_", "eager", "compile", "xbackend"))
        impls = ", ".join(f"{r.variant} {_us(r.us)}{_accuracy_note(r)}" for r in rs if r.impl)
        out_rows.append([
            case,
            _us(copy_.us) if copy_ else "—",
            _us(eager.us) if eager else "—",
            _us(comp.us) if comp else "—",
            f"**{_us(xb.us)}**" if xb else "—",
            f"{100 * copy_.us / xb.us:.0f}%" if copy_ and xb else "—",
            _x(eager.us / xb.us) if eager and xb else "—",
            _x(comp.us / xb.us) if comp and xb else "—",
            _yes(xb.exact) if xb else "—",
            _yes(comp.exact) if comp else "—",
            impls or "—",
        ])  # fmt: skip
    lines = _table(["case", "copy_ µs", "eager µs", "compile µs", "xbackend µs", "% of copy_", "vs eager",
                    "vs compile", "xbackend exact", "compile exact", "impls forced, µs"], out_rows)  # fmt: skip
    host = []
    for case, rs in cases.items():
        one = next((r for r in rs if r.variant == "host: 1 eager launch"), None)
        call = next((r for r in rs if r.variant == "host: xbackend call"), None)
        if one and call:
            ratio = call.vs_one_launch if call.vs_one_launch is not None else call.us / one.us
            host.append([case, _us(one.us), _us(call.us), _x(ratio)])
    if host:
        lines += ["", "Host-inclusive time per call at the small shapes, against one eager `torch.add` launch "
                  "(under `no_grad`, bursts of calls interleaved between the two):", ""]  # fmt: skip
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


_NA_QUICK = re.compile(r"^(?P<case>.+?): device (?P<dev>[\d.]+) ms = (?P<tf>[\d.]+) useful TFLOP/s; "
                       r"host-inclusive (?P<host>[\d.]+) ms$")  # fmt: skip
_REPORT = re.compile(r"^\s+neighborhood_attention\s.*?\s(?P<impl>[\w-]+:[\w-]+)\s+(?P<status>\S.*)$")


def render_na_quick(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    text = _read(_paths(run["text"])[0])
    timed = [m for m in map(_NA_QUICK.match, text.splitlines()) if m]
    report = [m for m in map(_REPORT.match, text.splitlines()) if m]
    if not timed or len(report) != len(timed):
        raise ValueError(f"{run['id']}: expected one report line per timed case in {run['text']}")
    rows = [[t["case"], t["dev"], t["tf"], t["host"], f"`{r['impl']}`", r["status"]]
            for t, r in zip(timed, report, strict=True)]  # fmt: skip
    return _table(["case", "device ms", "useful TFLOP/s", "host-inclusive ms", "impl", "guard"], rows)


_PDL_LABELS = {
    "copy_": "`copy_` of the same bytes",
    "compile": "torch.compile",
    "compile (inductor enable_pdl)": "torch.compile with inductor's `triton.enable_pdl`",
    "production": "**xbackend kernel as shipped** (2 rows per 8-warp program, PDL)",
    "r=2 warps=8": "same schedule without PDL",
    "r=2 warps=8 pdl=1": "same schedule with PDL (the script's copy)",
    "variant default": "1 row per 4-warp program, no PDL",
    "pdl=1": "1 row per 4-warp program, PDL",
}


def render_pdl(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    data = json.loads(_read(run["data"]))
    calls = sorted({r["calls"] for r in data["rounds"]})
    names = [k for k in data["rounds"][0] if k not in ("calls", "round")]
    med = {(n, c): statistics.median(r[n] for r in data["rounds"] if r["calls"] == c) for n in names for c in calls}
    rows = []
    for n in names:
        row = [_PDL_LABELS.get(n, n)]
        for c in calls:
            row += [_us(med[(n, c)]), _x(med[("compile", c)] / med[(n, c)])]
        row.append(_yes(data["exact"].get(n)) if n in data["exact"] else "—")
        rows.append(row)
    header = ["variant"] + [h for c in calls for h in (f"µs, {c} calls", f"vs compile, {c} calls")] + ["exact"]
    return _table(header, rows)


_DISPATCH = re.compile(r"^\s+(impl called directly|get_op\('(?P<op>\w+)'\)|overhead)\s+(?P<us>[\d.]+) µs/call")


def render_dispatch(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    rows = []
    for path in _paths(run["text"]):
        text = _read(path)
        found = {}
        for line in text.splitlines():
            m = _DISPATCH.match(line)
            if m:
                found[m.group(1).split("(")[0]] = m.group("us")
                if m.group("op"):
                    found["op"] = m.group("op")
        keys = next((ln.split("keys:", 1)[1].split("(")[0].strip() for ln in text.splitlines() if "keys:" in ln), "—")
        rows.append([f"`{path}`", f"`{found['op']}`", found["impl called directly"], found["get_op"],
                     found["overhead"], keys])  # fmt: skip
    return _table(["raw output", "op", "impl called directly µs", "get_op(...)(...) µs", "overhead µs", "keys"], rows)


def render_patch_check(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    rows, commands = [], []
    for path in _paths(run["data"]):
        data = json.loads(_read(path))
        _check_header(run, data.get("device"), data.get("torch"), software, path)
        for r in data["rows"]:
            variant, rope = r.get("variant", "ltx2.0"), r.get("rope_type", "interleaved")
            label = f"{'LTX-2.3' if variant == 'ltx2.3' else 'LTX-2.0'} ({rope} RoPE), {r['seq']} tokens"
            pc = r.get("patched_compile_ms")
            rounds = " / ".join(f"{v:.3f}" for v in r["patched_vs_compile_rounds"])
            rows.append([
                label,
                f"`{Path(path).stem}`, {r['rounds']} rounds",
                f"{r['eager_ms']:.2f}",
                f"**{r['patched_ms']:.2f}**",
                f"{r['compile_ms']:.2f} ({r['compile_warmup_s']:.1f} s)",
                f"{pc:.2f}" if pc is not None else "—",
                _x(r["eager_ms"] / r["patched_ms"]),
                f"{r['compile_ms'] / r['patched_ms']:.3f}× ({rounds})",
                f"{r['compile_ms'] / pc:.3f}×" if pc is not None else "—",
                "bit-identical" if r["patched"]["bit_identical"] else f"differs, max {r['patched']['max_abs_diff']}",
                "bit-identical" if r["compile"]["bit_identical"] else f"differs, max {r['compile']['max_abs_diff']}",
                "bit-identical" if pc is not None and r["patched_compile"]["bit_identical"]
                else (f"differs, max {r['patched_compile']['max_abs_diff']}" if pc is not None else "—"),
            ])  # fmt: skip
            flags = f" --variant {variant} --rope-type {rope}" if (variant, rope) != ("ltx2.0", "interleaved") else ""
            cp = " --compile-patched" if pc is not None else ""
            commands.append(f"- `{Path(path).stem}`: `{run['command']} --layers {r['layers']} --seqs {r['seq']}{cp} "
                            f"--rounds {r['rounds']}{flags}` → `{path}`")  # fmt: skip
    lines = _table(["blocks", "run", "eager ms", "xbackend.patch ms", "torch.compile ms (warm-up)", "patched + compile ms",
                    "patched vs eager", "patched vs compile (per round)", "patched + compile vs compile",
                    "patched output", "compile output", "patched + compile output"], rows)  # fmt: skip
    return lines + ["", "Commands (each row: medians of interleaved rounds in one process):", "", *commands]


def render_example_table(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    lines = [ln for ln in _read(_paths(run["text"])[0]).splitlines() if not _GLOG.match(ln)]
    start = next(i for i, ln in enumerate(lines) if ln.startswith("mode "))
    caption = [ln.strip() for ln in lines[:start] if ln.strip()]
    body = []
    for ln in lines[start + 1 :]:
        if not ln.strip():
            break
        body.append(re.split(r"\s{2,}", ln.strip()))
    header = re.split(r"\s{2,}", lines[start].strip())
    return [*(f"`{c}`  " for c in caption), "", *_table(header, body)]


def render_plugin_classify(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    """A plugin's precision classification (bench_liger.py --classify): per impl and dtype, the largest
    ulp distance and relative Frobenius error over its case catalogue, and the tier that admits it."""
    data = json.loads(_read(run["data"]))
    _check_env(run, data["env"], software)
    rows = []
    for r in data["summary"]:
        rows.append([f"`{r['impl']}`", r["dtype"].removeprefix("torch."), str(r["cases"]), "yes" if r["exact"] else "no",
                     str(r["max_ulp"]), f"{r['max_rel_fro']:.1e}", f"`{r['contract']}`",
                     "yes" if r["registered_dtype"] else "no", "yes" if r["holds"] else "no", f"`{r['tier']}`"])  # fmt: skip
    lines = [f"{k} {data['env'][k]}" for k in ("liger_kernel",) if k in data["env"]]
    caption = [f"`{' · '.join(lines).replace('_', '-')}`", ""] if lines else []
    return caption + _table(["impl", "dtype", "cases", "exact", "max ulp", "max rel. Frobenius", "contract",
                             "registered for dtype", "contract holds", "tier admitted"], rows)  # fmt: skip


def render_diffvae_decode(run: dict[str, Any], software: dict[str, str]) -> list[str]:
    """benchmarks/diffvae_decode.py's JSON: decode time per patch mode, bit-identity to the
    attention-only mode, and the CUDA time by kernel family of the profiled modes side by side."""
    data = json.loads(_read(run["data"]))
    _check_header(run, data["device"], data["torch"], software, run["data"])
    modes = data["modes"]
    base = modes["attention only"]["seconds"]
    rows = [[f"`{m}`", ", ".join(f"{k} {n}" for k, n in r["sites"].items()), f"{r['seconds']:.3f} s",
             _x(base / r["seconds"]), r["vs attention only"]] for m, r in modes.items()]  # fmt: skip
    out = _table(["patch", "sites", "decode (median)", "vs attention only", "output vs attention only"], rows)
    profiles = data["profiles"]
    names = list(profiles)
    families = list(dict.fromkeys(f for p in profiles.values() for f, _, _ in p["rows"]))
    got = {m: {f: ms for f, ms, _ in p["rows"]} for m, p in profiles.items()}
    prow = [[fam, *(f"{got[m].get(fam, 0.0):.0f} ms ({100 * got[m].get(fam, 0.0) / profiles[m]['total_ms']:.0f}%)"
                    for m in names)] for fam in families]  # fmt: skip
    prow.append(["**CUDA total**", *(f"**{profiles[m]['total_ms']:.0f} ms**" for m in names)])
    return [*out, "", "CUDA time of one decode by kernel family (`torch.profiler`, kernel names matched in order):", "",
            *_table(["kernel family", *(f"`{m}`" for m in names)], prow)]  # fmt: skip


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
                     f"{r['dense_ms']:.2f} ms", _x(r["flop_ratio"]), f"{r['sol_ms']:.3f} ms", f"**{r['pct_sol']:.0f}%**",
                     f"{100 * r['triton_useful_of_computed']:.0f}%" if r["impl"].endswith("na_triton") else "–", f"{r['rel_err']:.4f}"])  # fmt: skip
    return _table(["case", "impl", "time", "useful TFLOP/s", "dense SDPA", "FLOP ratio", "speed of light", "of SOL",
                   "useful / computed pairs", "rel. error"], rows)  # fmt: skip


RENDERERS: dict[str, Callable[[dict[str, Any], dict[str, str]], list[str]]] = {
    "bench": render_bench,
    "na_quick": render_na_quick,
    "pdl": render_pdl,
    "dispatch": render_dispatch,
    "patch_check": render_patch_check,
    "example_table": render_example_table,
    "plugin_classify": render_plugin_classify,
    "diffvae_decode": render_diffvae_decode,
    "na_sol": render_na_sol,
}


# -- the page -----------------------------------------------------------------------------------
INTRO = """\
# Performance

<!-- Generated by `python benchmarks/render.py` from benchmarks/runs.json and the raw outputs under
lab/results/. Do not edit by hand: tests/test_docs.py fails when this page and the data disagree. -->

Every table below is rendered from the raw output of one run, named under it with the command that
reproduces it, the hardware, the software versions and the date. Nothing here ran on an AMD GPU or
on Blackwell (see the README's hardware table).

**How the kernels are timed** (`xbackend bench`, `xbackend/bench/`): device time per call, CUDA
events, inputs rotated through enough copies to exceed the L2. Every variant of a case (`copy_` of
the same bytes, eager PyTorch, `torch.compile`, xbackend's dispatch, each eligible impl forced by
name) is sampled in turn, one sample of each, 50 samples per variant (20 with `--quick`), medians.
A sample is 4–64 back-to-back calls sized to about 200 µs of device time, queued behind a GPU sleep
that outlasts the host's enqueueing, so a 3 µs kernel is timed over 64 launches. `exact` means
`torch.equal` to the op's eager reference on the same GPU; `% of copy_` is `copy_`'s time over
xbackend's for the same bytes (above 100% where a kernel moves fewer bytes than the copy, such as a
broadcast gate read once).

**Reproducing.** On a GPU machine, from the repository root: `bash benchmarks/run_bench.sh` runs
the command of every `xbackend bench` table and of the `na_quick.py` and `na_sol.py` tables;
`bash benchmarks/run_models.sh` the LTX-2 block table (`benchmarks/patch_check.py`, needs diffusers
0.42.1); the example commands run as written. A table whose command names a commit holds numbers
measured at that checkout. Outputs land in `$OUT`. To publish a run: copy its outputs under
`lab/results/<gpu>/`, point its entry in `benchmarks/runs.json` at them (command, hardware, date), and
run `python benchmarks/render.py`.

Case names of `xbackend bench` (`xbackend/bench/cases.py`): `[B,L,D]` is x's shape; gated residual
gates are `bcast` `[1,1,D]`, `full` (x's shape) or `token` `[B,L,1]`; `mod[...]` is the modulation's
scale/shift shape; `fp32 freqs` means fp32 cos/sin against a bf16 x; `hN` is N heads (split RoPE,
cos/sin `[1,N,L,D/N/2]`); attention cases are `spatial hHEADS dHEAD_DIM wWINDOW`, with useful
FLOPs = 4 · tokens · window volume · head_dim · heads.
"""


def _provenance(run: dict[str, Any], software: dict[str, str]) -> str:
    raw = [*_paths(run.get("data")), *_paths(run.get("text"))]
    raw_s = ", ".join(f"`{p}`" for p in dict.fromkeys(raw))
    return (f"`{run['command']}` · {run['hardware']} · torch {software['torch']} (CUDA {software['cuda']}), "
            f"Triton {software['triton']} · {run['date']} · raw: {raw_s}")  # fmt: skip


def _pdl_note(manifest: dict[str, Any]) -> list[str]:
    """What the PDL table means for the pointwise table's norm rows, computed from both runs."""
    runs = {r["id"]: r for r in manifest["runs"]}
    if "rmsnorm_pdl" not in runs:
        return []
    data = json.loads(_read(runs["rmsnorm_pdl"]["data"]))
    med = lambda n: statistics.median(r[n] for r in data["rounds"])  # noqa: E731
    shipped, plain, comp = med("production"), med("r=2 warps=8"), med("compile")
    comp_pdl = med("compile (inductor enable_pdl)")
    return [
        "",
        "The exact RMSNorm kernels launch with programmatic dependent launch (PDL) on sm90+: each program",
        "waits on the previous grid (`griddepcontrol.wait`) before its first load and lets the next launch",
        "start, so back-to-back launches overlap the next kernel's launch and ramp-up with this one's tail.",
        "`xbackend bench` times back-to-back calls of one op and so counts that overlap; torch.compile's",
        "kernel launches without PDL there. In this run (medians over every round and burst length) the",
        f"shipped kernel runs at {_x(comp / shipped)} compile's speed and the same schedule without PDL at",
        f"{_x(comp / plain)}; against compile with inductor's own PDL switch ({_us(comp_pdl)} µs) the shipped",
        f"kernel runs at {_x(comp_pdl / shipped)}. In a model the norm usually follows a kernel launched",
        "without PDL, which ends before the norm starts, so there the overlap is mostly lost.",
    ]


def render(manifest: dict[str, Any] | None = None) -> str:
    manifest = manifest if manifest is not None else json.loads(MANIFEST.read_text(encoding="utf-8"))
    software = manifest["software"]
    out = [INTRO.rstrip("\n")]
    for run in manifest["runs"]:
        out += ["", f"## {run['title']}", "", _provenance(run, software), ""]
        out += RENDERERS[run["renderer"]](run, software)
        if run.get("note"):
            out += ["", run["note"]]
        if run["id"] == "rmsnorm_pdl":
            out += _pdl_note(manifest)
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
