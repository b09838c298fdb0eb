"""Triton qk_norm_rope_3d against the op's reference: torch.equal on the GPU (bf16, fp16, fp32, both
flavours, the DiffVAE's stage shapes, diffusers' module itself). On CPU (TRITON_INTERPRET=1), fp32 and
fp16 are bit-exact to the reference's scale and rotation over our interpreted RMSNorm kernel; the
interpreter's fp32->bf16 cast truncates, so bf16 is left to the GPU tests."""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from xbackend.kernels import rmsnorm  # noqa: E402
from xbackend.kernels import triton_qk_norm_rope_3d as K  # noqa: E402
from xbackend.kernels.rmsnorm.launch import Schedule  # noqa: E402
from xbackend.ops import qk_norm_rope_3d as mod  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
NUM = rmsnorm.ROCM_NUMERICS if torch.version.hip else rmsnorm.CUDA_NUMERICS  # the build the references run
supports = functools.partial(K.supports, numerics=NUM)
kernel = functools.partial(K.qk_norm_rope_3d, numerics=NUM)
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None


def _inputs(shape, dtype, weight=True, seed=0):
    g = torch.Generator(DEVICE).manual_seed(seed)
    q = (torch.randn(shape, generator=g, device=DEVICE) * 3).to(dtype)
    k = torch.randn(shape, generator=g, device=DEVICE).to(dtype)
    d = shape[-1]
    wq = (1 + 0.3 * torch.randn(d, generator=g, device=DEVICE)).to(dtype) if weight else None
    wk = (1 + 0.3 * torch.randn(d, generator=g, device=DEVICE)).to(dtype) if weight else None
    return q, k, wq, wk


@pytest.mark.parametrize("shape", [(0, 2, 3, 4, 2, 16), (1, 0, 3, 4, 2, 16), (1, 2, 0, 4, 2, 16), (1, 2, 3, 0, 2, 16),
                                   (1, 2, 3, 4, 0, 16)])  # fmt: skip
def test_empty_inputs_are_supported_and_return_empty(shape) -> None:
    """A zero-size axis (one of the divisors the plan precomputes) gives an empty result, not an error."""
    q, k, wq, wk = _inputs(shape, torch.float32)
    assert supports(q, k, wq, wk, 1e-6, 0.25, 10000.0, "torch") is None
    q_out, k_out = kernel(q, k, wq, wk, 1e-6, 0.25, 10000.0, "torch")
    assert q_out.shape == k_out.shape == shape


CPU_CASES = [((1, 3, 4, 5, 2, 64), 0.125), ((2, 2, 3, 3, 1, 32), 32**-0.5), ((1, 2, 2, 3, 3, 24), 24**-0.5),
             ((1, 2, 3, 2, 2, 96), 96**-0.5), ((1, 2, 2, 2, 1, 8), 1.0)]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("shape,scale", CPU_CASES)
def test_equals_the_reference_over_our_norm(shape, scale, flavour, dtype) -> None:
    """Bit-exact to the reference's scale and rotation applied to our RMSNorm kernel's output (the
    norm's order is the GPU build's, not the CPU reference's)."""
    q, k, wq, wk = _inputs(shape, dtype)
    assert supports(q, k, wq, wk, 1e-6, scale, 10000.0, flavour) is None
    got = kernel(q, k, wq, wk, 1e-6, scale, 10000.0, flavour)
    norm = functools.partial(rmsnorm.rmsnorm, eps=1e-6, flavour=flavour, numerics=NUM)
    want = (mod.rope3d(norm(q, wq) * scale, 10000.0), mod.rope3d(norm(k, wk), 10000.0))
    for out, w in zip(got, want, strict=True):
        assert out.shape == shape and out.dtype == dtype and out.is_contiguous()
        assert torch.equal(out, w)


