"""Test plugins: impls with arch ranges, contracts, and deliberate faults."""

from __future__ import annotations

import threading

import torch

import xbackend
from xbackend.ops import gated_residual, rmsnorm


def exact_copy_of_reference(x, update, gate):
    return gated_residual.reference(x, update, gate).contiguous()  # impls return contiguous outputs


def off_by_one_ulp(x, update, gate):
    out = gated_residual.reference(x, update, gate)
    flat = out.view(-1)
    if flat.numel():  # one element nudged: the guard must still catch it
        flat[flat.numel() // 2] = torch.nextafter(flat[flat.numel() // 2], torch.tensor(float("inf"), dtype=out.dtype))
    return out


def crashes(x, update, gate):
    raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")


CALLS = {"slow_exact": 0}
_calls_lock = threading.Lock()


def slow_exact(x, update, gate):
    with _calls_lock:
        CALLS["slow_exact"] += 1
    threading.Event().wait(0.01)
    return gated_residual.reference(x, update, gate)


def needs_even_d(x, update, gate):
    return None if x.shape[-1] % 2 == 0 else f"D={x.shape[-1]} is odd"


class FleetPlugin:
    """Impls the way vendor plugins register them: arch ranges, priorities, contracts."""

    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="gated_residual", name="hopper", fn=exact_copy_of_reference, priority=30, devices="sm90")
        registrar.register(op="gated_residual", name="blackwell", fn=exact_copy_of_reference, priority=30, devices="sm100..sm103")
        registrar.register(op="gated_residual", name="pointwise", fn=exact_copy_of_reference, priority=20, devices="sm90..sm103,gfx942,gfx950",
                           supports=needs_even_d)
        registrar.register(op="gated_residual", name="approx", fn=exact_copy_of_reference, priority=50, devices="cuda,rocm",
                           precision=xbackend.ulp(1))
        registrar.register(op="gated_residual", name="bf16_only", fn=exact_copy_of_reference, priority=40, devices="*",
                           dtypes={torch.bfloat16})
        registrar.register(op="rmsnorm", name="vendor_lib", fn=rmsnorm.reference, priority=10, devices="gfx942,gfx950",
                           available=lambda: (_ for _ in ()).throw(RuntimeError("ROCm version file not found")))


class FaultyPlugin:
    """A wrong impl and a crashing impl above an exact one, all on CPU."""

    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="gated_residual", name="wrong", fn=off_by_one_ulp, priority=30, devices="cpu")
        registrar.register(op="gated_residual", name="crashing", fn=crashes, priority=20, devices="cpu")
        registrar.register(op="gated_residual", name="exact", fn=exact_copy_of_reference, priority=10, devices="cpu")


class SlowPlugin:
    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="gated_residual", name="slow_exact", fn=slow_exact, priority=10, devices="cpu")
