"""Triton rmsnorm / rmsnorm_modulate kernels against the eager references.

On CPU the kernels run under TRITON_INTERPRET=1, whose fp32->bf16 cast truncates, so outputs are
compared within a dtype-keyed tolerance. What the CPU *can* check exactly is the reduction order:
the per-row statistic the kernel computes (rstd for "torch", mean of squares for "diffusers") must
equal, bit for bit, a plain loop-by-loop transliteration of aten's CUDA kernels (thread loops, warp
shuffles, shared-memory trees) written here in numpy fp32. Bit-exactness of the outputs against
eager PyTorch is checked by the GPU tests (>= 16M elements per shape).
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import triton.language as tl
import xbackend_cuda.launch as nvidia
import xbackend_rocm.launch as amd

from xbackend.kernels import rmsnorm as K
from xbackend.kernels.rmsnorm import exact as E
from xbackend.kernels.rmsnorm import fast as F_
from xbackend.kernels.rmsnorm import launch as L
from xbackend.kernels.rmsnorm.launch import op_kind, schedule_table, tuned_schedule

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
EPS = 1e-6
f32 = np.float32
# The PyTorch build the references run on and its vendor's launch traits (a test may probe the vendor;
# the shared kernel modules never do).
NUM, TRAITS = (amd.NUMERICS, amd.LAUNCH) if torch.version.hip else (nvidia.NUMERICS, nvidia.LAUNCH)
DEFAULT_SCHEDULE = K.Schedule()


def _ref(x, w, eps, flavour):
    if flavour == "torch":
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    v = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    h = x * torch.rsqrt(v + eps)
    if w is not None:
        if w.dtype in (torch.float16, torch.bfloat16):
            h = h.to(w.dtype)
        return h * w
    return h.to(x.dtype)


def _ref_mod(x, scale, shift, w, eps, flavour):
    return _ref(x, w, eps, flavour) * (1 + scale) + shift


def _rand(shape, dtype, seed, scale=1.0, offset=0.0, device=DEV):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (offset + scale * torch.randn(shape, generator=g)).to(device=device, dtype=dtype)


# Relative error allowed on CPU: the interpreter truncates each bf16/fp16 rounding (up to two
# roundings in a row, then the modulate's three) and the CPU reference sums in another order.
_REL = {torch.bfloat16: 2.0**-5, torch.float16: 2.0**-8, torch.float32: 2.0**-18}


def _assert_close(out, ref, dtype, extra=None):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    err = (out.double() - ref.double()).abs()
    scale = ref.double().abs() if extra is None else ref.double().abs() + extra
    bound = _REL[dtype] * scale + 1e-6
    assert bool((err <= bound).all()), f"max excess {float((err - bound).max())}"


# --------------------------------------------------------------------------------------------------
# aten reduction orders, transliterated loop by loop (numpy fp32)
# --------------------------------------------------------------------------------------------------


def _emulate_fused_rms_rstd(x: np.ndarray, eps: float, threads: int, warp: int) -> np.ndarray:
    """layer_norm_kernel.cu compute_stats<rms_norm=true> + rsqrt, for every row of x (fp32)."""
    m, d = x.shape
    acc = np.zeros((m, threads), f32)
    for t in range(threads):  # thread t: vectors t, t + threads, ..; 4 elements each, fma(x, x, acc)
        for i in range(t, d // 4, threads):
            for ii in range(4):
                v = x[:, 4 * i + ii]
                acc[:, t] = (acc[:, t] + v * v).astype(f32)  # exact: bf16 squares fit in fp32
    w = acc.reshape(m, threads // warp, warp)
    off = warp // 2
    while off:  # WARP_SHFL_DOWN, offsets warp/2 .. 1
        w = w.copy()
        w[:, :, : warp - off] = w[:, :, : warp - off] + w[:, :, off:]
        off //= 2
    wd = w[:, :, 0].copy()
    off = wd.shape[1] // 2
    while off:  # upper half of the warps writes to shared memory, lower half merges
        wd[:, :off] = wd[:, :off] + wd[:, off : 2 * off]
        off //= 2
    sigma2 = (wd[:, 0] / f32(d)).astype(f32)
    return (f32(1) / np.sqrt((sigma2 + f32(eps)).astype(f32))).astype(f32)  # the interpreter's rsqrt


def _emulate_mean(x: np.ndarray, num: K.Numerics) -> np.ndarray:
    """Reduce.cuh ReduceOp<MeanOps> on x.float().pow(2) for every row, with setReduceConfig's shape."""
    m, d = x.shape
    q = (x * x).astype(f32)
    vectorize, bw, y, _ = E.mean_config(m, d, num.warp)
    stride = bw * y
    v = np.zeros((m, y, bw), f32)
    for yy in range(y):
        for xx in range(bw):
            vl = [np.zeros(m, f32) for _ in range(4)]
            if vectorize:  # input_vectorized_thread_reduce_impl (rows are 16-byte aligned: D % 4 == 0)
                idx = xx + yy * bw
                while idx * 4 + 3 < d:
                    for i in range(4):
                        vl[i] = (vl[i] + q[:, idx * 4 + i]).astype(f32)
                    idx += stride
            else:  # thread_reduce_impl, vt0 = 4 strided accumulators, then the tail
                idx = xx
                while idx + 3 * bw < d:
                    for i in range(4):
                        vl[i] = (vl[i] + q[:, idx + i * bw]).astype(f32)
                    idx += 4 * bw
                for i in range(4):
                    if idx >= d:
                        break
                    vl[i] = (vl[i] + q[:, idx]).astype(f32)
                    idx += bw
            a = vl[0]
            for i in range(1, 4):
                a = (a + vl[i]).astype(f32)
            v[:, yy, xx] = a

    def block_x(v):
        dim_x = bw
        if bw > num.warp:
            off = bw // 2
            while off >= num.warp:
                v[:, :, :off] = v[:, :, :off] + v[:, :, off : 2 * off]
                off //= 2
            dim_x = num.warp
        offs = [1 << i for i in range(dim_x.bit_length() - 1)]
        for off in offs if num.mean_shfl_increasing else offs[::-1]:
            v = v.copy()
            v[:, :, : dim_x - off] = v[:, :, : dim_x - off] + v[:, :, off:dim_x]
        return v

    def block_y(v):
        off = y // 2
        while off:
            v[:, :off, :] = v[:, :off, :] + v[:, off : 2 * off, :]
            off //= 2
        return v

    v = block_y(block_x(v)) if num.mean_x_first else block_x(block_y(v))
    return (v[:, 0, 0] * f32(E.mean_factor(m, d))).astype(f32)


