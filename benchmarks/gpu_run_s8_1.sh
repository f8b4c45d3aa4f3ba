# The eighth session's first GPU run: issue 37's op-path sweep of qmatvec with 99 paired rounds (host µs now timed
# interleaved; the drop-in decode with its paired interval), then issue 35's sync loop under three sizes of MLX's
# command buffer (MLX_MAX_OPS_PER_BUFFER: unset, 32, 8; plain MLX and the package alike, M = 1): does letting the GPU
# start before the host has sent the whole token change the ratio, or only both sides' times?
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
timeout 230 python3 benchmarks/gpu_consumer.py --out $OUT --families qmatvec --rounds 99 > $OUT/consumer.txt 2>&1
echo "consumer exit $?"; tail -8 $OUT/consumer.txt
for ops in default 32 8; do
  if [[ $ops == default ]]; then unset MLX_MAX_OPS_PER_BUFFER; else export MLX_MAX_OPS_PER_BUFFER=$ops; fi
  PHASE=bench STORE=/tmp/store MS=1 ROUNDS=10 LIMIT=90 OUT=$OUT/ops_$ops bash benchmarks/gpu_decode_step.sh 2>&1 \
    | grep -E "exit|M=1 (sync|pipelined)" | sed "s/^/[ops $ops] /"
done
