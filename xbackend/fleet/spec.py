"""What a fleet run plans: the GPU types (from ``--targets`` or a fleet TOML), their lanes of torch /
Triton versions, and the op × dtype × quality matrix."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .._device import BUILTIN_FLEET

__all__ = ["DTYPES", "QUALITIES", "FleetSpec", "FleetTarget", "Lane", "Matrix", "load_fleet", "parse_targets"]

# CLI spelling -> torch dtype; plan entries name dtypes as torch does ("bfloat16").
DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
                                  "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
DEFAULT_DTYPES = ("bfloat16", "float16", "float32")
DEFAULT_QUALITIES = ("lossless", "high")
QUALITIES = ("lossless", "high", "fast")


class FleetSpecError(ValueError):
    """A fleet file or target list that cannot be planned; the message names the fix."""


@dataclass(frozen=True)
class Lane:
    """One software stack the fleet runs a GPU type with (torch and Triton version prefixes)."""

    name: str
    torch: str
    triton: str


@dataclass(frozen=True)
class FleetTarget:
    name: str  # as the user spelled it, lower-cased: "h200", "sm90", "mi355x"
    count: int | None = None
    lanes: tuple[Lane, ...] = ()


@dataclass(frozen=True)
class Matrix:
    ops: tuple[str, ...]
    dtypes: tuple[str, ...] = DEFAULT_DTYPES
    qualities: tuple[str, ...] = DEFAULT_QUALITIES

    @property
    def size(self) -> int:
        return len(self.ops) * len(self.dtypes) * len(self.qualities)

    def to_dict(self) -> dict[str, list[str]]:
        return {"ops": list(self.ops), "dtypes": list(self.dtypes), "qualities": list(self.qualities)}


@dataclass(frozen=True)
class FleetSpec:
    targets: tuple[FleetTarget, ...]
    duplicates: tuple[str, ...] = field(default=())  # names given more than once (dropped; --strict fails)


def _split(text: str | Iterable[str]) -> list[str]:
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    return [p.strip().lower() for p in parts if p.strip()]


def parse_targets(text: str | Iterable[str] | None) -> FleetSpec:
    """``"h100,h200,b200"`` (or several such strings) -> targets in the order given; a repeated name is
    kept once and reported in ``duplicates``."""
    names = _split(text) if text else list(BUILTIN_FLEET)
    seen: list[str] = []
    dupes: list[str] = []
    for name in names:
        (dupes if name in seen else seen).append(name)
    return FleetSpec(tuple(FleetTarget(n) for n in seen), tuple(dict.fromkeys(dupes)))


def parse_dtypes(text: str | None) -> tuple[str, ...]:
    if not text:
        return DEFAULT_DTYPES
    out = []
    for name in _split(text):
        if name not in DTYPES:
            raise FleetSpecError(f"unknown dtype {name!r}: expected some of bf16, fp16, fp32")
        out.append(str(DTYPES[name]).removeprefix("torch."))
    return tuple(dict.fromkeys(out))


def parse_qualities(text: str | None) -> tuple[str, ...]:
    if not text:
        return DEFAULT_QUALITIES
    names = _split(text)
    for name in names:
        if name not in QUALITIES:
            raise FleetSpecError(f"unknown quality {name!r}: expected some of {', '.join(QUALITIES)}")
    return tuple(dict.fromkeys(names))


def parse_ops(text: str | None, known: list[str]) -> tuple[str, ...]:
    if not text:
        return tuple(known)
    names = _split(text)
    for name in names:
        if name not in known:
            raise FleetSpecError(f"unknown op {name!r}: expected some of {', '.join(known)}")
    return tuple(dict.fromkeys(names))


def _toml_loads(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomllib is 3.11+, tomli is the same parser
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise FleetSpecError(
                f"--fleet needs a TOML parser: Python {sys.version_info.major}.{sys.version_info.minor} has no "
                "tomllib (3.11+); `pip install tomli`, or pass the GPU types with --targets"
            ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise FleetSpecError(f"fleet file is not valid TOML: {e}") from None


_GPU_KEYS = {"type", "count", "lanes"}
_LANE_KEYS = {"name", "torch", "triton"}
_TOP_KEYS = {"gpu", "lanes"}


def _lanes(raw: Any, where: str) -> tuple[Lane, ...]:
    if not isinstance(raw, list):
        raise FleetSpecError(f"{where}: lanes must be a list of {{ torch = \"2.11\", triton = \"3.6\" }} tables")
    lanes = []
    for i, lane in enumerate(raw):
        if not isinstance(lane, Mapping) or not {"torch", "triton"} <= set(lane) or set(lane) - _LANE_KEYS:
            raise FleetSpecError(f"{where}: lane {i + 1} needs torch and triton version strings (and an "
                                 f"optional name), got {dict(lane) if isinstance(lane, Mapping) else lane!r}")
        lanes.append(Lane(str(lane.get("name", f"lane{i + 1}")), str(lane["torch"]), str(lane["triton"])))
    return tuple(lanes)


def load_fleet(path: str | Path) -> FleetSpec:
    """A fleet TOML: ``[[gpu]]`` tables with ``type`` (a planning target), optional ``count`` and
    ``lanes``; top-level ``lanes`` apply to every GPU type that lists none of its own."""
    path = Path(path)
    try:
        data = _toml_loads(path.read_text())
    except OSError as e:
        raise FleetSpecError(f"cannot read fleet file {str(path)!r}: {e.strerror}") from None
    if unknown := set(data) - _TOP_KEYS:
        raise FleetSpecError(f"{path}: unknown key(s) {', '.join(sorted(unknown))}; expected [[gpu]] tables and lanes")
    default_lanes = _lanes(data["lanes"], f"{path}: lanes") if "lanes" in data else ()
    gpus = data.get("gpu")
    if not isinstance(gpus, list) or not gpus:
        raise FleetSpecError(f"{path}: no [[gpu]] table; add one per GPU type, e.g. [[gpu]] type = \"h200\"")
    targets: list[FleetTarget] = []
    dupes: list[str] = []
    for i, gpu in enumerate(gpus):
        where = f"{path}: gpu {i + 1}"
        if not isinstance(gpu, Mapping) or "type" not in gpu:
            raise FleetSpecError(f"{where}: needs type = \"<target>\" (h100, h200, b200, mi300x, sm90, ...)")
        if unknown := set(gpu) - _GPU_KEYS:
            raise FleetSpecError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected type, count, lanes")
        count = gpu.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
            raise FleetSpecError(f"{where}: count must be a positive integer, got {count!r}")
        name = str(gpu["type"]).strip().lower()
        if any(t.name == name for t in targets):
            dupes.append(name)
            continue
        lanes = _lanes(gpu["lanes"], where) if "lanes" in gpu else default_lanes
        targets.append(FleetTarget(name, count, lanes))
    return FleetSpec(tuple(targets), tuple(dict.fromkeys(dupes)))
