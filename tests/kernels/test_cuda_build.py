"""``_cuda_build.prebuild`` and ``xbackend build``: which CUDA extensions a host builds ahead of use,
which it skips and why, and how a failed build is reported. Nothing here compiles: torch's
``cpp_extension.load`` is replaced by a recorder (or a failing stand-in)."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
import torch.utils.cpp_extension

from xbackend import _fastkey, cli
from xbackend.kernels import _cuda_build, cuda_gated_residual, na_sm90


@pytest.fixture
def gpu_host(monkeypatch, tmp_path):
    """A host that can build CUDA extensions and sees one sm90 GPU; returns the recorded load() calls."""
    calls: list[dict] = []

    def fake_load(**kwargs):
        calls.append(kwargs)
        return types.SimpleNamespace(__file__=None)

    monkeypatch.setenv("XBACKEND_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "k.cu").write_text("__global__ void k() {}\n")
    monkeypatch.setattr(_cuda_build, "_CSRC", tmp_path / "src")  # where fresh() extensions find k.cu
    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_load)
    monkeypatch.setattr(_cuda_build, "environment_reason", lambda: None)
    monkeypatch.setattr(_cuda_build, "_device_capabilities", lambda: {(9, 0)})
    return calls


def fresh(name: str, **kwargs) -> _cuda_build.JitExtension:
    """An extension of k.cu (with gpu_host, in its source directory)."""
    return _cuda_build.JitExtension(name, ("k.cu",), f"test {name}", source_dir=_cuda_build._CSRC, **kwargs)


def test_the_package_extensions_are_each_modules_extension() -> None:
    assert _cuda_build.package_extensions() == [cuda_gated_residual.EXTENSION, na_sm90.EXTENSION]
    assert na_sm90.EXTENSION.capability == (9, 0) and cuda_gated_residual.EXTENSION.capability is None


def test_a_host_without_cuda_skips_every_extension_without_building(monkeypatch) -> None:
    monkeypatch.setattr(_cuda_build, "environment_reason", lambda: "no CUDA device")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda **kw: pytest.fail("nothing may build"))
    results = _cuda_build.prebuild([fresh("a"), fresh("b", capability=(9, 0))])
    assert [(r.outcome, r.detail) for r in results] == [("skipped", "no CUDA device")] * 2


def test_a_gpu_host_builds_what_its_gpus_run_and_skips_an_arch_specific_one_for_another_arch(gpu_host) -> None:
    sm90a = ("-gencode=arch=compute_90a,code=sm_90a",)
    sm100a = ("-gencode=arch=compute_100a,code=sm_100a",)
    results = _cuda_build.prebuild([fresh("any"), fresh("sm90", gencode=sm90a, capability=(9, 0)),
                                    fresh("sm100", gencode=sm100a, capability=(10, 0))])
    assert [r.outcome for r in results] == ["ready", "ready", "skipped"]
    assert results[2].detail == "no sm100 GPU visible (built for -gencode=arch=compute_100a,code=sm_100a only)"
    assert [c["name"] for c in gpu_host] == ["any_sm90", "sm90"]
    assert [Path(c["build_directory"]).name.rsplit("_", 1)[0] for c in gpu_host] == ["any_sm90", "sm90"]
    assert "-gencode=arch=compute_90,code=sm_90" in gpu_host[0]["extra_cuda_cflags"]
    assert sm90a[0] in gpu_host[1]["extra_cuda_cflags"]


def test_a_failed_build_reports_its_first_error_and_keeps_the_whole_log(gpu_host, monkeypatch) -> None:
    log = "Error building extension 'broken'\nk.cu(3): error: identifier \"x\" is undefined\n1 error detected"

    def failing_load(**kwargs):
        raise RuntimeError(log)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", failing_load)
    (result,) = _cuda_build.prebuild([fresh("broken")])
    assert result.outcome == "failed"
    assert result.detail == 'build failed: k.cu(3): error: identifier "x" is undefined'
    assert result.log == log


@pytest.mark.parametrize(("keys_fail", "outcomes", "rc"), [
    (False, ["skipped", "ready"], 0),
    (False, ["ready", "failed"], 1),
    (True, ["ready", "skipped"], 1),  # the CUDA kernels are still reported when the key extension fails
])
def test_xbackend_build_reports_each_extension_and_fails_on_a_failed_build(monkeypatch, capsys, keys_fail, outcomes,
                                                                           rc) -> None:
    def keys_build():
        if keys_fail:
            raise RuntimeError("fastkey.cpp:1: error: simulated")
        return None, 1.5

    fake = [_cuda_build.Prebuilt(f"cuda k{i}", o, 2.0 if o == "ready" else 0.0,
                                 {"skipped": "no CUDA device", "failed": "build failed: k.cu:1: error: x"}.get(o, ""),
                                 "the whole log" if o == "failed" else None) for i, o in enumerate(outcomes)]
    monkeypatch.setattr(_fastkey, "build", keys_build)
    monkeypatch.setattr(_cuda_build, "prebuild", lambda: fake)
    assert cli.main(["build"]) == rc
    out, err = capsys.readouterr()
    for r in fake:
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(r.label))
        assert ("ready (2.0 s)" if r.outcome == "ready" else f"{r.outcome}: {r.detail}") in line
    assert ("failed: the whole log" in err) == ("failed" in outcomes)
    assert ("dispatch key extension failed" in err) == keys_fail


def test_by_default_prebuild_reports_each_package_extension(monkeypatch) -> None:
    monkeypatch.setattr(_cuda_build, "environment_reason", lambda: "no CUDA device")
    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda **kw: pytest.fail("nothing may build"))
    assert [(r.label, r.outcome) for r in _cuda_build.prebuild()] == [
        ("cuda gated_residual", "skipped"), ("cuda na_sm90", "skipped")]


@pytest.mark.parametrize(("value", "built"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_an_extension_whose_switch_is_off_is_not_built(gpu_host, monkeypatch, value, built) -> None:
    monkeypatch.delenv("XB_TEST_SWITCH", raising=False)
    if value is not None:
        monkeypatch.setenv("XB_TEST_SWITCH", value)
    (result,) = _cuda_build.prebuild([fresh("switched", switch="XB_TEST_SWITCH")])
    assert (result.outcome, bool(gpu_host)) == (("ready", True) if built else ("skipped", False))
    if not built:
        assert result.detail == f"switched off (XB_TEST_SWITCH={value})"


def test_na_sm90s_extension_follows_its_switch() -> None:
    assert na_sm90.EXTENSION.switch == na_sm90.SWITCH


# -- the cache key: every source and header, the flags, the toolchain ---------------------------------
def _sources(root: Path) -> Path:
    """k.cu including k.cuh, which includes detail/inner.cuh and a toolkit header."""
    (root / "detail").mkdir(parents=True)
    (root / "k.cu").write_text('#include "k.cuh"\n#include <cuda_bf16.h>\n__global__ void k(float* y) { *y = VALUE; }\n')
    (root / "k.cuh").write_text('#pragma once\n  #  include "detail/inner.cuh"\n')
    (root / "detail" / "inner.cuh").write_text("#define VALUE 1.0f\n")
    return root


def _build_dir(calls: list[dict], src: Path, **kwargs) -> Path:
    """Where a fresh extension of ``src`` builds (``calls``: gpu_host's record of load())."""
    _cuda_build.JitExtension("xb_keyed", ("k.cu",), "test keyed", source_dir=src, **kwargs)._build()
    return Path(calls[-1]["build_directory"])


def _rewrite_older(path: Path, text: str) -> None:
    """New content with an mtime an hour older than before: an image rollback, ``rsync -a``, ``docker COPY``."""
    before = path.stat().st_mtime
    path.write_text(text)
    os.utime(path, (before - 3600, before - 3600))


def test_the_build_directory_follows_the_content_of_every_source_and_header_not_mtimes(gpu_host, tmp_path) -> None:
    src = _sources(tmp_path / "src")
    first = _build_dir(gpu_host, src)
    assert _build_dir(gpu_host, src) == first  # the same content: the same, already built, directory
    _rewrite_older(src / "detail" / "inner.cuh", "#define VALUE 2.0f\n")
    second = _build_dir(gpu_host, src)
    assert second != first
    _rewrite_older(src / "k.cu", (src / "k.cu").read_text() + "// a comment is content too\n")
    third = _build_dir(gpu_host, src)
    assert third not in (first, second)
    _rewrite_older(src / "detail" / "inner.cuh", "#define VALUE 1.0f\n")
    _rewrite_older(src / "k.cu", (src / "k.cu").read_text().replace("// a comment is content too\n", ""))
    assert _build_dir(gpu_host, src) == first  # back to the first content: its build is reused


def test_the_build_directory_follows_the_flags_and_the_toolchain(gpu_host, tmp_path, monkeypatch) -> None:
    src = _sources(tmp_path / "src")
    base = _build_dir(gpu_host, src, gencode=("-gencode=arch=compute_90a,code=sm_90a",))
    assert _build_dir(gpu_host, src, gencode=("-gencode=arch=compute_90,code=sm_90",)) != base
    monkeypatch.setattr(_cuda_build, "_nvcc_version", lambda: "Build cuda_13.1.r13.1/compiler.0_0")
    assert _build_dir(gpu_host, src, gencode=("-gencode=arch=compute_90a,code=sm_90a",)) != base


def test_a_missing_source_is_a_build_failure_naming_it(gpu_host, tmp_path) -> None:
    (result,) = _cuda_build.prebuild([_cuda_build.JitExtension("gone", ("gone.cu",), "test gone", source_dir=tmp_path)])
    assert result.outcome == "failed" and "gone.cu" in result.detail
