#!/usr/bin/env bash
# Issue 40 on a real GPU, one device call (~6 minutes on an H200): where MLX keeps a compiled custom kernel
# (benchmarks/gpu_compile_cache.py), then the tuning throughput with each config timed by the worker that
# compiled it (benchmarks/gpu_throughput.py). Both JSONs and the log go to $OUT.
# On the device (MLX installed into /tmp/site, ../shared/device/README.md):
#     OUT=$OUT bash benchmarks/gpu_compile_once.sh
# Here, on the simulated GPU (nothing measured; 8 configs):  DRY=1 bash benchmarks/gpu_compile_once.sh
set -u
OUT=${OUT:-/tmp/gpu_compile_once}
PY=${PY:-python3}
mkdir -p "$OUT"
if [ -z "${DRY:-}" ]; then
    rm -rf /tmp/site3 && PYTHONPATH=/tmp/site "$PY" -m pip install -q --no-deps --no-build-isolation --target /tmp/site3 . \
        > "$OUT/install.log" 2>&1 || { echo "install failed"; tail -5 "$OUT/install.log"; exit 1; }
    export PYTHONPATH=/tmp/site:/tmp/site3
    FLAGS=()
    TP_FLAGS=()
else
    FLAGS=(--dry-run)
    TP_FLAGS=(--dry-run --configs 8 --workers 4 --serial-seconds 60)
    [ -x .venv/bin/python ] && PY=.venv/bin/python
fi
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"; } | tee "$OUT/card.txt"
echo "== 1. a kernel compiled in one process, launched in another" | tee "$OUT/compile_once.log"
start=$(date +%s)
timeout 150 "$PY" benchmarks/gpu_compile_cache.py --out "$OUT" "${FLAGS[@]}" 2>&1 | tail -12 | tee -a "$OUT/compile_once.log"
echo "($(( $(date +%s) - start )) s)" | tee -a "$OUT/compile_once.log"
echo "== 2. tuning throughput: serial loop vs workers that compile and time" | tee -a "$OUT/compile_once.log"
start=$(date +%s)
timeout 420 "$PY" benchmarks/gpu_throughput.py --out "$OUT" "${TP_FLAGS[@]}" 2>&1 | tail -8 | tee -a "$OUT/compile_once.log"
echo "($(( $(date +%s) - start )) s)" | tee -a "$OUT/compile_once.log"
