"""DirectLaunch: one compiled kernel per Triton specialisation, launched without Triton's per-call work.

CPU: a fake JIT function stands in for Triton, to prove the cache key separates exactly what Triton
specialises on (pointer alignment, ints equal to 1 / divisible by 16 / 64-bit, constexprs, options).
GPU: the direct path against Triton's own path, bit for bit, on aligned and misaligned inputs.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from xbackend.kernels import _triton_launch as TL  # noqa: E402


class FakeKernel:
    def __init__(self, tag: int) -> None:
        self.tag, self.function, self.packed_metadata, self.launches = tag, object(), object(), []

    def run(self, g0, g1, g2, stream, function, packed, meta, enter, exit_, *args):
        assert function is self.function and packed is self.packed_metadata and enter is None
        self.launches.append(((g0, g1, g2), stream, args))


class FakeJit:
    """What DirectLaunch reads of a JITFunction: params (constexpr or not), device_caches, [grid]."""

    def __init__(self, constexpr: list[bool]) -> None:
        self.params = [SimpleNamespace(num=i, is_constexpr=c) for i, c in enumerate(constexpr)]
        self.device_caches: dict = {}
        self.compiled: list[FakeKernel] = []

    def __getitem__(self, grid):
        def run(*args, **options):
            kernel = FakeKernel(len(self.compiled))
            self.compiled.append(kernel)
            return kernel

        return run


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setattr(TL, "_current_device", lambda: -1)  # CPU tensors report get_device() == -1
    monkeypatch.setattr(TL, "_driver", SimpleNamespace(active=SimpleNamespace(get_current_stream=lambda d: 1234)))
    return FakeJit([False, False, False, True])


def test_second_launch_of_a_specialisation_skips_triton(fake):
    launch = TL.DirectLaunch(fake)
    x, y = torch.zeros(64), torch.zeros(64)
    first = launch((4,), (x, 32, 0.5, 7), num_warps=4)
    second = launch((8, 2), (y, 48, 0.25, 7), num_warps=4)
    assert len(fake.compiled) == 1 and first is second
    # The cached kernel ran once, on the current stream, with y's address passed as an integer.
    assert first.launches == [((8, 2, 1), 1234, (y.data_ptr(), 48, 0.25, 7))]


class CudaLauncher:  # the name and fields of Triton 3.6's NVIDIA launcher
    def __init__(self, scratch: int = 0) -> None:
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.launch_cooperative_grid = False
        self.launch_pdl = False
        self.raw, self.wrapped = [], []

    def launch(self, *args):
        self.raw.append(args)

    def __call__(self, *args):
        self.wrapped.append(args)


class HIPLauncher:  # AMD's: a raw launch with another argument order, no global scratch fields
    def __init__(self) -> None:
        self.launch_cooperative_grid = False
        self.profile_scratch_size = 0
        self.raw, self.wrapped = [], []

    def launch(self, *args):
        self.raw.append(args)

    def __call__(self, *args):
        self.wrapped.append(args)


@pytest.mark.parametrize("launcher,raw", [(CudaLauncher(), True), (CudaLauncher(scratch=64), False), (HIPLauncher(), False)],
                         ids=["cuda", "cuda-with-scratch", "hip"])  # fmt: skip
def test_launch_compiled_calls_the_raw_launcher_only_where_its_arguments_are_known(monkeypatch, launcher, raw):
    monkeypatch.setattr(TL, "_driver", SimpleNamespace(active=SimpleNamespace(get_current_stream=lambda d: 99)))
    kernel = SimpleNamespace(run=launcher, function="fn", packed_metadata="meta")
    TL.launch_compiled(kernel, (3, 2), 0, (11, 22))
    if raw:
        assert launcher.raw == [(3, 2, 1, 99, "fn", False, False, None, None, "meta", None, None, None, 11, 22)]
        assert not launcher.wrapped
    else:
        assert launcher.wrapped == [(3, 2, 1, 99, "fn", "meta", None, None, None, 11, 22)]
        assert not launcher.raw


def test_a_tensor_on_no_gpu_goes_to_triton_without_looping(monkeypatch, fake):
    monkeypatch.setattr(TL, "_current_device", lambda: 0)  # the CPU tensor reports -1: not the current device
    launch = TL.DirectLaunch(fake)
    launch((1,), (torch.zeros(64), 32, 0.5, 7))
    launch((1,), (torch.zeros(64), 32, 0.5, 7))
    assert len(fake.compiled) == 2  # Triton's path both times (it raises its own error on a real GPU)


@pytest.mark.parametrize(
    "change",
    [
        lambda a: (a[0][1:], *a[1:]),  # a pointer no longer 16-byte aligned
        lambda a: (a[0].to(torch.float16), *a[1:]),  # pointer dtype
        lambda a: (a[0], 1, *a[2:]),  # an int equal to 1 (Triton makes it a constexpr)
        lambda a: (a[0], 33, *a[2:]),  # not divisible by 16
        lambda a: (a[0], 2**33, *a[2:]),  # 64-bit
        lambda a: (a[0], 2**63, *a[2:]),  # unsigned 64-bit
        lambda a: (*a[:3], 8),  # a constexpr
    ],
)
def test_each_specialisation_compiles_its_own_kernel(fake, change):
    launch = TL.DirectLaunch(fake)
    args = (torch.zeros(64), 32, 0.5, 7)
    launch((1,), args, num_warps=4)
    launch((1,), change(args), num_warps=4)
    assert len(fake.compiled) == 2


def test_options_are_part_of_the_key(fake):
    launch = TL.DirectLaunch(fake)
    args = (torch.zeros(64), 32, 0.5, 7)
    launch((1,), args, num_warps=4)
    launch((1,), args, num_warps=8)
    assert len(fake.compiled) == 2


def test_unknown_argument_types_and_hooks_take_tritons_path(fake, monkeypatch):
    launch = TL.DirectLaunch(fake)
    args = (torch.zeros(64), 32, 0.5, 7)
    launch((1,), args)
    launch((1,), (torch.zeros(64), True, 0.5, 7))  # a bool: not a type DirectLaunch keys
    launch((1,), args)  # cached: no compile
    assert len(fake.compiled) == 2
    monkeypatch.setattr(TL._knobs.runtime, "launch_enter_hook", lambda *a: None)  # as Triton < 3.6 held it
    launch((1,), args)  # a profiler hook is set: Triton's path every time
    assert len(fake.compiled) == 3


def test_interpreter_functions_always_go_through_triton():
    class Interpreted:
        calls = 0

        def __getitem__(self, grid):
            def run(*args, **options):
                Interpreted.calls += 1

            return run

    launch = TL.DirectLaunch(Interpreted())
    launch((1,), (1,))
    launch((1,), (1,))
    assert Interpreted.calls == 2


gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows", [1, 16, 17, 126])
@pytest.mark.parametrize("offset", [0, 4, 1])
def test_gpu_direct_equals_triton_path(rows, offset):
    from xbackend.kernels import rmsnorm as K
    from xbackend.kernels import triton_gated_residual as G
    from xbackend.kernels import triton_rotary as R
    from xbackend.kernels.rmsnorm import launch as L

    d = 2048
    base = torch.randn(rows * d + offset, device="cuda", dtype=torch.bfloat16)
    x = base[offset:].view(1, rows, d)  # offset 1: a pointer Triton does not see as aligned
    u, w = torch.randn_like(x), torch.randn(d, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(1, 1, d, device="cuda", dtype=torch.bfloat16)
    def rmsnorm_path(direct: bool) -> None:
        L._DIRECT = direct

    def gated_path(direct: bool) -> None:
        G._KERNEL._direct = direct

    def rotary_path(direct: bool) -> None:
        R._KERNEL._direct = direct

    cos = torch.rand(1, rows, d, device="cuda").cos()

    calls = [
        (rmsnorm_path, lambda: K.rmsnorm(x, w, 1e-6, "diffusers", numerics=K.CUDA_NUMERICS)),
        (rmsnorm_path, lambda: K.rmsnorm_fast(x, w, 1e-6, "torch", numerics=K.CUDA_NUMERICS)),
        (rmsnorm_path, lambda: K.rmsnorm_modulate(x, gate, gate, w, 1e-6, "diffusers", numerics=K.CUDA_NUMERICS)),
    ]
    calls.append((gated_path, lambda: G.gated_residual(x, u, gate)))  # x misaligned when offset is odd
    calls.append((rotary_path, lambda: R.rotary_embedding(x, cos, cos)))
    calls.append((rotary_path, lambda: R.rotary_embedding(x[..., : d - 2 * offset], cos[..., : d - 2 * offset],
                                                          cos[..., : d - 2 * offset])))  # strided rows
    if offset % 8 == 0:  # the torch flavour rejects rows aten would not vectorize
        calls.append((rmsnorm_path, lambda: K.rmsnorm(x, w, 1e-6, "torch", numerics=K.CUDA_NUMERICS)))
    for set_direct, fn in calls:
        fn()  # compiles through Triton and caches the handle
        direct = fn()
        set_direct(False)
        try:
            triton_path = fn()
        finally:
            set_direct(True)
        assert torch.equal(direct, triton_path)
    from xbackend.ops.rotary_embedding import reference

    for cols in (d, d - 2 * offset):  # the direct path also equals diffusers' expression
        xs, cs = x[..., :cols], cos[..., :cols]
        assert torch.equal(R.rotary_embedding(xs, cs, cs), reference(xs, cs, cs, "interleaved"))


def test_a_hook_added_to_tritons_chain_is_seen():
    if TL._CHAINS is None:
        pytest.skip("this Triton keeps no HookChain")
    enter = TL._knobs.runtime.launch_enter_hook
    assert not TL.hooked()

    def hook(*args):
        return None

    enter.add(hook)
    try:
        assert TL.hooked()
    finally:
        enter.remove(hook)
    assert not TL.hooked()
