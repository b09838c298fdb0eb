"""xbackend.patch on diffusers 0.42.1's Flux2Transformer2DModel: tiny configs, random weights, CPU."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

pytest.importorskip("diffusers")

from diffusers import Flux2Transformer2DModel
from patch_helpers import assert_equal, block_inputs, compiled_ops, overrides, randomize_norms, run, spy_ops

import xbackend

CONFIG = {
    "patch_size": 1, "in_channels": 8, "num_layers": 2, "num_single_layers": 2, "attention_head_dim": 8,
    "num_attention_heads": 2, "joint_attention_dim": 16, "timestep_guidance_channels": 16,
    "axes_dims_rope": (2, 2, 2, 2),
}  # fmt: skip
DOUBLE, SINGLE = CONFIG["num_layers"], CONFIG["num_single_layers"]
BATCH, HEIGHT, WIDTH, TEXT = 2, 2, 3, 4
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = Flux2Transformer2DModel(**CONFIG).eval()
    randomize_norms(model)
    return model.to(dtype)


def inputs(dtype: torch.dtype = torch.float32, variant: str = "dev") -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    rows, cols = torch.arange(float(HEIGHT)), torch.arange(float(WIDTH))
    grid = torch.meshgrid(torch.zeros(1), rows, cols, torch.zeros(1), indexing="ij")
    out: dict[str, Any] = {
        "hidden_states": torch.randn(BATCH, HEIGHT * WIDTH, 8, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(BATCH, TEXT, 16, generator=g).to(dtype),
        "timestep": torch.tensor([0.3, 0.7]),
        "img_ids": torch.stack(grid, dim=-1).reshape(-1, 4).float(),
        "txt_ids": torch.stack([torch.zeros(TEXT)] * 3 + [torch.arange(TEXT).float()], dim=-1),
        "guidance": torch.tensor([3.5, 4.0]),
        "return_dict": False,
    }
    if variant == "kv-extract":
        # Reference-image KV extraction: the first tokens take another timestep's modulation, so every
        # image-stream and single-block scale/shift/gate is a per-token [B, L, D] tensor.
        out.update(kv_cache_mode="extract", num_ref_tokens=2)
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("variant", ["dev", "kv-extract"])
@pytest.mark.parametrize("dtype", list(DTYPES.values()), ids=list(DTYPES))
def test_patched_is_bit_identical(dtype: torch.dtype, variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = build(dtype)
    args = inputs(dtype, variant)
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    xbackend.patch(model)
    assert_equal(run(model, args), expected)
    # Double block: norm1 and norm1_context modulations, each stream's gated attention residual folded
    # with norm2's modulate, the two MLP residuals, two SwiGLUs. Single block: norm, one gated
    # residual, one SwiGLU.
    assert calls["layernorm_modulate"] == 2 * DOUBLE + SINGLE
    assert calls["add_layernorm"] == 2 * DOUBLE
    assert calls["gated_residual"] == 2 * DOUBLE + SINGLE
    assert calls["silu_mul"] == 2 * DOUBLE + SINGLE
    assert calls["rmsnorm"] == 4 * DOUBLE + 2 * SINGLE  # q/k (and added q/k) norms


def test_report_lists_every_site() -> None:
    model = build()
    report = xbackend.patch(model)
    double = [f"transformer_blocks.{i}" for i in range(DOUBLE)]
    single = [f"single_transformer_blocks.{i}" for i in range(SINGLE)]
    by_kind = report.by_kind()
    assert by_kind["layernorm_modulate"] == [f"{b}.{n}" for b in double for n in
                                             ("norm1", "norm1_context", "norm2", "norm2_context")] + [
                                                 f"{b}.norm" for b in single]  # fmt: skip
    assert by_kind["add_layernorm"] == [f"{b}.{n}" for b in double for n in ("norm2", "norm2_context")]
    assert by_kind["gated_residual"] == [f"{b}.{n}" for b in double for n in ("attn", "ff", "ff_context")] + [
        f"{b}.attn" for b in single]
    assert by_kind["silu_mul"] == [f"{b}.{n}.act_fn" for b in double for n in ("ff", "ff_context")] + [
        f"{b}.attn.mlp_act_fn" for b in single]
    assert sorted(by_kind["rmsnorm"]) == sorted(n for n, m in model.named_modules() if type(m) is nn.RMSNorm)
    assert set(by_kind) == {"layernorm_modulate", "add_layernorm", "gated_residual", "silu_mul", "rmsnorm"}
    assert all(s.new for s in report.sites) and not report.skipped
    assert "flavour=torch" in next(s.detail for s in report.sites if s.path == "single_transformer_blocks.0.norm")


def test_only_and_exclude_per_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build()
    args = inputs()
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    report = xbackend.patch(model, only=("silu_mul",))
    assert report.counts() == {"silu_mul": 2 * DOUBLE + SINGLE}
    assert_equal(run(model, args), expected)
    assert calls["silu_mul"] == 2 * DOUBLE + SINGLE and calls["layernorm_modulate"] == 0
    xbackend.unpatch(model)
    calls.update(dict.fromkeys(calls, 0))
    report = xbackend.patch(model, exclude=("add_layernorm", "silu_mul"))
    assert "add_layernorm" not in report.counts() and "silu_mul" not in report.counts()
    assert_equal(run(model, args), expected)
    assert calls["add_layernorm"] == 0 and calls["silu_mul"] == 0
    assert calls["layernorm_modulate"] == 4 * DOUBLE + SINGLE and calls["gated_residual"] == 4 * DOUBLE + SINGLE


def test_unpatch_restores_and_a_copy_stays_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build()
    args = inputs()
    expected = run(model, args)
    report = xbackend.patch(model)
    clone = copy.deepcopy(model)
    calls = spy_ops(monkeypatch)
    assert_equal(run(clone, args), expected)
    assert calls["add_layernorm"] == 2 * DOUBLE and calls["silu_mul"] == 2 * DOUBLE + SINGLE
    restored = xbackend.unpatch(model)
    assert sorted((s.kind, s.path) for s in restored.sites) == sorted((s.kind, s.path) for s in report.sites)
    assert not overrides(model) and overrides(clone)
    for m in model.modules():
        assert m.forward.__func__ is type(m).forward
    calls.update(dict.fromkeys(calls, 0))
    assert_equal(run(model, args), expected)
    assert not any(calls.values())


def test_norms_kept_in_float32_run_the_written_expression(monkeypatch: pytest.MonkeyPatch) -> None:
    # Affine norms stored in float32 under a bf16 model (layerwise casting skips "norm" modules): aten
    # normalizes bf16 x with float32 weights, which the "torch" flavour (weights of x's dtype) does not
    # compute. Those sites run diffusers' expression; the gates and SwiGLUs still fuse.
    model = build(torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    for block in (*model.transformer_blocks, *model.single_transformer_blocks):
        for name, norm in list(block.named_children()):
            if type(norm) is nn.LayerNorm:
                affine = nn.LayerNorm(norm.normalized_shape, eps=norm.eps)
                affine.weight.data.uniform_(0.5, 1.5, generator=g)
                affine.bias.data.normal_(0, 0.1, generator=g)
                setattr(block, name, affine)
    args = inputs(torch.bfloat16)
    expected = run(model, args)
    calls = spy_ops(monkeypatch)
    assert xbackend.patch(model).counts()["layernorm_modulate"] == 4 * DOUBLE + SINGLE
    assert_equal(run(model, args), expected)
    assert calls["layernorm_modulate"] == 0 and calls["add_layernorm"] == 0
    assert calls["silu_mul"] == 2 * DOUBLE + SINGLE and calls["gated_residual"] == 4 * DOUBLE + SINGLE


def test_changes_after_patching_take_the_written_expression(monkeypatch: pytest.MonkeyPatch) -> None:
    ref, model = build(), build()
    xbackend.patch(model)
    calls = spy_ops(monkeypatch)
    for m in (ref, model):
        m.transformer_blocks[0].ff.act_fn.gate_fn = nn.GELU()  # not silu: the SwiGLU runs as written
        m.single_transformer_blocks[1].norm.register_forward_hook(lambda mod, i, o: o * 2)
    assert_equal(run(model, inputs()), run(ref, inputs()))
    assert calls["silu_mul"] == 2 * DOUBLE + SINGLE - 1 and calls["layernorm_modulate"] == 2 * DOUBLE + SINGLE - 1


def _with_chunk(mod: torch.Tensor, parts: int, i: int, value: float) -> torch.Tensor:
    chunks = list(mod.chunk(parts, dim=-1))
    chunks[i] = torch.full_like(chunks[i], value)
    return torch.cat(chunks, dim=-1)


def test_fp16_clip_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """A last residual past fp16's range is inf; both blocks clip it to 65504 as diffusers does. The
    streams sit at 65504 (their norms see constant rows: zeros) and the last gate is 1000; the attention
    gate of the double block's text stream is 0, so its MLP residual is the one that overflows. The
    norms' zeros modulated by a shift of 3 feed the MLP and the attention."""
    model = build(torch.float16)
    args = inputs(torch.float16)
    double, single = model.transformer_blocks[1], model.single_transformer_blocks[1]
    d_in = block_inputs(model, double, lambda: model(**args))
    s_in = block_inputs(model, single, lambda: model(**args))
    d_in["encoder_hidden_states"] = torch.full_like(d_in["encoder_hidden_states"], 65504)
    mod = d_in["temb_mod_txt"]
    for i, value in ((2, 0.0), (3, 3.0), (5, 1000.0)):  # gate_msa, shift_mlp (the MLP's input), gate_mlp
        mod = _with_chunk(mod, 6, i, value)
    d_in["temb_mod_txt"] = mod
    s_in["hidden_states"] = torch.full_like(s_in["hidden_states"], 65504)
    s_in["temb_mod"] = _with_chunk(_with_chunk(s_in["temb_mod"], 3, 0, 3.0), 3, 2, 1000.0)  # shift, gate
    outs: dict[str, torch.Tensor] = {}
    hooks = [double.ff_context.register_forward_hook(lambda m, i, o: outs.update(ff=o)),
             single.attn.register_forward_hook(lambda m, i, o: outs.update(attn=o))]  # fmt: skip
    with torch.no_grad():
        expected = double(**d_in), single(**s_in)
    for h in hooks:
        h.remove()
    # Unclipped, these residuals hold infs; diffusers' outputs are finite, with 65504 where they were.
    assert torch.isinf(65504 + torch.tensor(1000.0, dtype=torch.float16) * outs["ff"]).any()
    assert torch.isinf(65504 + torch.tensor(1000.0, dtype=torch.float16) * outs["attn"]).any()
    assert torch.isfinite(expected[0][0]).all() and torch.isfinite(expected[1]).all()
    xbackend.patch(model)
    calls = spy_ops(monkeypatch)
    with torch.no_grad():
        assert_equal(double(**d_in), expected[0])
        assert_equal(single(**s_in), expected[1])
    assert calls["gated_residual"] == 3 and calls["add_layernorm"] == 2


def test_swiglu_is_left_alone_when_gate_fn_is_not_silu() -> None:
    model = build()
    model.transformer_blocks[0].ff.act_fn.gate_fn = nn.SiLU(inplace=True)
    report = xbackend.patch(model)
    assert [(k.kind, k.path) for k in report.skipped] == [("silu_mul", "transformer_blocks.0.ff.act_fn")]
    assert "forward" not in model.transformer_blocks[0].ff.act_fn.__dict__


def test_compiled_patched_model_has_no_graph_break() -> None:
    model = build()
    args = inputs()
    expected = run(model, args)
    xbackend.patch(model)
    out, seen = compiled_ops(model, args)
    assert_equal(tuple(out), expected)
    assert {"xbackend.layernorm_modulate_infer.default", "xbackend.add_layernorm_infer.default",
            "xbackend.gated_residual_infer.default", "xbackend.silu_mul_infer.default"} <= seen  # fmt: skip
