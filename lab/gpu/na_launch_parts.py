"""Where one neighborhood-attention call's time goes: every kernel a ``na_triton`` call launches
(the key-norm pass, the zero fills, the shift launch, the online launch for flagged tiles) in launch
order, from torch's profiler over 20 calls, beside four timings of the call:

  do_bench        ``triton.testing.do_bench`` median (L2 flushed before each call)
  flushed+sleep   the same flush, then a 1 ms GPU sleep before the start event, so the host has
                  queued the call's launches before the GPU reaches them: do_bench minus this is
                  time the GPU waited for the host
  back-to-back    events around 20 calls in a row, no flush
  host            host time a call to enqueue its launches (perf_counter, no sync)

    python3 lab/gpu/na_launch_parts.py [--cases stage5,video,small3d] [--set HOST_DESCRIPTORS=0,REDO_CHUNK_MAX=1]
                                       [--key-scale 8] [--online]

``--set`` sets na_triton module switches (integers) for the run. ``--key-scale F`` multiplies the keys
by F, which loosens every row's score bound (F = 8 pushes every tile of these cases past ``SHIFT_MAX``:
the shift launch walks nothing and the online launch takes every tile); ``--online`` runs the online
walk alone (``NAConfig.shift`` off, same tiles): the comparison for that worst case.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from na_sol import CASES, args_of, reference_sample, sample_error  # noqa: E402

from xbackend.kernels import na_triton as K  # noqa: E402

SHORT = {"video": "3-D video", "stage5": "DiffVAE stage-5 tile", "small3d": "3-D small window", "2d": "2-D image",
         "hd64": "DiffVAE stage-4 tile, 8 x 64"}
CALLS = 20


def compiled() -> str:
    """Registers and shared memory of every na_triton / na_gluon kernel compiled so far (Triton's JIT
    caches; their layout is Triton's private business, so a failure reads "?")."""
    found = []
    try:
        kernels = [K._na_fwd_kernel] + [kern.na_fwd_shift_kernel for kern in (K.na_gluon,) if kern is not None]
        for kernel in kernels:
            for cache in kernel.device_caches.values():
                for k in cache[0].values():
                    found.append(f"{kernel.fn.__name__} {k.n_regs} regs {k.metadata.shared // 1024} KiB")
    except Exception:
        return "?"
    return "; ".join(found)


def flagged_tiles(q: torch.Tensor, k: torch.Tensor, cfg: K.NAConfig) -> tuple[int, int]:
    """Tiles the shift launch leaves to the online launch, by its rule: a tile whose largest row bound
    ``|q| * max|k| * scale * log2(e)`` exceeds ``SHIFT_MAX`` (no dilation)."""
    q, k = K._as_3d(q), K._as_3d(k)
    dim = q.shape[-1]
    bound = (q.float().norm(dim=-1) * k.float().norm(dim=-1).amax(dim=(1, 2, 3), keepdim=True)
             * dim**-0.5 * math.log2(math.e))
    tiles = torch.nn.functional.max_pool3d(bound.permute(0, 4, 1, 2, 3), cfg.q_tile, cfg.q_tile, ceil_mode=True)
    return int((tiles > K.SHIFT_MAX).sum()), tiles.numel()


def flushed(fn, sleep_cycles: int, reps: int = 15) -> float:
    """Median ms of ``fn`` after a 256 MB L2 flush, with an optional GPU sleep before the start event."""
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    times = []
    for _ in range(reps):
        cache.zero_()
        if sleep_cycles:
            torch.cuda._sleep(sleep_cycles)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="stage5,video,small3d")
    ap.add_argument("--set", default="", help="na_triton switches, NAME=INT[,NAME=INT]")
    ap.add_argument("--key-scale", type=float, default=1.0, help="multiply the keys by this")
    ap.add_argument("--online", action="store_true", help="the online walk alone (NAConfig.shift off)")
    a = ap.parse_args()
    for item in filter(None, a.set.split(",")):
        name, value = item.split("=")
        if not hasattr(K, name):
            raise SystemExit(f"--set: na_triton has no switch {name!r}")
        setattr(K, name, type(getattr(K, name))(int(value)))
    print(f"na_triton switches: HOST_DESCRIPTORS={K.HOST_DESCRIPTORS} REDO_CHUNK_MAX={K.REDO_CHUNK_MAX}"
          f" REDO_MIN_PROGRAMS={K.REDO_MIN_PROGRAMS}")
    from triton.testing import do_bench

    by_name = {c.name: c for group in CASES.values() for c in group}
    for key in a.cases.split(","):
        case = by_name[SHORT[key]]
        args = args_of(case, torch.device("cuda"))
        if a.key_scale != 1.0:
            args = (args[0], args[1] * a.key_scale, *args[2:])
        n = len(case.spatial)
        cfg = K.config_for(args[0].shape, case.kernel, (1,) * n, (False,) * n)
        if a.online:
            cfg = dataclasses.replace(cfg, shift=False, pipelined=False)
        flagged, tiles = flagged_tiles(args[0], args[1], cfg)

        def fn(args=args, cfg=cfg):
            return K.neighborhood_attention(*args, config=cfg)

        ms = do_bench(fn, return_mode="median")
        # ~1.98 GHz: 2e6 cycles is about 1 ms, longer than any call's host time.
        slept = flushed(fn, 2_000_000)
        plain = flushed(fn, 0)
        torch.cuda.synchronize()
        a0, a1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a0.record()
        for _ in range(CALLS):
            fn()
        a1.record()
        a1.synchronize()
        b2b = a0.elapsed_time(a1) / CALLS
        torch.cuda._sleep(50_000_000)  # the GPU busy well past the host loop: enqueue never waits
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        host = (time.perf_counter() - t0) / CALLS * 1e3
        torch.cuda.synchronize()

        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                fn()
            torch.cuda.synchronize()
        kernels = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                         key=lambda ev: ev.time_range.start)
        per_call = len(kernels) // CALLS
        print(f"\n{case.name}: do_bench {ms * 1e3:8.1f} us  flushed {plain * 1e3:8.1f}  flushed+sleep "
              f"{slept * 1e3:8.1f}  back-to-back {b2b * 1e3:8.1f}  host {host * 1e3:7.1f} us a call")
        print(f"  keys x {a.key_scale:g}, {'online walk alone' if a.online else 'shipped launches'}: "
              f"{flagged} of {tiles} tiles past SHIFT_MAX, error {sample_error(case, fn(), reference_sample(case, args)):.4f}")
        print(f"  kernels in launch order (us a call, profiler; {per_call} a call):")
        for i in range(per_call):
            evs = kernels[i::per_call]
            print(f"  {sum(ev.time_range.elapsed_us() for ev in evs) / len(evs):9.1f}  {evs[0].name[:60]}")
        spans = [kernels[c * per_call + per_call - 1].time_range.end - kernels[c * per_call].time_range.start
                 for c in range(len(kernels) // per_call)]
        busy = sum(ev.time_range.elapsed_us() for ev in kernels) / (len(kernels) // per_call)
        print(f"  {busy:9.1f}  kernels total; first start to last end {statistics.median(spans):.1f} us")
        print(f"  compiled: {compiled()}")
        del args, fn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
