"""Which KV block shapes na_triton's TMA tiles get right on this GPU: 64- and 128-key blocks of
each 3-D kind on small 3-D problems at head_dim 64 and 128, TMA against the
pointer loads and the fp32 reference (relative Frobenius error on all queries).

    python3 lab/gpu/na_tma_shapes.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from xbackend.kernels import na_triton as K  # noqa: E402
from xbackend.ops.neighborhood_attention import attend_fp32  # noqa: E402


def main() -> None:
    try:
        sys.path.insert(0, str(ROOT / "lab" / "gpu"))
        import na_triton_divides as prev
    except ImportError:
        prev = None
    g = torch.Generator("cuda").manual_seed(0)
    for spatial, heads, dim, kernel in (((10, 24, 24), 2, 64, (5, 7, 7)), ((10, 24, 24), 2, 128, (5, 7, 7))):
        q, k, v = (torch.randn(1, *spatial, heads, dim, generator=g, device="cuda", dtype=torch.bfloat16)
                   for _ in range(3))
        args = (q, k, v, kernel, (1, 1, 1), (False,) * 3, None, (1, 1, 1))
        ref = attend_fp32(*args)
        print(f"\n{spatial} x {heads} x {dim}, window {kernel}", flush=True)
        for tq in ((2, 4, 8),):
            for tk in ((1, 2, 32), (1, 4, 16), (2, 1, 32), (2, 2, 16), (4, 4, 4), (8, 8, 1), (1, 4, 32), (2, 2, 32)):
                line = f"  q{tq} kv{tk}:"
                for label, mod, tma in (("tma", K, True), ("divides tma", prev, True)):
                    if mod is None:
                        continue
                    cfg = K.NAConfig(tq, tk, 4, 3, tma=tma)
                    try:
                        out = mod.neighborhood_attention(*args, config=cfg).float().reshape(ref.shape)
                        line += f"  {label} {float((out - ref).norm() / ref.norm()):.4f}"
                    except Exception as exc:  # a shape that does not compile is a result here
                        line += f"  {label} {type(exc).__name__}"
                print(line, flush=True)


if __name__ == "__main__":
    main()
