"""The CLI on a machine with no GPU: info must say something useful, plan must plan."""

from __future__ import annotations

import json
import subprocess
import sys

from xbackend.cli import main
from xbackend.fleet import SCHEMA_VERSION


def test_info_on_cpu(capsys) -> None:
    assert main(["info", "--impls"]) == 0
    out = capsys.readouterr().out
    assert "Devices:" in out and "Plugins:" in out
    assert "cuda " in out and "rocm " in out
    # the LayerNorm impls have not run on a GPU yet: the CUDA lines go per impl
    assert "cuda       rmsnorm:triton: torch 2.11 / Triton 3.6 on sm90" in out
    assert "cuda       layernorm_modulate:triton: never run on hardware" in out
    assert "cuda       add_layernorm:triton: never run on hardware" in out
    assert "rocm       all 17 impls: never run on hardware" in out
    assert "rmsnorm_modulate on cpu" in out and "chosen" in out
    assert "\nDispatch: C++ keys (" in out or "\nDispatch: Python keys (" in out


def _section(out: str, title: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title)) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("  ")), len(lines))
    return lines[start:end]


def test_info_is_a_short_status_with_the_impl_matrix_behind_a_flag(capsys) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    plugins = [line.split()[0] for line in _section(out, "Plugins") if "impls" in line or "FAILED" in line]
    assert {"cuda", "rocm"} <= set(plugins) and plugins == sorted(plugins)
    assert "Problems: none" in out or _section(out, "Problems")
    assert "verdict" not in out and "rmsnorm_modulate on cpu" not in out  # no per-impl rows
    assert len(out.splitlines()) <= 30, out
    assert out.rstrip().endswith("`xbackend info --impls`: every op's candidates and why, and the hardware each "
                                 "impl was verified on")
    assert main(["info", "--impls"]) == 0
    full = capsys.readouterr().out
    status = out[:out.index("\nDispatch: ")]
    assert full.startswith(status) and "rmsnorm_modulate on cpu" in full
    assert main(["info", "-v"]) == 0 and capsys.readouterr().out == full


