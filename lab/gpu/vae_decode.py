"""DiffVAE (LTX-2.5 diffusion decoder) tiled decode on 1 GPU and over torchrun ranks, with bit-identity.

Default diffusers config, random weights, bf16, diffusers' default tile sizes. For each size (smallest
first) it times diffusers' own serial `tiled_decode`, the adapter on one rank, and (under torchrun) the
adapter over all ranks, and checks that the outputs are torch.equal. Sizes stop growing once one decode
takes longer than --budget-s.

    python3 lab/gpu/vae_decode.py --out $OUT                                # 1 GPU
    torchrun --nproc_per_node=2 lab/gpu/vae_decode.py --out $OUT            # 2 GPUs (NCCL)

Attention: stock diffusers' flex processor cannot run these sizes (it builds a dense block mask, hundreds
of GiB at 1080p), so by default every DiffVAE attention goes through `--attn xbackend`, i.e.
`xbackend.get_op("neighborhood_attention")`, on both the stock reference and the adapter (same processor
on both sides, so the comparison stays like for like). `--attn stock` keeps diffusers' processor (small
sizes only).

Needs: diffusers==0.42.1 (pip install diffusers==0.42.1 --no-deps + huggingface-hub, safetensors, regex,
requests, Pillow, importlib_metadata).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

# cuBLAS picks workspaces per stream; a fixed config keeps its reductions identical from run to run.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from xbackend.adapters.diffusers_ltx2 import set_diffvae_attention, tiled_decode_diffvae


def attention_hook(kind: str) -> Callable[..., torch.Tensor] | None:
    """HOOK: the neighborhood-attention function every DiffVAE attention layer calls.

    It receives heads-last q, k, v `[B, T, H, W, heads, head_dim]` (query pre-scaled), the kernel size
    and `scale=1.0`. The lead plugs xbackend's fast NA op in here; returning None keeps diffusers' flex.
    """
    if kind == "stock":
        return None
    import xbackend

    return xbackend.get_op("neighborhood_attention")


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    """'HxWxF,HxWxF' -> [(height, width, frames)], smallest first."""
    sizes = [tuple(int(v) for v in item.split("x")) for item in text.split(",") if item]
    return sorted(sizes, key=lambda s: s[0] * s[1] * s[2])  # type: ignore[return-value]


def build_model(device: torch.device, distributed: bool):
    from diffusers import LTX2VideoDiffusionDecoderModel

    torch.manual_seed(0)
    with device:
        model = LTX2VideoDiffusionDecoderModel()
    model = model.to(torch.bfloat16).eval()
    if distributed:
        # Same weights on every rank no matter how each device's RNG initialised them.
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)
    model.enable_tiling()
    return model


def timed(fn: Callable[[], torch.Tensor | None], distributed: bool) -> tuple[torch.Tensor | None, float]:
    if distributed:
        dist.barrier()
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if distributed:
        # The decode is done when the slowest rank is.
        t = torch.tensor([elapsed], device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        elapsed = t.item()
    return out, elapsed


def run_size(model, size: tuple[int, int, int], args, world: int, rank: int, distributed: bool) -> dict:
    height, width, frames = size
    latent_shape = (1, 128, (frames - 1) // 8 + 1, height // 32, width // 32)
    z = torch.randn(latent_shape, generator=torch.Generator().manual_seed(1)).to("cuda", torch.bfloat16)

    def gen() -> torch.Generator:
        return torch.Generator(device="cuda").manual_seed(7)

    row: dict = {"size": f"{height}x{width}x{frames}", "latent": list(latent_shape), "world": world}
    with torch.no_grad():
        # Warm-up: kernel compilation and autotuning are not what this measures.
        tiled_decode_diffvae(model, z, generator=gen(), group=None if world == 1 else dist.group.WORLD)

        stock = ours_1 = None
        if rank == 0:
            stock, row["stock_serial_s"] = timed(lambda: model.tiled_decode(z, generator=gen()), False)
            ours_1, row["ours_1gpu_s"] = timed(lambda: _serial(model, z, gen), False)
            row["ours_1gpu_equal_stock"] = bits_equal(ours_1, stock)
            row["output_shape"] = list(stock.shape)
            row["output_finite"] = bool(torch.isfinite(stock).all())
        if world > 1:
            outs = []
            for _ in range(args.repeats):
                out, t = timed(lambda: tiled_decode_diffvae(model, z, generator=gen(), dst=0), True)
                outs.append(t)
            row[f"ours_{world}gpu_s"] = min(outs)
            if rank == 0:
                row[f"ours_{world}gpu_equal_stock"] = bits_equal(out, stock)
                row["speedup_vs_ours_1gpu"] = row["ours_1gpu_s"] / row[f"ours_{world}gpu_s"]
        del stock, ours_1
    torch.cuda.empty_cache()
    return row


def _serial(model, z, gen) -> torch.Tensor:
    # Under torchrun the default group would spread the tiles; a group of this rank alone keeps the
    # decode on this GPU (the op only goes distributed for a group of more than one rank).
    return tiled_decode_diffvae(model, z, generator=gen(), group=_SELF_GROUP)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal on the bit patterns: random weights may produce NaNs, and NaN != NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(ints), b.view(ints))


_SELF_GROUP = None


def main() -> None:
    global _SELF_GROUP
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="512x768x41,768x1024x81,1088x1920x121", help="HxWxF list")
    p.add_argument("--attn", choices=["xbackend", "stock"], default="xbackend")
    p.add_argument("--budget-s", type=float, default=60.0, help="stop growing once a decode takes longer")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = p.parse_args()

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    distributed = world > 1
    if distributed:
        dist.init_process_group("nccl", device_id=device)
        # Every rank creates every 1-rank group (new_group is collective); each keeps its own.
        singles = [dist.new_group([r]) for r in range(world)]
        _SELF_GROUP = singles[rank]

    model = build_model(device, distributed)
    fn = attention_hook(args.attn)
    if fn is not None:
        set_diffvae_attention(model, fn)

    rows = []
    for size in parse_sizes(args.sizes):
        try:
            row = run_size(model, size, args, world, rank, distributed)
        except torch.OutOfMemoryError as exc:
            row = {"size": "x".join(map(str, size)), "error": f"OOM: {str(exc)[:200]}"}
        rows.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)
        slowest = max((v for k, v in row.items() if k.endswith("_s")), default=0.0)
        if "error" in row or slowest > args.budget_s:
            break

    if rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, f"vae_decode_world{world}.json").write_text(json.dumps(rows, indent=2))
        cols = ["size", "stock_serial_s", "ours_1gpu_s"]
        if world > 1:
            cols += [f"ours_{world}gpu_s", "speedup_vs_ours_1gpu"]
        print(" | ".join(cols + ["equal"]))
        for row in rows:
            cells = [f"{row[c]:.3f}" if isinstance(row.get(c), float) else str(row.get(c, "-")) for c in cols]
            equal = all(v for k, v in row.items() if k.endswith("equal_stock"))
            print(" | ".join([*cells, str(equal)]))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
