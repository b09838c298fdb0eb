#!/usr/bin/env bash
# One device call for the model bars (issue 6): LTX-2 blocks patched vs eager vs compile vs patched+compile,
# three interleaved rounds per size, then the q/k kernel tests. Needs diffusers 0.42.1 as wheels in .whl/
# (carry ".whl"; `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
# --platform manylinux_2_28_x86_64 -d .whl diffusers==0.42.1 importlib_metadata`). ~4 min on an H200.
# Usage on the H200: bash gpu/run_models.sh
source "$(dirname "$0")/_setup.sh"
for s in 8160 32640; do
  # one process per size: a size that runs out of time still leaves the other's JSON
  timeout "${SEQ_TIMEOUT:-150}" python3 gpu/patch_check.py --layers 2 --seqs "$s" --compile-patched --rounds 3 \
    --out "$OUT/s$s" >"$OUT/patch_$s.log" 2>&1
  grep -v "kept in float32" "$OUT/patch_$s.log" | grep -v "^{" | cut -c1-300 | tail -6
done
timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_triton_qk_norm_rope.py \
  tests/test_gpu_integration.py >"$OUT/gpu_tests_models.txt" 2>&1; tail -2 "$OUT/gpu_tests_models.txt"
