"""The impl contract as ``xbackend_register_impls`` states it, against what the runtime does: ``fn`` and
``supports`` take the op's arguments positionally in signature order, an unsupported value is declined
by ``supports`` with a reason, and ``verified_on`` of a CPU impl names the arch ``cpu``."""

from __future__ import annotations

import inspect

import torch

import xbackend
from xbackend import hookspecs
from xbackend.cli import main
from xbackend.ops import rmsnorm as rn
from xbackend.testing import fresh_runtime

DOC = inspect.cleandoc(hookspecs.xbackend_register_impls.__doc__ or "")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_the_calling_convention_in_the_hook_doc_is_the_one_ops_prints(capsys) -> None:
    assert main(["ops", "--signatures"]) == 0
    out = capsys.readouterr().out
    assert "fn(x, weight, eps, flavour)" in out and "supports(x, weight, eps, flavour)" in out
    doc = _one_line(DOC)
    assert "``fn(x, weight, eps, flavour)`` and ``supports(x, weight, eps, flavour)``" in doc
    assert "positionally, in the order of its signature" in doc and "never by keyword" in doc
    assert "return a short reason" in doc and "docs/fleet.md" in doc
    assert '``verified_on=(("2.13", "3.9", "cpu"),)``' in doc


def test_ops_signatures_count_each_ops_outputs(capsys) -> None:
    assert main(["ops", "--signatures"]) == 0
    lines = capsys.readouterr().out.splitlines()
    impl_lines = {line.split("(")[0]: lines[i + 1] for i, line in enumerate(lines[:-1]) if not line.startswith(" ")}
    assert "-> a tuple of 2 new tensors" in impl_lines["add_rmsnorm"]
    assert "-> a tuple of 2 new tensors" in impl_lines["qk_norm_rope"]
    assert "-> a new tensor " in impl_lines["rmsnorm"]


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.asked: list[tuple] = []

    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar) -> None:
        def fn(*args):
            self.calls.append(args)
            return rn.reference(*args)

        def supports(*args):
            self.asked.append(args)
            return None if args[3] == "torch" else f"flavour {args[3]!r}: only 'torch'"

        registrar.register(op="rmsnorm", name="rec", fn=fn, supports=supports, devices="cpu",
                           dtypes={torch.float32}, verified_on=(("2.13", "3.9", "cpu"),))


def test_fn_and_supports_get_every_argument_positionally_and_an_unsupported_value_is_declined() -> None:
    x, w = torch.randn(4, 64), torch.randn(64)
    rec = _Recorder()
    with fresh_runtime([("rec", rec)]) as rt:
        xbackend.get_op("rmsnorm")(x, eps=1e-5, weight=w)  # keywords, out of order, flavour defaulted
        assert [tuple(map(type, c)) for c in rec.calls[:1]] == [(torch.Tensor, torch.Tensor, float, str)]
        assert rec.calls[0][2:] == (1e-5, "torch") and rec.asked[0][2:] == (1e-5, "torch")
        xbackend.get_op("rmsnorm")(x, w, 1e-5, "diffusers")
        assert rt.events[-1].impl == "xbackend:reference"
        assert all(c[3] == "torch" for c in rec.calls)  # fn never saw the value supports declined
        p = xbackend.plan("rmsnorm", "cpu", dtype=torch.float32, args=(x, w, 1e-5, "diffusers"))
        assert {r.qualname: r.why for r in p.rows}["rec:rec"] == "flavour 'diffusers': only 'torch'"
