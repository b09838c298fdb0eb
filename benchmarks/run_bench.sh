#!/usr/bin/env bash
# Every `xbackend bench` table of docs/performance.md, on one GPU, from the repository root:
#   bash benchmarks/run_bench.sh        (outputs in $OUT, default /tmp/xbackend-out)
# Then the get_op attention timing (benchmarks/na_quick.py), the attention speed-of-light table
# (benchmarks/na_sol.py) and the GPU environment (versions, clocks).
source "$(dirname "$0")/_setup.sh"
XB="python3 -m xbackend.cli"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, '| cuda', torch.version.cuda, '| triton', triton.__version__)"
  date -u +%Y-%m-%d
} | tee "$OUT/environment.txt"
$XB bench dispatch 2>&1 | tee "$OUT/dispatch.txt"
timeout "${BENCH_TIMEOUT:-200}" $XB bench rmsnorm rmsnorm_modulate gated_residual rotary_embedding qk_norm_rope --quick \
  --json "$OUT/bench_pointwise.json" --png "$OUT/bench_pointwise.png" >"$OUT/bench_pointwise.txt" 2>&1; cat "$OUT/bench_pointwise.txt"
timeout "${GATED_TIMEOUT:-150}" $XB bench gated_residual --json "$OUT/bench_gated.json" >"$OUT/bench_gated.txt" 2>&1
cat "$OUT/bench_gated.txt"
timeout "${NA_TIMEOUT:-120}" $XB bench neighborhood_attention --quick --json "$OUT/bench_na.json" >"$OUT/bench_na.txt" 2>&1
cat "$OUT/bench_na.txt"
timeout "${NA_TIMEOUT:-120}" python3 benchmarks/na_quick.py 2>&1 | tee "$OUT/na_quick.txt"
timeout "${SOL_TIMEOUT:-240}" python3 benchmarks/na_sol.py --out "$OUT/na_sol.json" 2>&1 | tee "$OUT/na_sol.txt"
