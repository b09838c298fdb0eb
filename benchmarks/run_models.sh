#!/usr/bin/env bash
# The LTX-2 block table of docs/performance.md: patched vs eager vs torch.compile vs patched + compile,
# interleaved rounds per size, LTX-2.0 (interleaved RoPE) and LTX-2.3 (split RoPE), then the q/k kernel
# tests. Needs diffusers 0.42.1; on a machine without network, as wheels in .whl/ (`pip download --no-deps
# --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl
# diffusers==0.42.1 importlib_metadata`). About 5 minutes on an H200.
#   bash benchmarks/run_models.sh       (outputs in $OUT, default /tmp/xbackend-out)
source "$(dirname "$0")/_setup.sh"
run() {  # NAME ARGS...: one process per configuration, so one that runs out of time leaves the others' JSON
  local name=$1; shift
  timeout "${SEQ_TIMEOUT:-150}" python3 benchmarks/patch_check.py --layers 2 --compile-patched "$@" \
    --out "$OUT/$name" >"$OUT/$name.log" 2>&1
  grep -v "kept in float32" "$OUT/$name.log" | grep -v "^{" | cut -c1-300 | tail -6
}
run ltx20_8160 --seqs 8160 --rounds 2
run ltx20_32640 --seqs 32640 --rounds 3
run ltx23_8160 --seqs 8160 --rounds 2 --variant ltx2.3 --rope-type split
timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_triton_qk_norm_rope.py \
  tests/test_gpu_integration.py >"$OUT/gpu_tests_models.txt" 2>&1; tail -2 "$OUT/gpu_tests_models.txt"
