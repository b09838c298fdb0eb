# Nsight Compute over lab/gpu/qk3d_ncu.py's launches (the third of each kernel): what bounds the prelude.
#   bash lab/gpu/qk3d_ncu.sh | tee $OUT/qk3d_ncu.txt
OUT=${OUT:-/tmp/xbackend-out}; mkdir -p "$OUT"
timeout 300 ncu --clock-control none -k regex:"qk_norm_rope_3d|rmsnorm_exact" --launch-skip 2 --launch-count 4 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats --section InstructionStats \
  --csv --page details python3 lab/gpu/qk3d_ncu.py >"$OUT/qk3d_ncu.csv" 2>"$OUT/qk3d_ncu.err"
echo "ncu rc=$?"; tail -3 "$OUT/qk3d_ncu.err"
python3 - <<'PY'
import csv, io, os
text = open(os.environ.get("OUT", "/tmp/xbackend-out") + "/qk3d_ncu.csv").read()
start = text.find('"ID"')
rows = list(csv.DictReader(io.StringIO(text[start:]))) if start >= 0 else []
seen = set()
for r in rows:
    key = (r["ID"], r["Section Name"], r["Metric Name"])
    if key in seen:
        continue
    seen.add(key)
    print(f'{r["ID"]:>3} {r["Kernel Name"][:24]:<24} {r["Section Name"][:22]:<22} {r["Metric Name"][:48]:<48} {r["Metric Value"]:>14} {r["Metric Unit"]}')
PY