@pytest.mark.parametrize("rows,warps,trim", [(None, None, None), (1, 1, None), (8, 2, True), (32, 8, None), (32, 2, True)])
@pytest.mark.parametrize("head_dim", [64, 24])
def test_every_schedule_is_the_same_arithmetic(rows, warps, trim, head_dim) -> None:
    q, k, wq, wk = _inputs((1, 3, 4, 5, 2, head_dim), torch.float16)
    args = (q, k, wq, wk, 1e-6, head_dim**-0.5, 10000.0, "torch")
    schedule = Schedule(rows_per_program=rows, num_warps=warps, trim=trim)
    got = K.qk_norm_rope_3d(*args, numerics=NUM, schedule=schedule)
    want = kernel(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_vendor_table_picks_the_launch() -> None:
    from xbackend.kernels.rmsnorm.launch import LaunchTraits, schedule_table

    traits = LaunchTraits(schedules=schedule_table({("qk_norm_rope_3d-torch", 64, 4): Schedule(rows_per_program=2)}))
    q, k, wq, wk = _inputs((1, 2, 3, 4, 2, 64), torch.float32)
    args = (q, k, wq, wk, 1e-6, 0.125, 10000.0, "torch", NUM)
    assert K._plan(*args, Schedule(), traits).grid == (24,)  # 48 rows, 2 per program
    assert K._plan(*args, Schedule(), LaunchTraits()).grid != (24,)
    assert K._plan(*args, Schedule(rows_per_program=4), traits).grid == (12,)  # an explicit schedule wins


def test_declines_what_it_cannot_reproduce() -> None:
    q, k, wq, wk = _inputs((1, 2, 3, 2, 3, 64), torch.float32)
    assert "one strided view" in supports(q[..., :2, :], k[..., :2, :], wq, wk, 1e-6, 1.0, 1e4, "torch")
    assert "multiple of 8" in supports(q[..., :12], k[..., :12], wq[:12], wk[:12], 1e-6, 1.0, 1e4, "torch")
    assert "one of q_weight" in supports(q, k, wq, None, 1e-6, 1.0, 1e4, "torch")
    assert supports(q[:, 1:], k[:, 1:], wq, wk, 1e-6, 1.0, 1e4, "torch") is None  # a contiguous slice of frames


def test_tables_are_the_reference_angles_and_cached() -> None:
    cos, sin = K.tables((3, 4, 5), 64, 10000.0, torch.device(DEVICE))
    assert cos.shape == (12, 64) and K.tables((3, 4, 5), 64, 10000.0, torch.device(DEVICE))[0] is cos
    ang = mod.axis_angles(4, 24, 10000.0, torch.device(DEVICE))
    assert torch.equal(cos[3:7, 16:40], ang.cos().repeat_interleave(2, -1))
    assert torch.equal(sin[7:, 40:], mod.axis_angles(5, 24, 10000.0, torch.device(DEVICE)).sin().repeat_interleave(2, -1))
    assert not cos[:3, 16:].any() and not cos[3:7, :16].any()



def test_tables_built_from_fake_tensors_are_not_cached() -> None:
    """Planning on a simulated device (xbackend fleet) builds the tables from fake tensors: never cached."""
    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    key = ((2, 3, 5), 32, 10000.0, torch.device("cpu"))
    with FakeTensorMode():
        cos, sin = K.tables(*key)
    assert is_fake(cos) and is_fake(sin) and cos.shape == (10, 32)
    assert key not in K._TABLES


GPU_CASES = [(1, 40, 96, 96, 4, 64), (1, 20, 48, 48, 8, 64), (1, 8, 16, 24, 16, 64), (2, 3, 5, 7, 2, 32),
             (1, 4, 6, 8, 3, 96), (1, 5, 7, 9, 2, 128), (1, 2, 3, 4, 2, 24)]  # fmt: skip


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", GPU_CASES)
def test_gpu_bit_exact(shape, dtype, flavour) -> None:
    q, k, wq, wk = _inputs(shape, dtype)
    d = shape[-1]
    args = (q, k, wq, wk, 1e-6, d**-0.5, 10000.0, flavour)
    assert supports(*args) is None
    got = kernel(*args)
    want = mod.reference(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("rows,warps,trim", [(1, 1, None), (2, 2, None), (4, 4, None), (8, 4, True), (16, 8, None),
                                             (32, 2, True), (64, 4, True)])  # fmt: skip
def test_gpu_bit_exact_under_every_schedule(rows, warps, trim) -> None:
    q, k, wq, wk = _inputs((1, 6, 12, 16, 4, 64), torch.bfloat16, seed=3)
    args = (q, k, wq, wk, 1e-6, 0.125, 10000.0, "torch")
    schedule = Schedule(rows_per_program=rows, num_warps=warps, trim=trim)
    got = K.qk_norm_rope_3d(*args, numerics=NUM, schedule=schedule)
    want = mod.reference(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@gpu
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers not installed")
def test_gpu_is_diffusers_project_qkv() -> None:
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeNeighborhoodAttention

    torch.manual_seed(0)
    attn = LTX2VideoVaeNeighborhoodAttention(256, (3, 5, 5), head_dim=64).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        attn.norm_q.weight.uniform_(0.5, 1.5)
        attn.norm_k.weight.uniform_(0.5, 1.5)
        x = torch.randn(1, 12, 24, 32, 256, device=DEVICE).to(torch.bfloat16)
        want_q, want_k, _ = attn.project_qkv(x)
        shape = (1, 12, 24, 32, 4, 64)
        got = kernel(attn.to_q(x).view(shape), attn.to_k(x).view(shape), attn.norm_q.weight, attn.norm_k.weight,
                     attn.norm_q.eps, attn.scale, attn.rope.base, "torch")  # fmt: skip
    assert torch.equal(got[0], want_q) and torch.equal(got[1], want_k)


@gpu
@pytest.mark.gpu
def test_gpu_nan_inf_and_zero_rows() -> None:
    q, k, wq, wk = _inputs((1, 3, 4, 5, 2, 64), torch.bfloat16)
    q[0, 0, 0, 0, 0, 3] = float("nan")
    q[0, 1, 2, 3, 1, 7] = float("inf")
    k[0, 2, 1, 1] = 0
    args = (q, k, wq, wk, 1e-6, 0.125, 10000.0, "torch")
    got, want = kernel(*args), mod.reference(*args)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
