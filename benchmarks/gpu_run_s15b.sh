# Issue 43 (fifteenth session): `kernsearch bench decode --mlx-lm` (benchmarks/gpu_mlx_lm.sh), the Llama-7B-shaped
# config, with MLX's default command buffers, then with one command buffer a decode token for both forms
# (MLX_MAX_OPS_PER_BUFFER=1000 MLX_MAX_MB_PER_BUFFER=100000: MLX's CUDA back-end commits a graph every 100 ops by
# default on sm_90, several a token). Each in its own process (MLX reads the variables once, at its start).
# run(carry=[.gpuwheels/b, .gpuwheels/c, .whl], "STORE_TGZ=benchmarks/data/gpu_store_H200_s13.tgz bash
#   benchmarks/gpu_setup_s11.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:/tmp/site3:/tmp/site5; bash benchmarks/gpu_run_s15b.sh")
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for form in ${FORMS:-default buffers}; do
  echo "== $form"
  if [[ $form == buffers* ]]; then
    MLX_MAX_OPS_PER_BUFFER=1000 MLX_MAX_MB_PER_BUFFER=100000 OUT=$OUT/$form bash benchmarks/gpu_mlx_lm.sh
  else
    OUT=$OUT/$form bash benchmarks/gpu_mlx_lm.sh
  fi
done
