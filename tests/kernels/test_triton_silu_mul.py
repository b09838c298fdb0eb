"""Triton silu_mul against eager ``F.silu(gate) * up`` (the op's reference).

On CPU the kernel runs under TRITON_INTERPRET=1, which cannot call libdevice: it takes numpy's exp,
so its outputs are compared with a numpy transliteration of the kernel's steps (fp32 and fp16: bit
for bit; the interpreter's fp32->bf16 cast truncates, so bf16 within its rounding) and with CPU eager
within a few ulp. What makes the GPU kernel exact is checked on CPU in the compiled code itself (PTX for
sm90, AMDGCN for gfx950): libdevice's expf, IEEE division, no contraction. The GPU tests compare
every bf16 and fp16 gate bit pattern, and random fp32 bit patterns, with CUDA eager bit for bit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from xbackend._precision import EXACT, compare, ulp_distance  # noqa: E402
from xbackend.kernels import triton_silu_mul as K  # noqa: E402
from xbackend.ops.silu_mul import reference  # noqa: E402

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ROOT = Path(__file__).resolve().parents[2]
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
interpreted = pytest.mark.skipif(K._LIBDEVICE, reason="compiled Triton here: the GPU tests cover the kernel")


def _inputs(shape, dtype, device="cpu", seed=0, scale=4.0):
    g = torch.Generator(device).manual_seed(seed)
    gate = (torch.randn(shape, generator=g, device=device) * scale).to(dtype)
    return gate, torch.randn(shape, generator=g, device=device).to(dtype)


def _interpreter_model(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The kernel's steps in numpy fp32, as the interpreter runs them (numpy's exp): silu rounded to
    the dtype, the product in fp32, rounded once more."""
    np_dtype = {torch.float32: np.float32, torch.float16: np.float16}[gate.dtype]
    x = gate.float().reshape(-1).numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        s = (x / (np.float32(1) + np.exp(-x))).astype(np_dtype)
        out = (s.astype(np.float32) * up.float().reshape(-1).numpy()).astype(np_dtype)
    return torch.from_numpy(out).reshape(gate.shape)


# numpy's exp against CPU eager's vectorised exp, each then rounded through the division, the dtype cast
# and the product: fp32 measured at most 6 ulp over 48M random gates (scales 1..60), fp16 at most 2.
EAGER_ULPS = {torch.float32: 8, torch.float16: 4, torch.bfloat16: 4}


def _assert_close_to_eager(out: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, ulps: int | None = None) -> None:
    ulps = EAGER_ULPS[gate.dtype] if ulps is None else ulps
    ref = reference(gate, up)
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    finite = ref.isfinite()
    assert torch.equal(out.isfinite(), finite)  # NaN and Inf where eager has them, with its signs
    assert bool(((out == ref) | (out.isnan() & ref.isnan()))[~finite].all())
    if finite.any():
        assert int(ulp_distance(out[finite], ref[finite]).max()) <= ulps


# -- CPU: the interpreter ---------------------------------------------------------------------------
# (shape, block): flat with and without a ragged tail, 0-d, one element, a 5-D channels-last activation.
FLAT = [((2, 8, 64), 1024), ((3, 1001), 1024), ((3, 1001), 4096), ((), 1024), ((1,), 1024), ((1, 2, 3, 4, 40), 256)]


@interpreted
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("shape", "block"), FLAT)
def test_interpreter_runs_the_kernels_steps(shape, block: int, dtype: torch.dtype) -> None:
    gate, up = _inputs(shape, dtype)
    out = K.silu_mul(gate, up, block=block)
    assert torch.equal(out, _interpreter_model(gate, up))
    _assert_close_to_eager(out, gate, up)


@interpreted
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_row_path_matches_the_flat_path(dtype: torch.dtype) -> None:
    fused, _ = _inputs((3, 7, 2 * 96), dtype)  # gate and up: the two halves of one projection
    gate, up = fused.chunk(2, dim=-1)
    assert not gate.is_contiguous() and K.supports(gate, up) is None
    assert isinstance(K._plan(gate, up, K.BLOCK, K.NUM_WARPS), K._RowsPlan)
    out = K.silu_mul(gate, up)
    assert torch.equal(out, K.silu_mul(gate.contiguous(), up.contiguous()))
    _assert_close_to_eager(out, gate, up)
    wide = torch.zeros(5, 40, dtype=dtype)  # padded rows for gate only, D not a power of two
    wide[:, :33], u = _inputs((5, 33), dtype, seed=1)
    g = wide[:, :33]
    assert torch.equal(K.silu_mul(g, u), K.silu_mul(g.contiguous(), u))


