"""The CUDA C++ sources the fleet compiles with nvcc, as data: whole impls (``NATIVE``) and kernels a
Triton impl's launch path launches instead of one of its own where the device and inputs allow
(``NATIVE_LAUNCHES``).

A native launch inside a Triton impl is captured like the impl's Triton launches (``_capture.py``):
the simulated GPU replaces its launch function with a recorder, and answers its availability check
(which builds the extension on this host) as the target would with the extension built, so the plan
shows what the target runs once its toolchain has built it. Whether the launch path takes it still
comes from the impl's own test (device, inputs, environment switches).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xbackend._cachekey import sources_digest

__all__ = ["NATIVE", "NATIVE_LAUNCHES", "NativeLaunch", "NativeSource", "native_key"]


@dataclass(frozen=True)
class NativeSource:
    """A CUDA C++ file whose kernels an impl launches."""

    path: str  # relative to the xbackend package
    flags: tuple[str, ...]  # nvcc flags besides the arch
    block_warps: int  # warps per block of its default launch, for the occupancy estimate
    # The C++ element type of each dtype: a plan reports the instantiations whose first template
    # argument is its dtype's.
    types: tuple[tuple[str, str], ...] = (("bfloat16", "__nv_bfloat16"), ("float16", "__half"), ("float32", "float"))
    # Appended to the target's arch for nvcc: "a" builds the arch-specific target (sm_90a: wgmma, TMA).
    arch_suffix: str = ""
    # Dynamic shared memory per block, which ptxas's resource report leaves out.
    dynamic_shared_bytes: int = 0

    def instantiates(self, kernel: str, dtype: str) -> bool:
        ctype = dict(self.types).get(dtype)
        return ctype is None or "<" not in kernel or kernel.split("<", 1)[1].split(",")[0].strip(" >") == ctype


@dataclass(frozen=True)
class NativeLaunch:
    """A CUDA C++ kernel that a Triton impl's launch path launches through ``launch`` after asking
    ``available`` (both "module:function"); captured in the impl's launch list in its place."""

    launch: str
    available: str
    source: NativeSource


NATIVE: dict[str, NativeSource] = {
    # The extension's own nvcc flags (_cuda_build.JitExtension._build) and its default 128-thread
    # blocks (kBlockThreads in gated_residual.cu).
    "cuda:cuda_vec": NativeSource("kernels/gated_residual.cu", ("-O3", "--fmad=false"), 4),
}

NATIVE_LAUNCHES: tuple[NativeLaunch, ...] = (
    # na_triton's shift launch on sm90 at head_dim 64 (na_sm90.takes). Its extension's flags and
    # sm_90a target (na_sm90.EXTENSION), 128-thread blocks and kSmem (na_sm90.cu: q, a 3-slot ring of K
    # and V blocks, 1 KiB of alignment slack).
    NativeLaunch("xbackend.kernels.na_sm90:shift_launch", "xbackend.kernels.na_sm90:available",
                 NativeSource("kernels/na_sm90.cu", ("-O3", "--fmad=false"), 4, arch_suffix="a",
                              dynamic_shared_bytes=64 * 128 + 3 * (56 * 128 + 64 * 128) + 1024)),
)


def native_key(src: NativeSource, arch: str) -> tuple[str, str, tuple[str, ...], str]:
    """(absolute path, nvcc arch, flags, digest of the source and the package headers it includes):
    one compile's cache key."""
    path = Path(__file__).resolve().parent.parent / src.path
    digest = sources_digest([path], [path.parent], src.flags) if path.exists() else ""
    return (str(path), arch + src.arch_suffix, src.flags, digest)
