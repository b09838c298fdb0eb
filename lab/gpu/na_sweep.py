"""na_triton variants on benchmarks/na_sol.py's cases, timed in one process on the GPU: the shipped
config, launch-config neighbours (stages, KV block width, 128-query tiles, TMA or pointer tiles), and
the comparison variant with per-trip divides and a separate scale multiply
(``lab/gpu/na_triton_divides.py``) at the same config.

    python3 lab/gpu/na_sweep.py [--cases video,stage5] [--only LABELS] [--ncu]

Per variant: median ms (do_bench), rate on useful and on computed pairs, error against the fp32
reference on 1024 queries. ``--ncu`` instead launches the shipped config of each case (or the first ``--only`` label's) three
times (for ``ncu -k regex:na_fwd --launch-skip 2``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from na_sol import CASES, args_of, reference_sample, sample_error, useful_pairs  # noqa: E402

from xbackend.kernels import na_triton as K  # noqa: E402
from xbackend.kernels import na_triton_config as C  # noqa: E402

SHORT = {"video": "3-D video", "stage5": "DiffVAE stage-5 tile", "2d": "2-D image", "small3d": "3-D small window",
         **{f"hd{d}": f"DiffVAE stage-4 tile, {h} x {d}" for h, d in ((16, 32), (8, 64), (6, 80), (5, 96), (4, 128))}}


# na_gluon schedule options by variant label: overrides of na_gluon.OPTIONS[head_dim] for the row.
GLUON = {"pipelined": {}, "pipelined q 128": {}, "pipelined q regs": {"Q_REGS": True},
         "pipelined q smem": {"Q_REGS": False}, "pipelined shallow": {"DEEP": False},
         "ws q 128": {}, "ws q 128 q regs": {"Q_REGS": True}, "ws q 128 q smem": {"Q_REGS": False},
         "ws q 128 shallow": {"DEEP": False}}
# Rows that set na_triton module switches (restored after the row) on the shipped config.
SWITCHES = {"host descriptors": {"HOST_DESCRIPTORS": True}, "in-kernel descriptors": {"HOST_DESCRIPTORS": False},
            "redo 8 tiles": {"REDO_CHUNK_MAX": 8}, "redo 1 tile": {"REDO_CHUNK_MAX": 1},
            "host desc + redo 8": {"HOST_DESCRIPTORS": True, "REDO_CHUNK_MAX": 8},
            "in-kernel + redo 1": {"HOST_DESCRIPTORS": False, "REDO_CHUNK_MAX": 1}}
# 128-query rows: na_gluon_ws's warp-specialized kernel ("ws ...") or na_gluon's 8-warp program.
TALL = ("pipelined q 128", "ws q 128", "ws q 128 q regs", "ws q 128 q smem", "ws q 128 shallow")


def variants(case, base: K.NAConfig) -> list[tuple[str, K.NAConfig]]:
    n = len(case.spatial)
    lead = (1,) * (3 - n)
    spatial = lead + case.spatial
    out = [("shipped", base), *((label, base) for label in SWITCHES),
           ("stages 2", dataclasses.replace(base, num_stages=2)), ("stages 4", dataclasses.replace(base, num_stages=4)),
           ("tma flipped", dataclasses.replace(base, tma=not base.tma)),
           ("shift flipped", dataclasses.replace(base, shift=not base.shift)),
           ("pipelined flipped", dataclasses.replace(base, pipelined=not base.pipelined)),
           *((label, dataclasses.replace(base, pipelined=True)) for label in GLUON if label not in TALL)]
    def tiles(**blocks: int) -> K.NAConfig:
        """The shipped launch (TMA, shift, stages) with choose_config's tiles for other block sizes."""
        pick = C.choose_config(spatial, lead + case.kernel, (1, 1, 1), case.dim, **blocks)
        return dataclasses.replace(base, q_tile=pick.q_tile, kv_tile=pick.kv_tile, num_warps=pick.num_warps)

    wide, tall, narrow = tiles(block_n=128), tiles(block_m=128), tiles(block_n=32)
    out += [(label, dataclasses.replace(tall, pipelined=True)) for label in TALL]
    out += [("kv 128", wide), ("kv 128 stages 2", dataclasses.replace(wide, num_stages=2)),
            ("q 128 / 8 warps", dataclasses.replace(tall, num_stages=2)),
            ("kv 32", dataclasses.replace(narrow, num_stages=4)), ("kv 32 stages 3", narrow),
            ("kv 32 stages 2", dataclasses.replace(narrow, num_stages=2))]
    return out


