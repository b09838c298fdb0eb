"""Neighborhood attention at the bench shapes through get_op (na_triton resolved and guard-verified): device
and host-inclusive time. Run from the repository root on a GPU: python3 benchmarks/na_quick.py"""

import torch

import xbackend
from xbackend.bench import _harness as h
from xbackend.bench.cases import CASES

for case in CASES["neighborhood_attention"]:
    g = torch.Generator(device="cuda").manual_seed(0)
    args = case.make(torch.device("cuda"), g)
    op = xbackend.get_op("neighborhood_attention")
    op(*args)
    dev = h.time_rotated(op, [args], reps=10, calls_per_rep=1)
    host = h.time_host_inclusive(op, args, calls=10)
    print(f"{case.name}: device {dev / 1e3:.2f} ms = {case.flops / dev / 1e6:.1f} useful TFLOP/s; host-inclusive {host / 1e3:.2f} ms")
print(xbackend.report())
