"""Patch diffusers' LTX-2.5 DiffVAE (LTX2VideoDiffusionDecoderModel) with xbackend; time its tiled decode
against stock diffusers and torch.compile.

    python examples/ltx2_diffvae.py                                   # tiny decoder, CPU, ~1 min (compile warm-up)
    python examples/ltx2_diffvae.py --device cuda --height 512 --width 768 --frames 41   # default config
    torchrun --nproc_per_node=2 examples/ltx2_diffvae.py --height 1088 --width 1920 --frames 121 --no-stock

Under torchrun (NCCL, one GPU per rank; gloo on CPUs) the patched decode runs twice: on rank 0's device
alone (`xbackend.patch(model)`: each rank decodes its own latent), then with its tiles spread over every
rank (`xbackend.patch(model, decode_group=torch.distributed.group.WORLD)`: every rank decodes the same
latent, which each call checks); rank 0 prints both times, the scaling and whether the outputs are
bit-identical. `--phases` adds one more decode over every rank, timed by phase on each
rank (`decode_phases`): stages 1-3 (every rank runs them on the whole latent), stage 4 and stage 5 of
the rank's own tiles, and the rest (the tile exchange, blending, noise): where the scaling goes.

Random weights from a config (nothing is downloaded). xbackend.patch routes the RMSNorms, the stage-5
adaLN modulations, every neighborhood attention (get_op("neighborhood_attention") in place of diffusers'
flex processor) and tiled_decode (the vae_tile_decode adapter; over every rank under torchrun).

Modes: stock diffusers (flex attention, eager), xbackend.patch, and stock diffusers with every attention
block torch.compile'd (compiled flex: the fast stock path; its first call includes the warm-up).
Attention is compared within tolerance (relative Frobenius error): the patched attention is a
different kernel. Stock flex builds a dense block mask, which does not fit a GPU beyond small videos;
`--no-stock` skips both stock modes. Needs diffusers==0.42.1.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from diffusers.utils import logging as diffusers_logging
from tqdm import tqdm

import xbackend

TINY_CONFIG = {
    "latent_channels": 8, "patch_size": 2, "decoder_head_dim": 8, "decoder_stage_channels": (32, 16, 8, 8, 8),
    "decoder_stage_depths": (1, 1, 1, 1, 2), "decoder_stage_kernels": ((3, 3, 3),) * 4,
    "decoder_upsample_channel_reductions": (2, 2, 1, 1), "decoder_stage5_kernel": (3, 3, 3),
    "decoder_t_emb_dim": 32, "spatial_compression_ratio": 16,
}  # fmt: skip
# A 3x3x3 tile grid on the tiny decoder's (9, 12, 16) feature volume.
TINY_TILING = {
    "tile_sample_min_num_frames": 10, "tile_sample_stride_num_frames": 6, "tile_sample_min_height": 24,
    "tile_sample_stride_height": 16, "tile_sample_min_width": 28, "tile_sample_stride_width": 20,
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None, help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--height", type=int, default=None, help="pixels (default config: a multiple of 32)")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--frames", type=int, default=None, help="pixel frames, 8k+1")
    p.add_argument("--tiny", action=argparse.BooleanOptionalAction, default=None, help="tiny decoder (default on CPU)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--compile", default=None, help="torch.compile backend or 'none' (default: inductor on GPU, aot_eager on CPU)")
    p.add_argument("--no-stock", action="store_true", help="skip stock diffusers (its flex mask is dense)")
    p.add_argument("--sites", action="store_true", help="print every patched site")
    p.add_argument("--phases", action="store_true", help="one more patched decode, timed by phase on each rank")
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.tiny = (not gpu) if args.tiny is None else args.tiny
    args.height = args.height or (48 if args.tiny else 512)
    args.width = args.width or (64 if args.tiny else 768)
    args.frames = args.frames or (17 if args.tiny else 41)
    args.dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if gpu else "fp32")]
    args.compile = args.compile or ("inductor" if gpu else "aot_eager")
    return args


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    from diffusers import LTX2VideoDiffusionDecoderModel

    torch.manual_seed(0)
    with torch.device(args.device):
        model = LTX2VideoDiffusionDecoderModel(**(TINY_CONFIG if args.tiny else {}))
    # The adaLN tables start at zero; random ones make the stage-5 modulation matter.
    for block in model.decoder.diff_blocks:
        block.scale_shift_table.data.normal_(0, 0.5)
    model.enable_tiling(**(TINY_TILING if args.tiny else {}))
    return model.to(args.dtype).eval()


def make_latent(model: torch.nn.Module, args: argparse.Namespace) -> torch.Tensor:
    cfg = model.config
    shape = (
        1,
        cfg.latent_channels,
        (args.frames - 1) // cfg.temporal_compression_ratio + 1,
        args.height // cfg.spatial_compression_ratio,
        args.width // cfg.spatial_compression_ratio,
    )
    return torch.randn(shape, generator=torch.Generator(args.device).manual_seed(1), device=args.device).to(args.dtype)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeats: int, label: str) -> tuple[Any, float, float]:
    """(output, first call in s, median of `repeats` later calls in s), with a progress bar."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    first = time.perf_counter() - start
    times = []
    for _ in tqdm(range(repeats), desc=f"{label:<8}", leave=False, unit="decode"):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return out, first, statistics.median(times) if times else first


