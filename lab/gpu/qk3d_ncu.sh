# Nsight Compute over lab/gpu/qk3d_ncu.py's launches (the third of each kernel): what bounds the prelude.
#   bash lab/gpu/qk3d_ncu.sh | tee $OUT/qk3d_ncu.txt
OUT=${OUT:-/tmp/xbackend-out}; mkdir -p "$OUT"
timeout 300 ncu --clock-control none -k regex:"qk_norm_rope_3d|rmsnorm_exact" --launch-skip 2 --launch-count 4 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --csv --page details python3 lab/gpu/qk3d_ncu.py >"$OUT/qk3d_ncu.csv" 2>"$OUT/qk3d_ncu.err"
echo "ncu rc=$?"; tail -3 "$OUT/qk3d_ncu.err"
python3 "$(dirname "$0")/ncu_table.py" "$OUT/qk3d_ncu.csv"