@interpreted
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_interpreter_bf16_is_within_the_truncating_cast() -> None:
    gate, up = _inputs((4, 1001), torch.bfloat16)
    _assert_close_to_eager(K.silu_mul(gate, up), gate, up, ulps=3)


@interpreted
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_interpreter_special_values(dtype: torch.dtype) -> None:
    values = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -200.0, 200.0, 1e-40, -1e-40, 88.0, -88.0]
    gate = torch.tensor(values).to(dtype)
    up = torch.tensor([1.0, 1.0, 2.0, 1.0, 1.0, 3.0, -1.0, 1.0, 1.0, 0.5, 0.5]).to(dtype)
    out = K.silu_mul(gate, up)
    assert compare(out, _interpreter_model(gate, up), EXACT) is None
    assert compare(out, reference(gate, up), EXACT) is None


def test_empty_inputs_launch_nothing() -> None:
    for shape in ((0,), (0, 8, 64), (2, 0)):
        gate, up = torch.empty(shape), torch.empty(shape)
        assert K.supports(gate, up) is None and K.silu_mul(gate, up).shape == shape


@pytest.mark.parametrize(
    ("gate", "up", "reason"),
    [
        (torch.randn(16, 8).t(), torch.randn(8, 16), "gate does not view as [rows, D]"),
        (torch.randn(8, 16), torch.randn(16, 8).t(), "up does not view as [rows, D]"),
        (torch.randn(2, 1, 16).expand(2, 4, 16), torch.randn(2, 4, 16), "gate does not view as [rows, D]"),
        (torch.randn(4, 32)[:, ::2], torch.randn(4, 16), "gate does not view as [rows, D]"),
        (torch.randn(4, 16), torch.randn(1, 16), "shapes differ"),
        (torch.randn(4, 16), torch.randn(4, 16, dtype=torch.bfloat16), "dtypes differ"),
        (torch.randn(4, 16, dtype=torch.float64), torch.randn(4, 16, dtype=torch.float64), "expected bf16, fp16 or fp32"),
    ],
)  # fmt: skip
def test_supports_gives_reasons(gate, up, reason: str) -> None:
    assert reason in (K.supports(gate, up) or "")
    with pytest.raises(ValueError, match=f"triton silu_mul: .*{re.escape(reason)}"):
        K.silu_mul(gate, up)


