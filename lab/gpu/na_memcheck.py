"""Neighborhood attention's GPU kernels on small shapes, for a run under compute-sanitizer (memcheck):
na_sm90's shift launch, na_triton's shift, online and safe launches (TMA descriptors and pointer tiles),
na_gluon's pipelined shift launches (64- and 128-query tiles), on ragged extents, windows 1-11, a
permuted view, a misaligned view, batch x heads = 65536 (the 1-D grid) and V holding an inf or a NaN
(the safe walk). Every call's output is checked against the op's fp32 reference (non-finite values at
the reference's positions, relative error over the rest), so a run with no sanitizer error also reports
the results.

    python3 lab/gpu/na_memcheck.py          # once without the sanitizer: builds na_sm90, fills Triton's cache
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --leak-check no --error-exitcode 1 \\
        python3 lab/gpu/na_memcheck.py [sm90,triton,views,grid]   # the sections to run (default: all)

PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives each tensor its own allocation, so a read past one is an error
rather than a read of a neighbour in the caching allocator's block.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time

import torch

from xbackend.kernels import na_sm90, na_triton
from xbackend.ops.neighborhood_attention import attend_fp32

PLAIN = ((False, False, False), None)


def qkv(shape, seed, poison=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    if poison is not None:
        v.view(-1, shape[-1])[poison[0], poison[1] % shape[-1]] = poison[2]
    return q, k, v


def check(label, out, q, k, v, kernel, sample=None) -> bool:
    """The op's reference on every query (or ``sample`` of them): NaN and infinities at its positions,
    relative error < 5e-3 over the rest."""
    n = len(kernel)
    tokens = math.prod(q.shape[1:-2])
    idx = None if sample is None else torch.randperm(tokens, generator=torch.Generator().manual_seed(0))[:sample]
    idx = idx.to("cuda") if idx is not None else None
    ref = attend_fp32(q, k, v, kernel, (1,) * n, (False,) * n, None, query_index=idx)
    got = out.reshape(q.shape[0], tokens, *q.shape[-2:]).float()
    got = got if idx is None else got[:, idx]
    same = all(torch.equal(f(got), f(ref)) for f in (torch.isnan, torch.isposinf, torch.isneginf))
    fin = ref.isfinite() & got.isfinite()
    err = float((got[fin] - ref[fin]).norm() / ref[fin].norm())
    ok = same and err < 5e-3
    print(f"{'ok  ' if ok else 'FAIL'} {label}: rel err {err:.2e}, non-finite at the reference's positions {same}",
          flush=True)
    return ok


def call(q, k, v, kernel, cfg, stride=None):
    n = len(kernel)
    return na_triton.neighborhood_attention(q, k, v, kernel, (1,) * n, (False,) * n, None, stride, config=cfg)


def main() -> int:
    start = time.perf_counter()
    sections = set(sys.argv[1].split(",")) if len(sys.argv) > 1 else {"sm90", "triton", "views", "grid"}
    results = []
    # na_sm90: every window 1-11 on ragged extents (the axes one to three keys past the window), batch 2
    # at window 11, a tile set loose (the online launch), an inf in V (the safe walk).
    sm90 = torch.cuda.get_device_capability() == (9, 0) and na_sm90.available() is None
    print(f"na_sm90 {'on' if sm90 else 'unavailable: ' + str(na_sm90.available())}", flush=True)
    na_sm90.pays = lambda *_: None  # every shape through the kernel, paying or not: this checks its memory use
    for w in range(1, 12) if "sm90" in sections else ():
        spatial = (w + 1, w + 2, w + 3)
        batch = 2 if w == 11 else 1
        poison = (5, 3, float("inf")) if w in (5, 11) else None
        q, k, v = qkv((batch, *spatial, 2, 64), seed=w, poison=poison)
        if w == 9:
            q[:, :2] *= 60.0  # loose bounds: those tiles walk nothing here and go online
        cfg = dataclasses.replace(na_triton.config_for(q.shape, (w,) * 3, (1,) * 3, PLAIN[0]), q_tile=(4, 4, 4),
                                  tma=True, shift=True)
        taken = sm90 and na_sm90.takes(*(na_triton._as_3d(t) for t in (q, k, v, q)), (w,) * 3, (1,) * 3, PLAIN[0],
                                      (1, 1, 1), 0.125, (4, 4, 4), cfg.kv_tile)
        results.append(check(f"na_sm90 {taken} window {w} {spatial} batch {batch} poison {poison}",
                             call(q, k, v, (w,) * 3, cfg), q, k, v, (w,) * 3))
    na_sm90.takes = lambda *_: False  # na_triton's own shift launches from here
    # na_triton: the shift launch on the launch's TMA descriptors and on pointer tiles, the online launch
    # alone; ragged extents, loose tiles, an inf and a NaN in V.
    for head_dim in (64, 128) if "triton" in sections else ():
        q, k, v = qkv((2, 9, 13, 19, 3, head_dim), seed=20, poison=(700, 7, float("nan")))
        q[:, :1] *= 60.0
        kernel = (5, 7, 9)
        base = na_triton.config_for(q.shape, kernel, (1,) * 3, PLAIN[0])
        for name, cfg in (("shift TMA", dataclasses.replace(base, pipelined=False)),
                          ("shift pointers", dataclasses.replace(base, tma=False)),
                          ("online pointers", dataclasses.replace(base, tma=False, shift=False))):
            results.append(check(f"na_triton {name} head_dim {head_dim}", call(q, k, v, kernel, cfg), q, k, v, kernel))
        # na_gluon (head_dim 64 and 128): 64-query tiles, and 128-query tiles warp-specialized.
        tall = na_triton.choose_config((9, 13, 19), kernel, (1, 1, 1), head_dim, block_m=128)
        for name, cfg in (("na_gluon 64-query", dataclasses.replace(base, pipelined=True)),
                          ("na_gluon_ws 128-query", dataclasses.replace(base, pipelined=True, q_tile=tall.q_tile,
                                                                         kv_tile=tall.kv_tile))):
            results.append(check(f"{name} head_dim {head_dim}", call(q, k, v, kernel, cfg), q, k, v, kernel))
    # A permuted view (heads-first memory, heads-last shape) and a view one element off alignment.
    kernel = (3, 5, 7)
    if "views" not in sections:
        return _grid(sections, results, start)
    g = torch.Generator(device="cuda").manual_seed(30)
    heads_first = [torch.randn(1, 3, 7, 10, 11, 64, generator=g, device="cuda").bfloat16().permute(0, 2, 3, 4, 1, 5)
                   for _ in range(3)]
    cfg = na_triton.config_for(heads_first[0].shape, kernel, (1,) * 3, PLAIN[0])
    results.append(check("permuted view (TMA in-kernel descriptors)", call(*heads_first, kernel, cfg), *heads_first,
                         kernel))
    off = torch.empty(heads_first[0].numel() + 1, device="cuda", dtype=torch.bfloat16)[1:].view(1, 7, 10, 11, 3, 64)
    off.copy_(heads_first[0])
    assert not na_triton.tma_layout_ok(off)
    results.append(check("misaligned view (pointer tiles)", call(off, *heads_first[1:], kernel, cfg), off,
                         *heads_first[1:], kernel))
    return _grid(sections, results, start)


def _grid(sections: set[str], results: list[bool], start: float) -> int:
    # batch x heads = 65536: one program a tile on a 1-D grid (CUDA's second grid axis stops at 65535),
    # the online launch alone and the shift launch (its key-norm pass too) with its chunked online and
    # safe launches.
    if "grid" in sections:
        q, k, v = qkv((256, 2, 2, 4, 256, 32), seed=40, poison=(12345, 1, float("inf")))
        kernel = (1, 1, 3)
        base = na_triton.config_for(q.shape, kernel, (1,) * 3, PLAIN[0])
        for name, cfg in (("online", base), ("shift", dataclasses.replace(base, tma=True, shift=True))):
            results.append(check(f"batch x heads 65536, {name}", call(q, k, v, kernel, cfg), q, k, v, kernel))
    print(f"{sum(results)} of {len(results)} ok in {time.perf_counter() - start:.0f} s")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
