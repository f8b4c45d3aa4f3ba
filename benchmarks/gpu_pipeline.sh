#!/usr/bin/env bash
# Issue 35 on the GPU: a custom kernel's host cost inline vs #include, then the decode step's host/GPU overlap
# (benchmarks/gpu_pipeline_probe.py) under MLX's default graphs, with graphs off, and with commits every 10 ops.
#   STORE=<store tuned on this chip> OUT=$OUT bash benchmarks/gpu_pipeline.sh
set -u
OUT=${OUT:-/tmp/gpu_pipeline}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
timeout 120 python3 benchmarks/gpu_host_cost.py > "$OUT/host_cost.txt" 2>&1; echo "host_cost exit $?"
cat "$OUT/host_cost.txt"
for tag in ${TAGS:-default nographs ops10}; do
  case $tag in
    nographs) env=(MLX_USE_CUDA_GRAPHS=0) ;;
    ops10) env=(MLX_MAX_OPS_PER_BUFFER=10) ;;
    *) env=() ;;
  esac
  echo "== $tag ${env[*]}"
  env "${env[@]}" timeout "${LIMIT:-150}" python3 benchmarks/gpu_pipeline_probe.py --store "${STORE:-artifacts}" \
    --out "$OUT" --tag "$tag" ${PROBE_ARGS:-} > "$OUT/probe_$tag.txt" 2>&1
  echo "exit $?"; grep -v "^built" "$OUT/probe_$tag.txt" | tail -14
done
