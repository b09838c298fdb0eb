"""Triton's host-side integer helpers (``triton.cdiv``, ``triton.next_power_of_2``) in plain Python, for
the launch analyses that an impl's ``supports`` runs where Triton cannot be imported."""

from __future__ import annotations

__all__ = ["cdiv", "next_power_of_2"]


def cdiv(x: int, y: int) -> int:
    """``triton.cdiv``: ``ceil(x / y)`` for y > 0."""
    return (x + (y - 1)) // y


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2``: the smallest power of two >= n (0 for n = 0), for n < 2**64."""
    n -= 1
    n |= n >> 1
    n |= n >> 2
    n |= n >> 4
    n |= n >> 8
    n |= n >> 16
    n |= n >> 32
    return n + 1
