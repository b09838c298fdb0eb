"""Neighborhood attention against its speed of light: one line per case, and a JSON that
benchmarks/render.py turns into the SOL table of docs/performance.md (renderer ``na_sol``).

    python3 benchmarks/na_sol.py [--out FILE.json] [--cases plain,strided] [--smoke]

Per case, through ``xbackend.get_op("neighborhood_attention")`` (resolved, guard-verified on its first
call; the impl that ran is read from ``xbackend.report()``):

  time        median device time (``triton.testing.do_bench``), bf16, batch as listed
  useful      4 * head_dim * heads * batch * (query-key pairs inside the windows) / time
  dense       SDPA over the same tokens with no mask (cuDNN where torch has it), its time
  SOL         dense time * useful pairs / dense pairs: the useful work at the dense kernel's rate
  % SOL       SOL / time
  useful/computed  useful pairs / the pairs na_triton computes (``visited_pairs``: padded Q tiles
              times whole KV blocks; q.k's 2 x 2 x 14 blocks where na_sm90 is the shift launch),
              shown when na_triton is the impl that ran
  error       relative Frobenius error against the fp32 reference over 1024 random queries

``--smoke`` runs two tiny cases on the CPU (the reference impl, no SOL claim) to check the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import xbackend
from xbackend.kernels import na_sm90, na_triton
from xbackend.ops.neighborhood_attention import attend_fp32, axis_windows


@dataclass(frozen=True)
class Case:
    name: str
    spatial: tuple[int, ...]
    heads: int
    dim: int
    kernel: tuple[int, ...]
    stride: tuple[int, ...] | None = None
    batch: int = 1
    causal: tuple[bool, ...] | None = None


CASES = {
    "plain": [
        Case("3-D video", (30, 48, 80), 24, 128, (18, 24, 24)),
        Case("DiffVAE stage-5 tile", (40, 96, 96), 4, 64, (11, 11, 11)),
        Case("2-D image", (128, 128), 16, 128, (13, 13), batch=2),
        Case("3-D small window", (16, 64, 112), 12, 128, (9, 15, 15)),
    ],
    "strided": [
        Case("3-D video, stride (2,4,8)", (30, 48, 80), 24, 128, (18, 24, 24), (2, 4, 8)),
        Case("3-D video, stride = window (blocks)", (30, 48, 80), 24, 128, (18, 24, 24), (18, 24, 24)),
        Case("3-D video 32x48x80, window = stride (8,16,16)", (32, 48, 80), 24, 128, (8, 16, 16), (8, 16, 16)),
        Case("2-D image, stride (13,13)", (128, 128), 16, 128, (13, 13), (13, 13), batch=2),
        Case("3-D causal, stride (3,5,5)", (16, 64, 112), 12, 128, (9, 15, 15), (3, 5, 5),
             causal=(True, False, False)),
    ],
    # The head dims the fast kernel takes, on a DiffVAE stage-4 tile (about 512 channels each); 80 and
    # 96 run padded to 128.
    "head_dims": [Case(f"DiffVAE stage-4 tile, {h} x {d}", (20, 48, 48), h, d, (11, 11, 11))
                  for h, d in ((16, 32), (8, 64), (6, 80), (5, 96), (4, 128))],
}
SMOKE = [Case("smoke 2-D", (12, 16), 2, 16, (5, 7)), Case("smoke 3-D strided", (6, 8, 8), 2, 16, (3, 4, 4), (3, 2, 4))]


def useful_pairs(case: Case) -> int:
    """Query-key pairs inside the windows, per batch and head (the windows are a product over axes)."""
    stride = case.stride or (1,) * len(case.spatial)
    causal = case.causal or (False,) * len(case.spatial)
    total = 1
    for length, ks, c, s in zip(case.spatial, case.kernel, causal, stride, strict=True):
        total *= int(axis_windows(length, ks, 1, c, torch.device("cpu"), s)[1].sum())
    return total


def args_of(case: Case, device: torch.device) -> tuple:
    g = torch.Generator(device=device).manual_seed(0)
    shape = (case.batch, *case.spatial, case.heads, case.dim)
    q, k, v = (torch.randn(shape, generator=g, device=device, dtype=torch.bfloat16) for _ in range(3))
    n = len(case.spatial)
    return q, k, v, case.kernel, (1,) * n, case.causal or (False,) * n, None, case.stride or (1,) * n


def reference_sample(case: Case, args: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """1024 random queries of the case (seed 1) and the fp32 reference on them: the accuracy sample
    every NA benchmark here reports."""
    tokens = math.prod(case.spatial)
    idx = torch.randperm(tokens, generator=torch.Generator().manual_seed(1))[:1024].to(args[0].device)
    return idx, attend_fp32(*args, query_index=idx)


def sample_error(case: Case, out: torch.Tensor, sample: tuple[torch.Tensor, torch.Tensor]) -> float:
    """Relative Frobenius error of ``out`` against the reference on the sample's queries."""
    idx, ref = sample
    got = out.reshape(case.batch, math.prod(case.spatial), case.heads, case.dim)[:, idx].float()
    return float((got - ref).norm() / ref.norm())


