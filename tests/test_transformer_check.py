"""benchmarks/transformer_check.py and its families: every real-size config builds and runs a forward on
the meta device (a typo in a config or an input shape fails on the CPU), the CPU smoke run writes the
JSON the ``transformer`` renderer of benchmarks/render.py reads, and ``--first-call`` runs its fresh
processes."""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("diffusers")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "transformer_check.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

import transformer_families as families  # noqa: E402


@functools.cache
def _module(name: str) -> Any:
    """A benchmarks/ script imported by path (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"xbackend_benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _smoke(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)  # fmt: skip


# -- real sizes, on the meta device -----------------------------------------------------------------
# (family, width = heads x head dim, image/video tokens, text tokens, output shape)
REAL = [
    ("wan", 40 * 128, 32_760, 512, [(1, 16, 21, 60, 104)]),
    ("flux2", 48 * 128, 4_096, 512, [(1, 4096, 128)]),
    ("qwen", 24 * 128, 6_889, 256, [(1, 6889, 64)]),
    ("ltx2", 32 * 128, 32_640, 256, [(1, 32640, 128), (1, 126, 128)]),
]


@pytest.mark.parametrize(("family", "width", "tokens", "text", "shapes"), REAL, ids=[r[0] for r in REAL])
def test_real_size_config_builds_and_runs_on_meta(family: str, width: int, tokens: int, text: int,
                                                  shapes: list[tuple[int, ...]]) -> None:  # fmt: skip
    model = families.build(family, tiny=False, layers=2, device="meta", dtype=torch.bfloat16)
    cfg = model.config
    assert cfg.num_attention_heads * cfg.attention_head_dim == width
    assert len(model.transformer_blocks if family != "wan" else model.blocks) == 2
    if family == "flux2":
        assert len(model.single_transformer_blocks) == 2 and cfg.joint_attention_dim == 15360
    if family == "wan":
        assert (cfg.ffn_dim, cfg.text_dim, tuple(cfg.patch_size)) == (13824, 4096, (1, 2, 2))
    assert families.tokens(family, tiny=False) == tokens and families.sizes(family, tiny=False).text == text
    # Two copies (stock and patched) of the bf16 weights stay far below an 80 GB card.
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert 2 * weights < 20e9, weights
    # The inputs at real size are small: built on the CPU, run through the model on the meta device.
    inputs = families.make_inputs(family, model, tiny=False, device="cpu", dtype=torch.bfloat16)
    inputs = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    with torch.no_grad():
        out = model(**inputs)
    assert [tuple(o.shape) for o in out] == shapes
    assert all(o.dtype == torch.bfloat16 for o in out)


def test_wan_keeps_its_float32_modules_as_from_pretrained_does() -> None:
    model = families.build("wan", tiny=True, layers=1, device="meta", dtype=torch.bfloat16)
    dtypes = {name: p.dtype for name, p in model.named_parameters()}
    assert dtypes["blocks.0.scale_shift_table"] == dtypes["scale_shift_table"] == torch.float32
    assert dtypes["blocks.0.norm2.weight"] == torch.float32
    assert dtypes["condition_embedder.time_embedder.linear_1.weight"] == torch.float32
    assert dtypes["blocks.0.attn1.to_q.weight"] == dtypes["blocks.0.attn1.norm_q.weight"] == torch.bfloat16
    with pytest.raises(ValueError, match="expected one of wan, flux2, qwen, ltx2, got 'sd3'"):
        families.build("sd3", tiny=True, layers=1, device="meta", dtype=torch.float32)


# -- the CPU smoke run and the renderer --------------------------------------------------------------
@pytest.fixture(scope="module")
def wan_smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("transformer_check")
    res = _smoke(out, "--family", "wan")
    assert res.returncode == 0, res.stderr[-3000:]
    return {"stdout": res.stdout, "data": json.loads((out / "transformer_wan.json").read_text()),
            "path": out / "transformer_wan.json"}  # fmt: skip


def test_smoke_run_writes_the_schema(wan_smoke: dict[str, Any]) -> None:
    check = _module("transformer_check")
    data = wan_smoke["data"]
    assert check.check_schema(data) == []
    assert [r["mode"] for r in data["rows"]] == ["eager", "patched", "compile", "patched_compile"]
    assert data["rows"][1]["bit_identical"] is True and data["bars"]["patched_bit_identical"]["met"] is True
    assert data["patch"]["counts"].get("rmsnorm", 0) >= 1 and data["smoke"] is True
    assert data["device"].startswith("cpu") and data["torch"] == torch.__version__
    # The printed table comes last: a header, one line per mode, the bars.
    lines = wan_smoke["stdout"].strip().splitlines()
    assert lines[0].startswith("Wan 2.2 14B, tiny config (WanTransformer3DModel), 2 layers, 36 tokens + 7 text")
    assert [ln.split()[0] for ln in lines[2:6]] == ["eager", "patched", "compile", "patched+compile"]
    assert lines[6].startswith("bars: patched_bit_identical True met")
    # The check can fail: a missing mode, a mistyped field.
    broken = {**data, "rows": data["rows"][:3], "tokens": "36"}
    problems = check.check_schema(broken)
    assert "tokens: expected <class 'int'>, got str" in problems
    assert any(p.startswith("rows: expected modes") for p in problems)


def test_transformer_renderer_reads_the_smoke_json(wan_smoke: dict[str, Any]) -> None:
    render = _module("render")
    data = wan_smoke["data"]
    run = {"id": "smoke", "data": str(wan_smoke["path"]), "hardware": data["device"]}
    software = {"torch": torch.__version__, "triton": data["triton"]}
    lines = render.render_transformer(run, software)
    assert lines[0].startswith("**Wan 2.2 14B**, tiny config: `WanTransformer3DModel`, 2 layers, 36 tokens + 7 text")
    table = lines[lines.index("") + 1 :]
    assert table[0] == ("| mode | median ms | vs eager | vs compile | first call s | output vs eager |")
    rows = {r["mode"]: r for r in data["rows"]}
    eager, patched = table[2].split(" | "), table[3].split(" | ")
    assert eager[0] == "| eager" and eager[1] == f"{rows['eager']['median_ms']:.2f}" and eager[-1] == "reference |"
    assert patched[1] == f"**{rows['patched']['median_ms']:.2f}**" and patched[-1] == "bit-identical |"
    assert patched[3] == f"{rows['patched']['vs_compile']:.2f}×"
    assert table[5].startswith("| patched + compile (fullgraph) |")
    assert any(ln.startswith("Bars: patched bit-identical: met") for ln in lines)
    # A result that records other hardware or software than the manifest does not render.
    with pytest.raises(ValueError, match="records device"):
        render.render_transformer({**run, "hardware": "NVIDIA H100"}, software)
    with pytest.raises(ValueError, match="records torch"):
        render.render_transformer(run, {**software, "torch": "2.11.0+cu130"})
    assert "transformer" in render.RENDERERS


def test_first_call_merges_into_the_same_run_only() -> None:
    check = _module("transformer_check")
    head = {"family": "wan", "config": {"patch_size": (1, 2, 2)}, "tokens": 36, "text_tokens": 7, "dtype": "float32",
            "device": "cpu (x86_64)", "layers": 2, "smoke": True}  # fmt: skip
    fc = {"met": True, "delta_s": 0.1}
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        assert check._merge_first_call(path, head, fc) == {**head, "first_call": fc}
        path.write_text(json.dumps({**head, "config": {"patch_size": [1, 2, 2]}, "rows": [1]}))
        assert check._merge_first_call(path, head, fc)["rows"] == [1]  # the same run, read back from JSON
        path.write_text(json.dumps({**head, "tokens": 37, "rows": [1]}))
        assert "rows" not in check._merge_first_call(path, head, fc)  # another run's rows are not kept


# -- slower: the other families, bf16, the fresh-process first calls -----------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("family", "dtype"), [("flux2", "fp32"), ("qwen", "fp32"), ("ltx2", "fp32"), ("wan", "bf16")])
def test_smoke_run_other_families(tmp_path: Path, family: str, dtype: str) -> None:
    res = _smoke(tmp_path, "--family", family, "--dtype", dtype)
    assert res.returncode == 0, res.stderr[-3000:]
    name = f"transformer_{family}{'_bfloat16' if dtype == 'bf16' else ''}.json"
    data = json.loads((tmp_path / name).read_text())
    assert _module("transformer_check").check_schema(data) == []
    assert data["rows"][1]["bit_identical"] is True, data["rows"][1]


@pytest.mark.slow
def test_first_call_runs_fresh_processes(tmp_path: Path) -> None:
    res = _smoke(tmp_path, "--family", "qwen", "--first-call", "--timeout", "120")
    assert res.returncode == 0, res.stderr[-3000:]
    fc = json.loads((tmp_path / "transformer_qwen.json").read_text())["first_call"]
    assert fc["patched"]["sites"] >= 1 and fc["eager"]["sites"] == 0
    assert fc["delta_s"] == pytest.approx(fc["patched"]["total_s"] - fc["eager"]["total_s"])
    assert fc["patched_warm"]["first_forward_s"] > 0
    assert res.stdout.startswith("first call, fresh processes: eager ")


def test_a_failing_mode_leaves_the_others(tmp_path: Path) -> None:
    """A compile backend that does not exist fails both compile modes; eager and patched are still timed,
    the rows say why, the bars that need compile are not met, and --smoke exits 1 on the error rows."""
    res = _smoke(tmp_path, "--family", "qwen", "--compile-backend", "no_such_backend")
    assert res.returncode == 1, res.stderr[-3000:]
    data = json.loads((tmp_path / "transformer_qwen.json").read_text())
    rows = {r["mode"]: r for r in data["rows"]}
    assert "median_ms" in rows["eager"] and "median_ms" in rows["patched"] and "vs_compile" not in rows["patched"]
    assert rows["compile"]["error"].startswith("InvalidBackend: ") and "no_such_backend" in rows["compile"]["error"]
    assert rows["patched_compile"]["fullgraph_error"].startswith("InvalidBackend: ")
    assert data["bars"]["patched_vs_compile"] == {"value": None, "need": 1.0, "met": False}
    assert "schema: row compile: InvalidBackend: " in res.stderr
