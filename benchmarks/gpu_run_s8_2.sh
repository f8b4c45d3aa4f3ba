# The eighth session's second GPU run: the decode step's sync loop (one eval per token) and mlx-lm's pipelined loop
# under sizes of MLX's command buffer (MLX_MAX_OPS_PER_BUFFER, read by MLX at start: one bench process per size;
# plain MLX and the package alike), M = 1 and 4. The first run found the sync ratio at M = 1 rising from 1.76x
# (MLX's default) to 1.88x at 32 and 1.97x at 8, the pipelined one unchanged.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
for ops in ${OPS:-default 16 8 4 2}; do
  if [[ $ops == default ]]; then unset MLX_MAX_OPS_PER_BUFFER; else export MLX_MAX_OPS_PER_BUFFER=$ops; fi
  PHASE=bench STORE=/tmp/store MS=${MS:-1,4} ROUNDS=${ROUNDS:-10} LIMIT=${LIMIT:-100} OUT=$OUT/ops_$ops \
    bash benchmarks/gpu_decode_step.sh 2>&1 | grep -E "exit|M=[0-9]+ (sync|pipelined)" | sed "s/^/[ops $ops] /"
done
