"""``xbackend fleet``: a mixed NVIDIA/AMD fleet's plans in one process, goldens for CI, per-target
kernel compiles and version-skew flags. See docs/fleet.md.

    from xbackend.fleet import Matrix, plan_target, parse_targets
    results = [plan_target(xbackend.runtime(), t, Matrix(("gated_residual",))) for t in parse_targets("h200").targets]
"""

from __future__ import annotations

from .golden import CheckResult, Drift, check, golden_doc
from .matrix import SCHEMA_VERSION, Assumption, TargetResult, default_matrix, envelope, plan_device, plan_target
from .skew import Unverified
from .spec import FleetSpec, FleetSpecError, FleetTarget, Lane, Matrix, load_fleet, parse_targets

__all__ = [
    "SCHEMA_VERSION",
    "Assumption",
    "CheckResult",
    "Drift",
    "FleetSpec",
    "FleetSpecError",
    "FleetTarget",
    "Lane",
    "Matrix",
    "TargetResult",
    "Unverified",
    "check",
    "default_matrix",
    "envelope",
    "golden_doc",
    "load_fleet",
    "parse_targets",
    "plan_device",
    "plan_target",
]
