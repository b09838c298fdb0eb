"""The diffusers LTX-2 adapters against diffusers' own serial tiled decodes (diffusers 0.42.1): bit-identical
(torch.equal) on one process and on 2 and 3 gloo ranks. Small configs, random weights, CPU, fp32.

Stock DiffVAE attention is flex attention, whose eager CPU path traces through dynamo on first use
(~10 s per process). One test keeps it; the others give both sides — diffusers' tiled_decode and the
adapter — the same dense masked-SDPA processor, so the comparison stays like for like.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("diffusers")

from diffusers import AutoencoderKLLTX2Video, LTX2VideoDiffusionDecoderModel
from test_vae_distributed import attempt, run_ranks

from xbackend.adapters.diffusers_ltx2 import (
    DiffVAENeighborhoodProcessor,
    set_diffvae_attention,
    tiled_decode_autoencoder_ltx2,
    tiled_decode_diffvae,
)

# -- models ------------------------------------------------------------------------------------------------


def dense_neighborhood_attention(q, k, v, kernel_size, scale=None):
    """Heads-last [B, T, H, W, heads, D] neighborhood attention as one masked SDPA (small grids only)."""
    batch, *grid, heads, dim = q.shape
    keep = torch.ones([1] * 6, dtype=torch.bool)
    for axis, (length, kernel) in enumerate(zip(grid, kernel_size, strict=True)):
        pos = torch.arange(length)
        start = (pos - kernel // 2).clamp(0, length - kernel)
        inside = (pos[None, :] >= start[:, None]) & (pos[None, :] < start[:, None] + kernel)
        # [query axis, key axis] window, broadcast over the other axes of a [T, H, W, T, H, W] mask.
        view = [1] * 6
        view[axis], view[3 + axis] = length, length
        keep = keep & inside.view(view)
    tokens = grid[0] * grid[1] * grid[2]
    mask = keep.expand(*grid, *grid).reshape(tokens, tokens)
    qh, kh, vh = (t.reshape(batch, tokens, heads, dim).transpose(1, 2) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out.transpose(1, 2).reshape(q.shape)


DIFFVAE_CONFIG = {
    "latent_channels": 8,
    "patch_size": 2,
    "decoder_head_dim": 8,
    "decoder_stage_channels": (32, 16, 8, 8, 8),
    "decoder_stage_depths": (1, 1, 1, 1, 1),
    "decoder_stage_kernels": ((3, 3, 3),) * 4,
    "decoder_upsample_channel_reductions": (2, 2, 1, 1),
    "decoder_stage5_kernel": (3, 3, 3),
    "decoder_t_emb_dim": 32,
}
# Feature grid (T, H, W) = (9, 12, 16), cell (2, 4, 4) px: tiles 5/3, 6/4, 7/5 cells -> a 3x3x3 grid whose
# last w tile absorbs a 1-cell remnant and whose last t tile carries the ghost frames.
DIFFVAE_TILING = {
    "tile_sample_min_num_frames": 10,
    "tile_sample_stride_num_frames": 6,
    "tile_sample_min_height": 24,
    "tile_sample_stride_height": 16,
    "tile_sample_min_width": 28,
    "tile_sample_stride_width": 20,
}
DIFFVAE_LATENT = (1, 8, 3, 3, 4)

AUTOENCODER_CONFIG = {
    "latent_channels": 8,
    "block_out_channels": (8, 8, 8, 8),
    "decoder_block_out_channels": (8, 16, 32),
    "layers_per_block": (1, 1, 1, 1, 1),
    "decoder_layers_per_block": (1, 1, 1, 1),
    "patch_size": 1,
    "spatial_compression_ratio": 8,
    "temporal_compression_ratio": 8,
    "timestep_conditioning": True,
}
# mode -> (latent shape, enable_tiling kwargs or None, use_framewise_decoding)
AUTOENCODER_MODES: dict[str, tuple[tuple[int, ...], dict[str, int] | None, bool]] = {
    # h fits its tile (5 <= 5) and is still cut at its stride, as diffusers does once w needs tiles.
    "spatial": ((1, 8, 2, 5, 11), {"tile_sample_min_height": 40, "tile_sample_stride_height": 24,
                                   "tile_sample_min_width": 40, "tile_sample_stride_width": 24}, False),
    # 5 temporal tiles of 3 latent frames, the last one decoding to nothing once its last frame is dropped.
    "temporal_spatial": ((1, 8, 5, 8, 9), {"tile_sample_min_height": 32, "tile_sample_stride_height": 24,
                                           "tile_sample_min_width": 32, "tile_sample_stride_width": 24,
                                           "tile_sample_min_num_frames": 16, "tile_sample_stride_num_frames": 8},
                         True),
    "temporal": ((1, 8, 6, 3, 4), {"tile_sample_min_num_frames": 24, "tile_sample_stride_num_frames": 16}, True),
    "untiled": ((1, 8, 2, 3, 4), None, False),
}  # fmt: skip


def build_diffvae(state: dict | None = None, dense_attention: bool = True) -> Any:
    torch.manual_seed(0)
    model = LTX2VideoDiffusionDecoderModel(**DIFFVAE_CONFIG).eval()
    if state is not None:
        model.load_state_dict(state)
    model.enable_tiling(**DIFFVAE_TILING)
    if dense_attention:
        assert set_diffvae_attention(model, dense_neighborhood_attention) == 5
    return model


def build_autoencoder(mode: str, state: dict | None = None, inject_noise: bool = False) -> tuple[Any, torch.Tensor]:
    torch.manual_seed(0)
    config = dict(AUTOENCODER_CONFIG)
    if inject_noise:
        config["decoder_inject_noise"] = (True, False, True, False)
    model = AutoencoderKLLTX2Video(**config).eval()
    if state is not None:
        model.load_state_dict(state)
    elif inject_noise:
        # The noise scales start at zero, which would hide the noise entirely.
        for name, p in model.named_parameters():
            if "per_channel_scale" in name:
                p.data.uniform_(0.2, 0.6)
    shape, tiling, framewise = AUTOENCODER_MODES[mode]
    if tiling is not None:
        model.enable_tiling(**tiling)
    model.use_framewise_decoding = framewise
    return model, torch.randn(shape, generator=torch.Generator().manual_seed(1))


TEMB = torch.tensor([0.05])


def stock_diffvae(model: Any, steps: int) -> torch.Tensor:
    z = torch.randn(DIFFVAE_LATENT, generator=torch.Generator().manual_seed(1))
    return model.tiled_decode(z, generator=torch.Generator().manual_seed(7), num_inference_steps=steps)


def ours_diffvae(model: Any, steps: int, **kwargs) -> torch.Tensor | None:
    z = torch.randn(DIFFVAE_LATENT, generator=torch.Generator().manual_seed(1))
    return tiled_decode_diffvae(
        model, z, generator=torch.Generator().manual_seed(7), num_inference_steps=steps, **kwargs
    )


@pytest.fixture(autouse=True)
def _one_thread():
    # The spawned ranks run on one thread each; the stock reference must reduce in the same order.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with torch.no_grad():
        yield
    torch.set_num_threads(before)


# -- one process -------------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
def test_diffvae_stock_flex_attention_one_rank():
    model = build_diffvae(dense_attention=False)
    assert torch.equal(ours_diffvae(model, 1), stock_diffvae(model, 1))


@pytest.mark.parametrize("steps", [1, 2])
def test_diffvae_one_rank(steps):
    model = build_diffvae()
    expected = stock_diffvae(model, steps)
    assert expected.shape == (1, 3, 17, 48, 64)
    assert torch.equal(ours_diffvae(model, steps), expected)


def test_diffvae_noise_comes_from_generator():
    model = build_diffvae()
    z = torch.randn(DIFFVAE_LATENT, generator=torch.Generator().manual_seed(1))
    a = tiled_decode_diffvae(model, z, generator=torch.Generator().manual_seed(7))
    b = tiled_decode_diffvae(model, z, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("mode", list(AUTOENCODER_MODES))
def test_autoencoder_one_rank(mode):
    model, z = build_autoencoder(mode)
    expected = model.decode(z, TEMB).sample
    assert torch.equal(tiled_decode_autoencoder_ltx2(model, z, TEMB), expected)


def test_autoencoder_injected_noise_one_rank():
    model, z = build_autoencoder("temporal_spatial", inject_noise=True)
    torch.manual_seed(3)
    expected = model.decode(z, TEMB).sample
    torch.manual_seed(3)
    assert torch.equal(tiled_decode_autoencoder_ltx2(model, z, TEMB), expected)
    torch.manual_seed(4)
    assert not torch.equal(tiled_decode_autoencoder_ltx2(model, z, TEMB), expected)


def test_autoencoder_rejects_stride_not_multiple_of_ratio():
    model, z = build_autoencoder("spatial")
    model.tile_sample_stride_width = 20
    with pytest.raises(ValueError, match="tile_sample_stride_width.*multiple of the compression ratio 8"):
        tiled_decode_autoencoder_ltx2(model, z, TEMB)


def test_processor_calls_given_attention():
    calls = []

    def spy(q, k, v, kernel_size, scale=None):
        calls.append((q.shape, kernel_size, scale))
        return dense_neighborhood_attention(q, k, v, kernel_size, scale)

    model = build_diffvae(dense_attention=False)
    set_diffvae_attention(model, spy)
    assert all(
        isinstance(m.processor, DiffVAENeighborhoodProcessor) for m in model.modules() if hasattr(m, "project_qkv")
    )
    stock_diffvae(model, 1)
    assert calls and all(kernel == (3, 3, 3) and scale == 1.0 for _, kernel, scale in calls)


# -- 2 and 3 gloo ranks ------------------------------------------------------------------------------------


def _worker(rank: int, world: int, states: dict[str, dict]) -> dict[str, Any]:
    pair = dist.new_group([0, 1])
    res: dict[str, Any] = {}
    with torch.no_grad():
        diffvae = build_diffvae(states["diffvae"])
        res["diffvae_world_1step"] = attempt(lambda: ours_diffvae(diffvae, 1))
        if rank in (0, 1):
            res["diffvae_pair_1step"] = attempt(lambda: ours_diffvae(diffvae, 1, group=pair))
            res["diffvae_pair_2steps"] = attempt(lambda: ours_diffvae(diffvae, 2, group=pair))
        res["diffvae_world_dst1"] = attempt(lambda: ours_diffvae(diffvae, 1, dst=1))
        for mode in ("temporal_spatial", "spatial"):
            model, z = build_autoencoder(mode, states[mode])
            res[f"ae_{mode}_world"] = attempt(lambda m=model, z=z: tiled_decode_autoencoder_ltx2(m, z, TEMB))
            if rank in (0, 1):
                res[f"ae_{mode}_pair_dst0"] = attempt(
                    lambda m=model, z=z: tiled_decode_autoencoder_ltx2(m, z, TEMB, group=pair, dst=0)
                )
        noisy, z = build_autoencoder("temporal_spatial", states["noisy"], inject_noise=True)
        res["ae_noise_world"] = attempt(lambda: tiled_decode_autoencoder_ltx2(noisy, z, TEMB))
    return res


@pytest.fixture(scope="module")
def references() -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    refs: dict[str, torch.Tensor] = {}
    states: dict[str, dict] = {}
    with torch.no_grad():
        diffvae = build_diffvae()
        states["diffvae"] = diffvae.state_dict()
        refs["diffvae_1"] = stock_diffvae(diffvae, 1)
        refs["diffvae_2"] = stock_diffvae(diffvae, 2)
        for mode in ("temporal_spatial", "spatial"):
            model, z = build_autoencoder(mode)
            states[mode] = model.state_dict()
            refs[mode] = model.decode(z, TEMB).sample
        states["noisy"] = build_autoencoder("temporal_spatial", inject_noise=True)[0].state_dict()
    torch.set_num_threads(before)
    return refs, states


@pytest.fixture(scope="module")
def ranks(references, tmp_path_factory) -> list[dict[str, Any]]:
    return run_ranks(_worker, 3, tmp_path_factory.mktemp("ltx2_dist"), args=(references[1],))


def _check(res: dict[str, Any], key: str, expected: torch.Tensor | None) -> None:
    assert res[key]["error"] is None, f"{key}: {res[key]['error']}"
    if expected is None:
        assert res[key]["out"] is None, key
    else:
        assert torch.equal(res[key]["out"], expected), key


def test_diffvae_three_ranks(references, ranks):
    refs = references[0]
    for rank, res in enumerate(ranks):
        _check(res, "diffvae_world_1step", refs["diffvae_1"])
        _check(res, "diffvae_world_dst1", refs["diffvae_1"] if rank == 1 else None)


def test_diffvae_two_ranks(references, ranks):
    for rank in (0, 1):
        _check(ranks[rank], "diffvae_pair_1step", references[0]["diffvae_1"])
        _check(ranks[rank], "diffvae_pair_2steps", references[0]["diffvae_2"])
    assert "diffvae_pair_1step" not in ranks[2]


@pytest.mark.parametrize("mode", ["temporal_spatial", "spatial"])
def test_autoencoder_two_and_three_ranks(references, ranks, mode):
    expected = references[0][mode]
    for rank, res in enumerate(ranks):
        _check(res, f"ae_{mode}_world", expected)
        if rank in (0, 1):
            _check(res, f"ae_{mode}_pair_dst0", expected if rank == 0 else None)


def test_autoencoder_injected_noise_refused_on_several_ranks(ranks):
    for res in ranks:
        kind, message = res["ae_noise_world"]["error"]
        assert kind == "ValueError" and "global RNG" in message