def test_plan_lines_fit_100_columns_and_show_each_precision_once(capsys) -> None:
    for device in ("h100", "b200", "mi300x", "cpu"):
        assert main(["plan", "--device", device]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert max(map(len, lines)) <= 100, device
        for line in lines:
            for shown in ("exact", "ulp(", "tolerance("):
                assert line.count(shown) <= 1, line


def test_plan_json_for_a_simulated_fleet(capsys) -> None:
    for target in ("sm90", "sm100", "gfx950", "mi300x"):
        assert main(["plan", "--device", target, "--op", "rmsnorm", "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["schema_version"] == SCHEMA_VERSION and {p["name"] for p in data["plugins"]} >= {"cuda", "rocm"}
        [t] = data["targets"]
        assert t["target"] == target and t["device"]["simulated"] is True and t["planned_as"] == "deployed"
        [p] = t["plans"]
        assert (p["op"], p["dtype"], p["quality"]) == ("rmsnorm", "bfloat16", "lossless")
        assert p["candidates"][-1]["impl"] == "xbackend:reference"
        assert p["candidates"][-1]["verdict"] == "lower_priority"


def test_plan_for_a_simulated_target_plans_as_deployed(capsys) -> None:
    """A CPU runner's missing CUDA build does not decide what an H200 runs; the assumption is shown."""
    assert main(["plan", "--device", "h200", "--op", "gated_residual"]) == 0
    out = capsys.readouterr().out
    chosen = next(i for i, line in enumerate(out.splitlines()) if "-> cuda:cuda_vec" in line)
    if "assumed available" in out:  # on the line under the row it decided
        assert out.splitlines()[chosen + 1].strip().startswith("(assumed available on sm90; here: ")
    assert main(["plan", "--device", "h200", "--op", "gated_residual", "--assume-available"]) == 0
    assert "-> cuda:cuda_vec" in capsys.readouterr().out


def test_unknown_target_is_a_clear_error(capsys) -> None:
    assert main(["plan", "--device", "tpu7"]) == 2
    assert "unknown device target 'tpu7'" in capsys.readouterr().err


def test_console_script_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "xbackend.cli", "plan", "--device", "b200", "--op", "gated_residual"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("gated_residual on sm100 (NVIDIA B200, simulated)")


def test_bench_dispatch_runs_on_cpu_and_op_timings_say_they_need_a_gpu(capsys) -> None:
    assert main(["bench", "dispatch", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "get_op('gated_residual')" in out and "overhead" in out
    if not __import__("torch").cuda.is_available():
        assert main(["bench", "rmsnorm"]) == 2
        assert "op timings need a GPU" in capsys.readouterr().out


def test_bench_table_formats_ratios_against_copy_eager_and_compile() -> None:
    from xbackend.bench._harness import Row, format_table

    rows = [Row("c", "copy_", 100.0, 10**8), Row("c", "eager", 400.0, 10**8, exact=True),
            Row("c", "compile", 150.0, 10**8, exact=False), Row("c", "xbackend", 125.0, 10**8, exact=True)]
    line = next(row for row in format_table(rows).splitlines() if " xbackend " in row)
    assert "80%" in line and "3.20x" in line and "1.20x" in line and line.rstrip().endswith("yes")


def test_plan_with_shapes_shows_a_supports_rejection(capsys) -> None:
    from xbackend.cli import main

    assert main(["plan", "--device", "h200", "--op", "rmsnorm", "--dtype", "fp32",
                 "--shape", "x=2,40000", "--shape", "weight=40000"]) == 0
    out = capsys.readouterr().out
    assert "float32[2,40000]" in out and "D > 16384" in out
    assert main(["plan", "--op", "rmsnorm", "--shape", "y=3"]) == 2
    assert "a tensor argument of rmsnorm (x, weight)" in capsys.readouterr().err


def test_ops_signatures(capsys) -> None:
    from xbackend.cli import main

    assert main(["ops", "--signatures"]) == 0
    out = capsys.readouterr().out
    assert "fn(x, update, gate)" in out and "supports(x, weight, eps, flavour) -> None | str" in out
    assert "vae_tile_decode(" in out


def test_plan_shape_errors_are_clear(capsys) -> None:
    from xbackend.cli import main

    assert main(["plan", "--op", "rmsnorm", "--shape", "x=none"]) == 2
    assert "rmsnorm requires argument 'x'" in capsys.readouterr().err
    assert main(["plan", "--op", "rmsnorm", "--shape", "x=-1,4"]) == 2
    assert "sizes >= 0" in capsys.readouterr().err


def test_info_names_each_ops_impl_when_they_differ_and_flags_an_unverified_cpu_impl(capsys) -> None:
    """A CPU impl is verified by a run on a CPU: arch ``cpu`` in ``verified_on`` with the run's versions."""
    import torch

    import xbackend
    from xbackend.fleet.skew import host_lane
    from xbackend.ops import gated_residual as gr
    from xbackend.testing import fresh_runtime

    lane = host_lane()

    def cpu_plugin(verified_on: tuple) -> object:
        class _Plugin:
            @xbackend.hookimpl
            def xbackend_register_impls(self, registrar) -> None:
                registrar.register(op="gated_residual", name="copy", fn=gr.reference, devices="cpu",
                                   dtypes={torch.bfloat16}, verified_on=verified_on)

        return _Plugin()

    with fresh_runtime([("mine", cpu_plugin(()))]):
        assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "\n  gated_residual           mine:copy\n" in out and "\n  rmsnorm                  xbackend:reference\n" in out
    assert "exactness unverified on torch " in out and "on cpu: the guard falls back if it differs: mine:copy" in out
    with fresh_runtime([("mine", cpu_plugin(((lane.torch, lane.triton, "cpu"),)))]):
        assert main(["info"]) == 0
    assert "exactness unverified" not in capsys.readouterr().out
