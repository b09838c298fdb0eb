#!/usr/bin/env bash
# On a GPU machine (Python 3.12, torch 2.11+cu130, Triton 3.6; no network): installs xbackend and this
# plugin from the checkout and liger-kernel from wheels/ (the wheel copied next to this script), then
# classifies liger's impls and benchmarks them at DiT shapes. Everything lands in $OUT:
#   liger.txt (the console), liger_classify.json, liger_bench.json, liger_install.log,
#   liger_tests.txt (step "tests": this plugin's tests and the conformance suite on the GPU).
# LIGER_STEPS picks the steps (default "classify bench"; e.g. LIGER_STEPS="tests" in a second call when
# one call's time limit is short). LIGER_TESTS=1 adds "tests". LIGER_BENCH_ARGS goes to bench_liger.py
# (e.g. "--ops rmsnorm --reps 50"; "--dry-run" checks this script on a CPU).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE/../.."
OUT=${OUT:-/tmp/xbackend-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
shopt -s nullglob
WHEELS=("$HERE"/wheels/*.whl)
shopt -u nullglob
[ ${#WHEELS[@]} -gt 0 ] || echo "run_gpu.sh: no wheel in $HERE/wheels/ (liger-kernel must then be installed already)"
python3 -m pip install -q --no-build-isolation --no-deps --no-index "${WHEELS[@]}" -e . -e "$HERE" \
  >"$OUT/liger_install.log" 2>&1 || { echo "install failed:"; tail -20 "$OUT/liger_install.log"; }
STEPS=" ${LIGER_STEPS:-classify bench} "
[ "${LIGER_TESTS:-0}" = 1 ] && STEPS="$STEPS tests "
{
  echo "== environment"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  python3 - <<'PY'
import platform, torch, triton
from xbackend_liger import impl
print(f"python {platform.python_version()} | torch {torch.__version__} | triton {triton.__version__} | "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
print(f"liger-kernel {impl.version()}: {impl.available() or 'available'}")
PY
  if [[ $STEPS == *" classify "* ]]; then
    echo "== classify (precision of every liger impl x dtype at DiT shapes)"
    timeout "${CLASSIFY_TIMEOUT:-200}" python3 "$HERE/bench_liger.py" --classify --json "$OUT/liger_classify.json" ${LIGER_BENCH_ARGS:-}
    echo "classify exit: $?"
  fi
  if [[ $STEPS == *" bench "* ]]; then
    echo "== bench (device µs; liger vs builtin vs eager vs torch.compile vs copy_)"
    timeout "${BENCH_TIMEOUT:-300}" python3 "$HERE/bench_liger.py" --json "$OUT/liger_bench.json" ${LIGER_BENCH_ARGS:-}
    echo "bench exit: $?"
  fi
  if [[ $STEPS == *" tests "* ]]; then
    echo "== tests (plugin tests and the conformance suite on this GPU)"
    timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider "$HERE/tests" >"$OUT/liger_tests.txt" 2>&1
    echo "tests exit: $?"
    tail -25 "$OUT/liger_tests.txt"
  fi
} 2>&1 | tee "$OUT/liger.txt"
