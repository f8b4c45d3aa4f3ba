# The ninth session: mlx-lm's generation with and without patch(model), now with each block's package calls replayed
# by mx.compile (and one RoPE call a layer), MLX's default buffer, 16 rounds (issue 43).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
STORE=/tmp/store ROUNDS=${ROUNDS:-16} OUT=$OUT/mlx_lm timeout "${LMLIMIT:-400}" bash benchmarks/gpu_mlx_lm.sh > "$OUT/mlx_lm.txt" 2>&1
echo "mlx-lm exit $?"; grep -E "round|decode tokens/s:|prefill|tokens:|layers (patched|left)|^mlx-lm Llama" "$OUT/mlx_lm.txt" | cut -c1-200
