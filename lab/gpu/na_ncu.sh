# Nsight Compute over the shipped na_triton config of the video and stage-5 cases (third launch of each):
# tensor-pipe use, issue-slot use and the warp stall reasons that bound the KV loop.
#   bash lab/gpu/na_ncu.sh | tee $OUT/na_ncu.txt
OUT=${OUT:-/tmp/xbackend-out}; mkdir -p "$OUT"
timeout 240 ncu --clock-control none -k regex:"_na_fwd" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.avg.per_cycle_active \
  --csv --page details python3 lab/gpu/na_sweep.py --ncu --cases "${1:-video,stage5}" >"$OUT/na_ncu.csv" 2>"$OUT/na_ncu.err"
echo "ncu rc=$?"; tail -3 "$OUT/na_ncu.err"
python3 "$(dirname "$0")/ncu_table.py" "$OUT/na_ncu.csv"
