"""Patch diffusers' LTX-2 transformer with xbackend; time it against eager diffusers and torch.compile.

    python examples/ltx2_transformer.py                        # tiny model, CPU, a few seconds
    python examples/ltx2_transformer.py --device cuda --layers 4 --seq 8160 --hidden 4096   # LTX-2 blocks

Random weights from a config (nothing is downloaded). The real LTX-2 block: hidden 4096 = 32 heads x
128, cross-attention dim 4096, audio 2048 = 32 heads x 64, caption channels 3840, no affine norms.
`--variant ltx2.3` adds adaLN on the text cross-attention and gated attention (more fused sites);
`--rope-type split` gives the attention LTX-2.3's split RoPE (cos/sin per head) instead of interleaved.

Prints the sites patched, then per mode (eager diffusers, patched, torch.compile of stock diffusers)
the first call (compile's warm-up included), the median of the timed calls, and whether the output
equals eager bit for bit. Needs diffusers==0.42.1.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from diffusers.utils import logging as diffusers_logging
from tqdm import tqdm

import xbackend

# (hidden, heads, audio hidden, audio heads, caption channels, audio tokens, text tokens)
REAL = (4096, 32, 2048, 32, 3840, 126, 256)
TINY = (64, 2, 32, 2, 32, 5, 8)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None, help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=60, help="video tokens (8160 = 4 x 34 x 60 latent frames/rows/cols)")
    p.add_argument("--hidden", type=int, default=None, help="video width = heads x head dim (default: 4096 on GPU)")
    p.add_argument("--heads", type=int, default=None)
    p.add_argument("--audio-hidden", type=int, default=None)
    p.add_argument("--audio-heads", type=int, default=None)
    p.add_argument("--audio-seq", type=int, default=None)
    p.add_argument("--text-seq", type=int, default=None)
    p.add_argument("--variant", choices=["ltx2.0", "ltx2.3"], default="ltx2.0")
    p.add_argument("--rope-type", choices=["interleaved", "split"], default="interleaved")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--compile", default=None, help="torch.compile backend, or 'none' (default: inductor on GPU, aot_eager on CPU)")
    p.add_argument("--sites", action="store_true", help="print every patched site")
    args = p.parse_args(argv)
    real = args.device.startswith("cuda")
    defaults = REAL if real else TINY
    for name, value in zip(("hidden", "heads", "audio_hidden", "audio_heads", "caption", "audio_seq", "text_seq"), defaults, strict=True):
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.heads == REAL[1] and args.hidden != REAL[0]:
        args.heads = max(1, args.hidden // 128)
    args.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype or ("bf16" if real else "fp32")]
    args.compile = args.compile or ("inductor" if real else "aot_eager")
    return args


def video_grid(seq: int) -> tuple[int, int, int]:
    """(frames, height, width) of the latent video: LTX-2's 1088x1920 grid (34 x 60) when it divides."""
    for rows, cols in ((34, 60), (6, 10)):
        if seq % (rows * cols) == 0:
            return seq // (rows * cols), rows, cols
    return 1, 1, seq


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    from diffusers import LTX2VideoTransformer3DModel

    if args.hidden % args.heads or args.audio_hidden % args.audio_heads:
        raise SystemExit("--hidden and --audio-hidden must be multiples of --heads and --audio-heads")
    extra = {"cross_attn_mod": True, "audio_cross_attn_mod": True, "gated_attn": True, "audio_gated_attn": True} if args.variant == "ltx2.3" else {}
    config = {
        "in_channels": 128, "out_channels": 128, "audio_in_channels": 128, "audio_out_channels": 128,
        "num_attention_heads": args.heads, "attention_head_dim": args.hidden // args.heads,
        "cross_attention_dim": args.hidden, "audio_num_attention_heads": args.audio_heads,
        "audio_attention_head_dim": args.audio_hidden // args.audio_heads,
        "audio_cross_attention_dim": args.audio_hidden, "caption_channels": args.caption,
        "num_layers": args.layers, "rope_type": args.rope_type, **extra,
    }  # fmt: skip
    torch.manual_seed(0)
    with torch.device(args.device):
        model = LTX2VideoTransformer3DModel(**config)
    return model.to(args.dtype).eval()


def make_inputs(args: argparse.Namespace) -> dict[str, Any]:
    g = torch.Generator(args.device).manual_seed(1)
    frames, height, width = video_grid(args.seq)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=args.device).to(args.dtype)

    return {
        "hidden_states": randn(1, args.seq, 128), "audio_hidden_states": randn(1, args.audio_seq, 128),
        "encoder_hidden_states": randn(1, args.text_seq, args.caption),
        "audio_encoder_hidden_states": randn(1, args.text_seq, args.caption),
        "timestep": torch.tensor([0.6], device=args.device), "sigma": torch.tensor([0.6], device=args.device),
        "num_frames": frames, "height": height, "width": width, "audio_num_frames": args.audio_seq,
        "return_dict": False,
    }  # fmt: skip


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeats: int, label: str) -> tuple[Any, float, float]:
    """(output, first call in s, median of `repeats` later calls in ms), with a progress bar."""
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    first = time.perf_counter() - start
    times = []
    for _ in tqdm(range(repeats), desc=f"{label:<8}", leave=False, unit="call"):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return out, first, statistics.median(times)


def compare(out: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> str:
    if all(torch.equal(a, b) for a, b in zip(out, ref, strict=True)):
        return "bit-identical"
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(out, ref, strict=True))
    return f"differs, max |diff| {diff:.3g}"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    diffusers_logging.set_verbosity_error()  # not the `.to(dtype)` advice meant for from_pretrained
    model = build_model(args)
    inputs = make_inputs(args)
    print(f"LTX-2 transformer: {args.layers} layers, video {args.seq} tokens x {args.hidden}, audio {args.audio_seq} x "
          f"{args.audio_hidden}, {str(args.dtype).removeprefix('torch.')} on {args.device}")  # fmt: skip

    def call() -> tuple[torch.Tensor, ...]:
        with torch.no_grad():
            return model(**inputs)

    rows = []
    ref, first, median = timed(call, args.device, args.repeats, "eager")
    rows.append(("eager diffusers", first, median, "reference"))

    report = xbackend.patch(model)
    print(report.table() if args.sites else report)
    out, first, median = timed(call, args.device, args.repeats, "patched")
    rows.append(("xbackend.patch", first, median, compare(out, ref)))
    xbackend.unpatch(model)

    if args.compile != "none":
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=args.compile)

        def call_compiled() -> tuple[torch.Tensor, ...]:
            with torch.no_grad():
                return compiled(**inputs)

        out, first, median = timed(call_compiled, args.device, args.repeats, "compile")
        rows.append((f"torch.compile ({args.compile})", first, median, compare(out, ref)))

    eager_ms = rows[0][2]
    print(f"\n{'mode':<28} {'first call':>11} {'median':>11} {'vs eager':>9}  output")
    for name, first_s, ms, verdict in rows:
        print(f"{name:<28} {first_s:>10.2f}s {ms:>9.2f}ms {eager_ms / ms:>8.2f}x  {verdict}")
    print("\n" + str(xbackend.report()))


if __name__ == "__main__":
    main()
