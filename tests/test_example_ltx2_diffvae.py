"""examples/ltx2_diffvae.py under torchrun on two gloo CPU ranks (tiny decoder): the decode spread over
decode_group is bit-identical to rank 0's alone, and `--phases` accounts for every tile once across the ranks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

pytest.importorskip("diffusers")

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not dist.is_available(), reason="needs torch.distributed")
def test_two_gloo_ranks_bit_identical_with_phases():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "examples" / "ltx2_diffvae.py"), "--device", "cpu", "--no-stock", "--repeats", "1", "--phases"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "xbackend.patch, 2 ranks" in out and "bit-identical to 1 rank" in out, out
    # The reports say where each decode ran: rank 0 alone, then over every rank.
    assert "tiled_decode at <model>: serial, on this rank alone" in out, out
    assert "tiled_decode at <model>: parallel, tiles over decode_group the default group (2 ranks: 0, 1)" in out, out
    rows = re.findall(r"^(\d)\s+(\d+)\s+([\d.]+)s\s+([\d.]+)s\s+([\d.]+)s\s+(-?[\d.]+)s\s+([\d.]+)s$", out, re.M)
    assert [r[0] for r in rows] == ["0", "1"], out
    # The tiny decoder's tiling is a 3x3x3 grid: every tile decoded by exactly one rank.
    assert sum(int(r[1]) for r in rows) == 27 and all(int(r[1]) > 0 for r in rows), rows
    for _, _, s123, s4, s5, rest, total in rows:
        assert float(s123) > 0 and float(s4) > 0 and float(s5) > 0
        assert abs(float(s123) + float(s4) + float(s5) + float(rest) - float(total)) < 2e-3, rows
