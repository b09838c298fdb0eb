"""na_gluon_ws's ring depth and load leads, timed through lab/gpu/na_sweep.py in this process: the
module constants are set before the kernel first compiles (Triton reads them at compile time).

    python3 lab/gpu/na_ws_slots.py SLOTS K_LEAD V_LEAD [na_sweep.py arguments]

With the consumers' refills waiting on each other, the slack between them is about SLOTS - LEAD - 1
trips per stream; 6 slots is the most 128 KiB-head_dim shared memory allows (6 x 32 KiB + 32 KiB of q).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "lab" / "gpu"))

import na_sweep  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

from xbackend.kernels import na_gluon_ws  # noqa: E402


def main() -> None:
    slots, k_lead, v_lead = (int(x) for x in sys.argv[1:4])
    na_gluon_ws.KV_BUFFERS = gl.constexpr(slots)
    na_gluon_ws.K_LEAD = gl.constexpr(k_lead)
    na_gluon_ws.V_LEAD = gl.constexpr(v_lead)
    print(f"na_gluon_ws: {slots} slots, K lead {k_lead}, V lead {v_lead}", flush=True)
    sys.argv = [sys.argv[0], *sys.argv[4:]]
    na_sweep.main()


if __name__ == "__main__":
    main()
