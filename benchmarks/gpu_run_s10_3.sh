# Issue 43: where a patched mlx-lm decode token's host time goes, now with mx.async_eval (MLX encoding and sending
# the step's kernels) timed beside the forward; plain mlx-lm against patch(model), rounds interleaved; then the same
# with MLX_MAX_OPS_PER_BUFFER=8 (the sync loop's best buffer size in bench decode).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache HF_HUB_OFFLINE=1
[ -d /tmp/store ] || { mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/; }  # the store of this machine's tunes where there is one
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site4 .whl/mlx_lm-*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site4
timeout "${L1:-220}" python3 benchmarks/gpu_mlx_lm_probe.py --store /tmp/store --out "$OUT/default" --forms compiled \
  --rounds "${ROUNDS:-10}" 2>&1 | grep -vE "^\[INFO\]|^built"
echo "probe exit ${PIPESTATUS[0]}"
MLX_MAX_OPS_PER_BUFFER=8 timeout "${L2:-200}" python3 benchmarks/gpu_mlx_lm_probe.py --store /tmp/store \
  --out "$OUT/ops8" --forms compiled --rounds "${ROUNDS2:-8}" 2>&1 | grep -vE "^\[INFO\]|^built"
echo "probe exit ${PIPESTATUS[0]}"
