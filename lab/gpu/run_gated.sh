#!/usr/bin/env bash
# The gated residual campaign (issue 3): build time, GPU tests, host cost per launch path, the bench
# table and the kernel variants, each step bounded so one slow step cannot eat the others' time.
source "$(dirname "$0")/../../benchmarks/_setup.sh"
python3 - <<'PY' 2>&1 | tee "$OUT/gated_build.txt"
import time
t = time.perf_counter()
from xbackend.kernels import cuda_gated_residual as c
print("cuda gated_residual available:", c.available(), f"build+load {time.perf_counter() - t:.1f} s")
PY
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_gated_residual_kernels.py \
  tests/test_gated_residual.py tests/test_backends.py >"$OUT/gpu_tests_gated.txt" 2>&1; tail -3 "$OUT/gpu_tests_gated.txt"
timeout "${HOST_TIMEOUT:-90}" python3 lab/gpu/gated_small_host.py --rounds 2 2>&1 | tee "$OUT/gated_small_host.txt"
python3 -m xbackend.cli bench dispatch 2>&1 | tee "$OUT/dispatch.txt"
timeout "${BENCH_TIMEOUT:-150}" python3 -m xbackend.cli bench gated_residual --json "$OUT/bench_gated.json" \
  >"$OUT/bench_gated.txt" 2>&1; cat "$OUT/bench_gated.txt"
if [ -n "${VARIANTS:-}" ]; then
  timeout "${VARIANTS_TIMEOUT:-150}" python3 lab/gpu/gated_residual_variants.py --out "$OUT" --rounds 2 2>&1 \
    | tee "$OUT/gated_residual_variants.txt"
fi
if [ -n "${SWEEP:-}" ]; then
  timeout "${SWEEP_TIMEOUT:-150}" python3 lab/gpu/gated_residual_sweep.py --out "$OUT" --rounds 2 2>&1 \
    | tee "$OUT/gated_residual_sweep.txt"
fi
if [ -n "${FULL:-}" ]; then  # every GPU test of the suite (~3.5 min on the H200)
  timeout "${FULL_TIMEOUT:-260}" python3 -m pytest -q -m gpu -p no:cacheprovider tests plugins >"$OUT/gpu_tests.txt" 2>&1
  tail -3 "$OUT/gpu_tests.txt"
fi
