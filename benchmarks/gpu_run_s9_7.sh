# The ninth session's last GPU run: K split eight ways inside a threadgroup (KS = 8, new in qmatvec's space), for the
# two M = 4 calls with N = 4096 that Nsight found launching 128 threadgroups for 132 SMs (O and down + residual):
# tunes with KS = 8 configs evaluated first, published into a copy of the store if the gate takes them, then `bench
# decode` M = 4 with the new store and the old, MLX_MAX_OPS_PER_BUFFER=8.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store_old /tmp/store; mkdir -p /tmp/store_old /tmp/store
cp -r .gpustore7b/store/. /tmp/store_old/; cp -r .gpustore7b/store/. /tmp/store/
S=PATH=mma,QBITS=4,MB=8,KS=8
for shape in 4,4096,4096,512,64 4,4096,11008,1376,172; do
  timeout 75 python3 -m kernsearch tune qmatvec_residual --shape $shape --dtype float16 --time-budget ${TUNE:-25s} \
    --publish --store /tmp/store --start $S,TW=1,RT=1,UNROLL=4 --start $S,TW=1,RT=2,UNROLL=2 --start $S,TW=2,RT=1,UNROLL=2 \
    > $OUT/tune_$shape.log 2>&1
  echo "tune $shape exit $?"; grep -E "^ [0-9] |as consumers|published|not published" $OUT/tune_$shape.log | cut -c1-260
done
export MLX_MAX_OPS_PER_BUFFER=8
for s in new old; do
  st=/tmp/store; [[ $s == old ]] && st=/tmp/store_old
  PHASE=bench STORE=$st MS=4 ROUNDS=${ROUNDS:-10} LIMIT=80 OUT=$OUT/bench_$s bash benchmarks/gpu_decode_step.sh 2>&1 \
    | grep -E "M=4 (sync|pipelined|o |down)" | cut -c1-230 | sed "s/^/[$s] /"
done