TORCH_ORDER_CASES = [
    ((4, 64), NUM),
    ((5, 256), NUM),
    ((3, 1000), NUM),
    ((2, 3072), NUM),
    ((3, 4096), NUM),  # the tuned launch (2 rows per 8-warp program), odd rows
    ((3, 1000), NUM._replace(torch_threads=256)),
    ((2, 4096), K.ROCM_NUMERICS),
]


@pytest.mark.parametrize("shape,num", TORCH_ORDER_CASES)
def test_torch_flavour_order_matches_aten_transliteration(shape, num):
    if HAS_CUDA:
        pytest.skip("the statistic is rstd: its rsqrt is the interpreter's here, rsqrt.approx on a GPU")
    x = _rand(shape, torch.bfloat16, seed=shape[1], device="cpu")
    _, stat = K.rmsnorm_stats(x, None, EPS, "torch", numerics=num)
    expect = _emulate_fused_rms_rstd(x.float().numpy(), EPS, num.torch_threads, num.warp)
    np.testing.assert_array_equal(stat.numpy(), expect)


MEAN_ORDER_CASES = [
    ((20, 64), NUM),  # D < 128: vt0 strided accumulators
    ((20, 65), NUM),  # ... with a tail
    ((3, 100), NUM),  # < 16 rows: wider blocks
    ((1, 256), NUM),  # one row: 64-thread block
    ((3, 1000), NUM),  # 128 threads: shared-memory stage before the shuffles
    ((17, 1000), NUM),  # the common config: one warp per row
    ((2, 4096), NUM),
    ((18, 8192), NUM),  # rows split across 16 warps: block-y tree
    ((17, 1000), NUM._replace(mean_shfl_increasing=True)),
    ((18, 8192), NUM._replace(mean_x_first=False)),
    ((20, 65), K.ROCM_NUMERICS),
    ((17, 1000), K.ROCM_NUMERICS),
]


@pytest.mark.parametrize("shape,num", MEAN_ORDER_CASES)
def test_diffusers_flavour_order_matches_aten_transliteration(shape, num):
    x = _rand(shape, torch.bfloat16, seed=shape[0] + shape[1], device="cpu")
    _, stat = K.rmsnorm_stats(x.to(DEV), None, EPS, "diffusers", numerics=num)
    np.testing.assert_array_equal(stat.cpu().numpy(), _emulate_mean(x.float().numpy(), num))


@pytest.mark.parametrize("flavour,shape", [("torch", (3, 1000)), ("diffusers", (17, 1000)), ("diffusers", (9, 65))])
@pytest.mark.parametrize("arrangement", [K.ARR_ARKB, K.ARR_MERGED])
@pytest.mark.parametrize("rows_per_program", [1, 2])
def test_tile_arrangement_never_changes_bits(flavour, shape, arrangement, rows_per_program):
    """The arrangement only steers Triton's layouts: outputs and statistics are identical."""
    x = _rand(shape, torch.bfloat16, seed=7)
    w = _rand(shape[-1], torch.bfloat16, seed=8, scale=0.5, offset=1.0)
    tried = K.Schedule(rows_per_program=rows_per_program, num_warps=2, arrangement=arrangement)
    baseline = K.Schedule(rows_per_program=1, num_warps=4, arrangement=K.ARR_ARKB)
    got, got_stat = K.rmsnorm_stats(x, w, EPS, flavour, numerics=NUM, schedule=tried)
    ref, ref_stat = K.rmsnorm_stats(x, w, EPS, flavour, numerics=NUM, schedule=baseline)
    assert torch.equal(got, ref) and torch.equal(got_stat, ref_stat)
    scale = _rand((shape[0], 1), torch.bfloat16, seed=9, scale=0.3)
    shift = _rand((1, shape[1]), torch.bfloat16, seed=10)
    got = K.rmsnorm_modulate(x, scale, shift, w, EPS, flavour, numerics=NUM, schedule=tried)
    ref = K.rmsnorm_modulate(x, scale, shift, w, EPS, flavour, numerics=NUM, schedule=baseline)
    assert torch.equal(got, ref)


def test_transliterations_tell_orders_apart():
    """The order checks above can fail: other orders give other sums on the same data."""
    x = _rand((300, 1000), torch.bfloat16, seed=3, device="cpu").float().numpy()
    dec = _emulate_mean(x, NUM._replace(mean_shfl_increasing=False))
    inc = _emulate_mean(x, NUM._replace(mean_shfl_increasing=True))
    naive = ((x * x).astype(f32).sum(-1, dtype=f32) * f32(1 / 1000)).astype(f32)
    assert (dec != inc).any() and (dec != naive).any()
    r128 = _emulate_fused_rms_rstd(x, EPS, 128, 32)
    r256 = _emulate_fused_rms_rstd(x, EPS, 256, 32)
    assert (r128 != r256).any()


def test_mean_config_follows_set_reduce_config():
    # (rows, D) -> (vectorize_input, block width, warps sharing a row, ctas per row)
    assert E.mean_config(32640, 4096, 32) == (True, 32, 1, 1)
    assert E.mean_config(1, 4096, 32) == (True, 512, 1, 1)
    assert E.mean_config(8, 1000, 32) == (True, 64, 1, 1)
    assert E.mean_config(16, 8192, 32) == (True, 32, 16, 1)
    assert E.mean_config(4096, 64, 32) == (False, 32, 1, 1)
    assert isinstance(E.mean_config(4, 1 << 20, 32), str)  # global reduce: rejected
    assert E.mean_factor(3, 1000) == float(f32(3) / f32(3000))


# --------------------------------------------------------------------------------------------------
# Outputs against the references (tolerance on CPU)
# --------------------------------------------------------------------------------------------------

RMS_CASES = [
    ("torch", (3, 7, 64)),
    ("torch", (5, 1000)),
    ("torch", (2, 2, 256)),
    ("diffusers", (3, 7, 64)),
    ("diffusers", (9, 65)),
    ("diffusers", (5, 1000)),
    ("diffusers", (1, 2, 256)),
]


