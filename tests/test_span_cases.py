"""The conformance cases whose views span past 2**31 elements (``_cases.span_past_2_31``), on the CPU.

The GPU suite runs them only where the device has the memory (``conformance._big_ok``) and skips a
case an impl's ``supports`` refuses, so here, on the CPU too: each case holds few elements in a view
whose last element sits 2**31 or more past its data pointer, the NVIDIA backend's Triton impls accept
it, and each gives on it what it gives on contiguous copies of the same values (under the interpreter
on the CPU, compiled on a GPU). A CPU buffer is mapped lazily: the ~4 GiB bf16 buffers of these cases
cost only the pages written.
"""

from __future__ import annotations

import pytest
import torch
import xbackend_cuda.impls as nvidia

from xbackend.kernels.spans import INT32_LIMIT, span
from xbackend.ops import OPS
from xbackend.testing.conformance import _big_ok

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")

SPAN_OPS = ["rmsnorm", "rmsnorm_modulate", "add_rmsnorm", "gated_residual", "silu_mul", "rotary_embedding",
            "qk_norm_rope", "qk_norm_rope_3d", "layernorm_modulate", "add_layernorm"]  # fmt: skip


def _contiguous(args: tuple) -> tuple:
    return tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)


def _same(got, want) -> bool:
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    return all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("op", SPAN_OPS)
def test_span_cases_hold_few_elements_span_past_2_31_and_run_on_the_triton_impls(op: str) -> None:
    spec = OPS[op]
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
        if not _big_ok(DEVICE):
            pytest.skip("the device lacks the memory for the big cases")
    try:
        cases = [c for c in spec.cases(torch.bfloat16, DEVICE, True) if "span past 2**31" in c.name]
    except RuntimeError as e:  # a host that refuses to reserve the address space
        pytest.skip(f"cannot allocate the cases' buffers: {e}")
    assert cases, f"{op} has no 'span past 2**31' case"
    impls = [i for i in nvidia.IMPLS if i.op == op and i.name.startswith("triton") and torch.bfloat16 in i.dtypes]
    assert impls
    for case in cases:
        args = spec.bind(*case.args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        assert all(t.numel() < INT32_LIMIT for t in tensors), case.name
        # the last element past 2**31 - 1: an offset formed in 32 bits wraps
        assert any(span(t) - 1 >= INT32_LIMIT for t in tensors), case.name
        ran = 0
        for impl in impls:
            reason = impl.resolved("supports")(*args)
            if reason is not None:
                assert "registered for flavour" in reason, f"{impl.qualname} refuses {case.name!r}: {reason}"
                continue
            ran += 1
            fn = impl.resolved("fn")
            assert _same(fn(*args), fn(*_contiguous(args))), f"{impl.qualname} on {case.name!r}"
        assert ran, f"no Triton impl of {op} accepts {case.name!r}"
