"""Device records, the probe that makes them, and the simulated targets used for planning.

Both vendors report device type "cuda" in torch; ROCm is told apart by ``torch.version.hip`` and
names its arch through ``gcnArchName`` ("gfx942:sramecc+:xnack-").
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import platform
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["BUILTIN_FAMILIES", "BUILTIN_FLEET", "DEVICES_GRAMMAR", "SIMULATED_TARGETS", "TARGET_ALIASES", "Device",
           "DeviceFamily", "DeviceSpec", "arch_key", "device_families", "families", "probe", "probed_target", "simulated"]


@dataclass(frozen=True)
class Device:
    """What a resolver needs to know about one device."""

    vendor: str  # "cuda" | "rocm" | "cpu", a plugin family's vendor, or another torch device type
    arch: str  # "sm90", "sm100", "gfx942", "cpu", ...
    name: str = ""
    index: int | None = None
    simulated: bool = False

    def __str__(self) -> str:
        where = f"{self.vendor}:{self.index}" if self.index is not None else self.vendor
        tag = ", simulated" if self.simulated else ""
        return f"{self.arch} ({self.name or where}{tag})"


@dataclass(frozen=True)
class DeviceFamily:
    """One vendor's arches in the devices grammar: what ``Impl.devices`` may name and how ranges order.

    ``vendor`` is the grammar's vendor word and ``Device.vendor`` of its devices; ``arch_pattern`` a
    regex one arch name matches in full; ``order_key`` maps an arch to what ranges compare (``lo..hi``
    holds the arches with ``order_key(lo) <= order_key(arch) <= order_key(hi)``), by default the arch's
    first run of digits as an int. ``spelling`` and ``examples`` name the arches in error messages
    ("smNN such as sm90, sm100"); a family whose only arch is its vendor word (cpu) has no spelling.
    The builtin families are ``BUILTIN_FAMILIES``; a plugin adds its own through the
    ``xbackend_device_families`` hook.
    """

    vendor: str
    arch_pattern: str
    order_key: Callable[[str], Any] | None = None
    spelling: str = ""
    examples: tuple[str, ...] = ()

    def has(self, arch: str) -> bool:
        return re.fullmatch(self.arch_pattern, arch) is not None

    def order(self, arch: str) -> Any:
        if self.order_key is not None:
            return self.order_key(arch)
        digits = re.search(r"\d+", arch)
        return int(digits.group()) if digits else 0

    def describe(self) -> str:
        return f"{self.spelling} such as {', '.join(self.examples)}" if self.spelling else ""


def _gfx_order(arch: str) -> int:
    return int(arch[3:], 16)  # gfx90a < gfx942 < gfx950


BUILTIN_FAMILIES = (
    DeviceFamily("cuda", r"sm_?\d+[a-z]?", None, "smNN", ("sm90", "sm100", "sm103")),  # sm90a orders as sm90
    DeviceFamily("rocm", r"gfx[0-9a-f]+", _gfx_order, "gfxNNN", ("gfx942", "gfx950")),
    DeviceFamily("cpu", r"cpu"),
)
# Families plugins declared, while the runtime that loaded them registers its impls (``device_families``).
_EXTRA_FAMILIES: contextvars.ContextVar[tuple[DeviceFamily, ...]] = contextvars.ContextVar("xbackend_device_families",
                                                                                         default=())


def families() -> tuple[DeviceFamily, ...]:
    """The families the devices grammar knows here: the builtin ones, then any ``device_families`` added."""
    return BUILTIN_FAMILIES + _EXTRA_FAMILIES.get()


@contextlib.contextmanager
def device_families(extra: tuple[DeviceFamily, ...]) -> Iterator[None]:
    """Parse devices with ``extra`` families too, within the block (the runtime wraps its plugins'
    registrations in it; a spec keeps the family it was parsed with, so matching needs no context)."""
    token = _EXTRA_FAMILIES.set(_EXTRA_FAMILIES.get() + tuple(extra))
    try:
        yield
    finally:
        _EXTRA_FAMILIES.reset(token)


def family_problem(family: object, known: tuple[DeviceFamily, ...]) -> str | None:
    """Why a plugin's ``family`` cannot join ``known`` (None when it can): a family must have its own
    vendor word and arch names that no other family's pattern takes."""
    if not isinstance(family, DeviceFamily):
        return f"expected an xbackend DeviceFamily, got {type(family).__name__}"
    if not (isinstance(family.vendor, str) and re.fullmatch(r"[a-z][a-z0-9_]*", family.vendor)):
        return f"vendor expected a lower-case name such as 'xpu', got {family.vendor!r}"
    try:
        re.compile(family.arch_pattern)
    except (re.error, TypeError) as e:
        return f"arch_pattern {family.arch_pattern!r} is not a regex: {e}"
    for other in known:
        if other.vendor == family.vendor:
            return f"vendor {family.vendor!r} already has a device family"
        taken = [a for a in (*other.examples, other.vendor) if family.has(a)]
        taken += [a for a in (*family.examples, family.vendor) if other.has(a)]
        if taken:
            return f"arch {taken[0]!r} would belong to both {family.vendor!r} and {other.vendor!r}"
    bad = [a for a in family.examples if not family.has(a)]
    if bad:
        return f"example {bad[0]!r} does not match arch_pattern {family.arch_pattern!r}"
    try:
        for a in family.examples:
            hash(family.order(a))
    except Exception as e:
        return f"order_key failed on {a!r}: {type(e).__name__}: {e}"
    return None


