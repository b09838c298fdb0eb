"""xbackend.attribute on the LTX-2 transformer (examples/ltx2_transformer.py's real config, 2 layers, bf16) at
quality "fast", with the Liger plugin installed: per patched site the impl that ran, its error against the
op's reference, and the output error it causes; the time it took, and suggest(1e-3).

Two runtimes: every installed plugin (what `xbackend.patch` runs at "fast" on this GPU), then the builtin
cuda/rocm backends blocked, so Liger's kernels serve every call they support and the references the rest
(Liger's impls rank below the builtins: priority 40).

    pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d .whl diffusers==0.42.1 importlib_metadata liger-kernel==0.8.5 packaging
    # on the GPU machine (.whl/ carried):
    source benchmarks/_setup.sh && python3 -m pip install -q --no-build-isolation --no-deps -e plugins/xbackend-liger \
        && python3 lab/gpu/attribute_ltx2.py --out $OUT
    python3 lab/gpu/attribute_ltx2.py --variant ltx2.3 --rope-type split --out $OUT   # Liger's RoPE and q/k too

Writes $OUT/attribute_ltx2_<variant>.json (both runs: the attribution documents and the suggestions).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

import xbackend
from xbackend.testing import fresh_runtime

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--seq", type=int, default=None, help="video tokens (default 8160 = 4 x 34 x 60 on a GPU)")
    p.add_argument("--device", default="cuda", help="cpu: the example's tiny config, to check this script")
    p.add_argument("--variant", choices=["ltx2.0", "ltx2.3"], default="ltx2.0")
    p.add_argument("--rope-type", choices=["interleaved", "split"], default="interleaved")
    p.add_argument("--quality", choices=["lossless", "high", "fast"], default="fast")
    p.add_argument("--method", choices=["auto", "bisect", "each"], default="auto")
    p.add_argument("--tolerance", type=float, default=1e-3)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"))
    return p.parse_args(argv)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def one_run(label: str, model: torch.nn.Module, inputs: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    print(f"\n== {label}")
    for status in xbackend.plugins():
        print(f"  plugin {status.name}: {status.error or f'{len(status.impls)} impls'}")
    sync(args.device)
    start = time.perf_counter()
    found = xbackend.attribute(model, quality=args.quality, method=args.method, **inputs)
    sync(args.device)
    seconds = time.perf_counter() - start
    print(found.table())
    start = time.perf_counter()
    suggestion = found.suggest(args.tolerance)
    sync(args.device)
    print(f"attribute: {seconds:.2f} s ({found.forwards} forwards, {found.method}); "
          f"suggest({args.tolerance:g}) {time.perf_counter() - start:.2f} s:\n{suggestion}")
    return {"label": label, "seconds": seconds, "attribution": found.to_dict(), "suggestion": suggestion.to_dict()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT / "examples"))
    import ltx2_transformer  # examples/: the real LTX-2 block config

    gpu = args.device.startswith("cuda")
    seq = args.seq or (8160 if gpu else None)
    example = ltx2_transformer.parse_args(["--device", args.device, "--layers", str(args.layers), "--variant", args.variant,
                                           "--rope-type", args.rope_type, *(["--seq", str(seq)] if seq else [])])
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    model = ltx2_transformer.build_model(example)
    inputs = ltx2_transformer.make_inputs(example)
    where = torch.cuda.get_device_name() if gpu else "cpu"
    print(f"LTX-2 transformer {args.variant} ({args.rope_type} RoPE): {args.layers} layers, video {example.seq} tokens x "
          f"{example.hidden}, audio {example.audio_seq} x {example.audio_hidden}, {example.dtype} on {where}, "
          f"torch {torch.__version__}")
    print(xbackend.patch(model))
    runs = [one_run("every installed plugin", model, inputs, args)]
    with fresh_runtime(autoload=True, block=["cuda", "rocm"]):
        runs.append(one_run("builtin cuda/rocm blocked: Liger where it takes the call, else the reference",
                            model, inputs, args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"attribute_ltx2_{args.variant}_{args.rope_type}.json"
    path.write_text(json.dumps({"args": vars(args), "device": where, "runs": runs}, indent=2) + "\n")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
