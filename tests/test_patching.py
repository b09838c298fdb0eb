"""xbackend.patch / unpatch on diffusers 0.42.1 models: tiny configs, random weights, CPU.

On CPU every op resolves to its reference, so torch.equal between the patched and the stock model
proves the rewrite itself: same values, same rounding steps, same order. Whether the GPU kernels are
exact is the ops' tests' business (and benchmarks/patch_check.py's).
"""

from __future__ import annotations

import copy
import importlib
import io
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

pytest.importorskip("diffusers")

import diffusers
from diffusers import LTX2VideoDiffusionDecoderModel, LTX2VideoTransformer3DModel
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm

import xbackend
from xbackend.adapters.diffusers_ltx2 import set_diffvae_attention
from xbackend.patching import KINDS, PATCHES, PatchReport, _common

# -- the LTX-2 transformer ---------------------------------------------------------------------------------

TRANSFORMER_CONFIG = {
    "in_channels": 8, "out_channels": 8, "num_attention_heads": 2, "attention_head_dim": 12,
    "cross_attention_dim": 24, "audio_in_channels": 8, "audio_out_channels": 8, "audio_num_attention_heads": 2,
    "audio_attention_head_dim": 8, "audio_cross_attention_dim": 16, "num_layers": 2, "caption_channels": 16,
}  # fmt: skip
# LTX-2.0 as shipped; LTX-2.3-style (adaLN on the text cross-attention, gated attention, affine norms);
# LTX-2.5-style (static prompt K/V table) with perturbed attention and per-token timesteps.
VARIANTS = {
    "ltx2.0": {},
    "ltx2.3": {"cross_attn_mod": True, "audio_cross_attn_mod": True, "gated_attn": True, "audio_gated_attn": True,
               "norm_elementwise_affine": True},
    "ltx2.5": {"cross_attn_mod": True, "audio_cross_attn_mod": True, "use_prompt_adaln_single": False,
               "perturbed_attn": True, "norm_elementwise_affine": True},
}  # fmt: skip
VARIANTS["ltx2.3-split"] = {**VARIANTS["ltx2.3"], "rope_type": "split"}  # LTX-2.3's split RoPE
BATCH, FRAMES, HEIGHT, WIDTH, AUDIO = 2, 2, 3, 4, 5
TOKENS = FRAMES * HEIGHT * WIDTH


