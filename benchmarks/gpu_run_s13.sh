# The thirteenth session's campaign (issue 38, then 35): the decode step's keys tuned afresh into an EMPTY store, so
# every published artifact is judged by the final round as it now times (the kernel behind the package's bound
# front, the op written as one function: search/evaluation, exporting/runtime/_binding.bind_plan), then the step.
# After the stage call and `bash benchmarks/gpu_setup_s11.sh` (PYTHONPATH=/tmp/site:/tmp/site3:/tmp/site5):
#   PHASE=tune1 bash benchmarks/gpu_run_s13.sh   # M = 1 keys into an empty store -> $OUT/store_m1.tgz; call paths
#   PHASE=tune4 STORE_TGZ=benchmarks/data/gpu_store_H200_s13_m1.tgz (setup) ... # + M = 4 keys -> $OUT/store_m4.tgz
#   PHASE=bench STORE_TGZ=benchmarks/data/gpu_store_H200_s13.tgz (setup) ...    # bench decode, 8 ops a commit
# DRY=1 runs the tunes on the CPU (model back-end): the commands and start configs only.
set -u
OUT=${OUT:-/tmp/gpu_s13}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=160
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee -a "$OUT/card.txt"
case "${PHASE:?tune1, tune4 or bench}" in
  tune1)
    rm -rf /tmp/store; mkdir -p /tmp/store
    M=1 OUT=$OUT bash benchmarks/gpu_run_s11_tune.sh 2>&1 | tee "$OUT/tune_m1.txt"
    [[ -z ${DRY:-} ]] && MLX_MAX_OPS_PER_BUFFER=8 timeout 120 python3 benchmarks/gpu_call_paths.py --store /tmp/store \
      --out "$OUT" --m 1 --rounds 24 2>&1 | tail -3 ;;
  tune4)
    M=4 OUT=$OUT bash benchmarks/gpu_run_s11_tune.sh 2>&1 | tee "$OUT/tune_m4.txt" ;;
  bench)
    MLX_MAX_OPS_PER_BUFFER=8 PHASE=bench STORE=/tmp/store MS=1,4 ROUNDS=${ROUNDS:-20} LIMIT=${LIMIT:-480} OUT=$OUT \
      bash benchmarks/gpu_decode_step.sh 2>&1 | tail -60 ;;
  *) echo "PHASE must be tune1, tune4 or bench" >&2; exit 2 ;;
esac
