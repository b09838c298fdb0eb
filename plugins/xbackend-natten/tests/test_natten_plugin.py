"""xbackend-natten against a SIMULATED ``natten`` module (CPU only, no NATTEN build needed).

A stub module is injected into ``sys.modules['natten']``: its na1d/na2d/na3d record the arguments
they receive and compute the result with xbackend's fp32 reference, interpreting the arguments the
way NATTEN documents them (heads-last layout, per-axis kernel_size/stride/dilation/is_causal,
scale). These tests check the plugin's argument mapping and its reporting, not NATTEN itself.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xbackend_natten import impl, plugin

from xbackend.ops.neighborhood_attention import reference


def _fake_natten(version: str = "0.21.0") -> types.ModuleType:
    mod = types.ModuleType("natten")
    mod.__version__ = version
    mod.calls = []

    def make(n: int):
        def na(query, key, value, kernel_size, stride=1, dilation=1, is_causal=False, scale=None, **perf):
            mod.calls.append(dict(n=n, kernel_size=kernel_size, stride=stride, dilation=dilation,
                                  is_causal=is_causal, scale=scale, perf=perf,
                                  contiguous=all(t.is_contiguous() for t in (query, key, value))))
            assert query.dim() == n + 3, "natten.naNd expects [B, *spatial(N), heads, dim]"
            assert len(stride) == n
            return reference(query, key, value, tuple(kernel_size), tuple(dilation), tuple(is_causal), scale,
                             tuple(stride))

        na.__name__ = f"na{n}d"
        return na

    mod.na1d, mod.na2d, mod.na3d = make(1), make(2), make(3)
    return mod


@pytest.fixture
def fake_natten(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    mod = _fake_natten()
    monkeypatch.setitem(sys.modules, "natten", mod)
    return mod


@pytest.mark.parametrize(
    ("spatial", "ks", "dil", "causal"),
    [
        ((11,), (5,), (2,), (True,)),
        ((7, 9), (3, 5), (1, 1), (False, True)),
        ((5, 6, 7), (3, 3, 5), (1, 2, 1), (True, False, False)),
    ],
)
def test_argument_mapping_simulated(fake_natten, spatial, ks, dil, causal) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, *spatial, 2, 32, generator=g) for _ in range(3))
    out = impl.neighborhood_attention(q, k, v, ks, dil, causal, None)
    call = fake_natten.calls[-1]
    assert call["n"] == len(spatial)
    assert call["kernel_size"] == ks and call["dilation"] == dil and call["is_causal"] == causal
    assert call["stride"] == (1,) * len(spatial)
    assert call["scale"] == pytest.approx(32**-0.5)  # explicit: NATTEN reads `scale or default`
    assert call["perf"] == {}
    torch.testing.assert_close(out, reference(q, k, v, ks, dil, causal, None))


def test_stride_passes_through_simulated(fake_natten) -> None:
    q = torch.randn(1, 8, 12, 2, 32)
    out = impl.neighborhood_attention(q, q, q, (3, 5), (1, 1), (False, False), None, (3, 5))
    assert fake_natten.calls[-1]["stride"] == (3, 5)
    torch.testing.assert_close(out, reference(q, q, q, (3, 5), (1, 1), (False, False), None, (3, 5)))


def test_scale_and_launch_knobs_pass_through_simulated(fake_natten) -> None:
    q = torch.randn(1, 6, 8, 2, 32).transpose(1, 2)  # non-contiguous: the plugin hands NATTEN copies
    impl.neighborhood_attention(q, q, q, (3, 3), (1, 1), (False, False), 0.25, backend="blackwell-fna",
                                q_tile_shape=[8, 16], kv_tile_shape=(8, 16))
    call = fake_natten.calls[-1]
    assert call["scale"] == 0.25 and call["contiguous"]
    assert call["perf"] == {"backend": "blackwell-fna", "q_tile_shape": (8, 16), "kv_tile_shape": (8, 16)}


def test_available_reports_missing_natten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "natten", None)  # makes `import natten` raise ImportError
    reason = impl.available()
    assert reason is not None and reason.startswith("natten not importable: ")


def test_available_reports_old_or_present_natten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "natten", _fake_natten("0.17.5"))
    assert "< 0.20" in impl.available()
    monkeypatch.setitem(sys.modules, "natten", _fake_natten("0.21.7+torch2100cu130"))
    assert impl.available() is None


def test_supports_reasons() -> None:
    meta = torch.empty(1, 8, 8, 8, 2, 64, device="meta", dtype=torch.bfloat16)
    assert impl.supports(meta, meta, meta, (3, 3, 3), (1, 1, 1), (False,) * 3, None) is None
    assert "even" in impl.supports(meta, meta, meta, (4, 3, 3), (1, 1, 1), (False,) * 3, None)
    assert impl.supports(meta, meta, meta, (4, 3, 3), (1, 1, 1), (True, False, False), None) is None
    odd = torch.empty(1, 8, 8, 2, 48, device="meta", dtype=torch.bfloat16)
    assert "head_dim" in impl.supports(odd, odd, odd, (3, 3), (1, 1), (False, False), None)
    cpu = torch.empty(1, 8, 2, 64, dtype=torch.bfloat16)
    assert "CUDA" in impl.supports(cpu, cpu, cpu, (3,), (1,), (False,), None)
    f32 = torch.empty(1, 8, 2, 64, device="meta")
    assert "dtype" in impl.supports(f32, f32, f32, (3,), (1,), (False,), None)


def test_registers_through_the_hook_and_plans_per_arch() -> None:
    """The plugin's records as the resolver sees them (NATTEN is not installed here)."""
    import xbackend
    from xbackend.testing import fresh_runtime

    with fresh_runtime([("natten", plugin)]) as rt:
        assert rt.plugins["natten"].impls == ["neighborhood_attention:natten_blackwell", "neighborhood_attention:natten"]
        for target in ("sm100", "b300"):
            p = xbackend.plan("neighborhood_attention", target, assume_available=True)
            assert (p.chosen.backend, p.chosen.impl) == ("natten", "natten_blackwell")
        p = xbackend.plan("neighborhood_attention", "sm90", assume_available=True)
        assert (p.chosen.backend, p.chosen.impl) == ("natten", "natten")
        here = {r.impl: r.reason for r in xbackend.plan("neighborhood_attention", "sm100").rows}
        if impl.available() is not None:
            assert here["natten_blackwell"].startswith("unavailable: natten not importable")
        assert xbackend.plan("neighborhood_attention", "gfx950").chosen.impl == "reference"


from xbackend.testing import conformance  # noqa: E402

test_conformance = conformance.suite("natten")
