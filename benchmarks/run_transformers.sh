#!/usr/bin/env bash
# Whole diffusers transformers at real size, 2 layers, random weights, bf16: eager, xbackend.patch,
# torch.compile and patched + compile (transformer_check.py), then the first forward of eager and of
# patched in fresh processes (--first-call), per family: Wan 2.2 14B, Flux.2 dev, Qwen-Image, LTX-2.
# Needs diffusers 0.42.1; on a machine without network, as wheels in .whl/ (see run_models.sh).
# One bounded process per family and step, so one that runs out of time leaves the others' JSON.
# Estimated 8-9 minutes on one H100 in all (per family about 70-130 s of modes, 40-50 s of first calls);
# the bound is MAIN_TIMEOUT + 3 x CHILD_TIMEOUT + 20 s per family. FAMILIES picks some, e.g. two per call.
#   bash benchmarks/run_transformers.sh                 (outputs in $OUT, default /tmp/xbackend-out)
#   FAMILIES="wan flux2" bash benchmarks/run_transformers.sh
source "$(dirname "$0")/_setup.sh"
CHILD_TIMEOUT=${CHILD_TIMEOUT:-45}
run() {  # FAMILY ARGS...: the modes, then the first calls; each writes $OUT/transformer_<family>.json
  local family=$1; shift
  local log=$OUT/transformer_$family.log
  timeout "${MAIN_TIMEOUT:-150}" python3 benchmarks/transformer_check.py --family "$family" --out "$OUT" "$@" >"$log" 2>&1
  report $? "$log" 8
  log=$OUT/transformer_${family}_first_call.log
  timeout $((3 * CHILD_TIMEOUT + 20)) python3 benchmarks/transformer_check.py --family "$family" --first-call \
    --timeout "$CHILD_TIMEOUT" --out "$OUT" >"$log" 2>&1
  report $? "$log" 1
}
report() {  # RC LOG N: the last N lines a run printed (its table), or how far it got
  if [ "$1" -eq 124 ]; then echo "$2: timed out; last progress:"; tail -2 "$2" | cut -c1-300; return; fi
  grep -v "^\[" "$2" | cut -c1-300 | tail -"$3"
}
for family in ${FAMILIES:-wan flux2 qwen ltx2}; do
  case $family in
    wan|ltx2) run "$family" --rounds 2 ;;  # about 0.2 s a forward: 2 rounds keep the timing near 20 s
    *) run "$family" --rounds 3 ;;
  esac
done
