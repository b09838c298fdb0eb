"""Device records, the probe that makes them, and the simulated targets used for planning.

Both vendors report device type "cuda" in torch; ROCm is told apart by ``torch.version.hip`` and
names its arch through ``gcnArchName`` ("gfx942:sramecc+:xnack-").
"""

from __future__ import annotations

import functools
import platform
import re
from dataclasses import dataclass

import torch

__all__ = ["BUILTIN_FLEET", "SIMULATED_TARGETS", "TARGET_ALIASES", "Device", "DeviceSpec", "probe", "probed_target", "simulated"]


@dataclass(frozen=True)
class Device:
    """What a resolver needs to know about one device."""

    vendor: str  # "cuda" | "rocm" | "cpu" (or another torch device type)
    arch: str  # "sm90", "sm100", "gfx942", "cpu", ...
    name: str = ""
    index: int | None = None
    simulated: bool = False

    def __str__(self) -> str:
        where = f"{self.vendor}:{self.index}" if self.index is not None else self.vendor
        tag = ", simulated" if self.simulated else ""
        return f"{self.arch} ({self.name or where}{tag})"


def arch_key(arch: str) -> tuple[str, int]:
    """Order arches within a vendor: sm90 < sm100 < sm103 < sm120; gfx90a < gfx942 < gfx950."""
    if m := re.fullmatch(r"sm_?(\d+)[a-z]?", arch):
        return ("sm", int(m.group(1)))
    if m := re.fullmatch(r"gfx([0-9a-f]+)", arch):
        return ("gfx", int(m.group(1), 16))
    return (arch, 0)


@dataclass(frozen=True)
class DeviceSpec:
    """One entry of an impl's device constraint, parsed from a string.

    ``"*"`` any device; ``"cuda"``/``"rocm"``/``"cpu"`` any arch of a vendor; ``"sm90"`` one arch;
    ``"sm90..sm103"`` an inclusive range; ``"sm90.."`` open above; ``"gfx942,gfx950"`` is two specs.
    """

    vendor: str | None  # None: any vendor
    lo: str | None = None
    hi: str | None = None

    @classmethod
    def parse(cls, text: str) -> tuple[DeviceSpec, ...]:
        specs = []
        for part in (p.strip() for p in text.split(",")):
            if part == "*":
                specs.append(cls(None))
            elif part in ("cuda", "rocm", "cpu"):
                specs.append(cls(part))
            else:
                lo, sep, hi = part.partition("..")
                vendor = _vendor_of(lo, text)
                if hi and _vendor_of(hi, text) != vendor:
                    raise ValueError(f"device spec {text!r}: range {part!r} mixes vendors")
                specs.append(cls(vendor, lo, (hi or None) if sep else lo))
        return tuple(specs)

    def matches(self, device: Device) -> bool:
        if self.vendor is not None and self.vendor != device.vendor:
            return False
        key = arch_key(device.arch)
        if self.lo is not None and (key[0] != arch_key(self.lo)[0] or key < arch_key(self.lo)):
            return False
        return self.hi is None or key <= arch_key(self.hi)

    def __str__(self) -> str:
        if self.vendor is None:
            return "*"
        if self.lo is None:
            return self.vendor
        return self.lo if self.lo == self.hi else f"{self.lo}..{self.hi or ''}"


# The devices grammar of Impl.devices, per comma-separated part: "*", a vendor, an arch, or an inclusive
# arch range "lo..hi" / open "lo.." within one vendor.
DEVICES_GRAMMAR = ('"*" | "cuda" | "rocm" | "cpu" | ARCH | ARCH".."ARCH | ARCH".." (comma-separated; '
                   'ARCH: smNN such as sm90, sm100, sm103, or gfxNNN such as gfx942, gfx950)')
_ARCH_VENDORS = ((re.compile(r"sm_?\d+[a-z]?"), "cuda"), (re.compile(r"gfx[0-9a-f]+"), "rocm"), (re.compile(r"cpu"), "cpu"))


def _vendor_of(arch: str, text: str | None = None) -> str:
    for pattern, vendor in _ARCH_VENDORS:
        if pattern.fullmatch(arch):
            return vendor
    where = f"device spec {text!r}: " if text is not None else ""
    hint = ""
    lo, dash, hi = arch.partition("-")
    if dash and all(any(p.fullmatch(a) for p, _ in _ARCH_VENDORS) for a in (lo, hi)):
        hint = f"; a range is written {lo}..{hi}"
    raise ValueError(f"{where}unknown arch {arch!r}{hint}; expected {DEVICES_GRAMMAR}")


SIMULATED_TARGETS: dict[str, Device] = {
    d.arch: d
    for d in (
        Device("cuda", "sm80", "NVIDIA A100", simulated=True),
        Device("cuda", "sm90", "NVIDIA H100/H200", simulated=True),
        Device("cuda", "sm100", "NVIDIA B200", simulated=True),
        Device("cuda", "sm103", "NVIDIA B300", simulated=True),
        Device("cuda", "sm120", "NVIDIA RTX PRO 6000 Blackwell", simulated=True),
        Device("rocm", "gfx942", "AMD Instinct MI300X/MI325X", simulated=True),
        Device("rocm", "gfx950", "AMD Instinct MI350X/MI355X", simulated=True),
        Device("cpu", "cpu", "CPU", simulated=True),
    )
}
TARGET_ALIASES = {
    "a100": "sm80",
    "h100": "sm90",
    "h200": "sm90",
    "b200": "sm100",
    "gb200": "sm100",
    "b300": "sm103",
    "gb300": "sm103",
    "rtxpro6000": "sm120",
    "mi300x": "gfx942",
    "mi325x": "gfx942",
    "mi350x": "gfx950",
    "mi355x": "gfx950",
}


# The GPU types `xbackend fleet` plans when given none, and whose goldens the repository checks in.
BUILTIN_FLEET = ("h100", "h200", "b200", "b300", "mi300x", "mi355x")


def simulated(target: str, extra: dict[str, Device] | None = None) -> Device:
    """The simulated device for a planning target such as ``"sm100"`` or ``"mi350x"``."""
    name = target.strip().lower()
    name = TARGET_ALIASES.get(name, name)
    table = {**SIMULATED_TARGETS, **(extra or {})}
    if name in table:
        return table[name]
    known = ", ".join(sorted(table) + sorted(TARGET_ALIASES))
    raise ValueError(f"unknown device target {target!r}: expected one of {known}")


def probed_target(device: Device, preferred: tuple[str, ...] = ()) -> str:
    """The planning target a real device stands for: the alias its marketing name contains ("NVIDIA
    H200" -> "h200", "AMD Instinct MI300X" -> "mi300x"; the longest match, and only an alias of the
    device's own arch), else its arch. Among equally long matches an alias in ``preferred`` wins."""
    name = re.sub(r"[^a-z0-9]", "", device.name.lower())
    matches = [a for a, arch in TARGET_ALIASES.items() if arch == device.arch and a in name]
    if not matches:
        return device.arch
    return max(matches, key=lambda a: (len(a), a in preferred, a))


@functools.cache
def probe(device: torch.device) -> Device:
    """Probe one torch device; cached per device, so two different GPUs in one host differ."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        if torch.version.hip:
            arch = getattr(props, "gcnArchName", "gfx").split(":")[0]
            return Device("rocm", arch, props.name, index)
        return Device("cuda", f"sm{props.major}{props.minor}", props.name, index)
    if device.type == "cpu":
        return Device("cpu", "cpu", platform.processor() or platform.machine())
    return Device(device.type, device.type, device.type, device.index)
