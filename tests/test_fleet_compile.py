"""xbackend.fleet.compile: every planned kernel compiled for a GPU this host does not have, with its
resources; waivers; Triton's FP-fusion default not reaching the exact kernels."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from xbackend._device import simulated
from xbackend.fleet import _resources, _worker
from xbackend.fleet import compile as fc
from xbackend.fleet._worker import CompileResult

KERNEL_OPS = ("rmsnorm", "rmsnorm_modulate", "add_rmsnorm", "gated_residual", "rotary_embedding", "qk_norm_rope", "qk_norm_rope_3d",
              "silu_mul", "layernorm_modulate", "add_layernorm")  # fmt: skip


def _plan(op: str, chosen: str, quality: str = "lossless", dtype: str = "bfloat16") -> dict[str, str]:
    return {"op": op, "dtype": dtype, "quality": quality, "chosen": chosen}


CUDA_PLANS = [
    _plan("rmsnorm", "cuda:triton"),
    _plan("rmsnorm", "cuda:triton", quality="high"),  # same impl: compiled once
    _plan("rmsnorm_modulate", "cuda:triton"),
    _plan("add_rmsnorm", "cuda:triton"),
    _plan("gated_residual", "cuda:triton"),
    _plan("gated_residual", "cuda:cuda_vec"),
    _plan("rotary_embedding", "cuda:triton"),
    _plan("qk_norm_rope", "cuda:triton"),
    _plan("qk_norm_rope_3d", "cuda:triton"),
    _plan("silu_mul", "cuda:triton"),
    _plan("layernorm_modulate", "cuda:triton"),
    _plan("add_layernorm", "cuda:triton"),
    _plan("neighborhood_attention", "cuda:na_triton"),
]
AMD_PLANS = [
    *(_plan(op, "rocm:triton") for op in KERNEL_OPS),
    _plan("rmsnorm", "rocm:aiter", quality="high"),
    _plan("neighborhood_attention", "rocm:na_flex"),
]


@pytest.fixture(scope="module")
def rows() -> dict[str, list[dict]]:
    """The first catalogue input of every op, compiled for H200 (sm90) and MI355X (gfx950), once."""
    return {
        "h200": fc.compile_target("h200", simulated("h200"), CUDA_PLANS, shapes=1),
        "mi355x": fc.compile_target("mi355x", simulated("mi355x"), AMD_PLANS, shapes=1),
    }


def _ok(rows: list[dict], op: str, chosen: str) -> list[dict]:
    return [r for r in rows if r["op"] == op and r["chosen"] == chosen and r["status"] == "ok"]


@pytest.mark.parametrize("target,prefix", [("h200", "cuda"), ("mi355x", "rocm")])
@pytest.mark.parametrize("op", KERNEL_OPS)
def test_every_op_compiles_with_resources(rows, target, prefix, op):
    found = _ok(rows[target], op, f"{prefix}:triton")
    assert found, [r for r in rows[target] if r["op"] == op]
    for r in found:
        assert r["registers"] > 0 and isinstance(r["shared_bytes"], int) and r["shared_bytes"] >= 0
        assert r["occupancy"] and r["occupancy_limiter"] and r["num_warps"] > 0 and r["grid"]
        assert r["problem"] == "" and r["arch"] == simulated(target).arch
        if prefix == "rocm":
            assert r["sgprs"] > 0


def test_neighborhood_attention_fused_kernel_on_sm90(rows):
    # The catalogue's 3-D head_dim-64 tile takes the score-bound shift: the key-norm pass, then the
    # shift launch (na_sm90's CUDA C++ kernel on sm90, built by nvcc where this host has it), the
    # online launch for the tiles it flags and the safe walk for tiles left with an inf or a NaN.
    every = [r for r in rows["h200"] if r["op"] == "neighborhood_attention" and r["chosen"] == "cuda:na_triton"]
    assert [r["kernel"] for r in every] == ["_max_key_norm_kernel", "na_shift_sm90", "_na_fwd_kernel",
                                            "_na_fwd_kernel"], every
    assert every[1]["status"] in ("ok", "skipped: no nvcc"), every[1]
    found = _ok(rows["h200"], "neighborhood_attention", "cuda:na_triton")
    for r in found:
        assert r["registers"] > 0
        assert r["shared_bytes"] > 0 or r["kernel"] == "_max_key_norm_kernel"


def test_strided_neighborhood_attention_compiles_on_sm90():
    """The catalogue's strided input (stride (2, 4, 8)): its own specialisations of the fused kernels,
    compiled for sm90 without spills."""
    from xbackend.fleet.catalogue import catalogue

    (index,) = [i for i, s in enumerate(catalogue("neighborhood_attention")) if " s2x4x8" in s.label]
    rows = fc.compile_target("h200", simulated("h200"), [_plan("neighborhood_attention", "cuda:na_triton")],
                             shapes=[index])
    # head_dim 128: the shift launch is na_gluon's pipelined kernel, its online and safe launches na_triton's.
    assert [row["kernel"] for row in rows] == ["_max_key_norm_kernel", "na_fwd_shift_kernel", "_na_fwd_kernel",
                                               "_na_fwd_kernel"], rows
    for row in rows:
        assert row["status"] == "ok" and row["problem"] == "", row
        assert row["spill_bytes"] == 0 and row["registers"] > 0 and "s2x4x8" in row["shape"]


def test_vendor_configs_come_from_each_vendors_launch_code(rows):
    # [1, 32640, 4096] torch-flavour RMSNorm: the CUDA launch takes 2 rows per 8-warp program (tuned on
    # the H200) with PDL; the ROCm numerics run one row per program (1024 threads, wave64).
    (cuda,) = _ok(rows["h200"], "rmsnorm", "cuda:triton")[:1]
    (amd,) = _ok(rows["mi355x"], "rmsnorm", "rocm:triton")[:1]
    assert tuple(cuda["grid"]) == (16320,) and tuple(amd["grid"]) == (32640,)


def test_layernorm_kernels_compile_for_sm100_without_spills():
    """The LayerNorm kernels on Blackwell (sm100), every catalogue input (Flux.2, Qwen-Image's per-token
    tables, Wan's float32 chain and gate): no spill, one lane per emulated aten thread (4 warps)."""
    plans = [_plan(op, "cuda:triton") for op in ("layernorm_modulate", "add_layernorm")]
    rows = fc.compile_target("b200", simulated("b200"), plans)
    assert len(rows) == 7 and {r["arch"] for r in rows} == {"sm100"}, rows
    for r in rows:
        assert r["status"] == "ok" and r["problem"] == "" and r["spill_bytes"] == 0, r
        assert r["kernel"] == "_layernorm_exact_kernel" and r["num_warps"] == 4 and r["registers"] > 0


def test_lossless_and_high_share_one_compile(rows):
    lossless, high = (r for r in rows["h200"] if r["op"] == "rmsnorm" and r["chosen"] == "cuda:triton")
    assert not lossless["cached"] and lossless["compile_s"] > 0
    assert high["cached"] and high["compile_s"] == 0 and high["registers"] == lossless["registers"]


def test_impls_without_kernels_here_are_skipped_with_the_reason(rows):
    for chosen, word in (("rocm:aiter", "AITER"), ("rocm:na_flex", "inductor")):
        (r,) = [r for r in rows["mi355x"] if r["chosen"] == chosen]
        assert r["status"].startswith("skipped: ") and word in r["status"] and r["problem"] == ""


def test_cuda_cpp_kernels_compiled_or_skipped_never_silently(rows):
    native = [r for r in rows["h200"] if r["chosen"] == "cuda:cuda_vec"]
    assert native
    if native[0]["status"] == "skipped: no nvcc":
        return
    assert all(r["status"] == "ok" and r["registers"] > 0 for r in native)
    assert all("__nv_bfloat16" in r["kernel"] for r in native)  # the plan's dtype's instantiations
    assert not [r for r in native if r["problem"]]


def test_native_flags_are_the_extensions_own():
    build = (Path(fc.__file__).parent.parent / "kernels" / "_cuda_build.py").read_text()
    for flag in fc.NATIVE["cuda:cuda_vec"].flags:
        assert f'"{flag}"' in build


NA_SM90 = {"XBACKEND_NA_SM90": "1"}  # the default, stated so a caller's environment cannot change it
NA_SM90_OFF = {"XBACKEND_NA_SM90": "0"}


@pytest.mark.parametrize(("target", "env", "native"), [
    ("h200", NA_SM90, True),
    ("h200", NA_SM90_OFF, False),  # the switch off: na_triton's own shift launch
    ("b200", NA_SM90, False),  # an sm_90a kernel: never planned for sm100
])  # fmt: skip
def test_a_native_launch_inside_a_triton_impl_is_captured_in_its_place(target, env, native):
    from xbackend.fleet.native import NATIVE_LAUNCHES

    device = simulated(target)
    stage5, video = fc.run_in_worker(_worker.capture_shapes, device.arch, device.vendor,
                                     "xbackend.kernels.na_triton:neighborhood_attention",
                                     "xbackend.kernels.na_triton:supports", "neighborhood_attention", "bfloat16",
                                     (0, 1), env)  # fmt: skip
    shift = stage5.launches[1].spec
    assert (shift == NATIVE_LAUNCHES[0]) is native, stage5.launches
    assert stage5.launches[2].spec.name == "_na_fwd_kernel"  # the online launch for flagged tiles
    assert not any(launch.spec in NATIVE_LAUNCHES for launch in video.launches)  # head_dim 128


def test_native_launch_rows_on_sm90():
    """With the switch on, the stage-5 tile's shift launch is na_sm90.cu's kernel, compiled for sm_90a
    with its dynamic shared memory counted: 4 CTAs of 4 warps an SM, as its __launch_bounds__ asks."""
    rows = fc.compile_target("h200", simulated("h200"), [_plan("neighborhood_attention", "cuda:na_triton")],
                             shapes=[0], env=NA_SM90)
    assert [r["kernel"] for r in rows][0::2] == ["_max_key_norm_kernel", "_na_fwd_kernel"], rows
    native = rows[1]
    if native["status"] == "skipped: no nvcc":
        return
    assert native["kernel"] == "na_shift_sm90" and native["status"] == "ok" and native["problem"] == "", native
    assert native["registers"] <= 128 and native["spill_bytes"] == 0 and native["num_warps"] == 4
    assert native["shared_bytes"] > 55296 and native["occupancy"] == 16, native


def test_native_launch_records_match_their_sources():
    import re

    from xbackend.fleet.native import NATIVE_LAUNCHES
    from xbackend.kernels import na_sm90

    (launch,) = NATIVE_LAUNCHES
    src = launch.source
    path = Path(fc.__file__).parent.parent / src.path
    text = path.read_text()
    headers = "".join(path.with_name(h).read_text() for h in re.findall(r'#include "([\w.]+)"', text))
    consts: dict[str, int] = {}
    for name, expr in re.findall(r"constexpr int (\w+) = ([^;]+);", headers + text):
        consts[name] = eval(expr, {}, dict(consts))  # the kernel's own constexpr arithmetic
    assert src.dynamic_shared_bytes == consts["kSmem"]
    assert f"__launch_bounds__({src.block_warps * 32}, " in text
    assert na_sm90.EXTENSION.gencode == (f"-gencode=arch=compute_90{src.arch_suffix},code=sm_90{src.arch_suffix}",)
    build = (Path(fc.__file__).parent.parent / "kernels" / "_cuda_build.py").read_text()
    assert all(f'"{flag}"' in build for flag in src.flags)
    assert launch.launch == "xbackend.kernels.na_sm90:shift_launch"
    assert launch.available == "xbackend.kernels.na_sm90:available"


def test_unknown_impl_fails_with_a_problem():
    (r,) = fc.compile_target("h200", simulated("h200"), [_plan("rmsnorm", "cuda:nonexistent")])
    assert r["status"].startswith("failed: ") and r["problem"]


def test_broken_specialisation_reports_failed_with_a_problem(rows):
    (shape,) = fc.run_in_worker(
        _worker.capture_shapes, "sm90", "cuda", "xbackend_cuda.launch:gated_residual_triton", None,
        "gated_residual", "bfloat16", (0,),
    )  # fmt: skip
    spec = shape.launches[0].spec
    index = [n for n, _ in spec.signature].index("BLOCK_D")
    constexprs = tuple((k, 1000 if k == (index,) else v) for k, v in spec.constexprs)  # tl.arange needs 2^n
    result = fc.compile_spec(dataclasses.replace(spec, constexprs=constexprs), "sm90")
    status, problem, waiver = fc.judge(spec.name, "sm90", result)
    assert status.startswith("failed: ") and "power of 2" in status, status
    assert problem and not waiver


def test_waivers():
    spilled = CompileResult("k", registers=255, spill_bytes=16, spill_stores=12)
    assert fc.judge("row_tile_kernel<float, 8, false, 2>", "sm100", spilled, waivers={}) == (
        "ok",
        "spills (16 B local memory per thread, 12 B spill stores) without a waiver",
        "",
    )
    waivers = {("row_tile_kernel<*, 8, *>", "sm10*"): "an explicit tuning knob"}
    assert fc.judge("row_tile_kernel<float, 8, false, 2>", "sm100", spilled, waivers) == (
        "ok",
        "",
        "an explicit tuning knob",
    )
    assert fc.judge("row_tile_kernel<float, 8, false, 2>", "sm90", spilled, waivers)[1]  # other arch
    assert fc.judge("row_tile_kernel<float, 4, false, 2>", "sm100", spilled, waivers)[1]  # other kernel
    narrow = {("k *fp32 * D=1024 *", "sm*"): "one input"}  # a Triton row's specialisation can be named
    assert fc.judge("k", "sm90", spilled, narrow, "*fp32 R=4 D=1024 num_warps=4")[2] == "one input"
    assert fc.judge("k", "sm90", spilled, narrow, "*bf16 R=4 D=1024 num_warps=4")[1]
    scratch = CompileResult("k", registers=128, spill_bytes=64, spill_stores=3)
    assert "64 B scratch per lane, 3 registers spilled" in fc.judge("k", "gfx942", scratch, {})[1]
    assert fc.judge("k", "sm90", CompileResult("k", registers=32), {}) == ("ok", "", "")
    for (kernel, arch), why in fc.WAIVERS.items():  # every declared waiver says why
        assert kernel and arch and len(why) > 10


def test_occupancy_from_the_limits_table():
    occ = _resources.occupancy
    # 82 registers: 2816 per warp -> 23 warps' worth -> two 8-warp blocks.
    assert occ("sm90", _resources.Resources(registers=82, shared_bytes=9216), 8) == _resources.Occupancy(
        16, 2, "registers"
    )
    assert occ("sm100", _resources.Resources(registers=32, shared_bytes=3072), 4) == _resources.Occupancy(
        64, 16, "warps"
    )
    # 120 KB of shared memory per block (+1 KB reserved): one block of 228 KB.
    assert occ("sm90", _resources.Resources(registers=32, shared_bytes=120 * 1024), 4).limiter == "shared"
    # 73 VGPRs -> 80 allocated -> 6 waves per SIMD -> three 8-wave workgroups per CU.
    amd = occ("gfx950", _resources.Resources(registers=73, sgprs=50, shared_bytes=16384), 8)
    assert amd == _resources.Occupancy(24, 3, "registers")
    # 48 KB of LDS: one workgroup on CDNA3 (64 KB), three on CDNA4 (160 KB).
    lds = _resources.Resources(registers=24, sgprs=30, shared_bytes=48 * 1024)
    assert occ("gfx942", lds, 4) == _resources.Occupancy(4, 1, "shared")
    assert occ("gfx950", lds, 4) == _resources.Occupancy(12, 3, "shared")
    assert occ("sm80", lds, 4) is None  # no limits entry


def test_compiler_report_parsers():
    log = """ptxas info    : Compiling entry function '_Z1kPf' for 'sm_100'
ptxas info    : Function properties for _Z1kPf
    16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 16 bytes cumulative stack size
ptxas info    : Compiling entry function '_Z1gPf' for 'sm_100'
ptxas info    : Function properties for _Z1gPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes smem"""
    found = _resources.ptxas_resources(log)
    assert found["_Z1kPf"] == _resources.Resources(registers=255, spill_bytes=16, spill_stores=12)
    assert found["_Z1gPf"] == _resources.Resources(registers=40, shared_bytes=2048)
    asm = """; NumVgprs: 34
; Occupancy: 8
amdhsa.kernels:
  - .agpr_count:     4
    .group_segment_fixed_size: 256
    .private_segment_fixed_size: 32
    .sgpr_count:     30
    .sgpr_spill_count: 1
    .vgpr_count:     40
    .vgpr_spill_count: 2
"""
    assert _resources.amdgcn_resources(asm, 4096) == _resources.Resources(
        registers=40, sgprs=30, agprs=4, spill_bytes=32, spill_stores=3, shared_bytes=4352, compiler_occupancy=8
    )


def _fusion_compile(fn: str, op: str, dtype: str, default: str, drop_option: bool = False) -> CompileResult:
    """Capture and compile for sm90 with TRITON_DEFAULT_FP_FUSION=default in the worker, from scratch."""
    env = {"TRITON_DEFAULT_FP_FUSION": default}
    (shape,) = fc.run_in_worker(_worker.capture_shapes, "sm90", "cuda", fn, None, op, dtype, (0,), env=env)
    spec = shape.launches[0].spec
    if drop_option:  # the control: what the kernel would get from Triton's default
        spec = dataclasses.replace(spec, options=tuple((k, v) for k, v in spec.options if k != "enable_fp_fusion"))
    else:
        assert spec.option["enable_fp_fusion"] is False
    return fc.run_in_worker(_worker.compile_triton, spec, "sm90", env={**env, "TRITON_ALWAYS_COMPILE": "1"},
                            stages=("ttgir", "ptx"))  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("fn,op,dtype", [
    ("xbackend_cuda.launch:rmsnorm", "rmsnorm", "bfloat16"),
    ("xbackend_cuda.launch:gated_residual_triton", "gated_residual", "float32"),
])  # fmt: skip
def test_exact_kernels_do_not_depend_on_the_fp_fusion_default(fn, op, dtype):
    off, on = (_fusion_compile(fn, op, dtype, default) for default in ("0", "1"))
    assert off.error is None and on.error is None
    assert off.extra["ptx"] == on.extra["ptx"] and off.extra["ttgir"] == on.extra["ttgir"]


@pytest.mark.slow
def test_the_fp_fusion_default_does_change_a_kernel_left_to_it():
    # fp32 x + u * g: with fusion left to the default, "on" contracts the product and sum into one FMA.
    fn, op = "xbackend_cuda.launch:gated_residual_triton", "gated_residual"
    off, on = (_fusion_compile(fn, op, "float32", default, drop_option=True) for default in ("0", "1"))
    assert "fma.rn.f32" in on.extra["ptx"] and "fma.rn.f32" not in off.extra["ptx"]


@pytest.mark.parametrize("target", ["h200", "mi355x"])
def test_no_triton_launch_leaves_fp_fusion_to_the_default(target):
    # Every Triton impl registered for the target, captured under both defaults: the launch options
    # must not move (the exact and fast kernels pass enable_fp_fusion=False, the fused attention True).
    import xbackend
    from xbackend.fleet.native import NativeLaunch

    device, rt = simulated(target), xbackend.runtime()
    impls = [i for op in xbackend._api.kernel_ops() for i in rt.candidates(op) if i.runs_on(device)]
    plans = [fc._classify(_plan(i.op, i.qualname), device, rt) for i in impls]
    seen = {}
    for default in ("0", "1"):
        for p in (p for p in plans if p.kind == "triton"):
            for shape in fc.run_in_worker(_worker.capture_shapes, device.arch, device.vendor, p.impl.fn, p.impl.supports,
                                          p.op, "bfloat16", (0,), env={"TRITON_DEFAULT_FP_FUSION": default}):  # fmt: skip
                for launch in shape.launches:
                    if isinstance(launch.spec, NativeLaunch):  # nvcc's contraction is its flags (--fmad=false)
                        continue
                    fusion = launch.spec.option["enable_fp_fusion"]
                    assert seen.setdefault((p.chosen, shape.shape), fusion) == fusion, (p.chosen, shape.shape)
                    if p.impl.precision == xbackend.EXACT:
                        assert fusion is False, (p.chosen, launch.spec.name)
                    if p.chosen == "cuda:na_triton":
                        assert fusion is True
    assert len(seen) >= 5
