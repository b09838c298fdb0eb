#!/usr/bin/env bash
# One device call: install (wheels in .whl/), the fleet goldens against the real device, the GPU tests
# in parallel workers, then (BENCH=1) `xbackend bench --quick` of the pointwise ops and (unless
# SKIP_LIGER=1) the Liger plugin's classification and bench. Usage: bash benchmarks/run_verify.sh
source "$(dirname "$0")/_setup.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m xbackend.cli fleet --check goldens/ --local >>"$OUT/gpu.txt" 2>&1; echo "fleet --local rc=$?" | tee -a "$OUT/gpu.txt"
tail -15 "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -q -m gpu -p no:cacheprovider -n "${WORKERS:-6}" \
  tests plugins >"$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -40; tail -3 "$OUT/gpu_tests.txt"
if [ -n "${BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-240}" python3 -m xbackend.cli bench rmsnorm rmsnorm_modulate gated_residual rotary_embedding \
    qk_norm_rope --quick --json "$OUT/bench_pointwise.json" >"$OUT/bench_pointwise.txt" 2>&1; cat "$OUT/bench_pointwise.txt"
fi
if [ -z "${SKIP_LIGER:-}" ]; then
  timeout "${LIGER_TIMEOUT:-150}" bash plugins/xbackend-liger/run_gpu.sh >"$OUT/liger_run.txt" 2>&1; tail -40 "$OUT/liger_run.txt"
fi
