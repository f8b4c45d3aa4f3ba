# Issue 35: why the h2 core (gpu_core_proto's kernel) streams at ~2/3 of a streaming read: Nsight Compute's warp
# stall reasons, scheduler and memory figures for one launch of each kernel at the Q/K/V shape (12288x4096, M = 1).
set -u
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"
for v in a1u4b256p4s a2u2b256p4s r2u1s4b256p4; do
  k=core; case $v in r*) k=ring;; esac
  timeout 150 ncu -k regex:"^$k\$" --launch-skip 5 --launch-count 1 $S --csv --page details \
    python3 benchmarks/gpu_core_ring.py --out /tmp/x --shapes qkv --reps 3 --variants $v > $OUT/ncu_$v.csv 2> $OUT/ncu_$v.err
  echo "$v exit $?"
done
timeout 100 ncu -k regex:'^stream$' --launch-skip 5 --launch-count 1 $S --csv --page details \
  python3 benchmarks/gpu_core_ring.py --out /tmp/x --shapes qkv --reps 3 --variants a1u4b256p4s > $OUT/ncu_stream.csv 2> $OUT/ncu_stream.err
echo "stream exit $?"