def build_transformer(variant: str = "ltx2.0", dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = LTX2VideoTransformer3DModel(**TRANSFORMER_CONFIG, **VARIANTS[variant]).eval()
    if variant != "ltx2.0":
        # Affine norms start at ones; random weights make their rounding visible.
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith(".weight"):
                p.data.uniform_(0.5, 1.5)
    return model.to(dtype)


def transformer_inputs(variant: str, dtype: torch.dtype) -> dict[str, Any]:
    g = torch.Generator().manual_seed(1)
    inputs: dict[str, Any] = {
        "hidden_states": torch.randn(BATCH, TOKENS, 8, generator=g).to(dtype),
        "audio_hidden_states": torch.randn(BATCH, AUDIO, 8, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(BATCH, 6, 16, generator=g).to(dtype),
        "audio_encoder_hidden_states": torch.randn(BATCH, 6, 16, generator=g).to(dtype),
        "timestep": torch.tensor([0.3, 0.7]),
        "sigma": torch.tensor([0.3, 0.7]),
        "num_frames": FRAMES, "height": HEIGHT, "width": WIDTH, "audio_num_frames": AUDIO,
        "return_dict": False,
    }  # fmt: skip
    if variant == "ltx2.5":
        # Per-token timesteps make every scale/shift/gate [B, L, D]; STG perturbs block 1.
        inputs["timestep"] = torch.rand(BATCH, TOKENS, generator=g)
        inputs["audio_timestep"] = torch.rand(BATCH, AUDIO, generator=g)
        inputs["spatio_temporal_guidance_blocks"] = [1]
        inputs["perturbation_mask"] = torch.tensor([1.0, 0.0]).to(dtype)
    return inputs


def run(model: nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model(**inputs)


def assert_equal(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y), f"max |diff| {(x.float() - y.float()).abs().max().item()}"


def paths_of(model: nn.Module, *classes: type) -> list[str]:
    return [name for name, m in model.named_modules() if type(m) in classes]


@pytest.fixture
def op_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the patched code called each fused op (so a test knows the fused path ran)."""
    calls = {"rmsnorm": 0, "rmsnorm_modulate": 0, "gated_residual": 0, "rotary_embedding": 0, "qk_norm_rope": 0}
    attrs = {"rotary_embedding": "_ROTARY"}
    for name in calls:
        attr = attrs.get(name, f"_{name.upper()}")
        op = getattr(_common, attr)

        def spy(*args: Any, _op: Any = op, _name: str = name) -> torch.Tensor:
            calls[_name] += 1
            return _op(*args)

        monkeypatch.setattr(_common, attr, spy)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_transformer_patched_is_bit_identical(variant: str, dtype: torch.dtype, op_calls: dict[str, int]) -> None:
    model = build_transformer(variant, dtype)
    inputs = transformer_inputs(variant, dtype)
    isolated = {**inputs, "isolate_modalities": True}  # skips the audio<->video cross-attention
    expected, expected_isolated = run(model, inputs), run(model, isolated)
    xbackend.patch(model)
    assert_equal(run(model, inputs), expected)
    # Per block: modulations norm1 x2, a2v/v2a 4, norm3 x2 (+ norm2 x2 with text adaLN); gates
    # attn1 x2, a2v/v2a 2, ff x2 (+ attn2 x2). Every one of them took the fused op.
    adaln = 2 if variant != "ltx2.0" else 0
    layers = TRANSFORMER_CONFIG["num_layers"]
    assert op_calls["rmsnorm_modulate"] == layers * (8 + adaln)
    assert op_calls["gated_residual"] == layers * (6 + adaln)
    # RoPE of query and key, interleaved or split: attn1 and audio_attn1 (self-attention) fuse both norms
    # and both RoPEs into one qk_norm_rope; a2v and v2a (keys of the other modality) rotate q and k apart.
    # LTX-2.5's perturbed-attention processor is not the one the RoPE patch transcribes (left alone).
    rope_calls = {"ltx2.5": (0, 0)}.get(variant, (2, 4))
    assert op_calls["qk_norm_rope"] == layers * rope_calls[0]
    assert op_calls["rotary_embedding"] == layers * rope_calls[1]
    assert_equal(run(model, isolated), expected_isolated)


def test_qk_fusion_steps_aside_for_hooks_and_wrappers(op_calls: dict[str, int]) -> None:
    """norm_q/norm_k are skipped by the fused q/k path; a hook or a forward wrapper added to them after
    patch() must still run, so those calls take the norms as written (same bits either way)."""
    model = build_transformer("ltx2.0", torch.float32)
    inputs = transformer_inputs("ltx2.0", torch.float32)
    expected = run(model, inputs)
    xbackend.patch(model)
    attn = model.transformer_blocks[0].attn1
    seen: list[str] = []
    handle = attn.norm_q.register_forward_hook(lambda *_: seen.append("hook"))
    assert_equal(run(model, inputs), expected)
    assert seen and op_calls["qk_norm_rope"] == TRANSFORMER_CONFIG["num_layers"] * 2 - 1
    handle.remove()
    inner = attn.norm_k.forward
    attn.norm_k.forward = lambda x: (seen.append("wrapper"), inner(x))[1]  # what accelerate's hooks do
    op_calls["qk_norm_rope"] = 0
    assert_equal(run(model, inputs), expected)
    assert "wrapper" in seen and op_calls["qk_norm_rope"] == TRANSFORMER_CONFIG["num_layers"] * 2 - 1


def block_inputs(model: nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the model's first transformer block receives for ``inputs``."""
    captured: dict[str, Any] = {}
    block = model.transformer_blocks[0]
    handle = block.register_forward_pre_hook(lambda _m, _a, kw: captured.update(kw), with_kwargs=True)
    run(model, inputs)
    handle.remove()
    return captured


@pytest.mark.parametrize("wrap_before_patch", [True, False])
def test_compiled_qk_fusion_keeps_a_forward_wrapper(wrap_before_patch: bool) -> None:
    """The fused q/k path must not skip a wrapper on norm_k in a compiled block either (the per-call check
    is traced: it compares the instance's forward with the one patch() installed)."""
    model = build_transformer("ltx2.3", torch.float32)
    inputs = transformer_inputs("ltx2.3", torch.float32)
    block = model.transformer_blocks[0]
    captured = block_inputs(model, inputs)

    def wrap() -> None:
        inner = block.attn1.norm_k.forward
        block.attn1.norm_k.forward = lambda x: inner(x) * 2  # a wrapper that changes the result

    if wrap_before_patch:
        wrap()
    report = xbackend.patch(model)
    if not wrap_before_patch:
        wrap()
    detail = next(s.detail for s in report.sites if s.kind == "rotary_embedding" and s.path == "transformer_blocks.0.attn1")
    assert ("not fused" in detail) == wrap_before_patch
    torch._dynamo.reset()
    with torch.no_grad():
        eager = block(**captured)
        compiled = torch.compile(block, fullgraph=True, backend="eager")(**captured)
    assert_equal(compiled, eager)


@pytest.mark.parametrize("variant", ["ltx2.0", "ltx2.3"])
def test_transformer_report_lists_every_site(variant: str) -> None:
    model = build_transformer(variant)
    report = xbackend.patch(model)
    adaln = variant == "ltx2.3"
    norms = ["norm1", "audio_norm1", *(["norm2", "audio_norm2"] if adaln else []), "audio_to_video_norm",
             "video_to_audio_norm", "norm3", "audio_norm3"]  # fmt: skip
    gates = ["attn1", "audio_attn1", *(["attn2", "audio_attn2"] if adaln else []), "audio_to_video_attn",
             "video_to_audio_attn", "ff", "audio_ff"]  # fmt: skip
    blocks = [f"transformer_blocks.{i}" for i in range(TRANSFORMER_CONFIG["num_layers"])]
    by_kind = report.by_kind()
    assert sorted(by_kind["rmsnorm_modulate"]) == sorted(f"{b}.{n}" for b in blocks for n in norms)
    assert sorted(by_kind["gated_residual"]) == sorted(f"{b}.{g}" for b in blocks for g in gates)
    # Every RMSNorm of the model: diffusers' (flavour "diffusers") and the attention q/k norms ("torch").
    assert sorted(by_kind["rmsnorm"]) == sorted(paths_of(model, DiffusersRMSNorm, nn.RMSNorm))
    flavours = {s.path: s.detail.split()[0] for s in report.sites if s.kind == "rmsnorm"}
    assert flavours["transformer_blocks.0.norm1"] == "flavour=diffusers"
    assert flavours["transformer_blocks.0.attn1.norm_q"] == "flavour=torch"
    attentions = ["attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn"]
    assert sorted(by_kind["rotary_embedding"]) == sorted(f"{b}.{a}" for b in blocks for a in attentions)
    assert set(by_kind) == {"rmsnorm", "rmsnorm_modulate", "gated_residual", "rotary_embedding"}
    assert all(s.new for s in report.sites) and not report.skipped
    assert "rmsnorm_modulate" in str(report) and "transformer_blocks.1.ff" in report.table()
    # norm_out is a LayerNorm followed by `* (1 + scale) + shift`: not an RMSNorm site, left alone.
    assert "forward" not in model.norm_out.__dict__


def _overrides(model: nn.Module) -> dict[str, Any]:
    return {name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__}


def test_patching_twice_is_harmless() -> None:
    model = build_transformer("ltx2.3")
    inputs = transformer_inputs("ltx2.3", torch.float32)
    expected = run(model, inputs)
    first = xbackend.patch(model)
    installed = _overrides(model)
    second = xbackend.patch(model)
    assert [(s.kind, s.path, s.detail) for s in second.sites] == [(s.kind, s.path, s.detail) for s in first.sites]
    assert not any(s.new for s in second.sites)
    assert _overrides(model) == installed  # the same bound methods: nothing re-wrapped
    assert_equal(run(model, inputs), expected)


def test_unpatch_restores_the_model_exactly() -> None:
    model = build_transformer("ltx2.3")
    inputs = transformer_inputs("ltx2.3", torch.float32)
    expected = run(model, inputs)
    state = {k: (v.data_ptr(), v.clone()) for k, v in model.state_dict().items()}
    dicts = {name: set(m.__dict__) for name, m in model.named_modules()}
    report = xbackend.patch(model)
    assert set(model.state_dict()) == set(state)
    restored = xbackend.unpatch(model)
    assert restored.action == "unpatch" and "restored" in str(restored)
    assert sorted((s.kind, s.path) for s in restored.sites) == sorted((s.kind, s.path) for s in report.sites)
    for name, m in model.named_modules():
        assert set(m.__dict__) == dicts[name], name
        assert m.forward.__func__ is type(m).forward, name
    after = model.state_dict()
    assert set(after) == set(state)
    for k, (ptr, value) in state.items():
        assert after[k].data_ptr() == ptr and torch.equal(after[k], value)
    assert_equal(run(model, inputs), expected)
    assert len(xbackend.unpatch(model)) == 0


def test_copies_of_a_patched_model() -> None:
    model = build_transformer()
    inputs = transformer_inputs("ltx2.0", torch.float32)
    expected = run(model, inputs)
    report = xbackend.patch(model)
    clone = copy.deepcopy(model)  # patched too, bound to its own modules
    assert clone.transformer_blocks[0].forward.__self__ is clone.transformer_blocks[0]
    assert_equal(run(clone, inputs), expected)
    assert len(xbackend.unpatch(clone)) == len(report)
    assert not _overrides(clone) and len(_overrides(model)) > 0
    # Pickled whole, it loads unpatched (stock forwards) and patches again.
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert_equal(run(loaded, inputs), expected)
    assert len(xbackend.patch(loaded)) == len(report)
    assert_equal(run(loaded, inputs), expected)


def test_kinds_selects_sites_and_rejects_unknown_names() -> None:
    model = build_transformer("ltx2.3")
    inputs = transformer_inputs("ltx2.3", torch.float32)
    expected = run(model, inputs)
    report = xbackend.patch(model, kinds=["gated_residual"])
    assert set(report.by_kind()) == {"gated_residual"}
    assert "forward" not in model.transformer_blocks[0].norm1.__dict__
    assert_equal(run(model, inputs), expected)
    with pytest.raises(ValueError, match="kinds.*rmsnorm"):
        xbackend.patch(model, kinds=["rmsnorm", "layernorm"])
    assert set(KINDS) >= {"rmsnorm", "rmsnorm_modulate", "gated_residual", "neighborhood_attention", "tiled_decode"}


def test_only_and_exclude_bisect_by_site_kind() -> None:
    model = build_transformer("ltx2.3")
    inputs = transformer_inputs("ltx2.3", torch.float32)
    expected = run(model, inputs)
    report = xbackend.patch(model, only=("gated_residual",))
    assert set(report.by_kind()) == {"gated_residual"}
    xbackend.unpatch(model)
    report = xbackend.patch(model, exclude=("gated_residual", "rmsnorm"))
    assert report.by_kind() and "gated_residual" not in report.by_kind() and "rmsnorm" not in report.by_kind()
    assert_equal(run(model, inputs), expected)
    xbackend.unpatch(model)
    with pytest.raises(ValueError, match="argument 'exclude'"):
        xbackend.patch(model, exclude=("layernorm",))
    with pytest.raises(TypeError, match="not both"):
        xbackend.patch(model, kinds=("rmsnorm",), only=("rmsnorm",))


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_mixed_dtypes_fall_back_to_the_written_expression(op_calls: dict[str, int]) -> None:
    # fp32 activations through bf16 norm weights: diffusers' RMSNorm returns bf16 and the modulation
    # promotes back to fp32, which no fused op computes. The patched model must run the expression.
    model = build_transformer("ltx2.3")
    for m in model.modules():
        if isinstance(m, DiffusersRMSNorm | nn.RMSNorm) and m.weight is not None:
            m.weight.data = m.weight.data.bfloat16()
    inputs = transformer_inputs("ltx2.3", torch.float32)
    expected = run(model, inputs)
    assert xbackend.patch(model).counts()["rmsnorm_modulate"] > 0
    assert_equal(run(model, inputs), expected)
    assert op_calls["rmsnorm_modulate"] == 0 and op_calls["rmsnorm"] == 0 and op_calls["gated_residual"] > 0


def test_hooked_norm_keeps_its_modulation_and_its_hook() -> None:
    model = build_transformer()
    inputs = transformer_inputs("ltx2.0", torch.float32)
    calls: list[str] = []
    model.transformer_blocks[0].norm1.register_forward_hook(lambda *_: calls.append("norm1"))
    expected = run(model, inputs)
    report = xbackend.patch(model)
    assert [(k.path, "hooks" in k.reason) for k in report.skipped] == [("transformer_blocks.0.norm1", True)]
    assert "transformer_blocks.1.norm1" in report.by_kind()["rmsnorm_modulate"]
    calls.clear()
    assert_equal(run(model, inputs), expected)
    assert calls == ["norm1"]


def test_foreign_forward_wrapper_is_left_alone() -> None:
    model = build_transformer()
    block = model.transformer_blocks[1]
    original = block.forward

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    block.forward = wrapper
    report = xbackend.patch(model)
    assert block.__dict__["forward"] is wrapper
    assert {k.path.split(".")[1] for k in report.skipped} == {"1"}
    assert all("already replaced" in k.reason for k in report.skipped)
    assert xbackend.unpatch(model) and block.__dict__["forward"] is wrapper


class _CustomNorm(nn.RMSNorm):
    """A subclass may change anything; patch must not treat it as torch's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 2


def test_unknown_and_unsupported_modules_are_left_alone() -> None:
    model = nn.ModuleDict({
        "custom": _CustomNorm(16, eps=1e-6),
        "layernorm": nn.LayerNorm(16),
        "default_eps": nn.RMSNorm(16),
        "two_dims": nn.RMSNorm((4, 16), eps=1e-6),
        "with_bias": DiffusersRMSNorm(16, eps=1e-6, bias=True),
        "torch": nn.RMSNorm(16, eps=1e-5),
        "diffusers": DiffusersRMSNorm(16, eps=1e-6, elementwise_affine=False),
    })  # fmt: skip
    report = xbackend.patch(model)
    assert sorted(report.by_kind()["rmsnorm"]) == ["diffusers", "torch"]
    reasons = {k.path: k.reason for k in report.skipped}
    assert set(reasons) == {"default_eps", "two_dims", "with_bias"}
    assert "eps=None" in reasons["default_eps"] and "bias" in reasons["with_bias"]
    for name in ("custom", "layernorm", "default_eps", "two_dims", "with_bias"):
        assert "forward" not in model[name].__dict__, name
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        x = (torch.randn(3, 5, 16, generator=g) * 4).to(dtype)
        for name in ("torch", "diffusers"):
            module = model[name].to(dtype)
            got = module(x)
            xbackend.unpatch(model)
            assert torch.equal(got, module(x)), (name, dtype)
            xbackend.patch(model)


def test_every_row_of_the_patch_table_names_a_class() -> None:
    for name in PATCHES:
        module, _, qualname = name.rpartition(".")
        cls = getattr(importlib.import_module(module), qualname)
        assert f"{cls.__module__}.{cls.__qualname__}" == name


class _Scale(nn.Module):
    """A model family of one class, patched through a row of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * 2


def _patch_scale(module: nn.Module, path: str, found: _common.Findings, options: _common.PatchOptions) -> None:
    found.add("rmsnorm", path, f"toy site; kinds={sorted(options.kinds)}")


def _unpatch_scale(module: nn.Module, path: str, found: _common.Findings) -> None:
    found.add("rmsnorm", path, "toy site restored")


def test_a_new_model_family_is_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PATCHES, f"{__name__}._Scale", (_patch_scale, _unpatch_scale))
    model = nn.ModuleDict({"scale": _Scale(), "norm": nn.RMSNorm(4, eps=1e-6)})
    report = xbackend.patch(model, kinds=["rmsnorm"])
    assert [(s.path, s.detail) for s in report.sites] == [
        ("scale", "toy site; kinds=['rmsnorm']"), ("norm", "flavour=torch dim=4 eps=1e-06 weight=yes")]
    assert [s.path for s in xbackend.unpatch(model).sites] == ["scale", "norm"]


def test_other_diffusers_version_leaves_diffusers_sites_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(diffusers, "__version__", "0.43.0")
    model = build_transformer()
    report = xbackend.patch(model)
    # torch.nn.RMSNorm is torch's, not diffusers': still patched. Nothing diffusers-derived is.
    assert set(report.by_kind()) == {"rmsnorm"}
    assert sorted(report.by_kind()["rmsnorm"]) == sorted(paths_of(model, nn.RMSNorm))
    assert report.skipped and all("0.43.0" in k.reason for k in report.skipped)
    assert "forward" not in model.transformer_blocks[0].__dict__


def test_compiled_patched_block_has_no_graph_break() -> None:
    model = build_transformer("ltx2.3")
    inputs = transformer_inputs("ltx2.3", torch.float32)
    block = model.transformer_blocks[0]
    captured = block_inputs(model, inputs)
    xbackend.patch(model)
    seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        eager = block(**captured)
        compiled = torch.compile(block, fullgraph=True, backend=backend)(**captured)
    assert_equal(compiled, eager)
    # no grad: the inference twins of the ops (register_inference_op), one opaque node each
    assert {"xbackend.rmsnorm_modulate_infer.default", "xbackend.gated_residual_infer.default",
            "xbackend.qk_norm_rope_infer.default"} <= set(seen)  # fmt: skip


# -- the DiffVAE (LTX-2.5 diffusion decoder) ---------------------------------------------------------------

DIFFVAE_CONFIG = {
    "latent_channels": 8, "patch_size": 2, "decoder_head_dim": 8, "decoder_stage_channels": (32, 16, 8, 8, 8),
    "decoder_stage_depths": (1, 1, 1, 1, 2), "decoder_stage_kernels": ((3, 3, 3),) * 4,
    "decoder_upsample_channel_reductions": (2, 2, 1, 1), "decoder_stage5_kernel": (3, 3, 3),
    "decoder_t_emb_dim": 32,
}  # fmt: skip
# Feature grid (T, H, W) = (9, 12, 16): a 3x3x3 tile grid, the last t tile carrying the ghost frames.
DIFFVAE_TILING = {
    "tile_sample_min_num_frames": 10, "tile_sample_stride_num_frames": 6, "tile_sample_min_height": 24,
    "tile_sample_stride_height": 16, "tile_sample_min_width": 28, "tile_sample_stride_width": 20,
}  # fmt: skip
DIFFVAE_LATENT = (1, 8, 3, 3, 4)


@pytest.fixture
def one_thread():
    # Reductions in the same order on both sides (and in the spawned ranks, which run one thread each).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build_diffvae(state: dict | None = None, dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    model = LTX2VideoDiffusionDecoderModel(**DIFFVAE_CONFIG).eval()
    if state is not None:
        model.load_state_dict(state)
    else:
        # The adaLN tables start at zero; random ones make the modulation matter.
        for block in model.decoder.diff_blocks:
            block.scale_shift_table.data.normal_(0, 0.5)
    model.enable_tiling(**DIFFVAE_TILING)
    return model.to(dtype)


def decode(model: nn.Module, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    z = torch.randn(DIFFVAE_LATENT, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        return model.decode(z, generator=torch.Generator().manual_seed(7)).sample


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_diffvae_patched_matches_stock_flex_within_attention_tolerance(one_thread) -> None:
    model = build_diffvae()
    expected = decode(model)  # diffusers' own tiled_decode and flex attention
    report = xbackend.patch(model)
    counts = report.counts()
    assert counts == {"rmsnorm": 25, "rmsnorm_modulate": 4, "add_rmsnorm": 8, "qk_norm_rope_3d": 6,
                      "neighborhood_attention": 6, "silu_mul": 6, "tiled_decode": 1}, counts  # fmt: skip
    assert sorted(report.by_kind()["neighborhood_attention"]) == sorted(
        n for n, m in model.named_modules() if hasattr(m, "project_qkv")
    )
    assert report.by_kind()["tiled_decode"] == [""]
    assert sorted(report.by_kind()["rmsnorm_modulate"]) == [f"decoder.diff_blocks.{i}.norm{j}" for i in (0, 1) for j in (1, 2)]
    det_blocks = [n for n, m in model.named_modules() if type(m).__name__ == "LTX2VideoVaeNABlock"]
    assert len(det_blocks) == 4 and sorted(report.by_kind()["add_rmsnorm"]) == sorted(
        [f"{b}.norm2" for b in det_blocks] + report.by_kind()["rmsnorm_modulate"]
    )
    got = decode(model)
    assert got.shape == expected.shape == (1, 3, 17, 48, 64)
    rel = ((got - expected).norm() / expected.norm()).item()
    assert rel < 1e-5, rel
    # Unpatched, it is diffusers' processor and decode again: the stock bits come back.
    restored = xbackend.unpatch(model)
    assert restored.counts() == counts
    assert all(type(m.processor).__name__ == "LTX2VideoVaeNeighborhoodAttnProcessor"
               for m in model.modules() if hasattr(m, "project_qkv"))  # fmt: skip
    assert "tiled_decode" not in model.__dict__
    assert torch.equal(decode(model), expected)
    # Patched again, a deep copy keeps xbackend's processors (rebuilt, not copied) and their originals.
    xbackend.patch(model)
    clone = copy.deepcopy(model)
    assert len(xbackend.unpatch(clone)) == len(report)
    assert torch.equal(decode(clone), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_diffvae_rewrite_is_bit_identical_with_the_same_attention(one_thread, dtype: torch.dtype) -> None:
    # Both sides run xbackend's attention through the adapter's processor, which patch does not own
    # (reported, left alone): what remains is the block rewrite, the norms and the tiled decode.
    model = build_diffvae(dtype=dtype)
    set_diffvae_attention(model, xbackend.get_op("neighborhood_attention"))
    expected = decode(model, dtype)
    report = xbackend.patch(model)
    assert {k.kind for k in report.skipped} == {"neighborhood_attention"}
    assert all("not one of diffusers' own" in k.reason for k in report.skipped)
    assert report.counts() == {"rmsnorm": 25, "rmsnorm_modulate": 4, "add_rmsnorm": 8, "silu_mul": 6, "tiled_decode": 1}
    assert torch.equal(decode(model, dtype), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_diffvae_fully_patched_is_bit_identical_to_only_its_attention_patched(one_thread, dtype: torch.dtype) -> None:
    """Same attention kernel on both sides: every other site (norms, modulations, the q/k prelude, the
    SwiGLU product, the tiled decode) reproduces diffusers' bits."""
    model = build_diffvae(dtype=dtype)
    assert xbackend.patch(model, only=("neighborhood_attention",)).counts() == {"neighborhood_attention": 6}
    expected = decode(model, dtype)
    xbackend.unpatch(model)
    report = xbackend.patch(model)
    assert report.counts()["qk_norm_rope_3d"] == report.counts()["silu_mul"] == 6 and not report.skipped, str(report)
    assert torch.equal(decode(model, dtype), expected)
    xbackend.unpatch(model)
    report = xbackend.patch(model, exclude=("qk_norm_rope_3d", "silu_mul", "add_rmsnorm"))
    assert not {"qk_norm_rope_3d", "silu_mul", "add_rmsnorm"} & set(report.counts())
    assert torch.equal(decode(model, dtype), expected)


def test_diffvae_residual_adds_fold_only_into_routed_norms(one_thread) -> None:
    """A residual add joins the norm that reads its sum where that norm is routed: asked alone, the fold
    reports each site with what else to patch; hooked on the norm, the add and the hooked norm run."""
    model = build_diffvae()
    report = xbackend.patch(model, only=("add_rmsnorm",))
    assert not report.sites and len(report.skipped) == 8
    assert {k.reason for k in report.skipped} == {"folds into the norm's rmsnorm site: patch that kind too",
                                                  "folds into the norm's rmsnorm_modulate site: patch that kind too"}
    xbackend.unpatch(model)
    report = xbackend.patch(model, only=("add_rmsnorm", "rmsnorm"))
    assert report.counts() == {"add_rmsnorm": 4, "rmsnorm": 25}
    xbackend.unpatch(model)
    xbackend.patch(model, only=("neighborhood_attention",))
    expected = decode(model)
    xbackend.unpatch(model)
    xbackend.patch(model)
    block = next(m for m in model.modules() if type(m).__name__ == "LTX2VideoVaeNABlock")
    seen = []
    block.norm2.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape))
    assert torch.equal(decode(model), expected) and seen  # the hooked norm ran, on the sum


def test_diffvae_add_fold_reports_a_norm_it_cannot_fuse() -> None:
    model = build_diffvae()
    model.decoder.diff_blocks[0].norm1.register_forward_hook(lambda *a: None)
    report = xbackend.patch(model)
    left = {(k.kind, k.path) for k in report.skipped}
    assert left == {("rmsnorm_modulate", "decoder.diff_blocks.0.norm1"), ("add_rmsnorm", "decoder.diff_blocks.0.norm1")}
    assert report.counts()["add_rmsnorm"] == 7


def test_diffvae_prelude_needs_the_attention_site_and_steps_aside_for_hooks() -> None:
    model = build_diffvae()
    report = xbackend.patch(model, only=("qk_norm_rope_3d",))
    assert not report.sites and {k.kind for k in report.skipped} == {"qk_norm_rope_3d"}
    assert "patch that kind too" in report.skipped[0].reason
    xbackend.unpatch(model)
    xbackend.patch(model)
    attn = next(m for m in model.modules() if hasattr(m, "project_qkv"))
    calls = []
    attn.norm_q.register_forward_hook(lambda *a: calls.append(1))
    decode(model)
    assert calls  # the hooked norm ran: that layer took diffusers' project_qkv


def test_diffvae_tiled_decode_is_serial_unless_given_a_decode_group() -> None:
    """Which ranks decode is in the report; bad decode_group values name the argument. The ranks
    themselves: test_patch_decode_group.py."""
    model = build_diffvae()
    report = xbackend.patch(model, only=("tiled_decode",))
    assert "tiled_decode at <model>: serial, on this rank alone (no decode_group)" in str(report), str(report)
    xbackend.unpatch(model)
    for bad, kind, got in [
        ("world", TypeError, "got str"),
        (True, TypeError, "got bool"),
        (dist.GroupMember.NON_GROUP_MEMBER, TypeError, "got GroupMember.NON_GROUP_MEMBER (what new_group returns"),
        ([0, 1], TypeError, "got list"),
    ]:
        with pytest.raises(kind) as info:
            xbackend.patch(model, decode_group=bad)
        message = str(info.value)
        assert message.startswith("xbackend.patch: argument 'decode_group' expected None (each rank decodes"), message
        assert got in message, message
    assert "tiled_decode" not in model.__dict__  # refused before anything was patched


def test_diffvae_decode_group_of_one_rank_and_after_destroy(tmp_path) -> None:
    model = build_diffvae()
    set_diffvae_attention(model, xbackend.get_op("neighborhood_attention"))
    expected = decode(model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        report = xbackend.patch(model, decode_group=group)
        assert "parallel, tiles over decode_group the default group (1 rank: 0)" in str(report), str(report)
        assert torch.equal(decode(model), expected)  # one rank: nothing to compare, nothing to exchange
        # Patched again with another decode_group: the first one stays, and the report says so.
        again = xbackend.patch(model)
        assert [(k.kind, k.path) for k in again.skipped if k.kind == "tiled_decode"] == [("tiled_decode", "")]
        assert "unpatch first to change it" in str(again)
        xbackend.unpatch(model)
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="argument 'decode_group' expected .* got a process group while torch.distributed"):
        xbackend.patch(model, decode_group=group)


def test_report_is_printable_and_serialisable() -> None:
    model = build_transformer()
    report = xbackend.patch(model)
    assert isinstance(report, PatchReport) and len(report) == len(report.to_dict()["sites"])
    assert str(report).startswith(f"xbackend patch: {len(report)} sites")


def test_patch_and_unpatch_reject_a_non_module() -> None:
    with pytest.raises(TypeError, match="xbackend.patch: argument 'model' expected a torch.nn.Module, got str"):
        xbackend.patch("model")
    with pytest.raises(TypeError, match="xbackend.unpatch: argument 'model' expected a torch.nn.Module, got dict"):
        xbackend.unpatch({})


def test_unpatch_keeps_an_attention_backend_chosen_after_patch() -> None:
    model = build_transformer("ltx2.0")
    attn = model.transformer_blocks[0].attn1
    original = attn.processor
    xbackend.patch(model)
    attn.processor._attention_backend = "native"  # what set_attention_backend does to each processor
    xbackend.unpatch(model)
    assert attn.processor is original and original._attention_backend == "native"


@pytest.mark.parametrize("variant", ["ltx2.0", "ltx2.3"])  # ltx2.3: gated attention
@pytest.mark.parametrize("masked", [False, True])
def test_rope_processor_equals_diffusers_with_and_without_a_mask(variant: str, masked: bool) -> None:
    model = build_transformer(variant)
    attn = model.transformer_blocks[0].attn1  # video self-attention: 24 channels, 2 heads
    g = torch.Generator().manual_seed(5)
    x = torch.randn(BATCH, TOKENS, 24, generator=g)
    angle = torch.rand(BATCH, TOKENS, 24, generator=g) * 6.3
    freqs = (angle.cos(), angle.sin())
    mask = None
    if masked:  # additive, per key token, as the pipelines pass an encoder mask
        mask = torch.zeros(BATCH, 1, TOKENS)
        mask[:, :, TOKENS // 2 :] = -10000.0
    expected = attn(x, None, mask, freqs, None)
    if masked:  # the mask matters for these inputs
        assert not torch.equal(expected, attn(x, None, None, freqs, None))
    xbackend.patch(model, kinds=["rotary_embedding"])
    assert type(attn.processor).__name__ == "XbackendLTX2AttnProcessor"
    assert_equal(attn(x, None, mask, freqs, None), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_swiglu_keeps_diffusers_token_tiles(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    from diffusers.models.autoencoders import ltx2_diffusion_decoder as dd

    monkeypatch.setattr(dd, "_SWIGLU_TILE_SIZE", 7)  # 3 x 4 x 5 = 60 tokens: 9 tiles, the last partial
    torch.manual_seed(0)
    mlp = dd.LTX2VideoVaeSwiGLU(16, 48).to(dtype)
    x = torch.randn(1, 3, 4, 5, 16).to(dtype)
    with torch.no_grad():
        want = mlp(x)
        report = xbackend.patch(mlp)
        assert report.counts() == {"silu_mul": 1} and "tiles of 7 tokens" in report.sites[0].detail
        assert torch.equal(mlp(x), want)
        assert torch.equal(mlp(x[:, :1, :1]), dd.LTX2VideoVaeSwiGLU.forward(mlp, x[:, :1, :1]))  # one tile
    xbackend.unpatch(mlp)
    assert "forward" not in mlp.__dict__


def _diffvae_pair(dtype: torch.dtype = torch.float32) -> tuple[nn.Module, nn.Module]:
    """The same DiffVAE twice: attention-only patched (the reference) and fully patched."""
    ref, full = build_diffvae(dtype=dtype), build_diffvae(dtype=dtype)
    xbackend.patch(ref, only=("neighborhood_attention",))
    xbackend.patch(full)
    return ref, full


def _attns(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "project_qkv")]


class _DoubledRope(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner, self.rope_dim_split, self.base = inner, inner.rope_dim_split, inner.base

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) * 2


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: setattr(a, "norm_q", nn.LayerNorm(a.head_dim)) or setattr(a, "norm_k", nn.LayerNorm(a.head_dim)),
        lambda a: setattr(a, "norm_q", nn.Identity()),
        lambda a: setattr(a, "norm_q", nn.RMSNorm(a.head_dim, eps=None)),
        lambda a: setattr(a, "rope", _DoubledRope(a.rope)),
        lambda a: setattr(a.rope, "_inv_freqs", lambda d, dev, f=a.rope._inv_freqs: f(d, dev) * 0.5),
        lambda a: setattr(a, "scale", float("nan")),
        lambda a: setattr(a, "scale", torch.tensor(0.3)),
        lambda a: setattr(a.rope, "base", -1.0),
    ],
    ids=["layernorm", "identity", "eps-none", "rope-module", "rope-method", "scale-nan", "scale-tensor", "base-negative"],
)
def test_diffvae_prelude_steps_aside_for_modules_changed_after_patching(one_thread, edit) -> None:
    ref, full = _diffvae_pair()
    for model in (ref, full):
        for attn in _attns(model):
            edit(attn)
    try:
        want = decode(ref)
    except Exception as e:  # what stock raises, the patched model raises too
        with pytest.raises(type(e)):
            decode(full)
        return
    got = decode(full)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


def test_diffvae_prelude_steps_aside_for_a_class_level_monkeypatch(one_thread, monkeypatch: pytest.MonkeyPatch) -> None:
    from diffusers.models.autoencoders import ltx2_diffusion_decoder as dd

    ref, full = _diffvae_pair()
    stock_forward = dd.LTX2VideoVaeRotaryPosEmbed3D.forward
    monkeypatch.setattr(dd.LTX2VideoVaeRotaryPosEmbed3D, "forward", lambda self, x: stock_forward(self, x) * 2)
    assert torch.equal(decode(full), decode(ref))


def test_diffvae_prelude_and_norms_run_as_written_under_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    """aten runs rms_norm in fp32 under (CUDA) autocast; the patched sites then run the written expression."""
    from xbackend.patching import ltx2_attention

    calls = []
    real = ltx2_attention._QK_NORM_ROPE_3D
    monkeypatch.setattr(ltx2_attention, "_QK_NORM_ROPE_3D", lambda *a: calls.append(1) or real(*a))
    _, full = _diffvae_pair(torch.bfloat16)
    decode(full, torch.bfloat16)
    assert calls
    calls.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        decode(full, torch.bfloat16)
    assert not calls


@pytest.mark.parametrize("edit", ["hook", "layernorm"])
def test_diffvae_modulated_norms_step_aside_for_changes_after_patching(one_thread, edit: str) -> None:
    ref, full = _diffvae_pair()
    for model in (ref, full):
        block = model.decoder.diff_blocks[0]
        if edit == "hook":
            block.norm1.register_forward_hook(lambda m, i, o: o * 2)
        else:
            block.norm2 = nn.LayerNorm(block.norm2.normalized_shape, elementwise_affine=False)
    assert torch.equal(decode(full), decode(ref))