def test_supports_answers_for_meta_tensors_and_picks_64_bit_offsets() -> None:
    meta = torch.device("meta")
    small = torch.empty(1, 16384, 1024, dtype=torch.bfloat16, device=meta)
    plan = K._plan(small, small, K.BLOCK, K.NUM_WARPS)
    assert isinstance(plan, K._FlatPlan) and plan.even and not plan.wide and plan.grid == (16384 * 1024 // K.BLOCK,)
    big = torch.empty(2**31 + 8, dtype=torch.bfloat16, device=meta)
    plan = K._plan(big, big, K.BLOCK, K.NUM_WARPS)
    assert K.supports(big, big) is None and plan.wide and not plan.even
    fused = torch.empty(2**20, 2 * 1100, dtype=torch.bfloat16, device=meta)  # rows 2200 apart: 2.3e9 elements
    gate, up = fused.chunk(2, dim=-1)
    plan = K._plan(gate, up, K.BLOCK, K.NUM_WARPS)
    assert (
        isinstance(plan, K._RowsPlan)
        and plan.wide
        and (plan.g_row_stride, plan.u_row_stride, plan.d) == (2200, 2200, 1100)
    )
    assert not K._plan(gate[:1000], up[:1000], K.BLOCK, K.NUM_WARPS).wide


# -- CPU: the compiled code (PTX for sm90, AMDGCN for gfx950) ------------------------------------------
_COMPILE = textwrap.dedent(
    """
    import json, sys
    import torch
    from xbackend.fleet import _capture, _worker
    from xbackend.kernels import triton_silu_mul as K

    def make(shape, chunk):
        def build(dtype, device):
            if chunk:
                return tuple(torch.empty(*shape[:-1], 2 * shape[-1], dtype=dtype, device=device).chunk(2, dim=-1))
            g = torch.empty(shape, dtype=dtype, device=device)
            return (g, torch.empty_like(g))
        return build

    out = {}
    for arch, vendor, stage in (("sm90", "cuda", "ptx"), ("gfx950", "rocm", "amdgcn")):
        for dtype in ("bfloat16", "float32"):
            for path, shape, chunk in (("flat", (1, 16384, 1024), False), ("rows", (16384, 1024), True),
                                       ("wide", (2**31 + 8,), False)):
                reason, launches = _capture.capture(arch, vendor, K.silu_mul, make(shape, chunk),
                                                    getattr(torch, dtype), K.supports)
                (launch,) = launches
                entry = {"reason": reason, "describe": launch.spec.describe(), "signature": dict(launch.spec.signature)}
                if path != "wide":
                    res = _worker.compile_triton(launch.spec, arch, stages=(stage,))
                    entry.update(error=res.error, code=res.extra.get(stage, ""))
                out[f"{arch} {dtype} {path}"] = entry
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-c", _COMPILE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("path", ["flat", "rows"])
def test_ptx_is_libdevice_expf_ieee_division_and_no_contraction(compiled, dtype: str, path: str) -> None:
    entry = compiled[f"sm90 {dtype} {path}"]
    assert entry["error"] is None and "LIBDEVICE=True" in entry["describe"]
    ptx = entry["code"]
    # __nv_expf: a round-down FMA and ex2.approx (tl.exp would be a bare ex2.approx of x * log2e)
    assert "fma.rm.ftz.f32" in ptx and "ex2.approx.ftz.f32" in ptx
    assert "div.rn.f32" in ptx and "div.full.f32" not in ptx and "div.approx" not in ptx
    # Only libdevice's own (FTZ) FMAs: nothing of the kernel's (1 + e, silu * up) is contracted.
    assert "fma.rn.f32" not in ptx
    if dtype == "bfloat16":  # silu rounded to bf16 (round to nearest even) before the product
        assert "cvt.rn.bf16x2.f32" in ptx or "cvt.rn.bf16.f32" in ptx
    if path == "flat":  # 16-byte vector loads of the contiguous path
        assert "ld.global.v4.b32" in ptx


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("path", ["flat", "rows"])
def test_amdgcn_is_ocml_expf_and_ieee_division(compiled, dtype: str, path: str) -> None:
    entry = compiled[f"gfx950 {dtype} {path}"]
    assert entry["error"] is None and "LIBDEVICE=True" in entry["describe"]
    code = entry["code"]
    assert "v_exp_f32" in code and "v_ldexp_f32" in code  # ocml's range-reduced exp, not a bare exp2
    assert "v_div_scale_f32" in code and "v_div_fixup_f32" in code  # correctly rounded division


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "gfx950"])
def test_past_2_31_elements_the_offsets_are_64_bit(compiled, arch: str) -> None:
    entry = compiled[f"{arch} bfloat16 wide"]
    assert entry["reason"] is None and "WIDE=True" in entry["describe"] and entry["signature"]["n"] == "i64"


# -- GPU: bit-exact against CUDA eager -----------------------------------------------------------------
def _assert_exact(gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None) -> None:
    out = K.silu_mul(gate, up) if out is None else out
    ref = reference(gate, up)
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    problem = compare(out, ref, EXACT)  # bits, -0.0 against +0.0 included; NaN payloads aside
    assert problem is None, problem


def _every_pattern(dtype: torch.dtype, device: str) -> torch.Tensor:
    """All 65536 values of a 16-bit float dtype (NaNs, infinities, subnormals and both zeros included)."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32, device=device).to(torch.int16).view(dtype)


def _ups(dtype: torch.dtype, n: int, device: str) -> torch.Tensor:
    """One row per up value: signs, 0, one, a subnormal-making scale, a huge one, then random ups."""
    tiny = 2.0**-130 if dtype != torch.float16 else 2.0**-20
    huge = 1e30 if dtype != torch.float16 else 3e4
    rows = [torch.full((n,), v, device=device) for v in (1.0, -1.0, 0.0, 3.140625, 1e-3, tiny, huge)]
    g = torch.Generator(device).manual_seed(5)
    rows += [torch.randn(n, generator=g, device=device) for _ in range(3)]
    return torch.stack(rows).to(dtype)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_every_gate_bit_pattern_is_exact(dtype: torch.dtype) -> None:
    gate = _every_pattern(dtype, "cuda")
    up = _ups(dtype, gate.numel(), "cuda")
    gate = gate.expand_as(up).contiguous()
    _assert_exact(gate, up)  # flat path (65536 * 10 elements: no ragged tail)
    _assert_exact(gate[:, 1:], up[:, 1:])  # row path: rows 65536 apart, misaligned by one element
    _assert_exact(gate.flatten()[3:], up.flatten()[3:])  # flat path with a ragged tail, misaligned
    fused = torch.cat([gate, up], dim=-1)  # gate and up as the halves of one projection
    _assert_exact(*fused.chunk(2, dim=-1))


@pytest.mark.gpu
@gpu
def test_gpu_random_fp32_bit_patterns_are_exact() -> None:
    g = torch.Generator("cuda").manual_seed(7)
    n = 1 << 24
    # Uniform bit patterns: every exponent (subnormals, NaN and Inf included) equally likely.
    gate = torch.randint(-(2**31), 2**31, (n,), generator=g, device="cuda", dtype=torch.int64).to(torch.int32)
    gate = gate.view(torch.float32)
    up = torch.randn(n, generator=g, device="cuda")
    _assert_exact(gate, up)
    # The range where silu is interesting, densely: |gate| < 128.
    gate = (torch.rand(n, generator=g, device="cuda") - 0.5) * 256
    _assert_exact(gate, up)
    _assert_exact(gate.view(4096, 4096)[:, :4000], up.view(4096, 4096)[:, :4000])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 16384, 1024), (1, 16384, 4096), (8192, 14336), (3, 77, 1001), (4097,)], ids=str)
