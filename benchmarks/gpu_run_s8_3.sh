# The eighth session's third GPU run: mlx-lm's own generation (issue 43) with and without patch(model), Llama-7B
# shape, under MLX's default command buffer and MLX_MAX_OPS_PER_BUFFER=8 (which took the bench's sync step at M = 1
# from 1.78x to 2.07x).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
for ops in default 8; do
  if [[ $ops == default ]]; then unset MLX_MAX_OPS_PER_BUFFER; else export MLX_MAX_OPS_PER_BUFFER=$ops; fi
  STORE=/tmp/store ROUNDS=${ROUNDS:-5} OUT=$OUT/mlx_lm_$ops timeout 260 bash benchmarks/gpu_mlx_lm.sh > $OUT/mlx_lm_$ops.txt 2>&1
  echo "[ops $ops] mlx-lm exit $?"; grep -vE "^\s+-|exact chip|skipped|^layer|^  " $OUT/mlx_lm_$ops.txt | tail -8 | sed "s/^/[ops $ops] /"
done
