"""xbackend's conformance suite over every liger impl (on the devices they are registered for: GPUs)."""

from xbackend_liger import plugin

from xbackend.testing import conformance

test_conformance = conformance.suite(("liger", plugin))
