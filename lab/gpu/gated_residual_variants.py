"""Why is torch.compile's ``x + update * gate`` 3-4% faster than the CUDA kernel at [1, 4096..4608, 3072]?

    PYTHONUNBUFFERED=1 python3 lab/gpu/gated_residual_variants.py [--out $OUT] [--rounds 3]

Schedules (``lab/gpu/gated_residual_src/variants.cu``, same rounding as production): ``flat`` (one 16-byte
pack per thread over the flat pack index, 32-bit index math: torch.compile's shape) and ``grid2d``
(row = blockIdx.y, no division), each with three load forms (``nc``: ld.global.nc as __ldg emits,
``plain``: ld.global, ``ef``: L1::evict_first; the gate then L1::evict_last) and 128/256 threads.
Against torch.compile and the production kernel's automatic choice, bf16, inputs rotated over > 256 MB,
interleaved rounds, ratios to compile within a round; every variant checked with torch.equal first.
Also writes torch.compile's generated code for the first shape ($OUT/inductor_<shape>.py). When
``lab/gpu/gated_residual_src/prev/`` holds an earlier copy of the production sources, that kernel is timed too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from torch._inductor.utils import run_and_get_code

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gated_residual import TIMED, eager, gate_shape, input_sets
from gated_residual_sweep import timed_rounds

from xbackend.kernels import cuda_gated_residual as cuda_gr
from xbackend.kernels._cuda_build import JitExtension

EXT = JitExtension("xbackend_gr_variants", ("variants_binding.cpp", "variants.cu"), "gated residual variants",
                   source_dir=Path(__file__).resolve().parent / "gated_residual_src")
PREV = Path(__file__).resolve().parent / "gated_residual_src" / "prev"


def _unwrap(out: object) -> torch.Tensor:
    if isinstance(out, str):  # the pybind binding before session 6 returned errors as strings
        raise RuntimeError(out)
    return out


SHAPES = TIMED[:7]  # the seed 001 shapes (lab/gpu/gated_residual.py)
VARIANTS = [(s, ld, t) for s in (0, 1) for ld in (0, 1, 2) for t in (128, 256)]
SCHEDULES = ("flat", "grid2d")
LOADS = ("nc", "plain", "ef")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"))
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    mod = EXT.load()
    prev = None
    if (PREV / "gated_residual.cu").exists():
        prev = JitExtension("xbackend_gr_prev", ("gated_residual_binding.cpp", "gated_residual.cu"),
                            "previous gated_residual", source_dir=PREV).load()
    compiled = torch.compile(eager, dynamic=False)
    gen = torch.Generator(device="cuda").manual_seed(5)
    report: dict[str, dict] = {}
    for i, (name, shape, form) in enumerate(SHAPES):
        gshape = gate_shape(shape, form)
        sets = input_sets(shape, gshape, torch.bfloat16, gen)
        want = eager(*sets[0])
        if i == 0:
            _, code = run_and_get_code(compiled, *sets[0])
            Path(args.out).mkdir(parents=True, exist_ok=True)
            Path(args.out, f"inductor_{name}.py").write_text("\n\n# ----\n\n".join(code))
        fns = {"compile": compiled, "production": cuda_gr.gated_residual}
        if prev is not None:  # an earlier production kernel, for an A/B in the same rounds
            fns["prev production"] = lambda x, u, g: _unwrap(prev.gated_residual(x, u, g))
        exact = {k: bool(torch.equal(fns[k](*sets[0]), want)) for k in fns if k != "compile"}
        for sched, loads, threads in VARIANTS:
            if sched == 1 and form == "full":
                continue
            label = f"{SCHEDULES[sched]} {LOADS[loads]} t{threads}"
            fns[label] = lambda x, u, g, c=(sched, loads, threads): mod.run(x, u, g, *c)
            exact[label] = bool(torch.equal(fns[label](*sets[0]), want))
        compiled(*sets[0])
        report[name] = timed_rounds(f"{name} {tuple(shape)} gate {tuple(gshape)}", fns, sets, exact, args.rounds)
        del sets
        torch.cuda.empty_cache()
    Path(args.out, "gated_residual_variants.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
