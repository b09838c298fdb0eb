"""Neighborhood attention's call time through ``get_op``, for two packages in one GPU call: the xbackend
this process imports (the working tree) against another (``--compare DIR``, a copy of an earlier
commit's package put on PYTHONPATH, e.g. ``.base``), in interleaved rounds of fresh processes.

    python3 lab/gpu/na_trust_bench.py --compare .base [--rounds 3] [--cases stage5,video] [--out FILE.json]
    python3 lab/gpu/na_trust_bench.py [--cases ...]   # the importable package alone, one table

Cases (bf16, benchmarks/na_sol.py's plain rows): ``stage5`` the DiffVAE stage-5 tile (40, 96, 96) x 4 heads
x 64, window 11^3 (on sm90: na_sm90's shift launch); ``video`` the 3-D video case (30, 48, 80) x 24 heads x
128, window (18, 24, 24) (na_gluon's pipelined shift launch); ``2d`` the 2-D image case (2 x 128 x 128) x 16
x 128, window 13^2 (na_triton's online launch alone); ``stage5-flex`` the stage-5 tile with na_flex
forced. Per case and package: the median of ``triton.testing.do_bench``'s medians over the rounds, and
the relative error against the fp32 reference on 1024 sampled queries. A round runs each package in
its own process (so each imports its own xbackend and builds its own na_sm90), alternating which goes
first; the Triton and extension caches are warm after the first round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = {
    "stage5": ((1, 40, 96, 96, 4, 64), (11, 11, 11), None),
    "video": ((1, 30, 48, 80, 24, 128), (18, 24, 24), None),
    "2d": ((2, 128, 128, 16, 128), (13, 13), None),
    "stage5-flex": ((1, 40, 96, 96, 4, 64), (11, 11, 11), "na_flex"),
}


def child(cases: list[str]) -> dict:
    """Time each case through get_op in this process: {case: {ms, rel_err, impl, package}}."""
    import math

    import torch
    from triton.testing import do_bench

    import xbackend
    from xbackend.ops.neighborhood_attention import attend_fp32

    rows = {}
    for name in cases:
        shape, kernel, forced = CASES[name]
        n = len(kernel)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        args = (q, k, v, kernel, (1,) * n, (False,) * n, None)
        op = xbackend.get_op("neighborhood_attention")
        with xbackend.use(neighborhood_attention=forced) if forced else contextlib.nullcontext():
            seen = len(xbackend.report().events)
            out = op(*args)  # resolution and the guard's verification
            events = xbackend.report().events[seen:]
            torch.cuda.synchronize()
            # Long calls get more repetitions than do_bench's default 100 ms of them.
            ms = float(do_bench(lambda op=op, args=args: op(*args), warmup=100, rep=1500, return_mode="median"))
        tokens = math.prod(shape[1:-2])
        idx = torch.randperm(tokens, generator=torch.Generator().manual_seed(1))[:1024].to("cuda")
        ref = attend_fp32(*args, query_index=idx)
        got = out.reshape(shape[0], tokens, *shape[-2:])[:, idx].float()
        rows[name] = {"ms": ms, "rel_err": float((got - ref).norm() / ref.norm()),
                      "impl": events[-1].impl if events else "?", "package": os.path.dirname(xbackend.__file__)}
    return rows


def _run(cases: list[str], pythonpath: str | None) -> dict:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    res = subprocess.run([sys.executable, __file__, "--child", ",".join(cases)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"child ({pythonpath or 'working tree'}) failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="stage5,video", help=f"comma-separated: {', '.join(CASES)}")
    ap.add_argument("--compare", default=None, help="a directory holding another xbackend package (e.g. .base)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="write every round's rows here as JSON")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child.split(","))))
        return 0
    cases = a.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"--cases: expected names from {', '.join(CASES)}, got {', '.join(unknown)}")
    if a.compare is not None and not (Path(a.compare) / "xbackend" / "__init__.py").is_file():
        ap.error(f"--compare: expected a directory holding xbackend/__init__.py, got {a.compare}")
    labels = {"new": None} if a.compare is None else {"new": None, "old": str(Path(a.compare).resolve())}
    rounds: list[dict] = []
    for r in range(a.rounds if a.compare else 1):
        order = list(labels) if r % 2 == 0 else list(reversed(labels))
        rounds.append({label: _run(cases, labels[label]) for label in order})
        print(f"round {r + 1}: " + "; ".join(f"{lab} {c} {rows[c]['ms']:.3f} ms" for lab, rows in rounds[-1].items()
                                             for c in cases), flush=True)
    print(f"\n{'case':<12} {'package':<8} {'impl':<20} {'median ms':>10} {'rounds (ms)':<32} {'rel err':>9}")
    for c in cases:
        med = {}
        for lab in labels:
            times = [rd[lab][c]["ms"] for rd in rounds]
            med[lab] = statistics.median(times)
            row = rounds[-1][lab][c]
            print(f"{c:<12} {lab:<8} {row['impl']:<20} {med[lab]:>10.3f} {' '.join(f'{t:.3f}' for t in times):<32} "
                  f"{row['rel_err']:>9.2e}")
        if "old" in med:
            print(f"{c:<12} new/old {med['new'] / med['old']:.4f}")
    for lab in labels:
        print(f"{lab}: {rounds[-1][lab][cases[0]]['package']}")
    if a.out:
        Path(a.out).write_text(json.dumps(rounds, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
