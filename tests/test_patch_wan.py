"""xbackend.patch on diffusers 0.42.1's WanTransformer3DModel: tiny configs, random weights, CPU."""

from __future__ import annotations

import copy
import io
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

import diffusers
from diffusers import WanTransformer3DModel
from patch_helpers import assert_equal, compiled_ops, overrides, randomize_norms, run, spy_ops

import xbackend
from xbackend.patching import KINDS

CONFIG = {
    "patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 4, "out_channels": 4,
    "text_dim": 16, "freq_dim": 16, "ffn_dim": 32, "num_layers": 2, "cross_attn_norm": True, "rope_max_seq_len": 32,
}  # fmt: skip
# Wan 2.1 / 2.2 14B text-to-video; Wan 2.2 ti2v (per-token timesteps: temb [B, L, 6, D]); Wan 2.1
# image-to-video (image tokens through the attention's added K/V); a block without its norm2.
VARIANTS = {
    "t2v": {},
    "ti2v": {},
    "i2v": {"image_dim": 8, "added_kv_proj_dim": 24},
    "no-cross-norm": {"cross_attn_norm": False},
}
BATCH, FRAMES, HEIGHT, WIDTH = 2, 2, 4, 6
TOKENS = FRAMES * (HEIGHT // 2) * (WIDTH // 2)
LAYERS = CONFIG["num_layers"]


def build(variant: str = "t2v", layout: str = "fp32") -> nn.Module:
    """``layout``: "fp32"; "bf16" as from_pretrained(torch_dtype=bf16) loads it (the model's
    _keep_in_fp32_modules, the RoPE buffers among them, stay float32); "bf16-cast": model.to(bf16),
    RoPE frequencies included."""
    torch.manual_seed(0)
    model = WanTransformer3DModel(**{**CONFIG, **VARIANTS[variant]}).eval()
    randomize_norms(model)
    if layout == "fp32":
        return model
    kept = {n: p.detach().clone() for n, p in model.named_parameters()
            if any(m in n.split(".") for m in model._keep_in_fp32_modules)}  # fmt: skip
    rope = {n: b.clone() for n, b in model.rope.named_buffers()}
    model.to(torch.bfloat16)
    if layout == "bf16":
        for name, p in model.named_parameters():
            if name in kept:
                p.data = kept[name]
        for name, b in rope.items():
            setattr(model.rope, name, b)
    return model


def inputs(variant: str = "t2v", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    text = 512 if variant == "i2v" else 5  # Wan's I2V attention takes the last 512 tokens as the text
    out: dict[str, Any] = {
        "hidden_states": torch.randn(BATCH, 4, FRAMES, HEIGHT, WIDTH, generator=g).to(dtype),
        "timestep": torch.tensor([300.0, 700.0]),
        "encoder_hidden_states": torch.randn(BATCH, text, 16, generator=g).to(dtype),
        "return_dict": False,
    }
    if variant == "ti2v":
        out["timestep"] = torch.rand(BATCH, TOKENS, generator=g) * 1000
    if variant == "i2v":
        out["encoder_hidden_states_image"] = torch.randn(BATCH, 3, 8, generator=g).to(dtype)
    return out


def dtype_of(layout: str) -> torch.dtype:
    return torch.float32 if layout == "fp32" else torch.bfloat16


@pytest.mark.parametrize("layout", ["fp32", "bf16", "bf16-cast"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_patched_is_bit_identical(variant: str, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = build(variant, layout)
    args = inputs(variant, dtype_of(layout))
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    xbackend.patch(model)
    assert_equal(run(model, args), expected)
    # Per block: norm1's modulate; norm2 (gated attn1 residual) and norm3 (attn2 residual) folded into
    # add_layernorm; the FFN's float32-gated residual. Without norm2, attn1's residual is a gate alone.
    cross_norm = variant != "no-cross-norm"
    assert calls["layernorm_modulate"] == LAYERS
    assert calls["add_layernorm"] == LAYERS * (2 if cross_norm else 1)
    assert calls["gated_residual"] == LAYERS * (1 if cross_norm else 2)
    # RoPE of q and k in attn1, where Wan computes it in float32: not with bf16 frequencies under bf16 x.
    assert calls["rotary_embedding"] == (0 if layout == "bf16-cast" else 2 * LAYERS)
    # q/k norms of attn1 and attn2 (and attn2's norm_added_k for I2V)
    assert calls["rmsnorm"] == LAYERS * (5 if variant == "i2v" else 4)


def test_report_lists_every_site() -> None:
    model = build()
    report = xbackend.patch(model)
    blocks = [f"blocks.{i}" for i in range(LAYERS)]
    by_kind = report.by_kind()
    assert by_kind["layernorm_modulate"] == [f"{b}.{n}" for b in blocks for n in ("norm1", "norm2", "norm3")]
    assert by_kind["add_layernorm"] == [f"{b}.{n}" for b in blocks for n in ("norm2", "norm3")]
    assert by_kind["gated_residual"] == [f"{b}.{n}" for b in blocks for n in ("attn1", "ffn")]
    assert by_kind["rotary_embedding"] == [f"{b}.attn1" for b in blocks]  # attn2 (cross) has no RoPE
    assert sorted(by_kind["rmsnorm"]) == sorted(n for n, m in model.named_modules() if type(m) is nn.RMSNorm)
    assert set(by_kind) == {"layernorm_modulate", "add_layernorm", "gated_residual", "rotary_embedding", "rmsnorm"}
    assert all(s.new for s in report.sites) and not report.skipped
    assert "flavour=fp32" in next(s.detail for s in report.sites if s.path == "blocks.0.norm2")
    assert {"layernorm_modulate", "add_layernorm"} <= set(KINDS)


def test_exclude_add_layernorm_runs_its_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build()
    args = inputs()
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    report = xbackend.patch(model, exclude=("add_layernorm",))
    assert "add_layernorm" not in report.counts() and report.counts()["layernorm_modulate"] == 3 * LAYERS
    assert_equal(run(model, args), expected)
    assert calls["add_layernorm"] == 0
    assert calls["layernorm_modulate"] == 3 * LAYERS and calls["gated_residual"] == 2 * LAYERS


def test_a_fold_needs_the_kinds_it_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build()
    args = inputs()
    expected = run(model, args)
    report = xbackend.patch(model, only=("add_layernorm",))
    assert not report.sites and "forward" not in model.blocks[0].__dict__
    assert {k.reason for k in report.skipped} == {"folds into the norm's layernorm_modulate site: patch that kind too"}
    xbackend.unpatch(model)
    # Without gated_residual, the gated attn1 residual stays as written and norm2 runs on its own;
    # norm3's residual is ungated and still folds.
    calls = spy_ops(monkeypatch)
    report = xbackend.patch(model, exclude=("gated_residual",))
    assert report.by_kind()["add_layernorm"] == [f"blocks.{i}.norm3" for i in range(LAYERS)]
    assert [k.reason for k in report.skipped if k.path == "blocks.0.norm2"] == [
        "folds the gated residual of attn1: patch gated_residual too"]
    assert_equal(run(model, args), expected)
    assert calls["gated_residual"] == 0 and calls["add_layernorm"] == LAYERS
    assert calls["layernorm_modulate"] == 2 * LAYERS


def test_unpatch_restores_and_a_copy_stays_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build()
    args = inputs()
    expected = run(model, args)
    processors = {n: m.processor for n, m in model.named_modules() if hasattr(m, "processor")}
    report = xbackend.patch(model)
    clone = copy.deepcopy(model)
    assert clone.blocks[0].forward.__self__ is clone.blocks[0]
    calls = spy_ops(monkeypatch)
    assert_equal(run(clone, args), expected)
    assert calls["add_layernorm"] == 2 * LAYERS and calls["rotary_embedding"] == 2 * LAYERS
    restored = xbackend.unpatch(model)
    assert sorted((s.kind, s.path) for s in restored.sites) == sorted((s.kind, s.path) for s in report.sites)
    assert not overrides(model)
    assert all(m.processor is processors[n] for n, m in model.named_modules() if hasattr(m, "processor"))
    calls.update(dict.fromkeys(calls, 0))
    assert_equal(run(model, args), expected)
    assert not any(calls.values())
    assert len(xbackend.unpatch(clone)) == len(report)
    # Pickled whole: the block forwards load as the classes' own, the attention processors as
    # xbackend's (each keeps the one it replaced), and the model computes the same; patch finds them.
    xbackend.patch(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert_equal(run(loaded, args), expected)
    assert len(xbackend.patch(loaded)) == len(report)


def test_inputs_the_ops_do_not_take_run_wans_expression(monkeypatch: pytest.MonkeyPatch) -> None:
    # float64 throughout: no op takes it; every site runs Wan's own expression.
    model = build().double()
    args = inputs(dtype=torch.float64)
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    assert xbackend.patch(model).counts()["add_layernorm"] == 2 * LAYERS
    assert_equal(run(model, args), expected)
    assert not any(calls.values())
    # bf16 RoPE frequencies under an fp32 x: Wan's products promote to float32, which is the op.
    model = build()
    model.rope.freqs_cos, model.rope.freqs_sin = model.rope.freqs_cos.bfloat16(), model.rope.freqs_sin.bfloat16()
    expected = run(model, inputs())
    xbackend.patch(model)
    assert_equal(run(model, inputs()), expected)
    assert calls["rotary_embedding"] == 2 * LAYERS


def test_changes_after_patching_take_the_written_expression(monkeypatch: pytest.MonkeyPatch) -> None:
    ref, model = build(), build()
    xbackend.patch(model)
    calls = spy_ops(monkeypatch)
    seen: list[str] = []
    for m in (ref, model):
        m.blocks[0].norm1.register_forward_hook(lambda *_: seen.append("hook"))
        m.blocks[1].norm3 = nn.LayerNorm(24, elementwise_affine=False)  # not FP32LayerNorm: not the op
    assert_equal(run(model, inputs()), run(ref, inputs()))
    assert seen == ["hook", "hook"]
    assert calls["layernorm_modulate"] == LAYERS - 1 and calls["add_layernorm"] == 2 * LAYERS - 1


def test_hooked_norm_is_left_alone_at_patch_time() -> None:
    model = build()
    model.blocks[0].norm3.register_forward_hook(lambda *_: None)
    report = xbackend.patch(model)
    assert [(k.kind, k.path) for k in report.skipped] == [
        ("layernorm_modulate", "blocks.0.norm3"), ("add_layernorm", "blocks.0.norm3")]


def test_other_diffusers_version_leaves_wan_sites_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diffusers, "__version__", "0.43.0")
    model = build()
    report = xbackend.patch(model)
    assert set(report.by_kind()) == {"rmsnorm"}  # torch's own RMSNorm modules only
    assert report.skipped and all("0.43.0" in k.reason for k in report.skipped)
    assert not any("forward" in b.__dict__ for b in model.blocks)


def test_compiled_patched_model_has_no_graph_break() -> None:
    model = build()
    args = inputs()
    expected = run(model, args)
    xbackend.patch(model)
    out, seen = compiled_ops(model, args)
    assert_equal(tuple(out), expected)
    assert {"xbackend.layernorm_modulate_infer.default", "xbackend.add_layernorm_infer.default",
            "xbackend.gated_residual_infer.default", "xbackend.rotary_embedding_infer.default"} <= seen  # fmt: skip



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rope_reads_cos_and_sin_as_wan_does(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Wan reads cos[2i] and sin[2i+1] for both channels of pair i. Its own frequencies repeat each value
    twice, so any reading would agree there: unpaired random frequencies tell them apart."""
    model = build(layout="fp32").to(dtype)
    attn = model.blocks[0].attn1
    stock = attn.processor
    g = torch.Generator().manual_seed(5)
    x = torch.randn(BATCH, TOKENS, 24, generator=g).to(dtype)
    freqs = tuple(torch.randn(1, TOKENS, 1, 12, generator=g) for _ in range(2))  # float32
    with torch.no_grad():
        expected = stock(attn, x, None, None, freqs)
        xbackend.patch(model)
        calls = spy_ops(monkeypatch)
        got = attn.processor(attn, x, None, None, freqs)
    assert type(attn.processor).__name__ == "XbackendWanAttnProcessor" and calls["rotary_embedding"] == 2
    assert_equal(got, expected)
