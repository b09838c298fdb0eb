"""``xbackend bench``: each op's impls against eager, torch.compile and ``copy_`` of the same bytes,
plus the dispatch overhead of ``get_op(...)(...)``."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from .._api import get_op, plan
from .._policy import use
from .._precision import Output
from ._harness import (
    Progress,
    Row,
    copy_fn,
    format_table,
    rotations,
    time_host_inclusive,
    time_host_inclusive_interleaved,
    time_rotated_interleaved,
    write_png,
)
from .cases import CASES, Case

__all__ = ["bench_dispatch", "bench_op", "main"]


def _eligible_impls(case: Case, args: tuple[Any, ...]) -> list[str]:
    p = plan(case.op, args[0].device, args=args)
    return [r.impl for r in p.rows if r.reason is None and r.impl != "reference"]


def bench_op(case: Case, *, reps: int = 50, progress: Progress | None = None) -> list[Row]:
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    first = case.make(device, g)
    per_set = case.bytes_moved or sum(a.numel() * a.element_size() for a in first if isinstance(a, torch.Tensor))
    sets = [first] + [case.make(device, g) for _ in range(rotations(per_set) - 1)]
    spec = get_op(case.op).spec
    op = get_op(case.op)
    rows: list[Row] = []
    expected = None if spec.tolerant else spec.reference(*first)
    timed: list[tuple[Any, list[Any]]] = []

    def add(variant: str, fn: Any, out: Output | None = None, time_sets: list[Any] = sets) -> None:
        exact, extra = None, {}
        if out is not None and expected is not None:
            exact = _equal(out, expected)
        elif out is not None and spec.tolerant:
            # Sampled queries against the fp32 reference: the guard's own comparison.
            from .._precision import tolerance
            from ..ops.neighborhood_attention import REL_FRO_BOUND

            problem = spec.check_output(out, first, tolerance(REL_FRO_BOUND))
            extra = {"accuracy": problem or f"rel_fro < {REL_FRO_BOUND}"}
        rows.append(Row(case.name, variant, 0.0, case.bytes_moved, case.flops, exact, extra))
        timed.append((fn, time_sets))

    if case.bytes_moved:
        copy, copy_sets = copy_fn(case.bytes_moved, device)
        add("copy_", copy, time_sets=copy_sets)
    if spec.tolerant:
        add("dense SDPA (cuDNN)", _dense_sdpa, None)
    else:
        compiled = torch.compile(spec.reference, dynamic=False)
        add("eager", spec.reference, spec.reference(*first))
        add("compile", compiled, compiled(*first))
    add("xbackend", op, op(*first))
    for name in (n for n in _eligible_impls(case, first) if n not in case.skip_impls):
        with use(**{case.op: name}):
            out = op(*first)
        add(f"  {name}", _pinned(op, case.op, name), out)
    # All variants' reps interleaved: their ratios (vs compile, % of copy_) come from the same minutes.
    times = time_rotated_interleaved(timed, reps=reps)
    for row, us in zip(rows, times, strict=True):
        row.us = us
        if progress:
            progress.step(f"{case.name} {row.variant}")
    # Host-inclusive cost of the whole call (back-to-back calls, one sync): what a caller pays when
    # the GPU is not the bottleneck. Small shapes compare it with one eager kernel launch.
    if case.small:  # bursts interleaved with one eager launch's: a ratio that host-speed drift cannot skew
        x = first[0]
        ours, one_launch = time_host_inclusive_interleaved([(op, first), (torch.add, (x, x))])
        rows.append(Row(case.name, "host: 1 eager launch", one_launch))
        rows.append(Row(case.name, "host: xbackend call", ours, extra={"vs_one_launch": ours / one_launch}))
    else:
        ours = time_host_inclusive(op, first, calls=5, bursts=2) if spec.tolerant else time_host_inclusive(op, first)
        rows.append(Row(case.name, "host: xbackend call", ours))
    return rows


def _pinned(op: Any, op_name: str, impl: str) -> Any:
    """``op`` with ``impl`` forced, for as long as each call lasts (the interleaved timer calls it
    between other variants' calls)."""

    def call(*args: Any) -> Output:
        with use(**{op_name: impl}):
            return op(*args)

    return call


def _equal(out: Output, expected: Output) -> bool:
    """``torch.equal``; for an op with several outputs, of every one (the column stays yes/NO)."""
    if isinstance(expected, (tuple, list)):
        return (
            isinstance(out, (tuple, list))
            and len(out) == len(expected)
            and all(_equal(o, e) for o, e in zip(out, expected, strict=True))
        )
    return isinstance(out, torch.Tensor) and bool(torch.equal(out, expected))


def _dense_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any) -> torch.Tensor:
    """Full attention over the same tokens through cuDNN: the dense baseline attention is measured against."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, d = q.shape[0], q.shape[-2], q.shape[-1]
    qt, kt, vt = (t.reshape(b, -1, h, d).transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)


def bench_dispatch(calls: int = 200_000) -> str:
    """Host cost of ``get_op(...)(...)`` over calling the resolved impl directly (CPU tensors).

    The impl timed is a stub registered for this bench only: it returns ``answer``, the reference's
    output for the bench's fixed inputs, computed once. It is a correct exact impl for those inputs
    (a tensor of the reference's values that shares no memory with any input), so the guard verifies
    it on the first call and dispatch then runs it; it does no work per call, so the difference
    between the two timings is dispatch alone. The bench raises if dispatch served anything else."""
    import xbackend
    from xbackend.testing import fresh_runtime

    x = torch.randn(4, 8, 16)
    update = torch.randn(4, 8, 16)
    gate = torch.randn(4, 1, 16)
    answer = get_op("gated_residual").spec.reference(x, update, gate)

    def instant(x, update, gate):
        return answer

    class Instant:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="gated_residual", name="instant", fn=instant, priority=1)

    op = get_op("gated_residual")
    with fresh_runtime([("instant", Instant())]), torch.inference_mode():
        op(x, update, gate)  # the guard's verification call
        if op(x, update, gate) is not answer:
            raise RuntimeError(f"bench dispatch: get_op('gated_residual') did not run the stub impl: {xbackend.report()}")

        def run(fn: Any) -> float:
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn(x, update, gate)
                best = min(best, (time.perf_counter() - t0) / calls * 1e6)
            return best

        direct = run(instant)
        via_op = run(op)
        served = [f"{e.impl} ({e.status})" for e in xbackend.report().events if e.op == "gated_residual"]
    from .._fastkey import active

    form = active()
    return (f"dispatch overhead ({calls} calls, best of 5; {'C++' if form and form.form == 'c++' else 'Python'} keys):\n"
            f"  impl called directly      {direct:6.3f} µs/call\n"
            f"  get_op('gated_residual')  {via_op:6.3f} µs/call\n"
            f"  overhead                  {via_op - direct:6.3f} µs/call\n"
            f"  impl: {', '.join(served)}\n"
            f"  keys: {form}")


def main(args: argparse.Namespace) -> int:
    ops = args.ops or ["rmsnorm", "rmsnorm_modulate", "gated_residual", "rotary_embedding", "qk_norm_rope", "qk_norm_rope_3d"]
    out: list[str] = []
    if "dispatch" in ops:
        out.append(bench_dispatch(20_000 if args.quick else 200_000))
        ops = [o for o in ops if o != "dispatch"]
    if ops and not torch.cuda.is_available():
        print("\n\n".join(out + ["xbackend bench: op timings need a GPU (torch sees none); `xbackend bench dispatch` runs anywhere"]))
        return 0 if out else 2
    unknown = [o for o in ops if o not in CASES]
    if unknown:
        raise ValueError(f"bench: unknown op(s) {unknown}; expected some of {', '.join([*CASES, 'dispatch'])}")
    if not ops:
        print("\n\n".join(out))
        return 0
    cases = [c for o in ops for c in CASES[o] if c.bar or not args.quick]
    progress = Progress(6 * len(cases), "bench")
    rows: list[Row] = []
    for case in cases:
        try:
            rows.extend(bench_op(case, reps=20 if args.quick else 50, progress=progress))
        except Exception as e:  # one broken case must not lose the table of the others
            print(f"bench: {case.name} failed: {type(e).__name__}: {e}")
    out.append(f"{torch.cuda.get_device_name()} | torch {torch.__version__}\n" + format_table(rows))
    print("\n\n".join(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r.__dict__, "tbps": r.tbps, "tflops": r.tflops} for r in rows], f, indent=2)
    if args.png:
        write_png([r for r in rows if not r.variant.startswith("host")], args.png)
    return 0