def time_ms(fn, device: torch.device, reps: int) -> float:
    if device.type == "cuda":
        from triton.testing import do_bench

        return float(do_bench(fn, return_mode="median"))
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e3


def dense_ms(case: Case, device: torch.device, reps: int) -> tuple[float, str]:
    """SDPA over all tokens with no mask: cuDNN where torch has it for this input, else flash, else
    torch's own choice. Only the probe call is guarded: an error while timing propagates."""
    tokens = math.prod(case.spatial)
    q = torch.randn(case.batch, case.heads, tokens, case.dim, device=device, dtype=torch.bfloat16)
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend

        for name, kind in (("cuDNN", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            try:
                _sdpa(q, kind)
            except RuntimeError:
                continue
            return time_ms(lambda kind=kind: _sdpa(q, kind), device, reps), name
    return time_ms(lambda: F.scaled_dot_product_attention(q, q, q), device, reps), "default"


def _sdpa(q: torch.Tensor, kind) -> torch.Tensor:
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(kind):
        return F.scaled_dot_product_attention(q, q, q)


def run(case: Case, device: torch.device, reps: int, dense_cache: dict) -> dict:
    op = xbackend.get_op("neighborhood_attention")
    args = args_of(case, device)
    seen = len(xbackend.report().events)
    op(*args)  # resolution and the guard's verification
    events = xbackend.report().events[seen:]
    impl = events[-1].impl if events else "?"
    status = "; ".join(f"{e.impl} {e.status}" for e in events)
    ms = time_ms(lambda: op(*args), device, reps)
    out = op(*args)
    err = sample_error(case, out, reference_sample(case, args))
    tokens = math.prod(case.spatial)
    key = (case.spatial, case.heads, case.dim, case.batch)
    if key not in dense_cache:
        dense_cache[key] = dense_ms(case, device, reps)
    d_ms, d_backend = dense_cache[key]
    pairs = useful_pairs(case)
    scale = 4 * case.dim * case.heads * case.batch  # q.k and p.v: 2 FLOPs each per pair and element
    sol_ms = d_ms * pairs / tokens**2
    row = dict(case=asdict(case), impl=impl, guard=status, ms=ms, useful_tflops=scale * pairs / ms / 1e9,
               dense_ms=d_ms, dense_backend=d_backend, flop_ratio=tokens**2 / pairs, sol_ms=sol_ms,
               pct_sol=100 * sol_ms / ms, rel_err=err)
    # na_triton's tiling for this case (what it computes when it is the impl that ran).
    cfg = na_triton.config_for(args[0].shape, *args[3:6], args[7])
    if _sm90_takes(args, cfg) and cfg.shift:  # takes() first: the CPU smoke run calls it too
        # The shift launch is na_sm90's: its q.k pairs are those of 2 x 2 x 14 key blocks (its p.v pads
        # each block to 64 keys).
        cfg = dataclasses.replace(cfg, kv_tile=na_sm90.KV_TILE)
    computed = na_triton.visited_pairs(case.spatial, case.kernel, args[4], args[5], args[7], cfg)
    row.update(triton_useful_of_computed=pairs / computed, q_tile=cfg.q_tile, kv_tile=cfg.kv_tile)
    return row


def _sm90_takes(args: tuple, cfg: na_triton.NAConfig) -> bool:
    q, k, v, ks, dil, causal, scale, stride = args
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return q.dim() == 6 and na_sm90.takes(q, k, v, q, ks, dil, causal, stride, float(scale), cfg.q_tile, cfg.kv_tile)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the rows as JSON here (rewritten after every case)")
    ap.add_argument("--cases", default="plain,strided", help=f"comma-separated groups: {', '.join(CASES)}")
    ap.add_argument("--smoke", action="store_true", help="two tiny cases on the CPU: checks the script only")
    a = ap.parse_args()
    unknown = [g for g in a.cases.split(",") if g not in CASES]
    if unknown:
        ap.error(f"--cases: expected comma-separated groups from {', '.join(CASES)}, got {', '.join(unknown)}")
    device = torch.device("cpu" if a.smoke else "cuda")
    cases = SMOKE if a.smoke else [c for g in a.cases.split(",") for c in CASES[g]]
    reps = 2  # CPU only: do_bench picks its own repetitions on a GPU
    rows: list[dict] = []
    dense_cache: dict = {}
    for case in cases:
        rows.append(run(case, device, reps, dense_cache))
        r = rows[-1]
        computed = f"{100 * r['triton_useful_of_computed']:.0f}%" if r["impl"].endswith("na_triton") else "-"
        print(f"{case.name:<48} {r['impl']:<18} {r['ms']:9.3f} ms {r['useful_tflops']:6.0f} TFLOP/s  dense "
              f"{r['dense_ms']:8.2f} ms  SOL {r['sol_ms']:8.3f} ms  {r['pct_sol']:4.0f}% of SOL  useful/computed "
              f"{computed:>4}  error {r['rel_err']:.4f}", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                               torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
