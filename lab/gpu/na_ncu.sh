# Nsight Compute over the shipped config of the video and stage-5 cases (third launch of each kernel
# matching KERNEL, default any NA forward kernel): tensor-pipe use, issue-slot use, the warp stall
# reasons that bound the KV loop, and L2/DRAM throughput (K/V tiles are re-read from L2 by every tile).
#   bash lab/gpu/na_ncu.sh | tee $OUT/na_ncu.txt
OUT=${OUT:-/tmp/xbackend-out}; mkdir -p "$OUT"
timeout 240 ncu --clock-control none -k regex:"${KERNEL:-na_fwd}" --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
  --section WarpStateStats --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
  --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.avg.per_cycle_active,lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex.avg.pct_of_peak_sustained_elapsed,dram__bytes.sum.per_second \
  --csv --page details python3 lab/gpu/na_sweep.py --ncu --cases "${1:-video,stage5}" ${ONLY:+--only "$ONLY"} >"$OUT/na_ncu.csv" 2>"$OUT/na_ncu.err"
echo "ncu rc=$?"; tail -3 "$OUT/na_ncu.err"
python3 "$(dirname "$0")/ncu_table.py" "$OUT/na_ncu.csv"