# The decoder methods the patched tiled decode calls: stages 1-3 once on the whole latent, then per
# tile stage 4 and the denoising stage 5.
PHASES = {"forward_stages_1_to_3": "stages 1-3", "forward_stage_4": "stage 4", "denoise": "stage 5"}


@contextlib.contextmanager
def phase_timers(decoder: torch.nn.Module, device: str):
    """Time every call of the `PHASES` methods on `decoder` (synchronised, so each call's time is its
    own): yields {method: [calls, seconds]}; the instance attributes are removed on exit."""
    spent = {name: [0, 0.0] for name in PHASES}

    def timing(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            sync(device)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                sync(device)
                spent[name][0] += 1
                spent[name][1] += time.perf_counter() - start

        return call

    for name in PHASES:
        setattr(decoder, name, timing(name, getattr(decoder, name)))
    try:
        yield spent
    finally:
        for name in PHASES:
            delattr(decoder, name)


def decode_phases(decode: Callable[[], Any], decoder: torch.nn.Module, device: str) -> dict[str, float]:
    """One `decode()` on this rank, split by phase: tiles (the rank's stage-4 calls), seconds per phase,
    the rest (exchange, blending, noise, assembly) and the total."""
    with phase_timers(decoder, device) as spent:
        sync(device)
        start = time.perf_counter()
        decode()
        sync(device)
        total = time.perf_counter() - start
    row = {"tiles": float(spent["forward_stage_4"][0])} | {label: spent[name][1] for name, label in PHASES.items()}
    row["rest"] = total - sum(spent[name][1] for name in PHASES)
    row["total"] = total
    return row


def print_phases(rows: list[dict[str, float]]) -> None:
    print(f"\n{'rank':<6} {'tiles':>5} " + " ".join(f"{k:>11}" for k in (*PHASES.values(), "rest", "total")))
    for rank, row in enumerate(rows):
        print(f"{rank:<6} {int(row['tiles']):>5} "
              + " ".join(f"{row[k]:>10.3f}s" for k in (*PHASES.values(), "rest", "total")))  # fmt: skip
    print("rest: the tile exchange, blending, noise and assembly; stages 1-3 run on every rank")


def compare(out: torch.Tensor, ref: torch.Tensor | None) -> str:
    if ref is None:
        return "-"
    if torch.equal(out, ref):
        return "bit-identical"
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    return f"rel. error {rel:.2e}"


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch.equal on the bit patterns: random weights can produce NaNs, and NaN != NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(ints), b.view(ints))


