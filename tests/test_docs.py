"""The documentation against the data and the code it describes.

- docs/performance.md is what ``benchmarks/render.py`` renders from benchmarks/runs.json and the raw
  outputs under lab/results/ (so text and data cannot drift);
- the README stays a user's guide: at most 12 KiB, its test command is the one ``.ci/run`` runs, and it
  (and the docs written with it) carry no development history;
- every relative link of the README and docs/ resolves, and nothing points at the pre-``lab/`` paths.

The same history check over the other docs and over the comments and docstrings of xbackend/ and
backends/ is a report only (printed, never failed): ``python tests/test_docs.py`` prints it, as does
``pytest -s tests/test_docs.py``.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import io
import json
import re
import shlex
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
README_MAX_BYTES = 12 * 1024

# Development history: numbered work periods and tracker references.
HISTORY = [
    r"\bsession ?\d+",
    r"\b(?:this|next|last|previous|earlier|first|second|third) session\b",
    r"\bissue ?\d+",
    r"\bseed ?\d+",
    r"#\d+",
    r"\bsince 20\d\d",
    r"\b(?:work )?period ?\d+",
    r"\bphase ?\d+",
    r"\bsprint ?\d+",
    r"\bin run \d\b",
    r"\bclosing note",
]
# Narration of change, banned outright in the user-facing pages written as product text.
NARRATION = [r"\bnow\b", r"\bsince\b", r"\bwas\b", r"\bwere\b", r"\bpreviously\b", r"\bno longer\b", r"\bused to\b"]
_HISTORY = re.compile("|".join(HISTORY), re.IGNORECASE)
_STRICT = re.compile("|".join(HISTORY + NARRATION), re.IGNORECASE)

# Pages held to the strict check; the other docs/*.md get the history report only.
STRICT_PAGES = ["README.md", "docs/architecture.md", "docs/exactness.md", "docs/fleet.md", "docs/install.md",
                "docs/performance.md", "benchmarks/README.md"]  # fmt: skip
# Paths that moved under lab/ (or were dropped): a reference not preceded by "lab/" is stale.
_STALE_PATH = re.compile(r"(?<![\w/.-])(?:gpu|results|notes)/")


@functools.cache
def _render_module():
    """benchmarks/render.py, imported by path (benchmarks/ is not a package)."""
    name = "xbackend_benchmarks_render"
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "render.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _offenders(text: str, pattern: re.Pattern[str], first_line: int = 1) -> list[tuple[int, str]]:
    return [(first_line + i, m.group(0)) for i, line in enumerate(text.splitlines()) for m in pattern.finditer(line)]


# -- docs/performance.md ------------------------------------------------------------------------------
def test_performance_page_is_rendered_from_the_data() -> None:
    render = _render_module()
    expected = render.render()
    current = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert current == expected, "docs/performance.md is out of date: run `python benchmarks/render.py`"


def test_every_cited_raw_output_exists() -> None:
    render = _render_module()
    manifest = json.loads((ROOT / "benchmarks" / "runs.json").read_text(encoding="utf-8"))
    for run in manifest["runs"]:
        assert run["renderer"] in render.RENDERERS, run["id"]
        for key in ("command", "hardware", "date"):
            assert run.get(key), f"{run['id']}: no {key}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", run["date"]), run["date"]
        for path in render._paths(run.get("data")) + render._paths(run.get("text")):
            assert (ROOT / path).is_file(), f"{run['id']}: {path} missing"


@pytest.mark.parametrize("name", ["bench_pointwise", "bench_gated"])
def test_bench_console_parser_agrees_with_the_json(name: str) -> None:
    """The console-table parser (used where a run wrote no JSON) reads back what --json recorded."""
    render = _render_module()
    base = ROOT / "lab" / "results" / "h200"
    header, text_rows = render.bench_rows_from_text((base / f"{name}.txt").read_text(encoding="utf-8"))
    json_rows = render.bench_rows_from_json(json.loads((base / f"{name}.json").read_text(encoding="utf-8")))
    assert header == "NVIDIA H200 | torch 2.11.0+cu130"
    assert len(text_rows) == len(json_rows)
    for t, j in zip(text_rows, json_rows, strict=True):
        assert (t.case, t.variant, t.impl, t.exact) == (j.case, j.variant, j.impl, j.exact)
        assert abs(t.us - j.us) <= 0.051
        if j.vs_one_launch is not None:
            assert abs(t.vs_one_launch - j.vs_one_launch) <= 0.006


def test_a_mislabelled_run_does_not_render() -> None:
    render = _render_module()
    manifest = json.loads((ROOT / "benchmarks" / "runs.json").read_text(encoding="utf-8"))
    run = next(r for r in manifest["runs"] if r["id"] == "pointwise")
    with pytest.raises(ValueError, match="records device"):
        render.render({**manifest, "runs": [{**run, "hardware": "AMD MI300X"}]})
    with pytest.raises(ValueError, match="records torch"):
        render.render({**manifest, "software": {**manifest["software"], "torch": "2.13.0"}, "runs": [run]})
    # A run on other software names its versions itself; the raw output's own record is checked against them.
    dispatch = next(r for r in manifest["runs"] if r["id"] == "dispatch")
    assert "torch 2.13.0+cpu" in render.render({**manifest, "runs": [dispatch]})
    with pytest.raises(ValueError, match="records torch '2.13.0\\+cpu'"):
        render.render({**manifest, "runs": [{k: v for k, v in dispatch.items() if k != "software"}]})


def test_plugin_bench_report_renders() -> None:
    """A plugin's bench JSON in the row format (``{"env": ..., "rows": [...]}``, as the Liger plugin's
    bench_liger.py writes) renders like `xbackend bench --json` rows."""
    render = _render_module()
    rows = [{"case": "rmsnorm [1,8,64]", "variant": v, "us": us, "accuracy": acc}
            for v, us, acc in (("copy_", 1.0, None), ("eager", 4.0, "exact"), ("compile", 2.0, "1ulp"),
                               ("xbackend", 1.0, "exact"), ("liger:rmsnorm", 1.6, "2ulp"))]  # fmt: skip
    parsed = render.bench_rows_from_json({"env": {"device": "NVIDIA H200", "torch": "2.11.0"}, "rows": rows})
    assert [(r.impl, r.exact) for r in parsed] == [(False, None), (False, True), (False, False), (False, True),
                                                   (True, False)]  # fmt: skip
    table = render.bench_table(parsed)
    assert table[2] == "| rmsnorm [1,8,64] | **1.0** | 100% | 2.00× | 4.00× | yes (no) | liger:rmsnorm 1.6 (2ulp) |"
    assert render._table(["a"], [["x|y"]])[-1] == "| x\\|y |"


# -- the README ---------------------------------------------------------------------------------------
def test_readme_is_at_most_12_kib() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes (limit {README_MAX_BYTES}): move detail into docs/"


def _ci_steps() -> list[str]:
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    start = next(i for i, ln in enumerate(lines) if ln == ". .venv/bin/activate") + 1
    steps = []
    for ln in lines[start:]:
        if not ln or ln.startswith("#") or "--upgrade pip" in ln:
            continue
        steps.append(re.sub(r"^python -m pip install -q ", "pip install ", ln))
    return steps


def _readme_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", README.read_text(encoding="utf-8"), re.DOTALL)


def test_readme_test_command_is_what_ci_runs() -> None:
    ci = _ci_steps()
    tests = [b for b in _readme_blocks() if "pytest" in b]
    assert len(tests) == 1, "the README has one test command"
    steps = [s.strip() for s in tests[0].split("&&")]
    assert steps[:2] == ["python3 -m venv .venv", ". .venv/bin/activate"]
    assert [shlex.split(s) for s in steps[2:]] == [shlex.split(s) for s in ci], (
        "README's test command differs from .ci/run's steps:\n  " + "\n  ".join(ci))


def test_readme_install_command_pins_ci_torch() -> None:
    torch_pin = next(s for s in _ci_steps() if s.startswith("pip install torch=="))
    install = next(b for b in _readme_blocks() if "xbackend info" in b)
    assert [s.strip() for s in install.split("&&")] == [
        "python3 -m venv .venv", ". .venv/bin/activate", torch_pin, "pip install -e . -e plugins/xbackend-natten",
        "xbackend info"]  # the goldens' plugin set: planning from this install matches them


@pytest.mark.parametrize("page", STRICT_PAGES)
def test_page_has_no_development_history(page: str) -> None:
    found = _offenders((ROOT / page).read_text(encoding="utf-8"), _STRICT)
    assert not found, f"{page}: development history or change narration: " + ", ".join(f"line {n}: {w!r}" for n, w in found)


# -- size and shape of the pages a user reads ---------------------------------------------------------
DOCS_MAX_BYTES = 40 * 1024
PARAGRAPH_MAX_WORDS = 120
# Pages held to the paragraph limit (docs/guard.md joins once its long paragraphs are split).
PARAGRAPH_PAGES = ["README.md", "docs/architecture.md", "docs/exactness.md", "docs/fleet.md", "docs/guard.md", "docs/install.md",
                   "docs/performance.md", "benchmarks/README.md"]  # fmt: skip


def test_docs_fit_in_40_kib() -> None:
    sizes = {p.name: len(p.read_bytes()) for p in sorted((ROOT / "docs").glob("*.md"))}
    assert sum(sizes.values()) <= DOCS_MAX_BYTES, f"docs/ is {sum(sizes.values())} bytes (limit {DOCS_MAX_BYTES}): {sizes}"


def paragraphs(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each prose paragraph of a Markdown page: code blocks, tables, headings and
    comments are not prose; each list item is a paragraph of its own."""
    out: list[tuple[int, str]] = []
    cur: list[str] = []
    start = 0
    fence = False
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("```"):
            fence = not fence
        item = re.match(r"(?:[-*]|\d+\.) ", s) is not None
        if fence or s.startswith("```") or not s or s.startswith(("|", "#", "<!--", "-->")) or item:
            if cur:
                out.append((start, " ".join(cur)))
                cur = []
            if fence or not item:
                continue
        if not cur:
            start = n
        cur.append(s)
    if cur:
        out.append((start, " ".join(cur)))
    return out


