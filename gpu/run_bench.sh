#!/usr/bin/env bash
# Benchmarks only (after gpu/run_all.sh has proven the tests): the README's tables come from here.
source "$(dirname "$0")/_setup.sh"
XB="python3 -m xbackend.cli"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_integration.py >"$OUT/gpu_tests.txt" 2>&1; tail -2 "$OUT/gpu_tests.txt"
$XB bench dispatch 2>&1 | tee "$OUT/dispatch.txt"
timeout "${BENCH_TIMEOUT:-200}" $XB bench rmsnorm rmsnorm_modulate gated_residual rotary_embedding qk_norm_rope --quick \
  --json "$OUT/bench_pointwise.json" --png "$OUT/bench_pointwise.png" >"$OUT/bench_pointwise.txt" 2>&1; cat "$OUT/bench_pointwise.txt"
timeout "${NA_TIMEOUT:-120}" $XB bench neighborhood_attention --quick --json "$OUT/bench_na.json" >"$OUT/bench_na.txt" 2>&1; cat "$OUT/bench_na.txt"
