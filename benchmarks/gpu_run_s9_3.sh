# The ninth session's last GPU run: the figures of record with the kernels as they stand (the seventh session's
# store; this session's template changes were measured and taken out again): `bench decode` M = 1 and 4 with
# MLX_MAX_OPS_PER_BUFFER=8 (the sync loop's best), 20 rounds; then mlx-lm's generation with and without
# patch(model) (one RoPE call a layer), MLX's default buffer (its pipelined loop's best), 16 rounds.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
MLX_MAX_OPS_PER_BUFFER=8 PHASE=bench STORE=/tmp/store MS=1,4 ROUNDS=${BROUNDS:-20} LIMIT=${BLIMIT:-200} OUT=$OUT/bench \
  bash benchmarks/gpu_decode_step.sh 2>&1 | grep -E "exit|M=[0-9]+ " | cut -c1-330
STORE=/tmp/store ROUNDS=${ROUNDS:-16} OUT=$OUT/mlx_lm timeout "${LMLIMIT:-300}" bash benchmarks/gpu_mlx_lm.sh > "$OUT/mlx_lm.txt" 2>&1
echo "mlx-lm exit $?"; grep -E "decode tokens/s:|prefill|tokens:|layers (patched|left)|^mlx-lm Llama" "$OUT/mlx_lm.txt" | cut -c1-300