def main_distributed(args: argparse.Namespace) -> None:
    """One device (rank 0 alone) against every rank, both through xbackend.patch, same bits expected."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device.startswith("cuda"):
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    unit = "GPU" if device.type == "cuda" else "rank"
    args.device = str(device)
    model = build_model(args)
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)  # the same random weights on every rank
    z = make_latent(model, args)
    dist.broadcast(z, src=0)

    def decode() -> torch.Tensor:
        with torch.no_grad():
            return model.decode(z, generator=torch.Generator(args.device).manual_seed(7)).sample

    def timed_all(label: str) -> tuple[torch.Tensor, float, float]:
        dist.barrier()
        out, first, median = timed(decode, args.device, args.repeats, label)
        t = torch.tensor([first, median], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # done when the slowest rank is
        return out, *t.tolist()

    one = first_one = median_one = None
    if rank == 0:
        print(f"DiffVAE ({'tiny' if args.tiny else 'default'} config): latent {tuple(z.shape)} -> "
              f"{args.frames}x{args.height}x{args.width}, {world} ranks")  # fmt: skip
        print(xbackend.patch(model))  # no decode_group: this rank decodes alone, the others go on
        one, first_one, median_one = timed(decode, args.device, args.repeats, f"1 {unit}")
        xbackend.unpatch(model)
    # Tiles over every rank, the result on every rank; each call checks that the ranks hold the same z.
    report = xbackend.patch(model, decode_group=dist.group.WORLD)
    if rank == 0:
        print(report)
    out, first_all, median_all = timed_all(f"{world} {unit}s")
    if rank == 0:
        same = "bit-identical" if bits_equal(out, one) else "DIFFERS"
        print(f"\n{'mode':<30} {'first call':>11} {'median':>10} {'scaling':>8}  output")
        print(f"{f'xbackend.patch, 1 {unit}':<30} {first_one:>10.2f}s {median_one:>9.3f}s {1.0:>7.2f}x  reference")
        print(f"{f'xbackend.patch, {world} {unit}s':<30} {first_all:>10.2f}s {median_all:>9.3f}s "
              f"{median_one / median_all:>7.2f}x  {same} to 1 {unit}")  # fmt: skip
    if args.phases:
        dist.barrier()
        rows: list[Any] = [None] * world
        dist.all_gather_object(rows, decode_phases(decode, model.decoder, args.device))
        if rank == 0:
            print_phases(rows)
    dist.barrier()
    dist.destroy_process_group()


def attention_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    decoder = model.decoder
    return [block for stage in decoder.det_stages for block in stage] + list(decoder.diff_blocks)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile")
    diffusers_logging.set_verbosity_error()  # not the `.to(dtype)` advice meant for from_pretrained
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return main_distributed(args)
    model = build_model(args)
    z = make_latent(model, args)
    print(f"DiffVAE ({'tiny' if args.tiny else 'default'} config): latent {tuple(z.shape)} -> "
          f"{args.frames}x{args.height}x{args.width}, {str(args.dtype).removeprefix('torch.')} on {args.device}")  # fmt: skip

    def decode() -> torch.Tensor:
        with torch.no_grad():
            return model.decode(z, generator=torch.Generator(args.device).manual_seed(7)).sample

    rows: list[tuple[str, float, float, str]] = []
    ref = None
    if not args.no_stock:
        ref, first, median = timed(decode, args.device, args.repeats, "stock")
        rows.append(("stock diffusers (flex)", first, median, "reference"))

    report = xbackend.patch(model)
    print(report.table() if args.sites else report)
    out, first, median = timed(decode, args.device, args.repeats, "patched")
    rows.append(("xbackend.patch", first, median, compare(out, ref)))
    if args.phases:
        print_phases([decode_phases(decode, model.decoder, args.device)])
    xbackend.unpatch(model)

    if args.compile != "none" and not args.no_stock:
        torch._dynamo.reset()
        for block in attention_blocks(model):
            block.compile(backend=args.compile)
        out, first, median = timed(decode, args.device, args.repeats, "compile")
        rows.append((f"stock, blocks compiled ({args.compile})", first, median, compare(out, ref)))

    base = rows[0][2]
    print(f"\n{'mode':<34} {'first call':>11} {'median':>10} {'speed-up':>9}  output")
    for name, first_s, median_s, verdict in rows:
        print(f"{name:<34} {first_s:>10.2f}s {median_s:>9.3f}s {base / median_s:>8.2f}x  {verdict}")


if __name__ == "__main__":
    main()
