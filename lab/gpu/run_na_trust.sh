#!/usr/bin/env bash
# The NA trust items on an sm90 GPU, one device call of under 10 minutes a mode:
#   bash lab/gpu/run_na_trust.sh verify   # the NA GPU tests (new and existing), then compute-sanitizer
#                                         # memcheck over lab/gpu/na_memcheck.py
#   bash lab/gpu/run_na_trust.sh bench    # call time of this tree against .base (an earlier commit's
#                                         # package): lab/gpu/na_trust_bench.py, stage-5 tile and 3-D video
#   bash lab/gpu/run_na_trust.sh all      # bench (2 rounds), then a subset of the tests and memcheck at once
# Each step is bounded so one slow step cannot eat the others' time.
source "$(dirname "$0")/../../benchmarks/_setup.sh"
case "${1:-verify}" in
  verify)
    timeout "${TEST_TIMEOUT:-330}" python3 -m pytest -v -p no:cacheprovider -m gpu -n 8 \
      tests/kernels/test_na_wide.py tests/kernels/test_na_nonfinite.py tests/kernels/test_na_sm90.py \
      tests/kernels/test_na_kernels.py >"$OUT/gpu_tests_na_trust.txt" 2>&1
    grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests_na_trust.txt" | tail -30
    timeout "${WARM_TIMEOUT:-90}" python3 lab/gpu/na_memcheck.py >"$OUT/na_memcheck_warm.txt" 2>&1
    tail -3 "$OUT/na_memcheck_warm.txt"
    sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SANITIZE_TIMEOUT:-150}" "$sanitizer" --tool memcheck \
      --leak-check no --error-exitcode 1 python3 lab/gpu/na_memcheck.py >"$OUT/na_memcheck.txt" 2>&1
    echo "memcheck exit $?"; tail -8 "$OUT/na_memcheck.txt"
    ;;
  all)  # one call: the bench alone first (timing), then the tests and memcheck side by side
    timeout "${BENCH_TIMEOUT:-250}" python3 lab/gpu/na_trust_bench.py --compare .base --rounds "${ROUNDS:-2}" \
      --cases stage5,video --out "$OUT/na_trust_bench.json" >"$OUT/na_trust_bench.txt" 2>&1
    tail -9 "$OUT/na_trust_bench.txt"
    sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${SANITIZE_TIMEOUT:-270}" "$sanitizer" --tool memcheck \
      --leak-check no --error-exitcode 1 python3 lab/gpu/na_memcheck.py >"$OUT/na_memcheck.txt" 2>&1 &
    timeout "${TEST_TIMEOUT:-270}" python3 -m pytest -v -p no:cacheprovider -m gpu -n 8 \
      tests/kernels/test_na_wide.py tests/kernels/test_na_nonfinite.py tests/kernels/test_na_sm90.py \
      tests/kernels/test_na_kernels.py -k "wide or fused or contiguous or non_finite or sm90 or gluon or shift or launch_forms or strided_inputs" \
      >"$OUT/gpu_tests_na_trust.txt" 2>&1
    grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests_na_trust.txt" | tail -30
    wait; echo "memcheck exit $?"; grep -E "^(ok|FAIL)|ERROR SUMMARY|of .* ok|Invalid|Error" "$OUT/na_memcheck.txt" | tail -40
    ;;
  bench)
    timeout "${BENCH_TIMEOUT:-540}" python3 lab/gpu/na_trust_bench.py --compare .base --rounds "${ROUNDS:-3}" \
      --cases "${CASES:-stage5,video}" --out "$OUT/na_trust_bench.json" 2>&1 | tee "$OUT/na_trust_bench.txt"
    ;;
esac
