# Issue 35 (twelfth session, second probe): where the h2 core and the lean tensor-core core spend their cycles.
# Nsight Compute's warp stall reasons (per issued instruction) and instruction mix for one launch of each at the
# Q/K/V shape, and each kernel's SASS (cuobjdump of the cubin nvcc makes of the same source and knobs).
set -u
export PATH=$PATH:/usr/local/cuda/bin
M="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section InstructionStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor.sum,sm__cycles_active.avg"
run() {  # name script kernel variant
  timeout 120 ncu -k regex:"^$3\$" --launch-skip 5 --launch-count 1 $M --csv --page raw \
    python3 benchmarks/$2 --out /tmp/x --shapes qkv --reps 3 --variants $4 > $OUT/ncu2_$1.csv 2> $OUT/ncu2_$1.err
  echo "$1 exit $?"
}
run h2 gpu_core_ring.py core a1u4b256p4s
run lean1 gpu_core_lean.py lean l4u2m1
run lean4 gpu_core_lean.py lean l8u2m4
run stream gpu_core_ring.py stream a1u4b256p4s
python3 - <<'PY'
import sys; sys.path.insert(0, "benchmarks")
from pathlib import Path
import gpu_core_proto as p, gpu_core_lean as l
Path("/tmp/core.cu").write_text(p.SOURCE); Path("/tmp/lean.cu").write_text(l.SOURCE)
PY
nvcc -arch=sm_90 -cubin -DRT=1 -DUNR=4 -DBLOCK=256 -DSUMCHUNK=1 -o /tmp/core.cubin /tmp/core.cu 2>/dev/null && cuobjdump -sass /tmp/core.cubin > $OUT/sass_h2.txt
nvcc -arch=sm_90 -cubin -DKS=4 -DUNR=2 -DMB=1 -DGS=64 -o /tmp/lean.cubin /tmp/lean.cu 2>/dev/null && cuobjdump -sass /tmp/lean.cubin > $OUT/sass_lean.txt
wc -l $OUT/sass_*.txt
