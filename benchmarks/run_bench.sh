#!/usr/bin/env bash
# Every `xbackend bench` table of docs/performance.md, on one GPU, from the repository root:
#   bash benchmarks/run_bench.sh        (outputs in $OUT, default /tmp/xbackend-out)
# Each table's command as benchmarks/runs.json names it, then the get_op attention timing
# (benchmarks/na_quick.py), the attention speed-of-light tables (benchmarks/na_sol.py, plain, strided
# and head-dim cases) and the GPU environment (versions, clocks).
source "$(dirname "$0")/_setup.sh"
XB="python3 -m xbackend.cli"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, '| cuda', torch.version.cuda, '| triton', triton.__version__)"
  date -u +%Y-%m-%d
} | tee "$OUT/environment.txt"
$XB bench dispatch 2>&1 | tee "$OUT/dispatch.txt"
bench() {  # NAME TIMEOUT ARGS...: one `xbackend bench` run, console output in $OUT/NAME.txt
  local name=$1 limit=$2; shift 2
  timeout "$limit" $XB bench "$@" >"$OUT/$name.txt" 2>&1; cat "$OUT/$name.txt"
}
bench bench_pointwise "${BENCH_TIMEOUT:-200}" rmsnorm rmsnorm_modulate gated_residual rotary_embedding qk_norm_rope --quick \
  --json "$OUT/bench_pointwise.json" --png "$OUT/bench_pointwise.png"
bench bench_narrow "${BENCH_TIMEOUT:-200}" qk_norm_rope_3d rmsnorm rmsnorm_modulate --quick --json "$OUT/bench_narrow.json"
bench bench_qk3d "${BENCH_TIMEOUT:-200}" qk_norm_rope_3d --json "$OUT/bench_qk3d.json"
bench bench_silu_mul "${BENCH_TIMEOUT:-200}" qk_norm_rope_3d silu_mul --quick --json "$OUT/bench_silu_mul.json"
bench bench_add_rmsnorm "${BENCH_TIMEOUT:-200}" add_rmsnorm rmsnorm_modulate --json "$OUT/bench_add_rmsnorm.json"
bench bench_gated "${GATED_TIMEOUT:-150}" gated_residual --json "$OUT/bench_gated.json"
bench bench_modulate "${BENCH_TIMEOUT:-200}" rmsnorm_modulate
bench bench_na "${NA_TIMEOUT:-120}" neighborhood_attention --quick --json "$OUT/bench_na.json"
timeout "${NA_TIMEOUT:-120}" python3 benchmarks/na_quick.py 2>&1 | tee "$OUT/na_quick.txt"
timeout "${SOL_TIMEOUT:-300}" python3 benchmarks/na_sol.py --cases plain,strided,head_dims --out "$OUT/na_sol.json" 2>&1 \
  | tee "$OUT/na_sol.txt"
