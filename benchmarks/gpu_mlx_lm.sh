#!/usr/bin/env bash
# Issue 43 on the GPU: an mlx-lm Llama model decoded by mlx-lm's own generation loop, with and without the exported
# package's patch(model) (kernsearch.bench._mlx_lm, what `kernsearch bench decode --mlx-lm` runs).
#
# On the device, from the repository root, after the MLX wheel install of ../shared/device/README.md and the tune
# phase of benchmarks/gpu_decode_step.sh (the store with the step's shapes tuned, in $STORE), with the mlx-lm wheel
# carried in .whl (the GPU machine has transformers, sentencepiece, protobuf, pyyaml, jinja2 already):
#   STORE=artifacts OUT=$OUT bash benchmarks/gpu_mlx_lm.sh
# Writes $OUT/gpu_mlx_lm_<chip>.json (the Llama-7B-shaped config: hidden 4096, FFN 11008, 32 layers, 32 heads, 4-bit
# g64, batch 1, prompt 128, 128 tokens) and $OUT/gpu_mlx_lm_<chip>_untuned.json (a GQA config nobody tuned: the ops
# must hold 1.0x), each with its .out.txt. Here (no GPU) DRY=1 runs both with tiny configs on MLX's CPU back-end.
set -u
OUT=${OUT:-/tmp/gpu_mlx_lm}
PY=${PY:-python3}
mkdir -p "$OUT"
export KERNSEARCH_HOME=${KERNSEARCH_HOME:-$(mktemp -d)} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if ! "$PY" -c "import kernsearch" 2>/dev/null; then
  rm -rf /tmp/site3 && "$PY" -m pip install -q --no-deps --no-build-isolation --target /tmp/site3 . \
    && export PYTHONPATH=${PYTHONPATH:-}:/tmp/site3
fi
if ! "$PY" -c "import mlx_lm" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site4 .whl/mlx_lm-*.whl \
    && export PYTHONPATH=${PYTHONPATH:-}:/tmp/site4
fi
"$PY" -c "import mlx.core as mx, mlx_lm, kernsearch; print('mlx', mx.__version__, 'mlx_lm', mlx_lm.__version__)" \
  | tee -a "$OUT/card.txt"
chip=$("$PY" -c "from kernsearch.hardware._chips import detect_chip; print(detect_chip().name.replace(' ', '-'))")
store=(--store "${STORE:-artifacts}")
if [[ -n ${DRY:-} ]]; then
  llama7b=(--hidden 256 --ffn 512 --layers 2 --heads 4 --kv-heads 4 --vocab 512 --prompt 16 --tokens 32 --rounds 1)
  untuned=(--hidden 128 --ffn 384 --layers 2 --heads 4 --kv-heads 1 --vocab 512 --group 32 --prompt 16 --tokens 32 --rounds 1)
else
  llama7b=(--hidden 4096 --ffn 11008 --layers 32 --heads 32 --kv-heads 32 --vocab 32000 --bits 4 --group 64
           --prompt 128 --tokens 128 --rounds "${ROUNDS:-5}")
  untuned=(--hidden 2048 --ffn 5632 --layers 22 --heads 32 --kv-heads 4 --vocab 32000 --bits 4 --group 64
           --prompt 128 --tokens 128 --rounds "${ROUNDS:-5}")
fi
for run in ${RUNS:-llama7b untuned}; do
  name="gpu_mlx_lm_$chip"; [[ $run == untuned ]] && name+="_untuned"
  declare -n args=$run
  timeout "${LIMIT:-280}" "$PY" -m kernsearch.bench._mlx_lm "${args[@]}" "${store[@]}" --json "$OUT/$name.json" \
    > "$OUT/$name.out.txt" 2>&1
  echo "$run exit $?"
  grep -v "^\[INFO\]" "$OUT/$name.out.txt" | head -12
done
