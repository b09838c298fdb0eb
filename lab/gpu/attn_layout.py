"""Does cuDNN attention care how q, k, v sit in memory? LTX-2 video self-attention shapes, bf16.

    python3 lab/gpu/attn_layout.py [--out $OUT]

diffusers hands SDPA ``[B, S, H, D]`` projections transposed to ``[B, H, S, D]`` (strided views);
torch.compile may materialize them head-major first. Times cuDNN's flash kernel on both layouts
(do_bench medians, one process) and says whether the outputs are bit-identical.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench


def sdpa_ms(qkv: list[torch.Tensor]) -> float:
    return do_bench(lambda: F.scaled_dot_product_attention(*qkv), rep=1000, return_mode="median")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/xbackend-out"))
    args = p.parse_args()
    rows = []
    for s, h, d in ((8160, 32, 128), (32640, 32, 128)):
        g = torch.Generator(device="cuda").manual_seed(0)
        bshd = [torch.randn(1, s, h, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3)]
        strided = [t.transpose(1, 2) for t in bshd]
        dense = [t.contiguous() for t in strided]
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o_s = F.scaled_dot_product_attention(*strided)
            o_d = F.scaled_dot_product_attention(*dense)
            mixed = [dense[0], dense[1], strided[2]]
            o_m = F.scaled_dot_product_attention(*mixed)
            row = {"seq": s, "heads": h, "dim": d, "bshd_views_ms": sdpa_ms(strided), "bhsd_dense_ms": sdpa_ms(dense),
                   "qk_dense_v_view_ms": sdpa_ms(mixed), "bshd_views_again_ms": sdpa_ms(strided),
                   "out_strides_views": o_s.stride(), "out_strides_dense": o_d.stride(),
                   "identical_dense": torch.equal(o_s, o_d), "identical_mixed": torch.equal(o_s, o_m)}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
        del bshd, strided, dense, mixed, o_s, o_d, o_m
        torch.cuda.empty_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "attn_layout.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
