#!/usr/bin/env bash
# One device call: install (wheels in .whl/), the GPU tests in parallel workers, the fleet golden
# against the real device, the Liger plugin's classification and bench. Usage: bash benchmarks/run_verify.sh
source "$(dirname "$0")/_setup.sh"
python3 -m pip install -q --no-build-isolation --no-deps -e plugins/xbackend-liger >>/tmp/install.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
python3 -m xbackend.cli fleet --check goldens/ --local >>"$OUT/gpu.txt" 2>&1; echo "fleet --local rc=$?" | tee -a "$OUT/gpu.txt"
tail -15 "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -q -m gpu -p no:cacheprovider -n "${WORKERS:-6}" \
  tests plugins >"$OUT/gpu_tests.txt" 2>&1; echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.txt" | head -40; tail -3 "$OUT/gpu_tests.txt"
if [ -z "${SKIP_LIGER:-}" ]; then
  timeout "${LIGER_TIMEOUT:-150}" bash plugins/xbackend-liger/run_gpu.sh >"$OUT/liger_run.txt" 2>&1; tail -40 "$OUT/liger_run.txt"
fi
