"""gated_residual kernels (Triton, CUDA C++) against eager ``x + update * gate``.

On CPU the Triton kernel runs under TRITON_INTERPRET=1. The interpreter computes fp32 and fp16
exactly like eager (separate fp32 multiply and add, round-to-nearest fp16), so those are compared
with torch.equal; its fp32->bf16 cast truncates, so bf16 is compared within one bf16 rounding.
Bit-exactness of every dtype, and the CUDA C++ kernel, are checked by the GPU tests.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import xbackend
from xbackend.kernels import cuda_gated_residual as cuda_gr
from xbackend.kernels import triton_gated_residual as triton_gr
from xbackend.kernels._cuda_build import first_error_line
from xbackend.kernels._gated_residual_layout import GateLayout, analyze

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HAS_CUDA = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


def _rand(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, device: str = "cpu") -> torch.Tensor:
    return torch.randn(shape, generator=gen, device=device).to(dtype)


def _reference(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x + update * gate


def _check_close(out: torch.Tensor, x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> None:
    ref = _reference(x, update, gate)
    assert out.dtype == ref.dtype and out.shape == ref.shape and out.is_contiguous()
    if ref.dtype != torch.bfloat16:
        assert torch.equal(out, ref)
        return
    # The interpreter truncates where eager rounds: each of the two roundings (product, sum) may
    # be off by one bf16 step (2**-7 relative), so bound the error by both magnitudes.
    prod = update.double() * gate.double()
    bound = 2**-6 * (prod.abs() + ref.double().abs()) + 1e-30
    err = (out.double() - ref.double()).abs()
    assert bool((err <= bound).all()), f"max excess {float((err - bound).max())}"


# (x shape, gate shape) covering every gate form the op promises, plus awkward sizes.
CPU_CASES = [
    ((2, 33, 67), (2, 33, 67)),  # full, odd D
    ((3, 17, 64), (3, 1, 64)),  # [B,1,D], B > 1
    ((2, 33, 67), (1, 1, 67)),  # [1,1,D] on B > 1
    ((2, 33, 67), (67,)),  # [D]
    ((2, 33, 67), (2, 33, 1)),  # per-token
    ((2, 6, 1), (2, 6, 1)),  # D == 1
    ((2, 3, 4, 5, 24), (2, 1, 1, 1, 24)),  # 5-D x, DiffVAE-style gate
    ((40,), (40,)),  # rank 1
    ((40,), (1,)),  # rank 1, scalar gate
    ((2, 4, 1, 16), (2, 4, 1, 1)),  # per-token over a size-1 inner dim
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "gate_shape"), CPU_CASES)
def test_triton_gate_forms(shape: tuple[int, ...], gate_shape: tuple[int, ...], dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(hash((shape, gate_shape)) % 2**31)
    x, update, gate = _rand(shape, dtype, gen), _rand(shape, dtype, gen), _rand(gate_shape, dtype, gen)
    assert triton_gr.supports(x, update, gate) is None
    out = triton_gr.gated_residual(x, update, gate)
    _check_close(out, x, update, gate)
    assert out.data_ptr() not in (x.data_ptr(), update.data_ptr(), gate.data_ptr())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("block_d", "block_rows"),
    [(16, 4), (32, 8), (128, 1)],  # ragged tiles; tiles straddling gate rows (L=7 not % 4 or 8)
)
@pytest.mark.parametrize("per_token", [False, True])
def test_triton_launch_configs(block_d: int, block_rows: int, per_token: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(7)
    x, update = _rand((3, 7, 40), dtype, gen), _rand((3, 7, 40), dtype, gen)
    gate = _rand((3, 7, 1) if per_token else (3, 1, 40), dtype, gen)
    out = triton_gr.gated_residual(x, update, gate, block_d=block_d, block_rows=block_rows, num_warps=2)
    _check_close(out, x, update, gate)


def test_triton_full_gate_tiles_identity_rows() -> None:
    gen = torch.Generator().manual_seed(3)
    x, update, gate = (_rand((5, 9, 24), torch.float32, gen) for _ in range(3))
    out = triton_gr.gated_residual(x, update, gate, block_d=8, block_rows=4)
    assert torch.equal(out, _reference(x, update, gate))


def test_triton_strided_gate_from_modulation_chunk() -> None:
    """A gate sliced out of a [B, 6, D] adaLN modulation tensor has row stride 6*D."""
    gen = torch.Generator().manual_seed(5)
    x, update = _rand((2, 11, 48), torch.float16, gen), _rand((2, 11, 48), torch.float16, gen)
    gate = _rand((2, 6, 48), torch.float16, gen)[:, 2:3]
    assert not gate.is_contiguous()
    assert torch.equal(triton_gr.gated_residual(x, update, gate), _reference(x, update, gate))


# A float32 gate under a half x (Wan's residual): the product and the sum in fp32, one rounding to x's dtype.
F32_GATE_CASES = [((2, 9, 64), (2, 1, 64)), ((3, 5, 40), (40,)), ((2, 7, 48), (2, 7, 1)), ((2, 4, 24), (2, 4, 24))]


@pytest.mark.parametrize(("shape", "gate_shape"), F32_GATE_CASES)
def test_triton_float32_gate_under_fp16_x_rounds_once(shape, gate_shape) -> None:
    """fp16 rounds to nearest in the interpreter too: eager's promoted result bit for bit, which two
    fp16 roundings (the gate cast to x's dtype) miss on these inputs."""
    gen = torch.Generator().manual_seed(11)
    x, update = _rand(shape, torch.float16, gen), _rand(shape, torch.float16, gen)
    gate = _rand(gate_shape, torch.float32, gen) * 0.37
    assert triton_gr.supports(x, update, gate) is None
    out = triton_gr.gated_residual(x, update, gate)
    want = (x + update * gate).to(x.dtype)
    assert out.dtype == torch.float16 and torch.equal(out, want)
    assert not torch.equal(want, x + (update * gate).to(x.dtype))  # the test tells one rounding from two


def test_triton_float32_gate_under_bf16_x_and_chunk_of_a_table() -> None:
    gen = torch.Generator().manual_seed(13)
    x, update = _rand((2, 11, 48), torch.bfloat16, gen), _rand((2, 11, 48), torch.bfloat16, gen)
    gate = _rand((2, 6, 48), torch.float32, gen)[:, 2:3]  # Wan: a [B,1,D] chunk of a [B,6,D] fp32 table
    out = triton_gr.gated_residual(x, update, gate)
    want = (x.double() + update.double() * gate.double())
    assert out.dtype == torch.bfloat16
    assert bool(((out.double() - want).abs() <= 2**-7 * want.abs() + 1e-30).all())  # one (truncating) rounding


def test_float32_gate_reasons() -> None:
    """The Triton kernel takes a float32 gate under a half x; the CUDA C++ kernel reads one dtype and
    says so; any other mix is refused by both."""
    x = torch.randn(2, 4, 8).bfloat16()
    assert triton_gr.supports(x, x, torch.randn(2, 1, 8)) is None
    assert cuda_gr.supports(x, x, torch.randn(2, 1, 8)) == "x, update and gate must share one dtype"
    for gate in (torch.randn(2, 1, 8).half(), torch.randn(2, 1, 8).double()):
        for kernel in (triton_gr, cuda_gr):
            assert "share one dtype" in kernel.supports(x, x, gate)
    assert "share one dtype" in triton_gr.supports(x.float(), x.float(), torch.randn(2, 1, 8).bfloat16())


@pytest.mark.parametrize("shape", [(0, 5, 8), (2, 0, 8), (2, 3, 0)])
def test_triton_empty(shape: tuple[int, ...]) -> None:
    x = torch.empty(shape, dtype=torch.bfloat16)
    gate = torch.empty((shape[0], 1, shape[2]), dtype=torch.bfloat16)
    assert triton_gr.supports(x, x, gate) is None
    out = triton_gr.gated_residual(x, x, gate)
    assert out.shape == x.shape and out.dtype == x.dtype and out.numel() == 0


def test_layout_values() -> None:
    x = torch.empty(2, 5, 64)
    assert analyze(x, x, torch.empty(2, 1, 64)) == GateLayout(10, 64, False, 5, 64)
    assert analyze(x, x, torch.empty(64)) == GateLayout(10, 64, False, 10, 0)
    assert analyze(x, x, torch.empty(2, 5, 1)) == GateLayout(10, 64, True, 1, 1)
    assert analyze(x, x, torch.empty(2, 6, 64)[:, 3:4]) == GateLayout(10, 64, False, 5, 384)
    full = analyze(x, x, torch.empty(2, 5, 64))
    assert isinstance(full, GateLayout) and full.full and full.inner == 1
    assert not GateLayout(10, 64, False, 5, 64).full


def _unsupported_cases() -> list[tuple[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor], str]]:
    x = torch.randn(2, 4, 8)
    return [
        ("int dtype", (x.int(), x.int(), x.int()), "dtype torch.int32 not supported"),
        ("mixed dtype", (x, x, x.half()), "share one dtype"),
        ("update shape", (x, x[:, :3], x), "update shape differs"),
        ("x strided", (x.transpose(0, 1), x.transpose(0, 1), x[:1, :1]), "x must be contiguous"),
        ("update strided", (x, x.transpose(1, 2).contiguous().transpose(1, 2), x[:1, :1]), "update must be"),
        ("gate rank", (x, x, x[None]), "more dims than x"),
        ("gate last dim", (x, x, torch.randn(2, 1, 4)), "last dim must be D or 1"),
        ("gate last strided", (x, x, torch.randn(2, 1, 16)[..., ::2]), "last dim must be contiguous"),
        ("inner-only broadcast", (x, x, torch.randn(1, 4, 8)), "outer dim but not an inner one"),
        ("uneven rows", (x, x, torch.randn(4, 2, 8).transpose(0, 1)), "not evenly strided"),
        ("not broadcastable", (x, x, torch.randn(2, 3, 8)), "does not broadcast"),
        ("0-d", (torch.tensor(1.0), torch.tensor(1.0), torch.tensor(1.0)), "at least one dim"),
    ]


