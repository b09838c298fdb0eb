"""xbackend: one registry of diffusion hot ops, vendor plugins that implement them, a resolver that
explains itself, and a guard that proves every fast path against the reference on first use."""

from __future__ import annotations

import pluggy

from ._api import Op, Plan, Report, get_op, list_ops, plan, plugins, problems, report
from ._device import Device, DeviceFamily
from ._guard import FallbackWarning
from ._policy import quality, use, verify
from ._precision import EXACT, Precision, tolerance, ulp
from ._registry import Impl, Registrar, RegistrationError
from ._runtime import ImplUnusableError, Runtime, runtime
from .attribute import Attribution, attribute
from .patching import PatchReport, patch, unpatch

hookimpl = pluggy.HookimplMarker("xbackend")

__version__ = "0.1.0"

__all__ = [
    "EXACT",
    "Attribution",
    "Device",
    "DeviceFamily",
    "FallbackWarning",
    "Impl",
    "ImplUnusableError",
    "Op",
    "PatchReport",
    "Plan",
    "Precision",
    "Registrar",
    "RegistrationError",
    "Report",
    "Runtime",
    "attribute",
    "get_op",
    "hookimpl",
    "list_ops",
    "patch",
    "plan",
    "plugins",
    "problems",
    "quality",
    "report",
    "runtime",
    "tolerance",
    "ulp",
    "unpatch",
    "use",
    "verify",
]
