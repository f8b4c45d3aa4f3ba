# The ninth session: where a patched mlx-lm decode spends its host time (gpu_mlx_lm_probe.py), plain mlx-lm against
# patch(model) compiled and patch(model, compiled=False), each a copy patched once; then the same with the garbage
# collector off during each timed generation.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache HF_HUB_OFFLINE=1
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site4 .whl/mlx_lm-*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site4
timeout "${L1:-240}" python3 benchmarks/gpu_mlx_lm_probe.py --store /tmp/store --out "$OUT/gc_on" --rounds "${ROUNDS:-10}" 2>&1 | grep -vE "^\[INFO\]|^built"
echo "probe exit ${PIPESTATUS[0]}"
timeout "${L2:-200}" python3 benchmarks/gpu_mlx_lm_probe.py --store /tmp/store --out "$OUT/gc_off" --rounds "${ROUNDS2:-6}" --gc-off 2>&1 | grep -vE "^\[INFO\]|^built"
echo "probe exit ${PIPESTATUS[0]}"
