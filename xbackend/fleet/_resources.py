"""What a compiled kernel uses of a GPU (registers, spills, shared memory / LDS) and how many of its
warps fit on one SM / CU, from the compiler's own reports and a table of hardware limits."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

__all__ = [
    "ARCH_LIMITS",
    "ArchLimits",
    "Occupancy",
    "Resources",
    "amdgcn_resources",
    "cubin_resources",
    "occupancy",
    "ptxas_resources",
]


@dataclass(frozen=True)
class ArchLimits:
    """Per-SM (NVIDIA) / per-CU (AMD) limits that bound how many warps / waves are resident."""

    vendor: str
    warp_size: int
    max_warps: int  # resident warps per SM / waves per CU
    max_blocks: int  # resident thread blocks per SM / workgroups per CU
    registers: int  # NVIDIA: 32-bit registers per SM; AMD: VGPRs per lane of one SIMD
    register_granule: int  # NVIDIA: registers per warp allocation unit; AMD: VGPR allocation granule
    shared: int  # bytes of shared memory per SM / LDS per CU
    shared_reserved: int  # bytes the hardware reserves per block (NVIDIA: system use)
    simds: int = 1  # AMD: SIMDs per CU (a workgroup's waves spread over them)
    waves_per_simd: int = 0  # AMD: wave slots per SIMD
    sgprs: int = 0  # AMD: scalar registers per SIMD
    sgpr_granule: int = 0  # AMD: SGPR allocation granule


# NVIDIA: CUDA C++ Programming Guide, "Compute Capabilities", technical specifications for compute
# capability 9.0 (H100/H200) and 10.0 / 10.3 (B200 / B300): 64K 32-bit registers per SM, at most 64
# resident warps and 32 resident blocks per SM, 228 KB of shared memory per SM of which 1 KB is
# reserved per block. Registers are allocated per warp in units of 256 (the CUDA occupancy
# calculator's register allocation unit for compute capability >= 5.0).
_HOPPER_BLACKWELL = ArchLimits(
    vendor="cuda",
    warp_size=32,
    max_warps=64,
    max_blocks=32,
    registers=65536,
    register_granule=256,
    shared=228 * 1024,
    shared_reserved=1024,
)
# AMD CDNA3 (gfx942, MI300X/MI325X) and CDNA4 (gfx950, MI350X/MI355X): 4 SIMDs per CU, 8 wave64 slots
# per SIMD, 512 unified VGPRs (arch VGPRs + AGPRs) per lane of a SIMD allocated in granules of 8, 800
# SGPRs per SIMD in granules of 16 (LLVM AMDGPUUsage / AMDGPUBaseInfo for gfx90a+), at most 16
# workgroups per CU once a workgroup spans several waves (one barrier each, 16 per CU). LDS per CU:
# 64 KB on CDNA3, 160 KB on CDNA4 (AMD CDNA3 / CDNA4 ISA guides and white papers).
_CDNA = dict(
    vendor="rocm",
    warp_size=64,
    max_warps=32,
    max_blocks=16,
    registers=512,
    register_granule=8,
    shared_reserved=0,
    simds=4,
    waves_per_simd=8,
    sgprs=800,
    sgpr_granule=16,
)
ARCH_LIMITS: dict[str, ArchLimits] = {
    "sm90": _HOPPER_BLACKWELL,
    "sm100": _HOPPER_BLACKWELL,
    "sm103": _HOPPER_BLACKWELL,
    "gfx942": ArchLimits(shared=64 * 1024, **_CDNA),
    "gfx950": ArchLimits(shared=160 * 1024, **_CDNA),
}


@dataclass(frozen=True)
class Resources:
    """One compiled kernel's resource use, as its compiler reports it."""

    registers: int  # NVIDIA: registers per thread; AMD: VGPRs per lane (arch VGPRs + AGPRs)
    sgprs: int = 0  # AMD: scalar registers per wave
    agprs: int = 0  # AMD: accumulation registers (part of ``registers``)
    spill_bytes: int = 0  # NVIDIA: bytes per thread in local memory (stack frame + local); AMD: scratch per lane
    spill_stores: int = 0  # NVIDIA (ptxas): spill-store bytes; AMD: spilled VGPRs + SGPRs
    shared_bytes: int = 0  # per block, the kernel's own: dynamic (Triton) plus static, no system reservation
    compiler_occupancy: int | None = None  # AMD: the LLVM backend's waves-per-SIMD estimate (registers only)


@dataclass(frozen=True)
class Occupancy:
    warps: int  # resident warps per SM / waves per CU
    blocks: int  # resident blocks per SM / workgroups per CU
    limiter: str  # what bounds it: "registers", "shared", "warps", "blocks", "sgprs"

    def __str__(self) -> str:
        return f"{self.warps} ({self.limiter})"


