"""The DiffVAE decode table of docs/performance.md: LTX2VideoDiffusionDecoderModel (default config,
random weights, bf16) decoding one video on one GPU, patched three ways, plus a CUDA-time breakdown.

    python benchmarks/diffvae_decode.py --height 1088 --width 1920 --frames 121 --out $OUT/diffvae

Modes (all through xbackend.patch, the same neighborhood-attention kernel in each):
  attention only   patch(model, only=("neighborhood_attention",)): diffusers' own glue around it
  without glue     every kind but the q/k prelude, the SwiGLU product and the residual-add fold
                   (qk_norm_rope_3d, silu_mul, add_rmsnorm)
  adds unfolded    every kind but add_rmsnorm
  full             xbackend.patch(model)
Prints the median decode time of each, whether each is bit-identical to "attention only", and a torch.profiler breakdown (CUDA time by kernel family) of one decode of
each mode but "attention only". Writes <out>.json. Needs diffusers==0.42.1 and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch

import xbackend

MODES = {
    "attention only": {"only": ("neighborhood_attention",)},
    "without glue": {"exclude": ("qk_norm_rope_3d", "silu_mul", "add_rmsnorm")},
    "adds unfolded": {"exclude": ("add_rmsnorm",)},
    "full": {},
}
# Kernel families of the breakdown, first match wins (CUDA kernel names of torch 2.11 / Triton 3.6).
FAMILIES = [
    ("neighborhood attention", r"_na_fwd|na_triton|na_shift_sm90|_max_key_norm|flex"),
    ("q/k prelude (qk_norm_rope_3d)", r"qk_norm_rope_3d"),
    ("RMSNorm / modulate / add+norm (xbackend)", r"rmsnorm"),
    ("SwiGLU product (silu_mul)", r"silu_mul"),
    ("GEMM (cuBLAS / CUTLASS)", r"gemm|sm90_xmma|cutlass|nvjet|cublas"),
    ("elementwise mul", r"MulFunctor|mul_"),
    ("cat / stack", r"CatArray|cat_"),
    ("copy / cast", r"copy|direct_copy|CopyKernel"),
    ("add / sub", r"CUDAFunctor_add|AddFunctor|add_|sub"),  # torch's binary add: CUDAFunctor_add
    ("silu", r"silu"),
    ("reduce (mean, norm)", r"reduce|Reduce"),
]


# A smoke-test decoder for CPU (--tiny): the example's tiny config, the same code paths in seconds.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from ltx2_diffvae import TINY_CONFIG as TINY  # noqa: E402


def build(height: int, width: int, frames: int, device: str, tiny: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    from diffusers import LTX2VideoDiffusionDecoderModel

    torch.manual_seed(0)
    with torch.device(device):
        model = LTX2VideoDiffusionDecoderModel(**(TINY if tiny else {}))
    for block in model.decoder.diff_blocks:  # the adaLN tables start at zero; random ones matter
        block.scale_shift_table.data.normal_(0, 0.5)
    model.enable_tiling()
    model = model.to(torch.bfloat16).eval()
    cfg = model.config
    shape = (1, cfg.latent_channels, (frames - 1) // cfg.temporal_compression_ratio + 1,
             height // cfg.spatial_compression_ratio, width // cfg.spatial_compression_ratio)  # fmt: skip
    z = torch.randn(shape, generator=torch.Generator(device).manual_seed(1), device=device).to(torch.bfloat16)
    return model, z


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(ints), b.view(ints))


def breakdown(fn, cuda: bool) -> tuple[float, list[tuple[str, float, int]]]:
    """(total device ms, [(family, ms, kernels)]) of one call of fn (CPU ops' self time without CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    total = 0.0
    for evt in prof.events():
        if cuda and evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = evt.device_time_total if cuda else evt.self_cpu_time_total
        total += us
        fam = next((f for f, pat in FAMILIES if re.search(pat, evt.name)), "other")
        by[fam][0] += us
        by[fam][1] += 1
    rows = sorted(((f, v[0] / 1e3, int(v[1])) for f, v in by.items()), key=lambda r: -r[1])
    return total / 1e3, rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--height", type=int, default=1088)
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny decoder (a CPU smoke test)")
    p.add_argument("--out", default=None, help="write <out>.json")
    args = p.parse_args()
    warnings.filterwarnings("ignore", message=".*kept in float32")
    model, z = build(args.height, args.width, args.frames, args.device, args.tiny)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def decode() -> torch.Tensor:
        with torch.no_grad():
            return model.decode(z, generator=torch.Generator(args.device).manual_seed(7)).sample

    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"{name} | torch {torch.__version__} | DiffVAE default config, latent "
          f"{tuple(z.shape)} -> {args.frames}x{args.height}x{args.width} bf16")  # fmt: skip
    result: dict = {"device": name, "torch": torch.__version__, "modes": {}, "profiles": {}}
    outputs: dict[str, torch.Tensor] = {}
    for mode, kw in MODES.items():
        report = xbackend.patch(model, **kw)
        print(f"\n[{mode}] {report}")
        out = decode()  # warm-up: kernel compiles, autotuning, allocator
        sync()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            decode()
            sync()
            times.append(time.perf_counter() - t0)
        outputs[mode] = out
        same = "reference" if mode == "attention only" else (
            "bit-identical" if bits_equal(out, outputs["attention only"]) else "DIFFERS")  # fmt: skip
        result["modes"][mode] = {"seconds": statistics.median(times), "all": times, "vs attention only": same,
                                 "sites": report.counts()}  # fmt: skip
        print(f"[{mode}] median {statistics.median(times):.3f} s of {[round(t, 3) for t in times]}; {same}")
        if mode != "attention only" and not args.no_profile:
            total, rows = breakdown(decode, cuda)
            result["profiles"][mode] = {"total_ms": total, "rows": rows}
        xbackend.unpatch(model)
    print(f"\n{'mode':<16} {'decode':>9}  output vs 'attention only'")
    for mode, r in result["modes"].items():
        print(f"{mode:<16} {r['seconds']:>8.3f}s  {r['vs attention only']}")
    for mode, prof in result["profiles"].items():
        print(f"\nCUDA time by kernel family, one decode, '{mode}': {prof['total_ms']:.0f} ms")
        for fam, ms, n in prof["rows"]:
            print(f"  {fam:<42} {ms:>9.1f} ms {100 * ms / prof['total_ms']:>5.1f}%  {n:>7} kernels")
    if args.out:
        with open(f"{args.out}.json", "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
