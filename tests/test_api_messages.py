"""What a newcomer reads first: errors that name the call and the way out, help that shows the op."""

from __future__ import annotations

import inspect
import os
import pydoc
import subprocess
import sys

import pytest

import xbackend
from xbackend._api import kernel_ops, list_ops


def test_plan_of_an_unknown_op_names_plan_the_known_ops_and_a_close_match() -> None:
    with pytest.raises(ValueError) as caught:
        xbackend.plan("rmsnrom")
    message = str(caught.value)
    assert message.startswith("plan: unknown op 'rmsnrom' (did you mean 'rmsnorm'?); expected one of ")
    assert message.endswith(", ".join(kernel_ops()))
    with pytest.raises(ValueError, match=r"^plan: unknown op 'foo'; expected one of rmsnorm, "):
        xbackend.plan("foo")


def test_get_op_and_use_of_an_unknown_op_suggest_a_close_match() -> None:
    with pytest.raises(KeyError) as caught:
        xbackend.get_op("vae_tile_decod")
    assert str(caught.value) == (f"get_op: unknown op 'vae_tile_decod' (did you mean 'vae_tile_decode'?); "
                                 f"expected one of {', '.join(list_ops())}")
    with pytest.raises(ValueError, match=r"^use: unknown op 'silu_mull' \(did you mean 'silu_mul'\?\)"):
        with xbackend.use(silu_mull="triton"):
            pass


def test_help_of_the_host_op_shows_its_own_doc_and_signature() -> None:
    from xbackend.ops import vae_tile_decode

    op = xbackend.get_op("vae_tile_decode")
    text = pydoc.render_doc(op, renderer=pydoc.plaintext)
    assert "decode a latent in overlapping" in text
    assert "An op that runs on the host around other ops" not in text
    assert inspect.signature(op) == inspect.signature(vae_tile_decode.reference)
    assert type(op).__doc__.startswith("vae_tile_decode(latent, decode_tile, *, tile, stride, scale")


def test_a_bad_xbackend_verify_warns_in_one_line_without_echoing_source() -> None:
    env = {**os.environ, "XBACKEND_VERIFY": "sometimes"}
    err = subprocess.run([sys.executable, "-c", "import xbackend"], env=env, capture_output=True, text=True,
                         check=True).stderr
    assert err.splitlines() == [
        "xbackend: XBACKEND_VERIFY: expected 'first', 'always' or 'sample:N' with N >= 1, got 'sometimes'; "
        "using 'first'"]
