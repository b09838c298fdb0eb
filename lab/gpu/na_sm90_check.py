"""na_sm90's shift launch on small shapes, for a run under compute-sanitizer (memcheck): ragged tiles,
unequal and even windows, an axis of one token, batch 2, and a tile set the bound flags. Each call's output is
checked against the fp32 reference, so a run that reports no sanitizer error also reports the error.

    XBACKEND_NA_SM90=1 compute-sanitizer --tool memcheck python3 lab/gpu/na_sm90_check.py
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "kernels"))

from test_na_kernels import make_qkv, reference, rel_err  # noqa: E402

from xbackend.kernels import na_sm90, na_triton  # noqa: E402

SHAPES = [  # spatial, heads, window, batch, scale of the first tiles' queries (flags them)
    ((13, 17, 19), 3, (11, 11, 11), 2, 1.0),
    ((11, 20, 14), 2, (7, 9, 11), 1, 1.0),
    ((1, 9, 13), 2, (1, 5, 7), 1, 1.0),
    ((1, 10, 13), 2, (1, 2, 10), 1, 1.0),
    ((12, 16, 16), 2, (11, 11, 11), 1, 40.0),
]


def main() -> int:
    assert na_sm90.switched_on(), f"set {na_sm90.SWITCH}=1"
    assert na_sm90.available() is None, na_sm90.build_log()
    na_sm90.pays = lambda *_: None  # every shape through the kernel, paying or not: this checks its memory use
    worst = 0.0
    for spatial, heads, window, batch, boost in SHAPES:
        q, k, v = make_qkv(spatial, heads, 64, torch.bfloat16, seed=5, device="cuda", batch=batch)
        q[:, :4, :4] *= boost
        config = dataclasses.replace(na_triton.config_for(q.shape, window, (1, 1, 1), (False,) * 3),
                                     q_tile=(4, 4, 4), tma=True, shift=True)
        taken = na_sm90.takes(*(na_triton._as_3d(t) for t in (q, k, v, q)), window, (1, 1, 1), (False,) * 3,
                              (1, 1, 1), 0.125, (4, 4, 4), config.kv_tile)
        out = na_triton.neighborhood_attention(q, k, v, window, (1, 1, 1), (False,) * 3, None, config=config)
        torch.cuda.synchronize()
        err = rel_err(out, reference(q.float(), k.float(), v.float(), window, (1, 1, 1), (False,) * 3))
        worst = max(worst, err)
        print(f"{spatial} heads {heads} window {window} batch {batch} boost {boost}: na_sm90 taken {taken}, "
              f"rel err {err:.5f}", flush=True)
    print(f"worst {worst:.5f}")
    return 0 if worst < 5e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
