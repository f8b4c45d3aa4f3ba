# The seventh session's sixth GPU run: the h2 configs of each M = 1 call under Nsight Compute (GPU time only: which
# config a host-free timing would pick), and one call's host cost by form, twice.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
H=PATH=h2,KS=1,TW=1,MB=1
specs=""
for role in qkv o down; do for rt in 1 2; do for u in 2 4; do specs+=" $role:$H,RT=$rt,UNROLL=$u"; done; done; done
for v in "RT=1,UNROLL=2" "RT=1,UNROLL=4" "RT=2,UNROLL=2"; do specs+=" gate_up:$H,$v"; done
(cd benchmarks && timeout 300 ncu --profile-from-start off --clock-control none --csv --metrics gpu__time_duration.sum \
  python3 gpu_ncu_decode.py $specs > $OUT/ncu_h2_sweep.csv 2> $OUT/ncu_h2_sweep.err); echo "ncu exit $?"
python3 - "$OUT/ncu_h2_sweep.csv" $specs <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
head, data = rows[0], rows[1:]
k, v = head.index("Kernel Name"), head.index("Metric Value")
times = [float(r[v].replace(",", "")) / 1000 for r in data]
names = [r[k][:40] for r in data]
print(len(times), "kernels")
specs = sys.argv[2:]
# per round: stream, then each spec; two rounds
per = 1 + len(specs)
for i, s in enumerate(specs):
    t = [times[r * per + 1 + i] for r in range(2) if r * per + 1 + i < len(times)]
    print(f"{s:50s} {' '.join(f'{x:6.1f}' for x in t)} us")
print("stream", [times[r * per] for r in range(2) if r * per < len(times)])
PY
[[ -n ${COST:-} ]] && for i in 1 2; do timeout 100 python3 benchmarks/gpu_call_cost.py --store .gpustore7b/store --out $OUT/cost$i --rounds 40 2>&1 | grep -E "_us"; done
