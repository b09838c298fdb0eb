"""xbackend.patch on diffusers 0.42.1's QwenImageTransformer2DModel: tiny configs, random weights, CPU."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

import diffusers
from diffusers import QwenImageTransformer2DModel
from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock
from patch_helpers import assert_equal, block_inputs, compiled_ops, overrides, randomize_norms, run, spy_ops

import xbackend

CONFIG = {
    "patch_size": 2, "in_channels": 16, "out_channels": 4, "num_layers": 2, "attention_head_dim": 8,
    "num_attention_heads": 2, "joint_attention_dim": 16, "axes_dims_rope": (2, 2, 4),
}  # fmt: skip
# Qwen-Image; Qwen-Image-Edit-2511's zero_cond_t (the condition image's tokens modulated by the
# timestep-0 tables: modulate_index, per token).
VARIANTS = {"base": {}, "zero_cond_t": {"zero_cond_t": True}}
LAYERS = CONFIG["num_layers"]
BATCH, HEIGHT, WIDTH, TEXT = 2, 2, 3, 5
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build(variant: str = "base", dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(**CONFIG, **VARIANTS[variant]).eval()
    randomize_norms(model)
    return model.to(dtype)


def inputs(variant: str = "base", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    images = 2 if variant == "zero_cond_t" else 1  # the edit model's target and condition image
    mask = torch.ones(BATCH, TEXT)
    mask[1, -2:] = 0  # a padded prompt
    return {
        "hidden_states": torch.randn(BATCH, images * HEIGHT * WIDTH, 16, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(BATCH, TEXT, 16, generator=g).to(dtype),
        "encoder_hidden_states_mask": mask,
        "timestep": torch.tensor([0.3, 0.7]),
        "img_shapes": [[(1, HEIGHT, WIDTH)] * images] * BATCH,
        "return_dict": False,
    }


@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_patched_is_bit_identical(variant: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    model = build(variant, dtype)
    args = inputs(variant, dtype)
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    xbackend.patch(model)
    assert_equal(run(model, args), expected)
    # Per block: img_norm1 and txt_norm1 modulations; each stream's gated attention residual folded with
    # its norm2's modulate (zero_cond_t: the image stream's per-token tables); the two MLP residuals.
    assert calls["layernorm_modulate"] == 2 * LAYERS
    assert calls["add_layernorm"] == 2 * LAYERS
    assert calls["gated_residual"] == 2 * LAYERS
    assert calls["rmsnorm"] == 4 * LAYERS + 1  # q/k and added q/k norms, and the model's txt_norm


def test_report_lists_every_site() -> None:
    model = build()
    report = xbackend.patch(model)
    blocks = [f"transformer_blocks.{i}" for i in range(LAYERS)]
    by_kind = report.by_kind()
    assert by_kind["layernorm_modulate"] == [f"{b}.{n}" for b in blocks for n in
                                             ("img_norm1", "txt_norm1", "img_norm2", "txt_norm2")]  # fmt: skip
    assert by_kind["add_layernorm"] == [f"{b}.{n}" for b in blocks for n in ("img_norm2", "txt_norm2")]
    assert by_kind["gated_residual"] == [f"{b}.{n}" for b in blocks for n in ("attn", "img_mlp", "txt_mlp")]
    assert len(by_kind["rmsnorm"]) == 4 * LAYERS + 1
    assert set(by_kind) == {"layernorm_modulate", "add_layernorm", "gated_residual", "rmsnorm"}
    assert all(s.new for s in report.sites) and not report.skipped


def test_only_and_exclude_per_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build("zero_cond_t")
    args = inputs("zero_cond_t")
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    report = xbackend.patch(model, only=("layernorm_modulate",))
    assert report.counts() == {"layernorm_modulate": 4 * LAYERS}
    assert_equal(run(model, args), expected)
    assert calls["layernorm_modulate"] == 4 * LAYERS and calls["gated_residual"] == 0
    xbackend.unpatch(model)
    calls.update(dict.fromkeys(calls, 0))
    report = xbackend.patch(model, exclude=("layernorm_modulate",))
    assert {k.reason for k in report.skipped} == {"folds into the norm's layernorm_modulate site: patch that kind too"}
    assert_equal(run(model, args), expected)
    assert calls["layernorm_modulate"] == 0 and calls["add_layernorm"] == 0 and calls["gated_residual"] == 4 * LAYERS


def test_unpatch_restores_and_a_copy_stays_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build("zero_cond_t")
    args = inputs("zero_cond_t")
    expected = run(model, args)
    report = xbackend.patch(model)
    clone = copy.deepcopy(model)
    calls = spy_ops(monkeypatch)
    assert_equal(run(clone, args), expected)
    assert calls["add_layernorm"] == 2 * LAYERS
    restored = xbackend.unpatch(model)
    assert sorted((s.kind, s.path) for s in restored.sites) == sorted((s.kind, s.path) for s in report.sites)
    assert not overrides(model) and overrides(clone)
    calls.update(dict.fromkeys(calls, 0))
    assert_equal(run(model, args), expected)
    assert not any(calls.values())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_replaced_modulate_runs_as_it_is(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``_modulate`` replaced on the class (after patching) is what both models call: the fused
    modulations step aside, the gated residuals still fuse."""
    ref, model = build(variant), build(variant)
    xbackend.patch(model)
    stock = QwenImageTransformerBlock._modulate
    monkeypatch.setattr(QwenImageTransformerBlock, "_modulate", lambda self, x, mod, index=None: tuple(
        t * 2 for t in stock(self, x, mod, index)))
    calls = spy_ops(monkeypatch)
    assert_equal(run(model, inputs(variant)), run(ref, inputs(variant)))
    assert calls["layernorm_modulate"] == 0 and calls["add_layernorm"] == 0 and calls["gated_residual"] == 4 * LAYERS