@pytest.mark.parametrize(("name", "args", "reason"), _unsupported_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_supports_reasons(name: str, args: tuple[torch.Tensor, ...], reason: str) -> None:
    for kernel in (triton_gr, cuda_gr):
        got = kernel.supports(*args)
        assert got is not None and reason in got, (name, kernel.__name__, got)
    with pytest.raises(ValueError, match=reason):
        triton_gr.gated_residual(*args)


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-only answers")
def test_cuda_kernel_reports_instead_of_raising_on_cpu() -> None:
    reason = cuda_gr.available()
    assert isinstance(reason, str) and reason
    x = torch.randn(2, 3, 8)
    assert cuda_gr.supports(x, x, x[:, :1]) is None  # shapes only: device and vendor are resolver filters
    with pytest.raises(cuda_gr.CudaKernelUnavailable, match=reason):
        cuda_gr.gated_residual(x, x, x[:, :1])


def test_cuda_first_error_line_picks_the_compiler_error() -> None:
    exc = RuntimeError("Error building extension 'x':\n[1/3] nvcc ...\nfoo.cu(3): error: identifier \"y\" is undefined\n")
    assert first_error_line(exc) == 'build failed: foo.cu(3): error: identifier "y" is undefined'


# ---------------------------------------------------------------------------------------------
# GPU: bit-exact (torch.equal) against eager on the same device.

# The residual-gate workloads of LTX-2.3, Ideogram 4 and FLUX.2, and the LTX-2 block (hidden 4096
# video / 2048 audio, sequence 8160 / 32640).
WORKLOAD_SHAPES = [
    (1, 32640, 4096),
    (1, 8160, 4096),
    (1, 4096, 4608),
    (1, 4608, 3072),
    (1, 4096, 3072),
    (1, 512, 3072),
    (1, 126, 2048),
    (1, 8160, 2048),
    (1, 32640, 2048),
]
GATE_FORMS = ("full", "bcast", "per_token")


def _gate_shape(shape: tuple[int, ...], form: str) -> tuple[int, ...]:
    if form == "full":
        return shape
    if form == "bcast":
        return (shape[0], *[1] * (len(shape) - 2), shape[-1])
    return (*shape[:-1], 1)


def _gpu_inputs(shape, gate_shape, dtype, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(_rand(s, dtype, gen, "cuda") for s in (shape, shape, gate_shape))


def _assert_exact(kernel, x, update, gate) -> None:
    assert kernel.supports(x, update, gate) is None
    ref = _reference(x, update, gate)
    out = kernel.gated_residual(x, update, gate)
    mismatches = int((out != ref).sum())
    assert torch.equal(out, ref), f"{mismatches} of {ref.numel()} elements differ"


KERNELS = pytest.mark.parametrize("kernel", [triton_gr, cuda_gr], ids=["triton", "cuda"])


@pytest.mark.gpu
@gpu
@KERNELS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("form", GATE_FORMS)
@pytest.mark.parametrize("shape", WORKLOAD_SHAPES, ids=str)
def test_gpu_seed_shapes_exact(kernel, shape, form: str, dtype: torch.dtype) -> None:
    _assert_exact(kernel, *_gpu_inputs(shape, _gate_shape(shape, form), dtype, seed=len(shape) + shape[1]))


GPU_EXTRA = [
    ((2, 4080, 4096), (2, 1, 4096)),  # B > 1 broadcast
    ((4, 126, 2048), (1, 1, 2048)),  # [1,1,D] on B > 1
    ((2, 4080, 3072), (2, 4080, 1)),  # per-token, B > 1
    ((3, 77, 1001), (3, 1, 1001)),  # odd D: scalar path
    ((3, 77, 1001), (3, 77, 1001)),
    ((3, 77, 1001), (3, 77, 1)),
    ((1, 127, 3072), (1, 1, 3072)),  # rows not a multiple of the row tile
    ((2, 5, 16, 16, 512), (2, 1, 1, 1, 512)),  # 5-D x
    ((3, 7, 5), (3, 7, 5)),  # fewer elements than a 16-byte pack per row
    ((4097,), (4097,)),  # flat path with a tail
]


@pytest.mark.gpu
@gpu
@KERNELS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("shape", "gate_shape"), GPU_EXTRA, ids=str)
def test_gpu_extra_forms_exact(kernel, shape, gate_shape, dtype: torch.dtype) -> None:
    _assert_exact(kernel, *_gpu_inputs(shape, gate_shape, dtype, seed=11))


@pytest.mark.gpu
@gpu
@KERNELS
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_misaligned_and_strided_exact(kernel, dtype: torch.dtype) -> None:
    gen = torch.Generator(device="cuda").manual_seed(13)
    n = 2 * 300 * 1024
    # Storage offset of one element: no 16-byte packs, the scalar path must take it.
    x, update = (_rand((n + 1,), dtype, gen, "cuda")[1:].view(2, 300, 1024) for _ in range(2))
    gate = _rand((2 * 1024 + 1,), dtype, gen, "cuda")[1:].view(2, 1, 1024)
    _assert_exact(kernel, x, update, gate)
    # Gate sliced from a [B, 6, D] modulation tensor (row stride 6*D).
    x, update = (_rand((2, 300, 1024), dtype, gen, "cuda") for _ in range(2))
    _assert_exact(kernel, x, update, _rand((2, 6, 1024), dtype, gen, "cuda")[:, 4:5])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows_per_thread", [1, 2, 4, 8])
def test_gpu_cuda_rows_per_thread_exact(rows_per_thread: int) -> None:
    x, update, gate = _gpu_inputs((2, 1001, 3072), (2, 1, 3072), torch.bfloat16, seed=17)
    out = cuda_gr.gated_residual(x, update, gate, rows_per_thread=rows_per_thread)
    assert torch.equal(out, _reference(x, update, gate))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("packs_per_thread", [1, 2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_cuda_packs_per_thread_exact(packs_per_thread: int, dtype: torch.dtype) -> None:
    # Full gate, flat path; 3 * 1001 * 999 elements leave partial blocks and a tail that fills no pack.
    x, update, gate = _gpu_inputs((3, 1001, 999), (3, 1001, 999), dtype, seed=19)
    out = cuda_gr.gated_residual(x, update, gate, packs_per_thread=packs_per_thread)
    assert torch.equal(out, _reference(x, update, gate))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("block_cols", [32, 64, 128, 192, 256])
@pytest.mark.parametrize(("shape", "gate_shape"), [((2, 77, 3072), (2, 1, 3072)), ((3, 50, 4608), (3, 50, 1))])
def test_gpu_cuda_block_cols_exact(block_cols: int, shape, gate_shape) -> None:
    x, update, gate = _gpu_inputs(shape, gate_shape, torch.bfloat16, seed=23)
    out = cuda_gr.gated_residual(x, update, gate, block_cols=block_cols)
    assert torch.equal(out, _reference(x, update, gate))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows_per_thread", [1, 2, 4, 8])
def test_gpu_cuda_gate_row_modes_exact(rows_per_thread: int) -> None:
    """Every way the row tile finds gate rows, with R rows per thread: one gate row for all (kSingle),
    R rows sharing one ([B,1,D] with L % R == 0: kPerTile), a strided per-row gate (kPerRow) and
    L % R != 0 (kDivide)."""
    gen = torch.Generator(device="cuda").manual_seed(37)
    d = 1024
    x, update = (_rand((2, 24, d), torch.bfloat16, gen, "cuda") for _ in range(2))
    odd_x, odd_update = (_rand((2, 25, d), torch.bfloat16, gen, "cuda") for _ in range(2))
    cases = [
        (x, update, _rand((1, 1, d), torch.bfloat16, gen, "cuda")),
        (x, update, _rand((2, 1, d), torch.bfloat16, gen, "cuda")),
        (x, update, _rand((2, 24, 2 * d), torch.bfloat16, gen, "cuda")[..., :d]),
        (odd_x, odd_update, _rand((2, 1, d), torch.bfloat16, gen, "cuda")),
    ]
    for args in cases:
        assert torch.equal(cuda_gr.gated_residual(*args, rows_per_thread=rows_per_thread), _reference(*args))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("load_hint", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_cuda_load_hints_exact(load_hint: int, dtype: torch.dtype) -> None:
    """Plain and evict_first loads on every path that takes the hint (flat; row tiles with a gate row per
    batch, one gate row for all, a strided per-row gate and a per-token gate), and the scalar fallback
    given the knob: a cache hint must never change a bit."""
    gen = torch.Generator(device="cuda").manual_seed(53)
    x, update = (_rand((2, 77, 1000), dtype, gen, "cuda") for _ in range(2))
    gates = [_rand(s, dtype, gen, "cuda") for s in ((2, 77, 1000), (2, 1, 1000), (1000,), (2, 77, 1))]
    gates.append(_rand((2, 77, 2000), dtype, gen, "cuda")[..., :1000])  # kPerRow, row stride 2000
    for gate in gates:
        out = cuda_gr.gated_residual(x, update, gate, load_hint=load_hint)
        assert torch.equal(out, _reference(x, update, gate)), tuple(gate.shape)
    odd = tuple(_rand((3, 5, 7), dtype, gen, "cuda") for _ in range(3))  # no 16-byte packs: scalar path
    assert torch.equal(cuda_gr.gated_residual(*odd, load_hint=load_hint), _reference(*odd))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("form", GATE_FORMS)
@pytest.mark.parametrize("shape", [(1, 32760, 5120), (1, 4608, 3072), (2, 77, 5120)], ids=str)
def test_gpu_triton_float32_gate_exact(shape, form: str, dtype: torch.dtype) -> None:
    """Wan's residual ([B, 1, D] fp32 gate chunks, 32760 tokens of 5120): eager's promoted sum, bit for bit."""
    gen = torch.Generator(device="cuda").manual_seed(53)
    x, update = _rand(shape, dtype, gen, "cuda"), _rand(shape, dtype, gen, "cuda")
    gate = _rand(_gate_shape(shape, form), torch.float32, gen, "cuda")
    assert triton_gr.supports(x, update, gate) is None
    assert torch.equal(triton_gr.gated_residual(x, update, gate), (x + update * gate).to(dtype))


@pytest.mark.gpu
@gpu
def test_gpu_cuda_more_row_tiles_than_grid_y() -> None:
    # 300000 rows of 64 bf16 (8 packs), 32-thread blocks of 4 rows: 75000 row tiles > gridDim.y's 65535.
    x, update, gate = _gpu_inputs((1, 300000, 64), (1, 1, 64), torch.bfloat16, seed=41)
    assert torch.equal(cuda_gr.gated_residual(x, update, gate, block_cols=32), _reference(x, update, gate))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    "knob", [{"rows_per_thread": 3}, {"packs_per_thread": 8}, {"block_cols": 48}, {"load_hint": 3}], ids=str
)
def test_gpu_cuda_bad_knob_names_the_argument(knob: dict) -> None:
    # The binding sets Python errors and never throws: a C++ exception crashed the H200 image (#3).
    x, update, gate = _gpu_inputs((2, 8, 64), (2, 1, 64), torch.bfloat16, seed=29)
    name = next(iter(knob))
    with pytest.raises(RuntimeError, match=f"gated_residual: {name} must be"):
        cuda_gr.gated_residual(x, update, gate, **knob)


@pytest.mark.gpu
@gpu
def test_gpu_cuda_direct_call_rejects_what_supports_rejects() -> None:
    x, update, gate = _gpu_inputs((2, 8, 64), (2, 1, 64), torch.bfloat16, seed=31)
    cases = [
        ((x.transpose(1, 2), update.transpose(1, 2), gate.transpose(1, 2)[:, :1]), "x must be contiguous"),
        ((x, update, gate.float()), "x, update and gate must share one dtype"),
        ((x, update[:, :4], gate), "update shape differs from x"),
        ((x, update, gate[..., :3]), "gate last dim must be D or 1"),
    ]
    for args, reason in cases:
        assert cuda_gr.supports(*args) == reason
        with pytest.raises(RuntimeError, match=f"gated_residual: {reason}"):
            cuda_gr.gated_residual(*args)


@pytest.mark.gpu
@gpu
def test_gpu_cuda_available() -> None:
    assert cuda_gr.available() is None


@pytest.mark.gpu
@gpu
def test_gpu_cuda_entry_is_the_extension_function() -> None:
    """The CUDA plugin's impl caches the C function itself (no Python frame per call), which
    must check its arguments as the wrapper does."""
    x, update, gate = _gpu_inputs((2, 8, 64), (2, 1, 64), torch.bfloat16, seed=43)
    cuda_gr.gated_residual(x, update, gate)  # builds the extension
    fn = cuda_gr.entry()
    assert fn is not cuda_gr.gated_residual and type(fn).__name__ == "builtin_function_or_method"
    assert torch.equal(fn(x, update, gate), _reference(x, update, gate))
    with pytest.raises(TypeError, match="gated_residual: gate must be a torch.Tensor, got float"):
        fn(x, update, 0.5)
    with pytest.raises(TypeError, match="gated_residual: takes 3 tensors"):
        fn(x, update)
    with pytest.raises(TypeError, match="gated_residual: block_cols must be an int, got str"):
        fn(x, update, gate, 0, 0, "64", 0)
    with pytest.raises(RuntimeError, match="gated_residual: needs a CUDA tensor"):
        fn(x.cpu(), update.cpu(), gate.cpu())
    # torch throws in C++ for a tensor without sizes: raised as Python, the process lives on.
    nested = torch.nested.nested_tensor([x[0], x[1, :4]], layout=torch.strided, device=x.device, dtype=x.dtype)
    with pytest.raises(RuntimeError, match="gated_residual: torch error: .*sizes"):
        fn(nested, nested, nested)


@pytest.mark.gpu
@gpu
def test_gpu_runtime_caches_the_c_function() -> None:
    """Through get_op the CUDA impl's cached callable is the extension's C function (no Python frame
    between Op.__call__ and the launch)."""
    from xbackend._runtime import runtime

    x, update, gate = _gpu_inputs((2, 8, 64), (2, 1, 64), torch.bfloat16, seed=59)
    with torch.no_grad():
        out = xbackend.get_op("gated_residual")(x, update, gate)
    assert torch.equal(out, _reference(x, update, gate))
    fns = [e.fn for cache in runtime()._caches.values() for e in cache.values()
           if e.impl is not None and e.impl.name == "cuda_vec"]
    assert fns and all(fn is cuda_gr.entry() for fn in fns)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("gate_form", ["full", "bcast", "token"])
def test_gpu_cuda_large_offsets_exact(gate_form: str) -> None:
    """Either side of 2**31 elements (4 GiB of bf16 per tensor): element offsets must not wrap in 32 bits."""
    d = 4096
    for rows in (2**19 - 1, 2**19 + 3):  # 2.15e9 elements either side of 2**31
        shape = (1, rows, d)
        gate_shape = {"full": shape, "bcast": (1, 1, d), "token": (1, rows, 1)}[gate_form]
        x, update, gate = _gpu_inputs(shape, gate_shape, torch.bfloat16, seed=47)
        out = cuda_gr.gated_residual(x, update, gate)
        assert torch.equal(out, _reference(x, update, gate)), rows
        del x, update, gate, out
        torch.cuda.empty_cache()
