"""The builtin NVIDIA and AMD backends as a mixed fleet sees them, planned from a CPU host, and the
AMD AITER path driven through a simulated gfx950 probe (no AMD GPU exists here)."""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch

import xbackend
from xbackend.kernels import aiter_rmsnorm
from xbackend.testing import fresh_runtime

# target -> op -> the impl a lossless plan must choose on this CPU host. NVIDIA's cuda_vec needs a
# GPU to build, so a CPU host plans its Triton fallback; AITER needs quality "high" or looser.
EXPECTED = {
    "sm90": {"rmsnorm": "cuda:triton", "rmsnorm_modulate": "cuda:triton", "gated_residual": "cuda:triton"},
    "b300": {"rmsnorm": "cuda:triton", "rmsnorm_modulate": "cuda:triton", "gated_residual": "cuda:triton"},
    "mi350x": {"rmsnorm": "rocm:triton", "rmsnorm_modulate": "rocm:triton", "gated_residual": "rocm:triton"},
    "sm120": {"rmsnorm": "xbackend:reference", "rmsnorm_modulate": "xbackend:reference", "gated_residual": "xbackend:reference"},
    "cpu": {"rmsnorm": "xbackend:reference", "rmsnorm_modulate": "xbackend:reference", "gated_residual": "xbackend:reference"},
}


@pytest.fixture
def builtin():
    with fresh_runtime(autoload=True) as rt:
        assert rt.plugins["cuda"].error is None and rt.plugins["rocm"].error is None
        yield rt


@pytest.mark.parametrize("target", list(EXPECTED))
def test_fleet_plan(builtin, target: str) -> None:
    for op, expected in EXPECTED[target].items():
        p = xbackend.plan(op, target)
        chosen = p.chosen
        assert f"{chosen.backend}:{chosen.impl}" == expected, str(p)


def test_cuda_vec_is_preferred_where_it_builds(builtin) -> None:
    p = xbackend.plan("gated_residual", "sm90", assume_available=True)
    assert (p.chosen.backend, p.chosen.impl) == ("cuda", "cuda_vec")
    here = {r.impl: r.reason for r in xbackend.plan("gated_residual", "sm90").rows if r.backend == "cuda"}
    assert here["cuda_vec"].startswith("unavailable: ")


def test_aiter_unavailable_reads_as_a_reason_not_a_crash(builtin, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Off ROCm, `import aiter` raises RuntimeError (aiter checks for a ROCm build at import), not ImportError."""
    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "__init__.py").write_text('raise RuntimeError("ROCm version file not found")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    aiter_rmsnorm._aiter.cache_clear()
    p = xbackend.plan("rmsnorm", "mi350x", quality="high")
    reason = {f"{r.backend}:{r.impl}": r.reason for r in p.rows}["rocm:aiter"]
    assert reason == "unavailable: aiter not importable: RuntimeError: ROCm version file not found"
    aiter_rmsnorm._aiter.cache_clear()


class _FakeAiter(types.ModuleType):
    """Stands in for `aiter`: checks the call against the documented signature, then computes an
    fp32 single-rounding RMSNorm as AITER's CK kernel does."""

    def __init__(self) -> None:
        super().__init__("aiter")
        self.calls: list[tuple[torch.Size, torch.dtype, torch.dtype]] = []

    def rms_norm(self, input, weight, epsilon, use_model_sensitive_rmsnorm=0):
        assert weight.dtype == input.dtype, "AITER needs weight dtype == input dtype"
        assert input.dim() == 2 and input.is_contiguous()
        assert use_model_sensitive_rmsnorm == 0
        self.calls.append((input.shape, input.dtype, weight.dtype))
        return torch.nn.functional.rms_norm(input, (input.shape[-1],), weight, epsilon)


class _PretendGfx950:
    """Probe hook: CPU tensors are reported as an MI350X, so the AMD impls are resolved and run."""

    @xbackend.hookimpl
    def xbackend_probe_device(self, device):
        return xbackend.Device("rocm", "gfx950", "AMD Instinct MI350X (simulated on CPU)", simulated=True)


def test_aiter_runs_through_the_resolver_on_a_simulated_mi350(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeAiter()
    monkeypatch.setitem(sys.modules, "aiter", fake)
    monkeypatch.setattr(torch.version, "hip", "7.0.0")
    aiter_rmsnorm._aiter.cache_clear()
    aiter_rmsnorm._ones.cache_clear()
    import xbackend_rocm.plugin

    with fresh_runtime([("rocm", xbackend_rocm.plugin), ("gfx950", _PretendGfx950())]) as rt:
        x = torch.randn(2, 5, 64, dtype=torch.bfloat16)
        w = torch.randn(64, dtype=torch.bfloat16)
        with xbackend.quality("high"):
            y = xbackend.get_op("rmsnorm")(x, w)
            y0 = xbackend.get_op("rmsnorm")(x)  # weightless: a cached ones vector, same dtype
        assert torch.equal(y, torch.nn.functional.rms_norm(x, (64,), w, 1e-6))
        assert y0.shape == x.shape
        assert fake.calls == [(torch.Size([10, 64]), torch.bfloat16, torch.bfloat16)] * 2
        assert [(e.impl, e.status) for e in rt.events] == [("rocm:aiter", "verified"), ("rocm:aiter", "verified")]
        # Lossless (the default) never admits AITER: the exact Triton path or the reference runs instead.
        # The Triton path may fall back here: on CPU tensors it runs under TRITON_INTERPRET, whose
        # fp32 -> bf16 rounding is not the GPU's, so its exactness is not what this test checks.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", xbackend.FallbackWarning)
            xbackend.get_op("rmsnorm")(x, w)
        assert "rocm:aiter" not in rt.events[-1].impl
    aiter_rmsnorm._aiter.cache_clear()