def arch_key(arch: str) -> tuple[str, Any]:
    """Order arches within a vendor: sm90 < sm100 < sm103 < sm120; gfx90a < gfx942 < gfx950."""
    for family in families():
        if family.has(arch):
            return (family.vendor, family.order(arch))
    return (arch, 0)


@dataclass(frozen=True)
class DeviceSpec:
    """One entry of an impl's device constraint, parsed from a string.

    ``"*"`` any device; ``"cuda"``/``"rocm"``/``"cpu"`` (or a plugin family's vendor) any arch of a
    vendor; ``"sm90"`` one arch; ``"sm90..sm103"`` an inclusive range; ``"sm90.."`` open above;
    ``"gfx942,gfx950"`` is two specs.
    """

    vendor: str | None  # None: any vendor
    lo: str | None = None
    hi: str | None = None
    family: DeviceFamily | None = field(default=None, compare=False, repr=False)  # the arches' family

    @classmethod
    def parse(cls, text: str) -> tuple[DeviceSpec, ...]:
        known = families()
        vendors = {f.vendor for f in known}
        specs = []
        for part in (p.strip() for p in text.split(",")):
            if part == "*":
                specs.append(cls(None))
            elif part in vendors:
                specs.append(cls(part))
            else:
                lo, sep, hi = part.partition("..")
                family = _family_of(lo, text, known)
                if hi and _family_of(hi, text, known) is not family:
                    raise ValueError(f"device spec {text!r}: range {part!r} mixes vendors")
                specs.append(cls(family.vendor, lo, (hi or None) if sep else lo, family))
        return tuple(specs)

    def matches(self, device: Device) -> bool:
        if self.vendor is not None and self.vendor != device.vendor:
            return False
        if self.lo is None:
            return True
        family = self.family
        if family is None or not family.has(device.arch):
            return False
        key = family.order(device.arch)
        if key < family.order(self.lo):
            return False
        return self.hi is None or key <= family.order(self.hi)

    def __str__(self) -> str:
        if self.vendor is None:
            return "*"
        if self.lo is None:
            return self.vendor
        return self.lo if self.lo == self.hi else f"{self.lo}..{self.hi or ''}"


def devices_grammar(known: tuple[DeviceFamily, ...] = BUILTIN_FAMILIES) -> str:
    """The devices grammar of Impl.devices over ``known`` families, for messages."""
    vendors = " | ".join(f'"{f.vendor}"' for f in known)
    arches = ", or ".join(d for d in (f.describe() for f in known) if d)
    return f'"*" | {vendors} | ARCH | ARCH".."ARCH | ARCH".." (comma-separated; ARCH: {arches})'


# The devices grammar of Impl.devices, per comma-separated part: "*", a vendor, an arch, or an inclusive
# arch range "lo..hi" / open "lo.." within one vendor.
DEVICES_GRAMMAR = devices_grammar()


def _family_of(arch: str, text: str | None = None, known: tuple[DeviceFamily, ...] | None = None) -> DeviceFamily:
    known = families() if known is None else known
    for family in known:
        if family.has(arch):
            return family
    where = f"device spec {text!r}: " if text is not None else ""
    hint = ""
    lo, dash, hi = arch.partition("-")
    if dash and all(any(f.has(a) for f in known) for a in (lo, hi)):
        hint = f"; a range is written {lo}..{hi}"
    raise ValueError(f"{where}unknown arch {arch!r}{hint}; expected {devices_grammar(known)}")


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
