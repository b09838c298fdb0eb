#!/usr/bin/env bash
# One device call: install, probe, GPU tests, benchmarks. Everything lands in $OUT (logs + JSON + PNG).
# Usage on the H200: PYTHONUNBUFFERED=1 bash gpu/run_all.sh
set -uo pipefail
OUT=${OUT:-/tmp/xbackend-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . -e plugins/xbackend-natten >"$OUT/install.log" 2>&1 \
  || { echo "install failed"; tail -20 "$OUT/install.log"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
xbackend info 2>&1 | tee "$OUT/info.txt" | head -40
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider -x --timeout=120 tests plugins 2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
xbackend bench dispatch 2>&1 | tee "$OUT/dispatch.txt"
timeout ${BENCH_TIMEOUT:-200} xbackend bench rmsnorm rmsnorm_modulate gated_residual --json "$OUT/bench_pointwise.json" --png "$OUT/bench_pointwise.png" 2>&1 | tee "$OUT/bench_pointwise.txt"
timeout ${NA_TIMEOUT:-120} xbackend bench neighborhood_attention --json "$OUT/bench_na.json" 2>&1 | tee "$OUT/bench_na.txt"
