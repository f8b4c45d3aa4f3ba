# The ninth session's second GPU run: (1) the current CUDA templates (mma path: rms_norm in half2, the next step's
# chunks prefetched into L2) against the seventh session's stored artifacts, same configs, paired in one process
# (gpu_ab_template.py; M = 1 rows whose h2 code did not change are the method's control); (2) mlx-lm's generation
# with and without patch(model), now one RoPE call a layer (issue 43), MLX's default command buffer.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
PY=${PY:-python3}
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
timeout "${ABLIMIT:-240}" "$PY" benchmarks/gpu_ab_template.py --store /tmp/store --out "$OUT" --rounds "${ABROUNDS:-40}" \
  2>&1 | grep -v "^built" | tail -20
echo "ab exit ${PIPESTATUS[0]}"
if [[ -z ${NOLM:-} ]]; then
  STORE=/tmp/store ROUNDS=${ROUNDS:-8} OUT=$OUT/mlx_lm timeout "${LMLIMIT:-280}" bash benchmarks/gpu_mlx_lm.sh > "$OUT/mlx_lm.txt" 2>&1
  echo "mlx-lm exit $?"; grep -vE "^\s+-|exact chip|skipped|^layer|^  " "$OUT/mlx_lm.txt" | tail -10
fi