def test_paragraphs_splits_prose_from_code_tables_and_list_items() -> None:
    text = "one two\nthree\n\n```\nfour five six\n```\n| a | b |\n- item one\n  goes on\n- item two\n"
    assert paragraphs(text) == [(1, "one two three"), (8, "- item one goes on"), (10, "- item two")]


@pytest.mark.parametrize("page", PARAGRAPH_PAGES)
def test_no_paragraph_over_120_words(page: str) -> None:
    path = ROOT / page
    long = [(n, len(p.split())) for n, p in paragraphs(path.read_text(encoding="utf-8")) if len(p.split()) > PARAGRAPH_MAX_WORDS]
    assert not long, f"{page}: paragraphs over {PARAGRAPH_MAX_WORDS} words (line, words): {long}"


def test_every_lab_result_the_docs_cite_exists() -> None:
    missing = []
    for page in _pages():
        for n, hit in _offenders(page.read_text(encoding="utf-8"), re.compile(r"lab/results/[\w./-]+\.(?:txt|json)")):
            if not (ROOT / hit).is_file():
                missing.append(f"{page.relative_to(ROOT)}:{n}: {hit}")
    assert not missing, "cited raw outputs that do not exist:\n" + "\n".join(missing)


# -- links and paths ----------------------------------------------------------------------------------
def _pages() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: link {target!r} does not resolve"


