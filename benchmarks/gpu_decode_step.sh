#!/usr/bin/env bash
# Issue 35 on the GPU: tune the fused decode families at every shape a Llama-7B-shaped step calls, then
# `kernsearch bench decode` through the exported package (one device call each; the store comes back as a tarball).
#
# On the device, from the repository root (or a copy of it), after the wheel install of ../shared/device/README.md:
#   PHASE=tune  TUNE_GROUPS="fused1" BUDGET=480 TUNE=60s OUT=$OUT bash benchmarks/gpu_decode_step.sh
#   PHASE=bench STORE=artifacts OUT=$OUT bash benchmarks/gpu_decode_step.sh
# H2START=1 evaluates the h2 core's configs first in each tune (tune --start).
# PHASE=tune publishes into $KERNSEARCH_ARTIFACTS (default: ./artifacts) and writes $OUT/artifacts_<group>.tgz;
# PHASE=bench writes $OUT/gpu_decode_step_<chip>.json (and .out.txt). Here (no GPU) DRY=1 runs both on the CPU
# with a small step: it checks the commands, not the kernels.
set -u
OUT=${OUT:-/tmp/gpu_decode_step}
PY=${PY:-python3}
PHASE=${PHASE:-bench}
mkdir -p "$OUT"
export KERNSEARCH_HOME=${KERNSEARCH_HOME:-$(mktemp -d)} PYTHONUNBUFFERED=1 COLUMNS=160
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"; } | tee -a "$OUT/card.txt"
if ! "$PY" -c "import kernsearch" 2>/dev/null; then
  rm -rf /tmp/site3 && "$PY" -m pip install -q --no-deps --no-build-isolation --target /tmp/site3 . \
    && export PYTHONPATH=${PYTHONPATH:-}:/tmp/site3
fi
"$PY" -c "import mlx.core as mx, kernsearch; print('mlx', mx.__version__, 'kernsearch', kernsearch.__file__)" \
  | tee -a "$OUT/card.txt"

case "$PHASE" in
  tune)
    for group in ${TUNE_GROUPS:-fused1}; do
      if [[ -n ${DRY:-} ]]; then
        "$PY" benchmarks/gpu_tune_decode.py --group "$group" --out "$OUT" --budget "${BUDGET:-480}" --dry-run ${H2START:+--h2-start}
      else
        "$PY" benchmarks/gpu_tune_decode.py --group "$group" --out "$OUT" --budget "${BUDGET:-480}" \
          --trials "${TRIALS:-200}" --time-budget "${TUNE:-60s}" ${H2START:+--h2-start}
      fi
      tail -30 "$OUT/tunes_$group.log" | grep -E "^\\$|beats|keep|published|winner|exit" | tee -a "$OUT/summary.txt"
    done ;;
  bench)
    args=(--store "${STORE:-artifacts}" --rounds "${ROUNDS:-30}" --m "${MS:-1,4}")
    [[ -n ${DRY:-} ]] && args+=(--hidden 256 --ffn 512 --layers 2 --rounds 3)
    chip=$("$PY" -c "from kernsearch.hardware._chips import detect_chip; print(detect_chip().name.replace(' ', '-'))")
    timeout "${LIMIT:-420}" "$PY" -m kernsearch bench decode "${args[@]}" --json \
      > "$OUT/gpu_decode_step_$chip.json" 2> "$OUT/gpu_decode_step_$chip.out.txt"
    echo "bench exit $?"
    cat "$OUT/gpu_decode_step_$chip.out.txt" ;;
  *) echo "PHASE must be tune or bench" >&2; exit 2 ;;
esac