def occupancy(arch: str, res: Resources, num_warps: int) -> Occupancy | None:
    """Resident warps (NVIDIA) / waves (AMD) of this kernel on one SM / CU, or None for an arch
    without a limits entry."""
    lim = ARCH_LIMITS.get(arch)
    if lim is None or num_warps <= 0:
        return None
    if lim.vendor == "cuda":
        per_warp = math.ceil(max(res.registers, 1) * lim.warp_size / lim.register_granule) * lim.register_granule
        bounds = {
            "warps": lim.max_warps // num_warps,
            "blocks": lim.max_blocks,
            "registers": (lim.registers // per_warp) // num_warps,
            "shared": lim.shared // (res.shared_bytes + lim.shared_reserved),
        }
    else:
        vgprs = math.ceil(max(res.registers, 1) / lim.register_granule) * lim.register_granule
        sgprs = math.ceil(max(res.sgprs, 1) / lim.sgpr_granule) * lim.sgpr_granule
        per_simd = math.ceil(num_warps / lim.simds)  # a workgroup's waves on its busiest SIMD
        bounds = {
            "warps": lim.waves_per_simd // per_simd,
            "blocks": lim.max_blocks,
            "registers": min(lim.waves_per_simd, lim.registers // vgprs) // per_simd,
            "sgprs": min(lim.waves_per_simd, lim.sgprs // sgprs) // per_simd,
            "shared": lim.shared // res.shared_bytes if res.shared_bytes else lim.max_blocks,
        }
    # The first listed wins a tie: a kernel at the hardware's own limit reports "warps", not a resource.
    limiter = min(bounds, key=lambda k: bounds[k])
    blocks = bounds[limiter]
    return Occupancy(blocks * num_warps, blocks, limiter)


# -- NVIDIA ------------------------------------------------------------------------------------------
_RESOURCE_LINE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def nvidia_tool(name: str) -> str | None:
    """A CUDA binary tool: Triton's bundled copy (``triton/backends/nvidia/bin``), else one on PATH."""
    try:
        import triton

        bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
        if os.path.exists(bundled):
            return bundled
    except ImportError:  # pragma: no cover - compile paths need triton anyway
        pass
    return shutil.which(name)


def cubin_resources(cubin: bytes, dynamic_shared: int, reserved_in_static: int = 0) -> dict[str, Resources]:
    """Per function of a cubin, from ``cuobjdump --dump-resource-usage``. ptxas puts spills in the
    ABI stack frame and these kernels call no functions, so STACK + LOCAL is spill space. Shared is
    the kernel's own: ``dynamic_shared`` (what Triton launches with) plus the static size, less
    ``reserved_in_static``, the per-block system reservation an arch's cubins fold into their static
    size (sm90+: 1 KB, whenever the kernel uses shared memory; measured with ptxas 13.0/13.4: an
    empty nvcc kernel reports SHARED:1024 on sm_90/sm_100 and 0 on sm_80). ``occupancy`` adds it back."""
    tool = nvidia_tool("cuobjdump")
    if tool is None:
        raise RuntimeError("cuobjdump not found (Triton's NVIDIA backend ships one)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True).stdout
    found: dict[str, Resources] = {}
    name = ""
    for line in out.splitlines():
        if m := re.match(r"\s*Function (\S+):", line):
            name = m.group(1)
        elif m := _RESOURCE_LINE.search(line):
            reg, stack, shared, local = map(int, m.groups())
            own = max(0, shared - reserved_in_static) + dynamic_shared
            found[name] = Resources(registers=reg, spill_bytes=stack + local, shared_bytes=own)
    return found


def ptxas_resources(log: str) -> dict[str, Resources]:
    """Per entry function, from ptxas's ``--resource-usage`` / ``-v`` log (nvcc's ``-Xptxas -v``)."""
    found: dict[str, Resources] = {}
    name = ""
    stack = stores = 0
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            name, stack, stores = m.group(1), 0, 0
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line):
            stack, stores = int(m.group(1)), int(m.group(2))
        elif name and (m := re.search(r"Used (\d+) registers", line)):
            smem = re.search(r"(\d+) bytes smem", line)
            found[name] = Resources(
                registers=int(m.group(1)),
                spill_bytes=stack,
                spill_stores=stores,
                shared_bytes=int(smem.group(1)) if smem else 0,
            )
    return found


# -- AMD ---------------------------------------------------------------------------------------------
def _field(text: str, name: str) -> int | None:
    m = re.search(rf"^\s*-?\s*\.{re.escape(name)}:\s+(\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else None


def amdgcn_resources(asm: str, dynamic_lds: int) -> Resources:
    """From the code object metadata at the end of Triton's ``amdgcn`` assembly: ``.vgpr_count``
    (arch VGPRs + AGPRs), ``.sgpr_count``, spill counts, ``.private_segment_fixed_size`` (scratch per
    lane) and ``.group_segment_fixed_size`` (static LDS; Triton's LDS is dynamic: ``dynamic_lds``)."""
    vgprs = _field(asm, "vgpr_count")
    if vgprs is None:
        raise RuntimeError("no .vgpr_count in the amdgcn metadata")
    occ = re.search(r"^; Occupancy: (\d+)", asm, re.MULTILINE)
    return Resources(
        registers=vgprs,
        sgprs=_field(asm, "sgpr_count") or 0,
        agprs=_field(asm, "agpr_count") or 0,
        spill_bytes=_field(asm, "private_segment_fixed_size") or 0,
        spill_stores=(_field(asm, "vgpr_spill_count") or 0) + (_field(asm, "sgpr_spill_count") or 0),
        shared_bytes=(_field(asm, "group_segment_fixed_size") or 0) + dynamic_lds,
        compiler_occupancy=int(occ.group(1)) if occ else None,
    )
