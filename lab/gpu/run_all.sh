#!/usr/bin/env bash
# One device call: install, probe, GPU tests, benchmarks. At most 8 files land in $OUT.
# Usage on the H200: bash lab/gpu/run_all.sh
source "$(dirname "$0")/../../benchmarks/_setup.sh"
XB="python3 -m xbackend.cli"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
$XB info >"$OUT/info.txt" 2>&1; head -12 "$OUT/info.txt"
timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -q -m gpu -p no:cacheprovider --timeout=120 \
  tests/test_gpu_integration.py tests/kernels plugins >"$OUT/gpu_tests.txt" 2>&1; tail -6 "$OUT/gpu_tests.txt"
$XB bench dispatch --quick 2>&1 | tee "$OUT/dispatch.txt"
timeout "${BENCH_TIMEOUT:-200}" $XB bench rmsnorm rmsnorm_modulate gated_residual rotary_embedding qk_norm_rope --quick \
  --json "$OUT/bench_pointwise.json" --png "$OUT/bench_pointwise.png" >"$OUT/bench_pointwise.txt" 2>&1; cat "$OUT/bench_pointwise.txt"
timeout "${NA_TIMEOUT:-130}" $XB bench neighborhood_attention --quick --json "$OUT/bench_na.json" >"$OUT/bench_na.txt" 2>&1; cat "$OUT/bench_na.txt"
