python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . >/tmp/i.log 2>&1 || tail -5 /tmp/i.log
timeout 300 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --csv --page details python3 lab/gpu/rmsnorm_ncu.py >$OUT/ncu.csv 2>$OUT/ncu.err; echo "rc=$?"; tail -4 $OUT/ncu.err
python3 - <<'PY'
import csv, os, io
text = open(os.environ["OUT"] + "/ncu.csv").read()
start = text.find('"ID"')
rows = list(csv.DictReader(io.StringIO(text[start:]))) if start >= 0 else []
print(len(rows), "metric rows")
keep = ("Duration", "DRAM Throughput", "Memory Throughput", "L1/TEX Hit Rate", "L2 Hit Rate", "Achieved Occupancy",
        "Theoretical Occupancy", "Registers Per Thread", "Block Size", "Warp Cycles Per Issued Instruction",
        "Achieved Active Warps Per SM", "Shared Memory Configuration Size", "Mem Busy", "Max Bandwidth", "L1/TEX Cache Throughput",
        "L2 Cache Throughput", "DRAM Frequency", "SM Frequency", "Dynamic Shared Memory Per Block", "Static Shared Memory Per Block",
        "Waves Per SM", "Grid Size", "Mem Pipes Busy", "Block Limit Registers", "Block Limit Shared Mem", "Block Limit Warps", "Block Limit SM")
for r in rows:
    if r["Metric Name"] in keep:
        print(f'{r["ID"]:>3} {r["Kernel Name"][:40]:<40} {r["Metric Name"]:<36} {r["Metric Value"]:>12} {r["Metric Unit"]}')
PY