def compiled(kernel) -> str:
    """Registers and shared memory of the kernel's most recent compile (Triton's JIT cache)."""
    try:
        cache = next(iter(kernel.device_caches.values()))[0]
        k = list(cache.values())[-1]
        return f"{k.n_regs} regs {k.metadata.shared // 1024} KiB"
    except Exception:  # the cache layout is Triton's private business; the row stands without it
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="video,stage5,2d,small3d")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--only", default=None, help="comma-separated variant labels to time (default: all)")
    a = ap.parse_args()
    from triton.testing import do_bench

    shipped_options = {d: dict(o) for d, o in K.na_gluon.OPTIONS.items()} if K.na_gluon is not None else {}
    shipped_ws = dict(K.na_gluon_ws.OPTIONS) if K.na_gluon_ws is not None else {}
    by_name = {c.name: c for group in CASES.values() for c in group}
    try:
        prev = importlib.import_module("na_triton_divides")
    except ImportError:
        prev = None
    for key in a.cases.split(","):
        case = by_name[SHORT[key]]
        args = args_of(case, torch.device("cuda"))
        n = len(case.spatial)
        base = K.config_for(args[0].shape, case.kernel, (1,) * n, (False,) * n)
        if a.ncu:
            # The shipped config, or the first --only variant (its kernel options set as for its row).
            label, cfg = next((r for r in variants(case, base) if a.only and r[0] == a.only.split(",")[0]),
                              ("shipped", base))
            if K.na_gluon is not None:
                K.na_gluon.OPTIONS.setdefault(case.dim, {}).update(GLUON.get(label, {}))
                K.na_gluon_ws.OPTIONS.update(GLUON.get(label, {}) if label.startswith("ws ") else {})
            K.WARP_SPECIALIZED = label.startswith("ws ")
            for _ in range(3):
                K.neighborhood_attention(*args, config=cfg)
            torch.cuda.synchronize()
            continue
        sample = reference_sample(case, args)
        pairs = useful_pairs(case)
        flops = 4 * case.dim * case.heads * case.batch
        print(f"\n{case.name}: {case.spatial} x {case.heads} x {case.dim}, window {case.kernel}", flush=True)
        rows = [r for r in variants(case, base) if a.only is None or r[0] in a.only.split(",")]
        if prev is not None:
            rows.insert(1, ("divides variant", base))
        for label, cfg in rows:
            fn = prev.neighborhood_attention if label == "divides variant" else K.neighborhood_attention
            if K.na_gluon is not None:
                K.na_gluon.OPTIONS.update({d: dict(o) for d, o in shipped_options.items()})
                K.na_gluon.OPTIONS.setdefault(case.dim, {}).update(GLUON.get(label, {}))
                # A "ws" row's options are the warp-specialized kernel's own (over na_gluon's).
                K.na_gluon_ws.OPTIONS.clear()
                K.na_gluon_ws.OPTIONS.update({**shipped_ws, **(GLUON.get(label, {}) if label.startswith("ws ") else {})})
            K.WARP_SPECIALIZED = label.startswith("ws ")
            saved = {name: getattr(K, name) for name in SWITCHES.get(label, {})}
            try:
                for name, value in SWITCHES.get(label, {}).items():
                    setattr(K, name, value)
                err = sample_error(case, fn(*args, config=cfg), sample)
                ms = do_bench(lambda fn=fn, cfg=cfg, args=args: fn(*args, config=cfg), return_mode="median")
            except Exception as exc:  # a variant that does not compile or launch is a row, not a stop
                print(f"  {label:<18} {cfg!s:<60} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            finally:
                for name, value in saved.items():
                    setattr(K, name, value)
            computed = K.visited_pairs(case.spatial, case.kernel, (1,) * n, (False,) * n, (1,) * n, cfg)
            print(f"  {label:<18} q{cfg.q_tile} kv{cfg.kv_tile} w{cfg.num_warps} s{cfg.num_stages} tma {int(cfg.tma)}"
                  f" shift {int(cfg.shift)}"
                  f": {ms:8.3f} ms  useful {flops * pairs / ms / 1e9:5.0f}  computed "
                  f"{flops * computed / ms / 1e9:5.0f} TFLOP/s  useful/computed {pairs / computed:.3f}  error {err:.4f}  "
                  f"{compiled((prev if label == 'divides variant' else K)._na_fwd_kernel)}",
                  flush=True)
        del args, sample
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
