"""The Liger-Kernel plugin's hook: registers liger's Triton forward kernels with xbackend.

Every impl ranks below the builtin CUDA/ROCm impls of its op (they sit at priority 90..120): liger
serves a call only when those are blocked, forced away, or reject the input, or when forced itself
(``xbackend.use(rmsnorm="liger:liger")``). None of these is exact, so the default "lossless" tier never
runs one; the contracts and why are in ``impl.py`` and the README, and ``bench_liger.py --classify``
measures them on a GPU.
"""

from __future__ import annotations

import torch

import xbackend

from .impl import available, version

_I = "xbackend_liger.impl"
PRIORITY = 40  # below every builtin impl of these ops (the lowest is 90: triton_fast)
DEVICES = "cuda,rocm"  # Triton kernels, no arch-specific schedule
HALF = frozenset({torch.bfloat16, torch.float16})
FLOAT = frozenset({torch.bfloat16, torch.float16, torch.float32})
# A modulation's "+ shift" and RoPE's "x1*c - x2*s" cancel near zero, where one rounding differing
# from eager's is many ulps of the output: relative Frobenius error, the builtin fast modulate's bar.
TOLERANCE = xbackend.tolerance(5e-3)

IMPLS: list[xbackend.Impl] = [
    xbackend.Impl(op="rmsnorm", name="liger", fn=f"{_I}:rmsnorm", supports=f"{_I}:supports_rmsnorm_torch",
                  priority=PRIORITY, devices=DEVICES, dtypes=HALF, precision=xbackend.ulp(1), available=available,
                  description="liger rms_norm, casting mode gemma (fp32, one rounding), flavour torch"),
    xbackend.Impl(op="rmsnorm", name="liger_diffusers", fn=f"{_I}:rmsnorm", supports=f"{_I}:supports_rmsnorm_diffusers",
                  priority=PRIORITY, devices=DEVICES, dtypes=HALF, precision=xbackend.ulp(2), available=available,
                  description="liger rms_norm, casting mode llama (round, then * w rounded), flavour diffusers"),
    xbackend.Impl(op="rmsnorm_modulate", name="liger", fn=f"{_I}:rmsnorm_modulate",
                  supports=f"{_I}:supports_rmsnorm_modulate", priority=PRIORITY, devices=DEVICES, dtypes=FLOAT,
                  precision=TOLERANCE, available=available,
                  description="liger modulated_rms_norm (gemma for torch, llama for diffusers), fused"),
    xbackend.Impl(op="rotary_embedding", name="liger", fn=f"{_I}:rotary_embedding",
                  supports=f"{_I}:supports_rotary_embedding", priority=PRIORITY, devices=DEVICES, dtypes=FLOAT,
                  precision=TOLERANCE, available=available,
                  description="liger rope (rotate_half), layout split, on a copy (the kernel is in place)"),
    xbackend.Impl(op="qk_norm_rope", name="liger", fn=f"{_I}:qk_norm_rope", supports=f"{_I}:supports_qk_norm_rope",
                  priority=PRIORITY, devices=DEVICES, dtypes=FLOAT, precision=TOLERANCE, available=available,
                  description="liger rms_norm of q and k, then one liger rope launch for both, layout split"),
]


@xbackend.hookimpl
def xbackend_register_impls(registrar: xbackend.Registrar) -> None:
    for impl in IMPLS:
        registrar.register(impl)


@xbackend.hookimpl
def xbackend_report_header() -> list[str]:
    reason = available()
    return [f"liger plugin: {'liger-kernel ' + str(version()) + ' importable' if reason is None else reason}"]
