"""xbackend's builtin NVIDIA backend (loaded through the ``xbackend`` entry-point group)."""
