# Issue 35 (twelfth session): the persistent lean core (gpu_core_lean.py's lean2) under Nsight Compute, GPU time of one
# launch at each step shape, at the clock ncu locks (as the ninth session's ncu of the tuned M = 4 mma kernels,
# data/ncu_m4_H200.csv, and of the streaming read): M = 4 and M = 1, beside the h2 core's prototype at M = 1.
set -u
export PATH=$PATH:/usr/local/cuda/bin
for shape in qkv down o gate_up; do
  for v in p8u2m4b2 p8u4m1b2 a1u4b256p4s; do
    k=lean2; case $v in a*) k=core;; esac
    t=$(timeout 100 ncu -k regex:"^$k\$" --launch-skip 5 --launch-count 1 --metrics gpu__time_duration.sum --csv \
      python3 benchmarks/gpu_core_lean.py --out /tmp/x --shapes $shape --reps 3 --variants $v 2>/dev/null \
      | grep gpu__time_duration | awk -F'","' '{print $NF}' | tr -d '"')
    echo "$shape $v ${t} ns"
  done
  t=$(timeout 100 ncu -k regex:'^stream$' --launch-skip 5 --launch-count 1 --metrics gpu__time_duration.sum --csv \
    python3 benchmarks/gpu_core_lean.py --out /tmp/x --shapes $shape --reps 3 --variants a1u4b256p4s 2>/dev/null \
    | grep gpu__time_duration | awk -F'","' '{print $NF}' | tr -d '"')
  echo "$shape stream ${t} ns"
done