def test_a_modulate_replaced_before_patching_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    stock = QwenImageTransformerBlock._modulate

    def replaced(self: nn.Module, x: torch.Tensor, mod: torch.Tensor, index: Any = None) -> Any:
        return stock(self, x, mod, index)

    monkeypatch.setattr(QwenImageTransformerBlock, "_modulate", replaced)
    report = xbackend.patch(build())
    assert set(report.counts()) == {"gated_residual", "rmsnorm"}
    assert {(k.kind, k.reason) for k in report.skipped} == {
        (kind, "QwenImageTransformerBlock._modulate is not diffusers' own (replaced on the class)")
        for kind in ("layernorm_modulate", "add_layernorm")}


def test_norms_kept_in_float32_run_the_written_expression(monkeypatch: pytest.MonkeyPatch) -> None:
    # Affine norms stored in float32 under a bf16 model: not the "torch" flavour (weights of x's dtype).
    model = build("zero_cond_t", torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    for block in model.transformer_blocks:
        for name in ("img_norm1", "txt_norm1", "img_norm2", "txt_norm2"):
            norm = nn.LayerNorm(block.dim, eps=1e-6)
            norm.weight.data.uniform_(0.5, 1.5, generator=g)
            setattr(block, name, norm)
    args = inputs("zero_cond_t", torch.bfloat16)
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    assert xbackend.patch(model).counts()["add_layernorm"] == 2 * LAYERS
    assert_equal(run(model, args), expected)
    assert calls["layernorm_modulate"] == 0 and calls["add_layernorm"] == 0 and calls["gated_residual"] == 4 * LAYERS


def test_hooks_added_after_patching_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ref, model = build(), build()
    xbackend.patch(model)
    calls = spy_ops(monkeypatch)
    for m in (ref, model):
        m.transformer_blocks[1].img_norm2.register_forward_hook(lambda mod, i, o: o * 2)
    assert_equal(run(model, inputs()), run(ref, inputs()))
    assert calls["add_layernorm"] == 2 * LAYERS - 1 and calls["layernorm_modulate"] == 2 * LAYERS


def test_fp16_clip_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both streams at 65504 (their norms see constant rows: zeros), attention gates 0, MLP inputs the
    shift 3 and MLP gates 1000: the MLP residuals leave fp16's range and diffusers clips them."""
    model = build("zero_cond_t", torch.float16)
    args = inputs("zero_cond_t", torch.float16)
    block = model.transformer_blocks[1]
    kw = block_inputs(model, block, lambda: model(**args))
    kw["hidden_states"] = torch.full_like(kw["hidden_states"], 65504)
    kw["encoder_hidden_states"] = torch.full_like(kw["encoder_hidden_states"], 65504)
    for mod in (block.img_mod[1], block.txt_mod[1]):
        mod.weight.data.zero_()
        bias = mod.bias.data.view(6, -1)  # shift1, scale1, gate1, shift2, scale2, gate2
        bias[2], bias[3], bias[5] = 0.0, 3.0, 1000.0
    outs: dict[str, torch.Tensor] = {}
    hooks = [block.img_mlp.register_forward_hook(lambda m, i, o: outs.update(img=o)),
             block.txt_mlp.register_forward_hook(lambda m, i, o: outs.update(txt=o))]  # fmt: skip
    with torch.no_grad():
        expected = block(**kw)
    for h in hooks:
        h.remove()
    big = torch.tensor(1000.0, dtype=torch.float16)
    assert torch.isinf(65504 + big * outs["img"]).any() and torch.isinf(65504 + big * outs["txt"]).any()
    assert all(torch.isfinite(t).all() for t in expected)
    xbackend.patch(model)
    calls = spy_ops(monkeypatch)
    with torch.no_grad():
        assert_equal(block(**kw), expected)
    assert calls["gated_residual"] == 2 and calls["add_layernorm"] == 2


def test_other_diffusers_version_leaves_qwen_sites_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diffusers, "__version__", "0.43.0")
    model = build()
    report = xbackend.patch(model)
    assert "layernorm_modulate" not in report.counts()
    assert {k.kind for k in report.skipped} == {"rmsnorm", "layernorm_modulate", "add_layernorm", "gated_residual"}
    assert all("0.43.0" in k.reason for k in report.skipped)
    assert not any("forward" in b.__dict__ for b in model.transformer_blocks)


def test_compiled_patched_model_has_no_graph_break() -> None:
    model = build("zero_cond_t")
    args = inputs("zero_cond_t")
    expected = run(model, args)
    xbackend.patch(model)
    out, seen = compiled_ops(model, args)
    assert_equal(tuple(out), expected)
    assert {"xbackend.layernorm_modulate_infer.default", "xbackend.add_layernorm_infer.default",
            "xbackend.gated_residual_infer.default"} <= seen  # fmt: skip
