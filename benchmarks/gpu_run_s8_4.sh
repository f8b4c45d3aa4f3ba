# The eighth session's fourth GPU run: mlx-lm's generation with and without patch(model) after patch learned to
# leave alone what no kernel wins (the untuned config then runs mlx-lm's own forward), 8 rounds, MLX's default buffer.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
STORE=/tmp/store ROUNDS=${ROUNDS:-8} OUT=$OUT/mlx_lm LIMIT=250 timeout 520 bash benchmarks/gpu_mlx_lm.sh > $OUT/mlx_lm.txt 2>&1
echo "mlx-lm exit $?"; grep -vE "^\s+-|exact chip|skipped|^  " $OUT/mlx_lm.txt | tail -32
