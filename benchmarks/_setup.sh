# Sourced by benchmarks/run_*.sh and lab/gpu/run_*.sh, run from the repository root: $OUT, unbuffered
# Python, and the project installed in the device's Python (with the wheels in .whl/, e.g. diffusers,
# when the call carried them).
set -uo pipefail
OUT=${OUT:-/tmp/xbackend-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
shopt -s nullglob
WHEELS=(.whl/*.whl)
shopt -u nullglob
python3 -m pip install -q --no-build-isolation --no-deps --no-index "${WHEELS[@]}" -e . -e plugins/xbackend-natten \
  >/tmp/install.log 2>&1 || { echo "install failed"; tail -20 /tmp/install.log; }
