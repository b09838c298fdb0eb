"""na_triton's tile choice: the max-box model of ``choose_config`` against the exact count of computed
query-key pairs (``visited_pairs``), on benchmarks/na_sol.py's cases.

    python3 lab/gpu/na_tile_model.py                 # CPU: chosen vs the top configs by exact useful/computed
    python3 lab/gpu/na_tile_model.py --time --top 4  # GPU: also time them (do_bench, bf16), with the error
                                                     # against the fp32 reference on 1024 queries

The question it answers: does ranking 64x64 tile shapes by the exact count pick faster kernels than the
shipped model? (On "3-D small window" the exact count finds 0.61 useful against the chosen config's 0.49.)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from na_sol import CASES, Case, args_of, reference_sample, sample_error, useful_pairs  # noqa: E402

from xbackend.kernels import na_triton as K  # noqa: E402
from xbackend.kernels import na_triton_config as C  # noqa: E402


def ranked(case: Case, block: int = 64) -> tuple[K.NAConfig, list[tuple[float, K.NAConfig]]]:
    n = len(case.spatial)
    lead = (1,) * (3 - n)
    spatial, kernel = lead + case.spatial, lead + case.kernel
    stride = lead + (case.stride or (1,) * n)
    causal = case.causal or (False,) * n
    chosen = K.config_for((case.batch, *case.spatial, case.heads, case.dim), case.kernel, (1,) * n, causal, stride[3 - n:])
    pairs = useful_pairs(case)
    q_limits = tuple(C._pow2_le(2 * s - 1) for s in spatial)
    out = []
    for tq in C._shapes(block, q_limits):
        box = tuple(min(k + K.leader_span(t, s), L) for k, t, s, L in zip(kernel, tq, stride, spatial, strict=True))
        for tk in C._shapes(block, tuple(C._pow2_le(2 * b - 1) for b in box)):
            cfg = dataclasses.replace(chosen, q_tile=tq, kv_tile=tk)  # the chosen launch, other tiles
            out.append((pairs / K.visited_pairs(case.spatial, case.kernel, (1,) * n, causal, stride[3 - n:], cfg), cfg))
    out.sort(key=lambda r: -r[0])
    return chosen, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--time", action="store_true", help="time the chosen and the top configs (needs a GPU)")
    a = ap.parse_args()
    for case in [c for g in CASES.values() for c in g]:
        chosen, rows = ranked(case)
        score = dict((cfg, u) for u, cfg in rows)
        print(f"\n{case.name}: chosen q{chosen.q_tile} kv{chosen.kv_tile} useful/computed {score[chosen]:.3f}")
        picks = [chosen] + [cfg for _, cfg in rows[: a.top] if cfg != chosen]
        if a.time:
            from triton.testing import do_bench

            args = args_of(case, torch.device("cuda"))
            sample = reference_sample(case, args)
        for cfg in picks:
            line = f"  q{cfg.q_tile} kv{cfg.kv_tile}: useful/computed {score[cfg]:.3f}"
            if a.time:
                err = sample_error(case, K.neighborhood_attention(*args, config=cfg), sample)
                ms = do_bench(lambda cfg=cfg, args=args: K.neighborhood_attention(*args, config=cfg), return_mode="median")
                line += f"  {ms:.3f} ms  error {err:.4f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
