# Issue 43 (fifteenth session): are the patched decode's slow rounds threads sharing the main thread's CPU? The
# probe (plain mlx-lm against patch(model), rounds interleaved, one process each) as it runs, then with the main
# thread alone on one CPU after the warm-up (--isolate: MLX's and CUDA's threads moved off it).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site4 .whl/mlx_lm-*.whl 2>/dev/null; export PYTHONPATH=$PYTHONPATH:/tmp/site4
for form in ${FORMS:-shared isolated}; do
  echo "== $form"
  extra=(); [[ $form == isolated ]] && extra=(--isolate 3)
  timeout 250 python3 benchmarks/gpu_mlx_lm_probe.py --store /tmp/store --out "$OUT/$form" --forms compiled \
    --rounds "${ROUNDS:-20}" --tokens "${TOKENS:-64}" "${extra[@]}" 2>&1 | grep -vE "^\[INFO\]|^built|^round"
done
