"""xbackend.attribute on the tiny LTX-2 models (CPU): which patched site makes the output drift, by how much.

On CPU every builtin op resolves to its reference, so a drift exists only where a test plugin registers a
deliberately inexact impl: an RMSNorm 1% off, admitted by the "fast" tier (its declared contract is a
relative Frobenius error of 2%) and refused by "lossless".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

import xbackend
from xbackend import cli
from xbackend._attribute_models import DIFFVAE_TILING, DIFFVAE_TINY, DIT_TINY, bundled
from xbackend.attribute import SCHEMA_VERSION, Attribution
from xbackend.ops import rmsnorm, silu_mul
from xbackend.patching import _sites
from xbackend.testing import fresh_runtime

ROOT = Path(__file__).resolve().parents[1]
SLOPPY = "sloppy:one_percent_off"


def rmsnorm_one_percent_off(x, weight, eps, flavour):
    return rmsnorm.reference(x, weight, eps, flavour) * 1.01


def silu_mul_one_percent_off(gate, up):
    return silu_mul.reference(gate, up) * 1.01


class SloppyRMSNorm:
    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="rmsnorm", name="one_percent_off", fn=rmsnorm_one_percent_off, priority=50,
                           devices="cpu", precision=xbackend.tolerance(0.02))


class SloppySiluMul:
    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="silu_mul", name="one_percent_off", fn=silu_mul_one_percent_off, priority=50,
                           devices="cpu", precision=xbackend.tolerance(0.02))


def patched(name: str) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    model, args, kwargs = bundled(name, torch.device("cpu"), torch.float32)
    xbackend.patch(model)
    return model, args, kwargs


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Two torch threads on a shared 2-core runner spin against each other (a 0.2 s DiffVAE forward took 4 s).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def dit() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    return patched("ltx2-dit")


def test_sloppy_impl_ranks_its_site_kind_first_and_suggest_excludes_exactly_it(dit) -> None:
    model, args, kwargs = dit
    with fresh_runtime(plugins=[("sloppy", SloppyRMSNorm())]):
        found = xbackend.attribute(model, *args, quality="fast", method="bisect", **kwargs)
        each = xbackend.attribute(model, *args, quality="fast", method="each", **kwargs)
        suggestion = found.suggest(1e-6)
    assert isinstance(found, Attribution)
    assert found.divergence > 1e-3
    top = found.rows[0]
    assert (top.kind, top.op, top.impl, top.precision) == ("rmsnorm", "rmsnorm", SLOPPY, "tolerance(rel_fro<0.02)")
    drifting = [r for r in found.rows if r.output_error > 0]
    assert drifting and {r.kind for r in drifting} == {"rmsnorm"} and {r.impl for r in drifting} == {SLOPPY}
    for row in drifting:
        assert row.local_error == pytest.approx(0.01, rel=1e-3)  # the impl's own error, on the site's inputs
        assert row.local_max_abs > 0 and row.calls >= 1
    assert all(r.local_error == 0 and r.output_error == 0 for r in found.rows if r.impl != SLOPPY)
    outputs = [r.output_error for r in found.rows]
    assert outputs == sorted(outputs, reverse=True)
    # Bisection finds the same per-site output errors as running each site alone, in fewer forwards.
    assert {(r.site, r.kind): r.output_error for r in found.rows} == {(r.site, r.kind): r.output_error for r in each.rows}
    assert all(r.output_without is not None for r in each.rows if r.impl == SLOPPY)
    assert found.forwards < each.forwards
    assert found.by_kind()[0].kind == "rmsnorm" and found.by_kind()[0].output_error == pytest.approx(found.divergence)
    assert suggestion.exclude == ("rmsnorm",) and suggestion.use == {"rmsnorm": "reference"}
    assert suggestion.met and suggestion.output_error == 0
    assert "rmsnorm" in found.table() and SLOPPY in found.table()
    json.dumps(found.to_dict())


def test_suggest_changes_nothing_when_the_model_is_within_tolerance(dit, capsys) -> None:
    model, args, kwargs = dit
    with fresh_runtime(plugins=[("sloppy", SloppyRMSNorm())]):
        found = xbackend.attribute(model, *args, quality="fast", progress=True, **kwargs)
        loose = found.suggest(found.divergence * 2)
    assert loose.met and loose.use == {} and loose.exclude == () and loose.forwards == 0
    err = capsys.readouterr().err
    assert f"xbackend attribute: {found.forwards} forwards" in err and "forward 4 (" in err


@pytest.mark.parametrize("quality", ["fast", "lossless"])
def test_exact_impls_only_give_zero_rows(dit, quality: str) -> None:
    model, args, kwargs = dit
    # Lossless refuses the plugin's contract; with no plugin, every op on CPU is its reference.
    plugins = [("sloppy", SloppyRMSNorm())] if quality == "lossless" else []
    with fresh_runtime(plugins=plugins):
        found = xbackend.attribute(model, *args, quality=quality, **kwargs)
    assert found.divergence == 0 and found.noise == 0
    assert found.rows and all(r.local_error == 0 and r.local_max_abs == 0 and r.output_error == 0 for r in found.rows)
    assert all(r.impl in ("xbackend:reference", "-") for r in found.rows)
    assert found.forwards == 3  # the recording forward and the all-reference one twice: nothing to switch


def _state(model: nn.Module) -> dict[str, Any]:
    overrides = {(p, attr): m.__dict__.get(attr) for p, m in model.named_modules()
                 for attr in ("forward", "tiled_decode", "processor")}
    return {"overrides": overrides, "training": {p: m.training for p, m in model.named_modules()},
            "tensors": {k: v.clone() for k, v in model.state_dict(keep_vars=True).items()},
            "report": xbackend.patch(model, only=()).to_dict()}


def test_model_is_left_exactly_as_it_was(dit) -> None:
    model, args, kwargs = dit
    before = _state(model)
    with fresh_runtime(plugins=[("sloppy", SloppyRMSNorm())]):
        xbackend.attribute(model, *args, quality="fast", **kwargs).suggest(1e-6)
        with pytest.raises(TypeError):  # the model's own error, mid-way: nothing stays installed
            xbackend.attribute(model, *args, quality="fast", not_an_argument=1, **kwargs)
    after = _state(model)
    assert _sites._observer is None
    assert all(after["overrides"][k] is v for k, v in before["overrides"].items())
    assert after["training"] == before["training"] and after["report"] == before["report"]
    assert before["tensors"].keys() == after["tensors"].keys()
    assert all(torch.equal(before["tensors"][k], after["tensors"][k]) for k in before["tensors"])


def test_unpatched_model_and_bad_arguments_get_clear_errors() -> None:
    model, args, kwargs = bundled("ltx2-dit", torch.device("cpu"), torch.float32)
    with pytest.raises(ValueError, match=r"xbackend\.attribute: .*no patched site.*xbackend\.patch\(model\)"):
        xbackend.attribute(model, *args, **kwargs)
    with pytest.raises(TypeError, match="argument 'model' expected a torch.nn.Module, got str"):
        xbackend.attribute("model")
    xbackend.patch(model)
    with pytest.raises(ValueError, match="argument 'quality' expected one of 'lossless', 'high', 'fast', got 'best'"):
        xbackend.attribute(model, *args, quality="best", **kwargs)
    with pytest.raises(ValueError, match="argument 'method' expected one of 'auto', 'bisect', 'each', got 'all'"):
        xbackend.attribute(model, *args, method="all", **kwargs)


def test_diffvae_noise_is_drawn_alike_in_every_forward_and_a_sloppy_swiglu_ranks_first() -> None:
    model, args, kwargs = patched("ltx2-diffvae")
    generator = kwargs["generator"]  # stage 5 draws noise from it on every forward
    state = generator.get_state()
    with fresh_runtime():
        exact = xbackend.attribute(model, *args, quality="fast", **kwargs)
    assert exact.divergence == 0 and exact.noise == 0
    assert torch.equal(generator.get_state(), state)
    with fresh_runtime(plugins=[("sloppy", SloppySiluMul())]):
        found = xbackend.attribute(model, *args, quality="fast", **kwargs)
    assert found.rows[0].kind == "silu_mul" and found.rows[0].impl == SLOPPY
    assert {r.kind for r in found.rows if r.output_error > 0} == {"silu_mul"}
    assert found.by_kind()[0].kind == "silu_mul"


def test_cli_json_carries_the_schema_version(capsys) -> None:
    assert cli.main(["attribute", "--model", "ltx2-dit", "--quality", "fast", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == SCHEMA_VERSION and doc["command"] == "attribute"
    assert doc["model"] == "ltx2-dit" and doc["quality"] == "fast"
    assert doc["rows"] and set(doc["rows"][0]) >= {"site", "kind", "op", "impl", "precision", "local_error", "output_error"}
    assert {"xbackend", "host", "plugins", "problems"} <= set(doc)


def test_cli_prints_the_table(capsys) -> None:
    assert cli.main(["attribute", "--quality", "lossless"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("xbackend attribute: LTX2VideoTransformer3DModel") and "model output: relative error 0 " in out


def _same_tensors(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    return a == b


def test_bundled_models_are_the_examples_tiny_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import ltx2_diffvae
    import ltx2_transformer

    try:
        args = ltx2_transformer.parse_args(["--device", "cpu"])
        assert DIT_TINY == {k: getattr(args, k) for k in DIT_TINY}
        model, _, inputs = bundled("ltx2-dit", torch.device("cpu"), torch.float32)
        assert _same_tensors(model.state_dict(), ltx2_transformer.build_model(args).state_dict())
        assert _same_tensors(inputs, ltx2_transformer.make_inputs(args))
        assert DIFFVAE_TINY == ltx2_diffvae.TINY_CONFIG and DIFFVAE_TILING == ltx2_diffvae.TINY_TILING
        args = ltx2_diffvae.parse_args(["--device", "cpu"])
        model, (z,), _ = bundled("ltx2-diffvae", torch.device("cpu"), torch.float32)
        theirs = ltx2_diffvae.build_model(args)
        assert _same_tensors(model.state_dict(), theirs.state_dict())
        assert _same_tensors(z, ltx2_diffvae.make_latent(theirs, args))
    finally:
        for module in ("ltx2_diffvae", "ltx2_transformer"):
            sys.modules.pop(module, None)
