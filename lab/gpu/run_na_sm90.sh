#!/usr/bin/env bash
# na_sm90 on an sm90 GPU, one device call of under 10 minutes a mode:
#   bash lab/gpu/run_na_sm90.sh verify   # build, its GPU tests and the NA GPU tests, memcheck,
#                                        # lab variants
#   bash lab/gpu/run_na_sm90.sh sol      # benchmarks/na_sol.py's plain cases
#   bash lab/gpu/run_na_sm90.sh profile  # Nsight Compute over its stage-5 launch: tensor-pipe and
#                                        # issue use, MUFU use, warp stall reasons (na_ncu.sh's sections)
# Each step is bounded so one slow step cannot eat the others' time.
source "$(dirname "$0")/../../benchmarks/_setup.sh"
export XBACKEND_NA_SM90=1
case "${1:-verify}" in
  verify)
    python3 - <<'PY' 2>&1 | tee "$OUT/na_sm90_build.txt"
import time
t = time.perf_counter()
from xbackend.kernels import na_sm90
print("na_sm90 available:", na_sm90.available(), f"build+load {time.perf_counter() - t:.1f} s")
print(na_sm90.build_log() or "")
PY
    timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu -n 8 \
      tests/kernels/test_na_sm90.py tests/kernels/test_na_kernels.py tests/test_neighborhood_attention.py \
      >"$OUT/gpu_tests_na_sm90.txt" 2>&1; tail -5 "$OUT/gpu_tests_na_sm90.txt"
    sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
    timeout "${SANITIZE_TIMEOUT:-120}" "$sanitizer" --tool memcheck python3 lab/gpu/na_sm90_check.py 2>&1 \
      | tee "$OUT/na_sm90_memcheck.txt" | tail -8
    timeout "${LAB_TIMEOUT:-150}" python3 lab/gpu/na56/run.py --variants base,pair,late_refill --rounds 5 2>&1 \
      | tee "$OUT/na56_variants.txt"
    ;;
  sol)
    timeout "${SOL_TIMEOUT:-560}" python3 benchmarks/na_sol.py --cases plain --out "$OUT/na_sol_sm90.json" 2>&1 \
      | tee "$OUT/na_sol_sm90.txt"
    ;;
  profile)
    KERNEL=na_shift_sm90 bash "$(dirname "$0")/na_ncu.sh" stage5 2>&1 | tee "$OUT/na_sm90_ncu.txt"
    ;;
esac
