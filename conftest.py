"""Repository-wide test setup."""

from __future__ import annotations

import os

import torch

# Triton kernels are tested on CPU through its interpreter, which must be chosen before triton loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
