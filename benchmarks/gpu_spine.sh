#!/usr/bin/env bash
# Issue 30 on a real GPU: the measured path after the typed spine (records from the worker to the manifest, one
# publish path, the shared rules shipped in the package), in one device call of a few minutes.
#   1. the GPU tests (CUDA kernels built, verified against float64 and timed; every family called through an
#      exported package; the committed H100 artifacts dispatched by the package);
#   2. a measured search end to end: `tune --backend cuda --publish` (workers return Proof/Measurement, the final
#      round FinalTimings, the winner goes through Candidate.from_winner and the gate), then `explain`,
#      `artifacts verify` and `export` of the store it wrote.
# On the device: PYTHONPATH=/tmp/site:/tmp/site3 OUT=$OUT bash benchmarks/gpu_spine.sh  (see gpu_results.md).
# Here (no GPU): the GPU tests skip and BACKEND=model runs step 2 on the performance model, as a dry run.
set -u
OUT=${OUT:-/tmp/gpu_spine}
BACKEND=${BACKEND:-cuda}
PY=${PY:-python3}
mkdir -p "$OUT"
export KERNSEARCH_HOME=${KERNSEARCH_HOME:-$(mktemp -d)} KERNSEARCH_ARTIFACTS=${KERNSEARCH_ARTIFACTS:-$(mktemp -d)/store}

{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU"; } | tee "$OUT/card.txt"
"$PY" -c "import mlx.core as mx, kernsearch; print('mlx', mx.__version__, 'kernsearch', kernsearch.__file__)" \
    | tee -a "$OUT/card.txt"

echo "== 1. GPU tests" | tee "$OUT/spine.log"
start=$(date +%s)
timeout 330 "$PY" -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_cuda.py tests/test_gpu_families.py \
    tests/test_export.py 2>&1 | tail -25 | tee -a "$OUT/spine.log"
echo "(pytest: $(( $(date +%s) - start )) s)" | tee -a "$OUT/spine.log"

echo "== 2. tune layernorm --backend $BACKEND --publish" | tee -a "$OUT/spine.log"
start=$(date +%s)
timeout 150 "$PY" -m kernsearch tune layernorm --backend "$BACKEND" --trials 10 --finalists 2 --publish --json \
    > "$OUT/tune_layernorm.json" 2> "$OUT/tune_layernorm.err"
echo "tune exit $? ($(( $(date +%s) - start )) s)" | tee -a "$OUT/spine.log"
tail -4 "$OUT/tune_layernorm.err" | tee -a "$OUT/spine.log"
"$PY" - "$OUT/tune_layernorm.json" <<'EOF' 2>&1 | tee -a "$OUT/spine.log"
import json, sys
r = json.load(open(sys.argv[1]))
final = r.get("final") or {}
print("evidence", r.get("evidence"), "| winner", final.get("winner"), "| speedup", final.get("speedup"),
      "low", final.get("speedup_low"), "| modes", json.dumps(final.get("modes")),
      "| verdict", r.get("verdict"), "| publish", json.dumps(r.get("publish")))
EOF
for cmd in "explain layernorm" "artifacts verify" "export layernorm --out $OUT/dist --version 1.0.0"; do
    echo "-- kernsearch $cmd" | tee -a "$OUT/spine.log"
    # shellcheck disable=SC2086
    timeout 120 "$PY" -m kernsearch $cmd 2>&1 | tail -6 | tee -a "$OUT/spine.log"
done
# verify checks correctness: another chip's space may be checked on the GPU here (its limits, this device's run)
other=H100; grep -q H100 "$OUT/card.txt" && other=H200
echo "-- kernsearch verify gemm --backend $BACKEND --chip $other --shape 256,256,256" | tee -a "$OUT/spine.log"
timeout 120 "$PY" -m kernsearch verify gemm --backend "$BACKEND" --chip "$other" --shape 256,256,256 2>&1 | tail -3 \
    | tee -a "$OUT/spine.log"
cp -r "$KERNSEARCH_ARTIFACTS" "$OUT/store" 2>/dev/null || true
rm -rf "$OUT/dist/src" 2>/dev/null || true
