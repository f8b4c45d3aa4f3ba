# Issue 43 (fourteenth session): what async_eval costs a primitive (gpu_eval_costs.py), then mlx-lm's generation,
# Llama-7B-shaped, 128 tokens, plain mlx-lm against patch(model)
# with RoPE inside the compiled step ("compiled") and without it ("nostep": mlx-lm's RoPE op by op, as the
# thirteenth session's patch ran it), rounds interleaved in one process; MLX's default command buffers.
# run(carry=[.gpuwheels/b, .gpuwheels/c, .whl], "STORE_TGZ=benchmarks/data/gpu_store_H200_s13.tgz bash
#   benchmarks/gpu_setup_s11.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:/tmp/site3:/tmp/site5; bash benchmarks/gpu_run_s14.sh")
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -n "${COSTS-1}" ] && timeout 120 python3 benchmarks/gpu_eval_costs.py --out "$OUT/costs" --n 64 --reps 30
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site4 .whl/mlx_lm-*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site4
timeout "${L1:-400}" python3 benchmarks/gpu_mlx_lm_probe.py --store /tmp/store --out "$OUT/s14" \
  --forms "${FORMS:-compiled,nostep}" --rounds "${ROUNDS:-10}" ${CENSUS:+--census} 2>&1 | grep -vE "^\[INFO\]|^built"
echo "probe exit ${PIPESTATUS[0]}"
