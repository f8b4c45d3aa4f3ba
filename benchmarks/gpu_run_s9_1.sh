# The ninth session's first GPU run (issue 35): the mma path's rms_norm folded into X's fragments in half2 (M = 4).
# Tunes norm + Q/K/V and norm + gate/up at M = 4 into a copy of the seventh session's H200 store (its winners
# evaluated first; the regression gate judges the new version against the stored one in this run), then `bench
# decode` at M = 4 (sync and pipelined, MLX_MAX_OPS_PER_BUFFER=8) with the old store and with the new, one process
# each, so that old and new kernels are compared within one run. Writes $OUT/store_s9.tgz (the new store).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
PY=${PY:-python3}
rm -rf /tmp/store_old /tmp/store; mkdir -p /tmp/store_old /tmp/store
cp -r .gpustore7b/store/. /tmp/store_old/; cp -r .gpustore7b/store/. /tmp/store/
tune() {
  timeout "${TLIMIT:-150}" "$PY" -m kernsearch tune "$1" --shape "$2" --dtype float16 --time-budget "${TUNE:-40s}" \
    --publish --store /tmp/store --start "$3" --start "$4" > "$OUT/tune_$1.log" 2>&1
  echo "tune $1 exit $?"; grep -vE "configs evaluated \(" "$OUT/tune_$1.log" | tail -16
}
tune rmsnorm_qmatvec 4,12288,4096,512,64 PATH=mma,QBITS=4,TW=1,KS=4,RT=1,UNROLL=2,MB=8 PATH=mma,QBITS=4,TW=1,KS=2,RT=1,UNROLL=4,MB=8
tune rmsnorm_swiglu_qmatvec 4,11008,4096,512,64 PATH=mma,QBITS=4,TW=1,KS=2,RT=1,UNROLL=4,MB=8 PATH=mma,QBITS=4,TW=1,KS=4,RT=1,UNROLL=2,MB=8
tar czf "$OUT/store_s9.tgz" -C /tmp store
export MLX_MAX_OPS_PER_BUFFER=8
for s in old new; do
  st=/tmp/store; [[ $s == old ]] && st=/tmp/store_old
  PHASE=bench STORE=$st MS=${MS:-4} ROUNDS=${ROUNDS:-10} LIMIT=${LIMIT:-110} OUT=$OUT/bench_$s PY=$PY \
    bash benchmarks/gpu_decode_step.sh 2>&1 | grep -E "exit|M=[0-9]+ " | cut -c1-400 | sed "s/^/[$s] /"
  "$PY" - "$OUT"/bench_$s/gpu_decode_step_*.json <<'PYEOF' | sed "s/^/[$s] /"
import json, sys
def r(v):
    return round(v, 1) if isinstance(v, (int, float)) else v
for k in json.load(open(sys.argv[1])).get("kernels", []):
    print(k.get("M"), k["family"], k["shape"], *(f"{f} {r(k.get(f))}" for f in (
        "us", "stream_us", "pct_of_stream", "us_compiled", "stream_us_compiled", "pct_of_stream_compiled")))
PYEOF
done
