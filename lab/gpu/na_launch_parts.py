"""Where one neighborhood-attention call's GPU time goes: every kernel a ``na_triton`` call launches
(the key-norm pass, the zero fills, the shift launch, the online launch for flagged tiles), from
torch's profiler over 20 calls, beside the call's ``do_bench`` median.

    python3 lab/gpu/na_launch_parts.py [--cases stage5,video,small3d]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from na_sol import CASES, args_of  # noqa: E402

from xbackend.kernels import na_triton as K  # noqa: E402

SHORT = {"video": "3-D video", "stage5": "DiffVAE stage-5 tile", "small3d": "3-D small window", "2d": "2-D image"}
CALLS = 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="stage5,video,small3d")
    a = ap.parse_args()
    from triton.testing import do_bench

    by_name = {c.name: c for group in CASES.values() for c in group}
    for key in a.cases.split(","):
        case = by_name[SHORT[key]]
        args = args_of(case, torch.device("cuda"))
        def fn(args=args):
            return K.neighborhood_attention(*args)

        ms = do_bench(fn, return_mode="median")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(CALLS):
                fn()
            torch.cuda.synchronize()
        per = collections.defaultdict(float)
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                per[ev.name[:60]] += ev.device_time / CALLS
        print(f"\n{case.name}: do_bench median {ms * 1e3:9.1f} us a call; kernels (us a call, profiler):")
        for name, us in sorted(per.items(), key=lambda kv: -kv[1]):
            print(f"  {us:9.1f}  {name}")
        print(f"  {sum(per.values()):9.1f}  total")
        del args, fn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