@pytest.mark.parametrize("flavour,shape", RMS_CASES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rmsnorm_close_to_reference(flavour, shape, dtype, with_weight):
    x = _rand(shape, dtype, seed=1)
    w = _rand(shape[-1], dtype, seed=2, scale=0.5, offset=1.0) if with_weight else None
    assert K.supports_rmsnorm(x, w, EPS, flavour, numerics=NUM) is None
    out = K.rmsnorm(x, w, EPS, flavour, numerics=NUM)
    assert out.is_contiguous()
    _assert_close(out, _ref(x, w, EPS, flavour), dtype)


@pytest.mark.parametrize("flavour", K.FLAVOURS)
def test_d4096_default_launch(flavour):
    """The benchmark shape's defaults (the diffusers modulate uses the [A*B, R, K] arrangement)."""
    x = _rand((2, 1, 4096), torch.bfloat16, seed=5)
    w = _rand(4096, torch.bfloat16, seed=6, scale=0.5, offset=1.0)
    _assert_close(K.rmsnorm(x, w, EPS, flavour, numerics=NUM), _ref(x, w, EPS, flavour), torch.bfloat16)
    scale = _rand((2, 1, 4096), torch.bfloat16, seed=7, scale=0.3)
    shift = _rand((2, 1, 4096), torch.bfloat16, seed=8)
    out = K.rmsnorm_modulate(x, scale, shift, w, EPS, flavour, numerics=NUM)
    extra = (_ref(x, w, EPS, flavour) * (1 + scale)).double().abs()
    _assert_close(out, _ref_mod(x, scale, shift, w, EPS, flavour), torch.bfloat16, extra)


def _single_plan(numerics, traits, schedule=DEFAULT_SCHEDULE):
    """The one launch plan a fresh launcher of this variant holds after a call (its plans are cleared)."""
    run = L.launcher(L.Variant(True, numerics, traits, schedule))
    run.plans.clear()
    return run


def test_d4096_torch_flavour_takes_the_tuned_launch():
    """Under the NVIDIA backend's traits, plain torch-flavour norms at D=4096 run two rows per 8-warp
    program (measured on the H200); an odd row count leaves the last program half masked."""
    x = _rand((3, 4096), torch.bfloat16, seed=9)
    w = _rand(4096, torch.bfloat16, seed=10, scale=0.5, offset=1.0)
    run = _single_plan(nvidia.NUMERICS, nvidia.LAUNCH)
    _assert_close(run(x, w, None, None, EPS, "torch"), _ref(x, w, EPS, "torch"), torch.bfloat16)
    (lp,) = run.plans.values()
    assert lp.grid == (2,) and lp.options["num_warps"] == 8
    untuned = [
        (nvidia.NUMERICS, nvidia.LAUNCH, K.Schedule(), (x, w, None, None), "diffusers"),  # 25-45% slower that way
        (nvidia.NUMERICS, nvidia.LAUNCH, K.Schedule(), (x, w, x[:1], x[:1]), "torch"),  # the modulate: not measured
        (nvidia.NUMERICS, nvidia.LAUNCH, K.Schedule(rows_per_program=1), (x, w, None, None), "torch"),  # explicit wins
        (nvidia.NUMERICS, nvidia.LAUNCH, K.Schedule(), (x.float(), w.float(), None, None), "torch"),  # fp32: unmeasured
        (amd.NUMERICS, amd.LAUNCH, K.Schedule(), (x, w, None, None), "torch"),  # AMD tunes nothing
        (nvidia.NUMERICS, K.LaunchTraits(), K.Schedule(), (x, w, None, None), "torch"),  # no vendor, no table
    ]
    for numerics, traits, schedule, args, flavour in untuned:
        run = _single_plan(numerics, traits, schedule)
        run(*args, EPS, flavour)
        (lp,) = run.plans.values()
        assert lp.grid == (3,)  # one row per program


# --------------------------------------------------------------------------------------------------
# Vendor schedule tables (LaunchTraits.schedules) and non-default schedules on narrow rows
# --------------------------------------------------------------------------------------------------


def _meta_plan(traits, shape, flavour, modulate, dtype=torch.bfloat16, schedule=DEFAULT_SCHEDULE):
    """The launch plan of bf16 meta tensors (planning needs no device), mod [1, .., 1, D] if modulate."""
    x = torch.empty(shape, dtype=dtype, device="meta")
    w = torch.empty(shape[-1], dtype=dtype, device="meta")
    s = torch.empty((1,) * (len(shape) - 1) + (shape[-1],), dtype=dtype, device="meta") if modulate else None
    return L.plan(L.Variant(True, NUM, traits, schedule), x, w, s, s, EPS, flavour, False)


def test_schedule_table_lookup_narrowest_range_first():
    a, b, c = K.Schedule(rows_per_program=16), K.Schedule(num_warps=2), K.Schedule(rows_per_program=4, trim=True)
    table = K.schedule_table(
        {
            ("modulate-torch", (1, 1024), 2): a,
            ("modulate-torch", (129, 256), 2): b,
            ("modulate-torch", 256, 2): c,
            ("rmsnorm-diffusers", (64, 64), 4): a,
        }
    )
    assert all(isinstance(e, K.ScheduleEntry) for e in table) and set(K.OPS) >= {e.op for e in table}
    find = L.tuned_schedule
    assert find(table, "modulate-torch", 256, 2) is c  # exact D before the ranges that contain it
    assert find(table, "modulate-torch", 129, 2) is b and find(table, "modulate-torch", 255, 2) is b
    assert find(table, "modulate-torch", 128, 2) is a and find(table, "modulate-torch", 1024, 2) is a
    assert find(table, "modulate-torch", 1025, 2) is None  # bounds are inclusive, nothing past them
    assert find(table, "modulate-torch", 256, 4) is None  # keyed by the element size
    assert find(table, "modulate-diffusers", 256, 2) is None and find(table, "rmsnorm-torch", 256, 2) is None
    assert find(table, "rmsnorm-diffusers", 64, 4) is a
    assert L.op_kind("torch", True) == "modulate-torch" and L.op_kind("diffusers", False) == "rmsnorm-diffusers"
    for bad in [
        {("layernorm-torch", 64, 2): a},  # unknown op kind
        {("rmsnorm-torch", (256, 128), 2): a},  # empty range
        {("rmsnorm-torch", 0, 2): a},
        {("rmsnorm-torch", 64, 3): a},  # not an element size
        {("rmsnorm-torch", 64, 2): K.Schedule(rows_per_program=3)},  # tl.arange needs a power of two
        {("rmsnorm-torch", 64, 2): {"rows_per_program": 2}},  # a Schedule, not its fields
    ]:
        with pytest.raises(ValueError):
            K.schedule_table(bad)
    hash(K.LaunchTraits(schedules=table))  # traits are part of a cached Variant's key


def test_vendor_tables_hold_the_measured_d4096_entry_only_where_measured():
    tuned = K.Schedule(rows_per_program=2, num_warps=8)
    assert L.tuned_schedule(nvidia.LAUNCH.schedules, "rmsnorm-torch", 4096, 2) == tuned
    for op, d, size in [("rmsnorm-diffusers", 4096, 2), ("modulate-torch", 4096, 2), ("rmsnorm-torch", 4096, 4)]:
        assert L.tuned_schedule(nvidia.LAUNCH.schedules, op, d, size) is None
    assert amd.LAUNCH.schedules == () and K.LaunchTraits().schedules == ()


@pytest.mark.parametrize("flavour", K.FLAVOURS)
@pytest.mark.parametrize("modulate", [False, True])
def test_no_table_entry_keeps_the_default_plan(flavour, modulate):
    """Where the vendor's table has no entry the plan is the one without a table, where it has one the
    plan is that entry's: same grid, warps, constexprs (planned on meta tensors for the narrow rows and the DiffVAE's 5-D layouts)."""
    shapes = [(4096, d) for d in (64, 128, 256, 512, 768, 1000, 1024, 2048, 4096)]
    shapes += [(1, 40, 96, 96, 4, 64), (1, 40, 96, 96, 256), (1, 20, 48, 48, 512), (1, 16, 48, 80, 512)]
    table = nvidia.LAUNCH.schedules
    tuned = 0
    for shape in shapes:
        entry = tuned_schedule(table, op_kind(flavour, modulate), shape[-1], 2)
        got = _meta_plan(nvidia.LAUNCH, shape, flavour, modulate)
        want = _meta_plan(K.LaunchTraits(schedules=schedule_table({(op_kind(flavour, modulate), shape[-1], 2): entry})
                                         if entry else ()), shape, flavour, modulate)  # fmt: skip
        assert (got.grid, got.options, got.consts) == (want.grid, want.options, want.consts), shape
        if entry is None:
            plain = _meta_plan(K.LaunchTraits(), shape, flavour, modulate)
            assert (got.grid, got.options, got.consts) == (plain.grid, plain.options, plain.consts), shape
        tuned += entry is not None
    assert tuned  # the H200 table covers narrow rows of every op kind


def test_table_entries_reach_every_op_kind_and_explicit_schedules_win():
    table = K.schedule_table(
        {
            ("rmsnorm-torch", (1, 512), 2): K.Schedule(rows_per_program=32, num_warps=2, trim=True),
            ("rmsnorm-diffusers", 256, 2): K.Schedule(rows_per_program=64, num_warps=8),
            ("modulate-torch", 256, 2): K.Schedule(rows_per_program=16, num_warps=1, arrangement=K.ARR_MERGED),
            ("modulate-diffusers", (200, 300), 2): K.Schedule(rows_per_program=4),
        }
    )
    traits = K.LaunchTraits(schedules=table)
    shape = (1, 40, 96, 96, 256)
    m = 40 * 96 * 96
    lp = _meta_plan(traits, (1, 40, 96, 96, 4, 64), "torch", False)  # per-head rows of 64, trimmed
    assert lp.grid == (4 * m // 32,) and lp.options["num_warps"] == 2 and (lp.consts.A, lp.consts.R) == (16, 32)
    lp = _meta_plan(traits, shape, "torch", False)
    assert lp.grid == (m // 32,) and (lp.consts.A, lp.consts.K, lp.consts.BW) == (64, 1, 64)
    lp = _meta_plan(traits, shape, "diffusers", False)
    assert lp.grid == (m // 64,) and lp.options["num_warps"] == 8
    lp = _meta_plan(traits, shape, "torch", True)
    assert lp.grid == (m // 16,) and lp.options["num_warps"] == 1 and lp.consts.ARR == K.ARR_MERGED
    assert lp.consts.A == 128  # trim is the entry's choice, not implied
    lp = _meta_plan(traits, shape, "diffusers", True)
    assert lp.grid == (m // 4,) and lp.options["num_warps"] == 4  # the entry's unset fields: the default
    lp = _meta_plan(traits, shape, "torch", False, dtype=torch.float32)  # keyed by the element size
    assert lp.consts == _meta_plan(K.LaunchTraits(), shape, "torch", False, dtype=torch.float32).consts
    # A caller's rows_per_program or num_warps drops the entry; its arrangement or trim overrides the entry's.
    lp = _meta_plan(traits, shape, "torch", False, schedule=K.Schedule(num_warps=8))
    assert lp.grid == (m // 8,) and lp.consts.A == 128
    lp = _meta_plan(traits, shape, "torch", False, schedule=K.Schedule(trim=False, arrangement=K.ARR_MERGED))
    assert lp.grid == (m // 32,) and lp.consts.A == 128 and lp.consts.ARR == K.ARR_MERGED


def test_trim_applies_to_one_step_rows_only():
    trim = K.Schedule(trim=True)
    for d, a in [(4, 1), (12, 4), (64, 16), (128, 32), (200, 64), (256, 64), (512, 128), (516, 128), (4096, 128)]:
        tile, _, rows, warps = L.exact_schedule(64, d, "torch", NUM, trim)
        assert (tile.a, tile.bw) == (a, a) and tile.b == 4
        assert tile == L.exact_schedule(64, d, "torch", NUM, DEFAULT_SCHEDULE).tile or tile.k == 1
        assert rows == L.default_rows(tile.k * tile.a * tile.b) and warps == max(1, min(8, a // 32))
    # diffusers: D < 128 keeps the accumulators that hold elements (a*B + b < D); vectorized rows are unchanged
    for d, a in [(8, 1), (32, 1), (48, 2), (64, 2), (96, 4), (100, 4), (128, None), (256, None)]:
        untrimmed = L.exact_schedule(64, d, "diffusers", NUM, DEFAULT_SCHEDULE).tile
        tile = L.exact_schedule(64, d, "diffusers", NUM, trim).tile
        assert tile == (untrimmed if a is None else untrimmed._replace(a=a)) and untrimmed.vec_form is (a is None)


@pytest.mark.parametrize("d", [8, 32, 48, 64, 96])
def test_trimmed_diffusers_rows_keep_aten_order(d):
    """A trimmed diffusers tile: the mean bit for bit equal to the Reduce.cuh transliteration, outputs equal
    to the untrimmed launch's (plain and modulated)."""
    x = _rand((37, d), torch.bfloat16, seed=d + 11)
    w = _rand(d, torch.bfloat16, seed=d + 12, scale=0.5, offset=1.0)
    s, t = _rand((1, d), torch.bfloat16, seed=d + 13, scale=0.3), _rand((1, d), torch.bfloat16, seed=d + 14)
    for schedule in (K.Schedule(trim=True), K.Schedule(rows_per_program=16, num_warps=2, trim=True),
                     K.Schedule(rows_per_program=8, num_warps=4, trim=True, arrangement=K.ARR_MERGED, flat_mod=True)):  # fmt: skip
        got, stat = K.rmsnorm_stats(x, w, EPS, "diffusers", numerics=NUM, schedule=schedule)
        want, want_stat = K.rmsnorm_stats(x, w, EPS, "diffusers", numerics=NUM)
        assert torch.equal(got, want) and torch.equal(stat, want_stat)
        np.testing.assert_array_equal(stat.cpu().numpy(), _emulate_mean(x.cpu().float().numpy(), NUM))
        got = K.rmsnorm_modulate(x, s, t, w, EPS, "diffusers", numerics=NUM, schedule=schedule)
        assert torch.equal(got, K.rmsnorm_modulate(x, s, t, w, EPS, "diffusers", numerics=NUM))


NARROW_SCHEDULES = [
    K.Schedule(trim=True),
    K.Schedule(rows_per_program=16, num_warps=1, trim=True),
    K.Schedule(rows_per_program=4, num_warps=8, trim=True, arrangement=K.ARR_MERGED),
    K.Schedule(rows_per_program=32, num_warps=2),
    K.Schedule(rows_per_program=1, num_warps=1, arrangement=K.ARR_MERGED),
]


@pytest.mark.parametrize("d", [64, 128, 256, 1000])
@pytest.mark.parametrize("schedule", NARROW_SCHEDULES, ids=lambda s: f"R{s[0]}w{s[1]}a{s[2]}t{s[3]}")
def test_narrow_rows_under_other_schedules_keep_the_order(d, schedule):
    """Statistics bit for bit equal to the aten transliterations, outputs (plain and modulated on the
    DiffVAE's [1, T, H, W, C] layout with [1, 1, 1, 1, C] modulation) equal to the default launch's."""
    x = _rand((1, 3, 1, 7, d), torch.bfloat16, seed=d + 3)  # 21 rows: the last program is partly masked
    w = _rand(d, torch.bfloat16, seed=d + 4, scale=0.5, offset=1.0)
    s = _rand((1, 1, 1, 1, d), torch.bfloat16, seed=d + 5, scale=0.3)
    t = _rand((1, 1, 1, 1, d), torch.bfloat16, seed=d + 6)
    rows = x.reshape(-1, d).cpu().float().numpy()
    for flavour in K.FLAVOURS:
        got, stat = K.rmsnorm_stats(x, w, EPS, flavour, numerics=NUM, schedule=schedule)
        want, want_stat = K.rmsnorm_stats(x, w, EPS, flavour, numerics=NUM)
        assert torch.equal(got, want) and torch.equal(stat, want_stat)
        if flavour == "diffusers":
            np.testing.assert_array_equal(stat.cpu().numpy(), _emulate_mean(rows, NUM))
        elif not HAS_CUDA:  # rstd: the interpreter's rsqrt, as the transliteration takes it
            np.testing.assert_array_equal(stat.numpy(), _emulate_fused_rms_rstd(rows, EPS, NUM.torch_threads, NUM.warp))
        got = K.rmsnorm_modulate(x, s, t, w, EPS, flavour, numerics=NUM, schedule=schedule)
        assert torch.equal(got, K.rmsnorm_modulate(x, s, t, w, EPS, flavour, numerics=NUM))


@pytest.mark.parametrize("flavour", K.FLAVOURS)
@pytest.mark.parametrize(
    "x_shape,s_shape,flat",
    [
        ((1, 3, 1, 7, 256), (1, 1, 1, 1, 256), True),  # the DiffVAE's modulation
        ((21, 64), (64,), True),
        ((3, 7, 64), (1, 1, 64), True),
        ((3, 7, 64), (3, 1, 64), False),  # one row per batch: per-row loads stay
        ((3, 7, 64), (3, 7, 64), False),
    ],
)
def test_flat_modulation_loads_the_same_values(flavour, x_shape, s_shape, flat):
    """flat_mod loads a row-invariant scale/shift once per program: outputs equal the per-row loads'."""
    d = x_shape[-1]
    x = _rand(x_shape, torch.bfloat16, seed=71)
    w = _rand(d, torch.bfloat16, seed=72, scale=0.5, offset=1.0)
    s = _rand(s_shape, torch.bfloat16, seed=73, scale=0.3)
    t = _rand(s_shape, torch.bfloat16, seed=74)
    want = K.rmsnorm_modulate(x, s, t, w, EPS, flavour, numerics=NUM)
    for schedule in (K.Schedule(flat_mod=True), K.Schedule(rows_per_program=8, num_warps=1, flat_mod=True, trim=True),
                     K.Schedule(rows_per_program=2, num_warps=2, flat_mod=True, arrangement=K.ARR_MERGED)):  # fmt: skip
        run = _single_plan(NUM, K.LaunchTraits(), schedule)
        assert torch.equal(run(x, w, s, t, EPS, flavour), want)
        (lp,) = run.plans.values()
        assert lp.consts.MOD_FLAT is flat
    assert _meta_plan(K.LaunchTraits(), x_shape, flavour, True).consts.MOD_FLAT is False  # never by default
    strided = _rand(2 * d, torch.bfloat16, seed=75)[::2]  # a [D] view with column stride 2, read in place
    run = _single_plan(NUM, K.LaunchTraits(), K.Schedule(flat_mod=True))
    got = run(x, w, strided, t.reshape(-1, d)[0], EPS, flavour)
    (lp,) = run.plans.values()
    assert lp.consts.MOD_FLAT and lp.sc_l[3] == 2
    want = K.rmsnorm_modulate(x, strided.contiguous(), t.reshape(-1, d)[0], w, EPS, flavour, numerics=NUM)
    assert torch.equal(got, want)


def test_trimmed_tile_under_a_table_matches_the_default_on_per_head_rows():
    """Per-head norms of [B, T, H, W, heads, 64] through a vendor table that trims: same bits as untrimmed."""
    traits = K.LaunchTraits(schedules=K.schedule_table({("rmsnorm-torch", 64, 2): K.Schedule(8, 1, trim=True)}))
    x = _rand((1, 2, 3, 3, 4, 64), torch.bfloat16, seed=61)
    w = _rand(64, torch.bfloat16, seed=62, scale=0.5, offset=1.0)
    run = _single_plan(NUM, traits)
    got = run(x, w, None, None, EPS, "torch")
    (lp,) = run.plans.values()
    assert lp.consts.A == 16 and lp.grid == (9,)
    assert torch.equal(got, K.rmsnorm(x, w, EPS, "torch", numerics=NUM))


def test_constexpr_records_name_the_kernels_constexprs_in_order():
    """The launch passes every kernel argument by position (the compiled launcher takes no names): the
    constexpr records' fields are the kernels' trailing constexpr parameters, in signature order."""
    for kernel, record in ((E._rmsnorm_exact_kernel, E.ExactConstexprs), (F_._rmsnorm_fast_kernel, F_.FastConstexprs)):
        params = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters.values())
        constexprs = [p.name for p in params if p.annotation in (tl.constexpr, "tl.constexpr")]
        assert constexprs == list(record._fields) == [p.name for p in params[-len(constexprs) :]]


def test_numerics_are_data_and_no_shared_kernel_probes_the_vendor():
    """The porting surface: each record says which PyTorch versions it was read from and where it ran;
    which record applies is the backend's choice, never a probe inside a shared kernel module."""
    assert K.CUDA_NUMERICS.verified_on and K.CUDA_NUMERICS.verified_on[0].torch.startswith("2.11")
    assert K.ROCM_NUMERICS.verified_on == () and "2.11" in K.ROCM_NUMERICS.torch_versions
    assert nvidia.NUMERICS is K.CUDA_NUMERICS and amd.NUMERICS is K.ROCM_NUMERICS
    kernels = Path(E.__file__).parent.parent
    vendor_only = {"_cuda_build.py"}  # the CUDA C++ extension's build helper
    for path in sorted(kernels.rglob("*.py")):
        if path.name not in vendor_only:
            assert not re.search(r"version\.hip|version\.cuda", path.read_text()), path


# (x shape, scale/shift shape): every broadcast form the op promises
MOD_FORMS = [
    ((2, 5, 64), (2, 1, 64)),
    ((2, 5, 64), (2, 5, 64)),
    ((2, 5, 64), (64,)),
    ((2, 5, 64), (1, 1, 64)),
    ((2, 3, 2, 2, 64), (2, 1, 1, 1, 64)),
    ((3, 4, 65), (3, 1, 65)),
]


@pytest.mark.parametrize("x_shape,s_shape", MOD_FORMS)
@pytest.mark.parametrize("flavour", K.FLAVOURS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rmsnorm_modulate_close_to_reference(x_shape, s_shape, flavour, dtype):
    x = _rand(x_shape, dtype, seed=11)
    w = _rand(x_shape[-1], dtype, seed=12, scale=0.5, offset=1.0)
    scale = _rand(s_shape, dtype, seed=13, scale=0.3)
    shift = _rand(s_shape, dtype, seed=14)
    ref = _ref_mod(x, scale, shift, w, EPS, flavour)
    # error scale: the rounding of n * (1 + scale) before the shift is added
    extra = (_ref(x, w, EPS, flavour) * (1 + scale)).double().abs()
    if K.supports_rmsnorm_modulate(x, scale, shift, w, EPS, flavour, numerics=NUM) is None:
        _assert_close(K.rmsnorm_modulate(x, scale, shift, w, EPS, flavour, numerics=NUM), ref, dtype, extra)
    else:
        assert flavour == "torch" and x_shape[-1] % 4
    _assert_close(K.rmsnorm_modulate_fast(x, scale, shift, w, EPS, flavour, numerics=NUM), ref, dtype, extra)


@pytest.mark.parametrize("flavour", K.FLAVOURS)
@pytest.mark.parametrize("shape", [(4, 9, 65), (6, 1000)])
def test_fast_close_to_reference(flavour, shape):
    x = _rand(shape, torch.bfloat16, seed=21)
    w = _rand(shape[-1], torch.bfloat16, seed=22, scale=0.5, offset=1.0)
    assert K.supports_rmsnorm_fast(x, w, EPS, flavour) is None
    _assert_close(K.rmsnorm_fast(x, w, EPS, flavour, numerics=NUM), _ref(x, w, EPS, flavour), torch.bfloat16)


@pytest.mark.parametrize("flavour", K.FLAVOURS)
def test_empty_rows(flavour):
    x = torch.empty(0, 3, 64, dtype=torch.bfloat16, device=DEV)
    w = torch.ones(64, dtype=torch.bfloat16, device=DEV)
    s = torch.zeros(0, 1, 64, dtype=torch.bfloat16, device=DEV)
    for out in (
        K.rmsnorm(x, w, EPS, flavour, numerics=NUM),
        K.rmsnorm_modulate(x, s, s, w, EPS, flavour, numerics=NUM),
        K.rmsnorm_fast(x, None, EPS, flavour, numerics=NUM),
        K.rmsnorm_modulate_fast(x, s, s, None, EPS, flavour, numerics=NUM),
    ):
        assert out.shape == x.shape and out.dtype == x.dtype


@pytest.mark.parametrize("flavour", K.FLAVOURS)
def test_strided_inputs_equal_contiguous(flavour):
    """Sliced and transposed inputs give bit for bit what the same kernel gives on a copy."""
    base = _rand((6, 4, 80), torch.bfloat16, seed=31)
    w = _rand(64, torch.bfloat16, seed=32, scale=0.5, offset=1.0)
    for x in (base[:, :, :64], base[:, :, 8:72].transpose(0, 1)):
        assert not x.is_contiguous()
        want = K.rmsnorm(x.contiguous(), w, EPS, flavour, numerics=NUM)
        assert torch.equal(K.rmsnorm(x, w, EPS, flavour, numerics=NUM), want)
    s = _rand((4, 6, 1, 64), torch.bfloat16, seed=33)[:, :, :, :].transpose(0, 1)  # [6, 4, 1, 64] view
    x = base[:, :, :64].unsqueeze(2)  # [6, 4, 1, 64]
    got = K.rmsnorm_modulate(x, s, s, w, EPS, flavour, numerics=NUM)
    want = K.rmsnorm_modulate(x.contiguous(), s.contiguous(), s.contiguous(), w, EPS, flavour, numerics=NUM)
    assert torch.equal(got, want)


def test_bcast_layout_addresses_expanded_operand():
    x_shape = torch.Size((3, 4, 5, 6))
    for s_shape in [(6,), (1, 1, 1, 6), (3, 1, 1, 6), (3, 4, 5, 6), (3, 1, 5, 6), (1, 4, 1, 6)]:
        t = torch.arange(float(np.prod(s_shape))).reshape(s_shape)
        te, inner, s_outer, s_inner, s_col = L.bcast_layout(t, x_shape)
        rows = torch.arange(3 * 4 * 5)[:, None]
        cols = torch.arange(6)[None, :]
        off = (rows // inner) * s_outer + (rows % inner) * s_inner + cols * s_col
        flat = te.as_strided((te.untyped_storage().nbytes() // te.element_size(),), (1,), 0)
        got = flat[off + te.storage_offset()]
        assert torch.equal(got, t.expand(x_shape).reshape(-1, 6)), s_shape


def test_supports_reasons():
    x = _rand((4, 64), torch.bfloat16, seed=41)
    w = _rand(64, torch.bfloat16, seed=42)
    assert K.supports_rmsnorm(x, w, EPS, "torch", numerics=NUM) is None
    assert "D % 4" in K.supports_rmsnorm(_rand((4, 65), torch.bfloat16, seed=1), None, EPS, "torch", numerics=NUM)
    assert "D % 4" in K.supports_rmsnorm(_rand((4, 130), torch.bfloat16, seed=1), None, EPS, "diffusers", numerics=NUM)
    assert K.supports_rmsnorm(_rand((4, 65), torch.bfloat16, seed=1), None, EPS, "diffusers", numerics=NUM) is None
    misaligned = _rand((4 * 64 + 1,), torch.bfloat16, seed=43)[1:].view(4, 64)
    assert "aligned" in K.supports_rmsnorm(misaligned, w, EPS, "torch", numerics=NUM)
    assert K.supports_rmsnorm(misaligned, w, EPS, "diffusers", numerics=NUM) is None  # the mean reads a fresh copy
    assert "dtype" in K.supports_rmsnorm(x.double(), None, EPS, "torch", numerics=NUM)
    assert "weight" in K.supports_rmsnorm(x, w.float(), EPS, "torch", numerics=NUM)
    assert "flavour" in K.supports_rmsnorm(x, w, EPS, "apex", numerics=NUM)
    assert "broadcast" in K.supports_rmsnorm_modulate(x, x[:2], x[:2], w, EPS, "torch", numerics=NUM)
    assert K.supports_rmsnorm_fast(_rand((4, 65), torch.bfloat16, seed=1), None, EPS, "torch") is None
    with pytest.raises(ValueError, match="D % 4"):
        K.rmsnorm(_rand((4, 65), torch.bfloat16, seed=1), None, EPS, "torch", numerics=NUM)


def test_misaligned_calls_fall_back_per_call_not_per_shape():
    """A misaligned view has the shapes of an aligned tensor: the exact kernel's launch plan (and a
    dispatch key) cannot tell them apart, so the backend impl answers that one call with the reference
    and keeps the kernel for the next aligned call."""
    w = _rand(64, torch.bfloat16, seed=42)
    base = _rand((4 * 64 + 1,), torch.bfloat16, seed=43)
    aligned, misaligned = base[:-1].view(4, 64), base[1:].view(4, 64)
    assert K.supports_rmsnorm(misaligned, w, EPS, "torch", alignment=False, numerics=NUM) is None
    with pytest.raises(K.NotVectorizable):
        K.rmsnorm(misaligned, w, EPS, "torch", numerics=NUM)
    fallbacks = []

    def reference(x, weight, eps, flavour):
        fallbacks.append(x.data_ptr())
        return F.rms_norm(x, (x.shape[-1],), weight, eps)

    impl = K.rmsnorm_with(NUM, reference)
    impl(aligned, w, EPS, "torch")
    assert fallbacks == []
    out = impl(misaligned, w, EPS, "torch")
    assert fallbacks == [misaligned.data_ptr()] and torch.equal(out, F.rms_norm(misaligned, (64,), w, EPS))
    impl(aligned, w, EPS, "torch")
    assert len(fallbacks) == 1


# --------------------------------------------------------------------------------------------------
# GPU: bit-exactness against eager (>= 16M elements per shape)
# --------------------------------------------------------------------------------------------------

GPU_RMS = (
    [(fl, d, dt, True) for fl in K.FLAVOURS for d in (1000, 3072, 4096, 5120) for dt in (torch.bfloat16,)]
    + [
        (fl, 4096, dt, wt)
        for fl in K.FLAVOURS
        for dt, wt in ((torch.float16, True), (torch.float32, True), (torch.bfloat16, False))
    ]
    + [
        ("diffusers", 64, torch.bfloat16, True),
        ("diffusers", 65, torch.bfloat16, True),
        ("torch", 64, torch.bfloat16, True),
    ]
)


def test_pdl_comes_from_the_vendors_traits(monkeypatch):
    """Programmatic dependent launch needs Hopper's griddepcontrol: the NVIDIA traits ask for compute
    capability 9+, the AMD traits never; no PDL for a CPU tensor or under the interpreter."""
    for cap, want in [((9, 0), True), ((10, 3), True), ((8, 9), False)]:
        L._pdl_capable.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None, cap=cap: cap)
        assert L._pdl_capable(0, nvidia.LAUNCH.pdl_min_major) is (want and L.gdc_wait is not None)
    assert amd.LAUNCH.pdl_min_major is None and K.LaunchTraits().pdl_min_major is None
    on_gpu = SimpleNamespace(is_cuda=True, get_device=lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: (9, 0))
    L._pdl_capable.cache_clear()
    monkeypatch.setattr(L, "interpreting", lambda: False)
    assert L.use_pdl(on_gpu, nvidia.LAUNCH) is (L.gdc_wait is not None)
    assert not L.use_pdl(on_gpu, amd.LAUNCH) and not L.use_pdl(on_gpu, K.LaunchTraits())
    monkeypatch.setattr(L, "interpreting", lambda: True)
    assert not L.use_pdl(on_gpu, nvidia.LAUNCH)
    L._pdl_capable.cache_clear()
    x = _rand((3, 64), torch.float32, seed=13)
    if not x.is_cuda:
        assert not L.use_pdl(x, nvidia.LAUNCH)  # not a CUDA tensor
        run = _single_plan(nvidia.NUMERICS, nvidia.LAUNCH)
        run(x, None, None, None, EPS, "torch")
        (lp,) = run.plans.values()
        assert "launch_pdl" not in lp.options and lp.consts.PDL is False


@pytest.mark.gpu
@gpu
def test_gpu_pdl_launches_chain_exactly():
    """On sm90+ the exact kernels launch with PDL; a chain where each norm reads the previous one's
    output stays bit-identical (each program waits for the previous grid before loading)."""
    x = _rand((4096, 4096), torch.bfloat16, seed=14)
    w = _rand(4096, torch.bfloat16, seed=15, scale=0.5, offset=1.0)
    run = _single_plan(NUM, TRAITS)
    y = x
    for _ in range(8):  # back to back: each launch may start while the previous one drains
        y = run(y, w, None, None, EPS, "torch")
    want = x
    for _ in range(8):
        want = _ref(want, w, EPS, "torch")
    assert torch.equal(y, want)
    (lp,) = run.plans.values()
    hopper = torch.cuda.get_device_capability()[0] >= 9 and torch.version.hip is None
    assert lp.options.get("launch_pdl", False) is hopper
    assert all(k.metadata.launch_pdl is hopper for k in lp.kernels.values())


@pytest.mark.gpu
@gpu
def test_gpu_rmsnorm_tuned_launch_odd_rows():
    x = _rand((4097, 4096), torch.bfloat16, seed=11)
    w = _rand(4096, torch.bfloat16, seed=12, scale=0.5, offset=1.0)
    assert torch.equal(K.rmsnorm(x, w, EPS, "torch", numerics=NUM, traits=TRAITS), _ref(x, w, EPS, "torch"))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("flavour,d,dtype,with_weight", GPU_RMS)
def test_gpu_rmsnorm_exact(flavour, d, dtype, with_weight):
    x = _rand((-(-(1 << 24) // d), d), dtype, seed=d)
    w = _rand(d, dtype, seed=d + 1, scale=0.5, offset=1.0) if with_weight else None
    assert torch.equal(K.rmsnorm(x, w, EPS, flavour, numerics=NUM, traits=TRAITS), _ref(x, w, EPS, flavour))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    "x_shape,s_shape",
    [
        ((4, 1024, 4096), (4, 1, 4096)),
        ((4, 1024, 4096), (4, 1024, 4096)),
        ((4, 1024, 4096), (4096,)),
        ((4, 1024, 4096), (1, 1, 4096)),
        ((4, 8, 32, 32, 128), (4, 1, 1, 1, 128)),
    ],
)
@pytest.mark.parametrize("flavour", K.FLAVOURS)
def test_gpu_rmsnorm_modulate_exact(x_shape, s_shape, flavour):
    dt = torch.bfloat16
    x = _rand(x_shape, dt, seed=51)
    w = _rand(x_shape[-1], dt, seed=52, scale=0.5, offset=1.0)
    scale = _rand(s_shape, dt, seed=53, scale=0.3)
    shift = _rand(s_shape, dt, seed=54)
    out = K.rmsnorm_modulate(x, scale, shift, w, EPS, flavour, numerics=NUM, traits=TRAITS)
    assert torch.equal(out, _ref_mod(x, scale, shift, w, EPS, flavour))


GPU_NARROW_SCHEDULES = [
    K.Schedule(rows_per_program=32, num_warps=2, trim=True, flat_mod=True),
    K.Schedule(rows_per_program=16, num_warps=4, arrangement=K.ARR_MERGED, trim=True, flat_mod=True),
    K.Schedule(rows_per_program=4, num_warps=1, flat_mod=True),
]


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("x_shape", [(1, 16, 48, 48, 4, 64), (1, 40, 48, 48, 256), (1, 16, 48, 80, 512)])
@pytest.mark.parametrize("flavour", K.FLAVOURS)
def test_gpu_narrow_schedules_exact(x_shape, flavour):
    """The narrow-row knobs (trim, flat_mod, rows, warps, arrangement) on the DiffVAE's layouts: eager's bits."""
    d = x_shape[-1]
    x = _rand(x_shape, torch.bfloat16, seed=81)
    w = _rand(d, torch.bfloat16, seed=82, scale=0.5, offset=1.0)
    s = _rand((1, 1, 1, 1, d), torch.bfloat16, seed=83, scale=0.3)
    t = _rand((1, 1, 1, 1, d), torch.bfloat16, seed=84)
    want, want_mod = _ref(x, w, EPS, flavour), _ref_mod(x, s, t, w, EPS, flavour)
    for schedule in GPU_NARROW_SCHEDULES:
        assert torch.equal(K.rmsnorm(x, w, EPS, flavour, numerics=NUM, schedule=schedule, traits=TRAITS), want)
        got = K.rmsnorm_modulate(x, s, t, w, EPS, flavour, numerics=NUM, schedule=schedule, traits=TRAITS)
        assert torch.equal(got, want_mod), schedule