def test_gpu_model_shapes_are_exact(shape, dtype: torch.dtype) -> None:
    _assert_exact(*_inputs(shape, dtype, device="cuda", seed=len(shape)))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("block,num_warps", [(1024, 4), (2048, 4), (4096, 8), (8192, 8)])
def test_gpu_launch_configs_are_exact(block: int, num_warps: int) -> None:
    gate, up = _inputs((3, 1001, 999), torch.bfloat16, device="cuda", seed=3)
    _assert_exact(gate, up, K.silu_mul(gate, up, block=block, num_warps=num_warps))


@pytest.mark.gpu
@gpu
def test_gpu_through_the_op_is_the_triton_kernel() -> None:
    import xbackend

    gate, up = _inputs((1, 4096, 1024), torch.bfloat16, device="cuda")
    p = xbackend.plan("silu_mul", gate.device, args=(gate, up))
    assert f"{p.chosen.backend}:{p.chosen.impl}" == "cuda:triton", str(p)
    _assert_exact(gate, up, xbackend.get_op("silu_mul")(gate, up))


@pytest.mark.gpu
@gpu
def test_gpu_past_2_31_elements_is_exact() -> None:
    n = 2**31 + 4099
    free, _ = torch.cuda.mem_get_info()
    if free < 8 * n * 2 + (2 << 30):
        pytest.skip(f"needs {8 * n * 2 / 2**30:.0f} GiB of free device memory")
    gate = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    up = torch.empty_like(gate)
    g = torch.Generator("cuda").manual_seed(11)
    for chunk in range(0, n, 1 << 28):  # fill in pieces: a full-size fp32 randn would need 8.6 GB more
        gate[chunk : chunk + (1 << 28)] = torch.randn(min(1 << 28, n - chunk), generator=g, device="cuda") * 4
        up[chunk : chunk + (1 << 28)] = torch.randn(min(1 << 28, n - chunk), generator=g, device="cuda")
    assert K._plan(gate, up, K.BLOCK, K.NUM_WARPS).wide
    out = K.silu_mul(gate, up)
    ref = reference(gate, up)
    tail = slice(2**31 - 4096, n)  # the elements past the 32-bit boundary, and a block before it
    assert compare(out[tail], ref[tail], EXACT) is None
    assert compare(out, ref, EXACT) is None
