"""xbackend-natten: neighborhood attention through NATTEN (>= 0.20) as an xbackend plugin."""

from .impl import available, neighborhood_attention, supports

__all__ = ["available", "neighborhood_attention", "supports"]
