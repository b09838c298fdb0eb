"""Proof that the ranks of a distributed decode were given the same inputs.

A distributed decode splits one latent's tiles over the ranks and hands every rank the blended result.
Ranks that pass different latents (a data-parallel job, each rank its own video), different tile
arguments or differently seeded noise would each get a mix of tiles from all of them, without an error.
So before any tile is decoded the ranks all-gather a fingerprint of what they were given, a fixed
`_WIDTH` int64s (shape, dtype and a content digest computed on the tensor's own device per item), and
compare; on a difference every rank raises the same `InputMismatchError`, naming the ranks that differ
and in what. Every rank takes part in the same collectives whatever the outcome, so nobody waits, and
the group stays usable.

The content digest sums the tensor's bits as integers (wrapping, so exact and order-free: the same
value on any device and with any thread count) along its last dim and along the one before, and weighs
the sums by position: a changed element, or two swapped ones, change it. It is a check against
accidents, not a cryptographic hash. Its cost is two reduction passes over the tensor and no copy of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .collective import GroupLink
from .tiling import _check_group, group_world_size

__all__ = ["InputMismatchError", "NoiseDigest", "content_digest", "require_same", "require_same_on_ranks"]

# Items per fingerprint (fixed, so every rank's all-gather has the same size whatever it was given).
_MAX_ITEMS = 16
_SLOTS = 3  # per item: kind and shape (or device), dtype, content (or value)
_WIDTH = 1 + _MAX_ITEMS * _SLOTS
# Odd 63-bit multipliers: positions weighted by them, and sums folded with them, differ in every bit.
_K_POS = 0x1F3D5B79A2C4E6F1
_K_OFF = 0x2545F4914F6CDD1D
_K_FOLD = 0x5851F42D4C957F2D
_INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_ASPECTS = {"tensor": ("shape", "dtype", "content"), "generator": ("device", "", "state"), "value": ("value", "", "value")}


class InputMismatchError(ValueError):
    """The ranks of a distributed decode were given different inputs; raised on every rank alike."""


def value_digest(value: Any) -> int:
    """A signed int64 from `repr(value)`, the same in every process (Python's own hash is salted)."""
    raw = hashlib.blake2b(repr(value).encode(), digest_size=8).digest()
    return int.from_bytes(raw, "little", signed=True)


def _int64(value: int) -> int:
    """`value` wrapped to a signed int64, as tensor arithmetic wraps it."""
    return (value + 2**63) % 2**64 - 2**63


def _weights(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(1, n + 1, dtype=torch.int64, device=device).mul_(_K_POS).add_(_K_OFF)


def content_digest(t: torch.Tensor) -> torch.Tensor:
    """An int64 0-d tensor on `t`'s device from `t`'s bits (module docstring); no host sync."""
    x = t.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    if x.dtype == torch.bool:
        x = x.view(torch.uint8)
    if x.numel() == 0:
        return torch.zeros((), dtype=torch.int64, device=x.device)
    if x.ndim == 0:
        x = x.reshape(1)
    # The same bits as integers of the same width: a view for any strides, and sums that wrap exactly.
    ints = x.view(_INTS[x.element_size()])
    # Sums along the last dim and along the one before it: a changed element changes one of each, two
    # swapped elements change two of either. Both reduce one dim, which runs at memory speed (summing
    # over all leading dims at once ran 7x slower on a CPU).
    rows = ints.sum(dim=-1, dtype=ints.dtype).reshape(-1).to(torch.int64)
    cols = (ints.sum(dim=-2, dtype=ints.dtype) if ints.ndim > 1 else ints).reshape(-1).to(torch.int64)
    along = (rows * _weights(rows.numel(), x.device)).sum()
    across = (cols * _weights(cols.numel(), x.device)).sum()
    return along.mul_(_K_FOLD).add_(across)


def _plain(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device))


def _fingerprint(value: Any, device: torch.device) -> tuple[str, list[int | torch.Tensor], dict[str, str]]:
    """(kind, three slots, what to show of it) for one item."""
    if isinstance(value, torch.Tensor):
        shape = list(value.shape)
        slots: list[int | torch.Tensor] = [value_digest(("tensor", shape)), value_digest(str(value.dtype))]
        slots.append(content_digest(value).to(device))
        return "tensor", slots, {"shape": str(shape), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, torch.Generator):
        state = content_digest(value.get_state()).to(device)
        return "generator", [value_digest(("generator", str(value.device))), 0, state], {"device": str(value.device)}
    if _plain(value):
        digest = value_digest(value)
        return "value", [value_digest(("value", type(value).__name__)), 0, digest], {"value": repr(value)[:200]}
    raise TypeError(f"xbackend.vae.require_same: cannot compare a {type(value).__name__} across ranks")


def require_same(link: GroupLink, items: Mapping[str, Any], *, label: str, hint: str) -> None:
    """All-gather the fingerprints of `items` (name -> tensor, generator or plain value) over `link`'s
    group; raise `InputMismatchError` on every rank if any rank's differ (module docstring)."""
    if len(items) > _MAX_ITEMS:
        raise ValueError(f"xbackend.vae.require_same: at most {_MAX_ITEMS} items, got {len(items)}")
    # NCCL gathers device tensors, gloo either: the link's device (the latent's) suits both.
    device = link.device
    slots: list[int | torch.Tensor] = [value_digest(tuple(items))]
    kinds, shown = [], []
    for value in items.values():
        kind, item_slots, show = _fingerprint(value, device)
        kinds.append(kind)
        shown.append(show)
        slots.extend(item_slots)
    host = torch.tensor([s if isinstance(s, int) else 0 for s in slots] + [0] * (_WIDTH - len(slots)), dtype=torch.int64)
    mine = host.to(device)
    for i, s in enumerate(slots):
        if isinstance(s, torch.Tensor):
            mine[i] = s
    gathered = [torch.empty_like(mine) for _ in range(link.world)]
    link.all_gather(gathered, mine)
    rows = [tuple(row) for row in torch.stack(gathered).cpu().tolist()]
    if len(set(rows)) == 1:
        return
    names = list(items)
    describe = _gather_descriptions(link, shown)

    def what(slot: int, differing: Sequence[int], reference: Sequence[int]) -> str:
        if slot == 0:
            return "the names of the items compared (different code on the ranks?)"
        item, aspect_index = divmod(slot - 1, _SLOTS)
        if item >= len(names):
            return "the number of items compared (different code on the ranks?)"
        aspect = _ASPECTS[kinds[item]][aspect_index]
        text = f"{names[item]!r} ({aspect}"
        if describe is not None and aspect in shown[item]:
            text += ": " + ", ".join(
                f"{describe[group[0]][item].get(aspect, '?')} on {_ranks(group)}" for group in (reference, differing)
            )
        return text + ")"

    raise InputMismatchError(mismatch_message(rows, what, label=label, hint=hint))


def require_same_on_ranks(
    group: Any, items: Mapping[str, Any], *, device: torch.device, label: str, hint: str, timeout: Any = None
) -> None:
    """`require_same` over `group` (a process group, or None for the default group), bounded by `timeout`
    (default: the group's) like the decode's own collectives; nothing to do on a group of one rank."""
    _check_group(group, None)
    if group_world_size(group) <= 1:
        return
    link = GroupLink(group, dist.get_rank(group), dist.get_world_size(group), device, timeout)
    link.note("check")
    with link:
        require_same(link, items, label=label, hint=hint)


class NoiseDigest:
    """A running digest of everything `draw_noise` returned, in draw order, on `device`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.value = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, noise: Any) -> None:
        self.value = self.value.mul(_K_FOLD).add_(self._digest(noise))

    def _digest(self, noise: Any) -> torch.Tensor | int:
        if isinstance(noise, torch.Tensor):
            shape = value_digest((list(noise.shape), str(noise.dtype)))
            return content_digest(noise).to(self.device).add_(shape)
        if isinstance(noise, (tuple, list)):
            acc: torch.Tensor | int = value_digest(len(noise))
            for part in noise:
                folded = acc * _K_FOLD if isinstance(acc, torch.Tensor) else _int64(acc * _K_FOLD)
                acc = self._digest(part) + folded
                if isinstance(acc, int):
                    acc = _int64(acc)
            return acc
        if _plain(noise):
            return value_digest(noise)
        # Any other object: its repr may hold an address, which differs between ranks for equal noise.
        return 0


def mismatch_message(rows: Sequence[tuple[int, ...]], what: Any, *, label: str, hint: str) -> str:
    """Name the ranks whose row differs from the most common one (ties: the one rank 0 holds) and, through
    `what(slot, differing_ranks, reference_ranks)`, in what; the same text on every rank."""
    classes: dict[tuple[int, ...], list[int]] = {}
    for rank, row in enumerate(rows):
        classes.setdefault(row, []).append(rank)
    reference_row = max(classes, key=lambda row: (len(classes[row]), -classes[row][0]))
    reference = classes[reference_row]
    parts = []
    for row, ranks in classes.items():
        if row is reference_row:
            continue
        slots = [i for i, (a, b) in enumerate(zip(row, reference_row, strict=True)) if a != b]
        # A shape or dtype that differs makes the content differ too: name the first aspect per item.
        seen, shown = set(), []
        for slot in slots:
            key = (slot - 1) // _SLOTS if slot > 0 else -1
            if key not in seen:
                seen.add(key)
                shown.append(what(slot, ranks, reference))
        verb = "differs" if len(ranks) == 1 else "differ"
        parts.append(f"{_ranks(ranks)} {verb} from {_ranks(reference)} in {' and '.join(shown)}")
    return f"{label}: the ranks of a distributed decode must be given the same inputs; {'; '.join(parts)}. {hint}"


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def _gather_descriptions(link: GroupLink, shown: list[dict[str, str]]) -> list[Any] | None:
    # Every rank saw the same difference, so all of them join; the values shown are a courtesy.
    out: list[Any] = [None] * link.world
    try:
        dist.all_gather_object(out, shown, group=link.group)
    except Exception:
        return None
    return out if all(isinstance(d, list) and len(d) == len(shown) for d in out) else None