def _product_text_files() -> list[Path]:
    files = [*_pages(), *(ROOT / "examples").rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
             *(ROOT / "benchmarks").glob("*.*"), ROOT / ".ci" / "run"]  # fmt: skip
    return [f for f in files if f.is_file() and f.name != "test_docs.py" and "__pycache__" not in f.parts]


def test_no_reference_to_pre_lab_paths() -> None:
    stale = []
    for f in _product_text_files():
        for n, hit in _offenders(f.read_text(encoding="utf-8"), _STALE_PATH):
            stale.append(f"{f.relative_to(ROOT)}:{n}: {hit}")
    assert not stale, "paths that moved under lab/ (gpu/, results/) or were dropped (notes/):\n" + "\n".join(stale)


# -- report only: other docs, and comments and docstrings of the code ---------------------------------
def _python_prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring line of a Python file."""
    source = path.read_text(encoding="utf-8")
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
        tree = ast.parse(source)
    except (SyntaxError, tokenize.TokenError):
        return out
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out += [(first.lineno + i, line) for i, line in enumerate(first.value.value.splitlines())]
    return out


def _c_prose(path: Path) -> list[tuple[int, str]]:
    out = []
    in_block = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if in_block or "/*" in line:
            out.append((n, line))
            in_block = "*/" not in line.split("/*")[-1] if "/*" in line else "*/" not in line
        elif "//" in line:
            out.append((n, line[line.index("//") :]))
    return out


def history_report() -> list[str]:
    """file:line: word for every history pattern in the other docs and in the code's comments/docstrings."""
    lines = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        if str(page.relative_to(ROOT)) in STRICT_PAGES:
            continue
        lines += [f"{page.relative_to(ROOT)}:{n}: {w}" for n, w in _offenders(page.read_text(encoding="utf-8"), _HISTORY)]
    for top in ("xbackend", "backends"):
        for path in sorted((ROOT / top).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.suffix == ".py":
                prose = _python_prose(path)
            elif path.suffix in (".cu", ".cuh", ".cpp", ".h"):
                prose = _c_prose(path)
            else:
                continue
            for n, text in prose:
                for m in _HISTORY.finditer(text):
                    lines.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
                for m in _STALE_PATH.finditer(text):
                    lines.append(f"{path.relative_to(ROOT)}:{n}: stale path {m.group(0)}")
    return lines


def test_history_report_for_other_docs_and_code() -> None:
    """Report only: prints every offender (run with -s to see them); never fails."""
    report = history_report()
    print(f"\nhistory report: {len(report)} hit(s) in other docs and in comments/docstrings of xbackend/, backends/")
    for line in report:
        print("  " + line)


if __name__ == "__main__":
    for line in history_report():
        print(line)


def test_no_module_of_the_package_is_over_500_lines() -> None:
    root = Path(__file__).resolve().parents[1] / "xbackend"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"split these modules (one idea each): {long}"


def test_na_sol_benchmark_runs_and_renders(tmp_path: Path) -> None:
    """benchmarks/na_sol.py's CPU smoke mode writes the JSON its renderer reads: the script and the
    ``na_sol`` renderer stay in step before a GPU run publishes a table."""
    import subprocess

    import torch

    out = tmp_path / "na_sol.json"
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "na_sol.py"), "--smoke", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    assert len(res.stdout.strip().splitlines()) == 2  # one line per case
    run = {"id": "smoke", "data": str(out), "hardware": "cpu"}
    table = _render_module().render_na_sol(run, {"torch": torch.__version__})
    assert len(table) == 4 and table[0].startswith("| case | impl | time |")
    assert "stride 3×2×4" in table[3] and table[3].count("|") == table[0].count("|")
    data = json.loads(out.read_text())
    assert 0 < data["rows"][1]["triton_useful_of_computed"] <= 1
    assert all(r["rel_err"] < 0.005 for r in data["rows"])
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "na_sol.py"), "--cases", "plain,strides"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert bad.returncode == 2 and "--cases: expected comma-separated groups from plain, strided, head_dims, got strides" in bad.stderr
