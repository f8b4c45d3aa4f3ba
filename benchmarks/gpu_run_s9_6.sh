# The ninth session: the M = 4 calls' kernels (the store's tuned mma configs) and the streaming read under Nsight
# Compute, full sections: what holds them at 40-62 % of the streaming read (bandwidth, occupancy, stalls).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
M4="PATH=mma,QBITS=4,MB=8"
specs="qkv:$M4,TW=1,KS=4,RT=1,UNROLL=2 o:$M4,TW=1,KS=4,RT=2,UNROLL=4 gate_up:$M4,TW=1,KS=2,RT=1,UNROLL=4 down:$M4,TW=2,KS=4,RT=1,UNROLL=4"
(cd benchmarks && NCU_M=4 timeout 400 ncu --profile-from-start off --csv --page details --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  python3 gpu_ncu_decode.py $specs > $OUT/ncu_m4.csv 2> $OUT/ncu_m4.err); echo "ncu exit $?"
python3 - "$OUT/ncu_m4.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, data = rows[0], rows[1:]
ix = {h: i for i, h in enumerate(head)}
want = ("Duration", "DRAM Throughput", "Memory Throughput", "Achieved Occupancy", "Theoretical Occupancy",
        "Registers Per Thread", "Block Size", "Grid Size", "Waves Per SM", "Compute (SM) Throughput",
        "Warp Cycles Per Issued Instruction", "Issue Slots Busy", "Dynamic Shared Memory Per Block")
seen = {}
for r in data:
    k = (r[ix["ID"]], r[ix["Kernel Name"]][:38])
    if r[ix["Metric Name"]] in want:
        seen.setdefault(k, []).append(f"{r[ix['Metric Name']]}={r[ix['Metric Value']]}{r[ix['Metric Unit']]}")
for k, v in seen.items():
    print(k[0], k[1], "; ".join(v))
PY
