# Issue 43 (fifteenth session): mlx-lm's generation, Llama-7B-shaped, 128 tokens, plain mlx-lm against patch(model)
# with each block's tail chained to the next block's step ("compiled": one compiled call a layer) and without the
# chains ("nochain": two a layer, as the fourteenth session's patch ran it), rounds interleaved in one process; MLX's
# default command buffers (needs data/s15/chain.patch applied: `git apply benchmarks/data/s15/chain.patch`).
# run(carry=[.gpuwheels/b, .gpuwheels/c, .whl], "STORE_TGZ=benchmarks/data/gpu_store_H200_s13.tgz bash
#   benchmarks/gpu_setup_s11.sh >/dev/null 2>&1; export PYTHONPATH=/tmp/site:/tmp/site3:/tmp/site5; bash benchmarks/gpu_run_s15.sh")
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site4 .whl/mlx_lm-*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site4
timeout "${L1:-400}" python3 benchmarks/gpu_mlx_lm_probe.py --store /tmp/store --out "$OUT/s15" \
  --forms "${FORMS:-compiled,nochain}" --rounds "${ROUNDS:-12}" --tokens "${TOKENS:-128}" ${CENSUS:+--census} 2>&1 | grep -vE "^\[INFO\]|^built"
echo "probe exit ${PIPESTATUS[0]}"
