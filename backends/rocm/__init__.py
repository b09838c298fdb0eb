"""xbackend's builtin AMD backend (loaded through the ``xbackend`` entry-point group)."""
