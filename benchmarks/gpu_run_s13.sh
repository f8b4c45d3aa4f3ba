# The thirteenth session's campaign (issue 38, then 35): the decode step's keys tuned afresh into an EMPTY store, so
# every published artifact is judged by the final round as it now times (the kernel behind the package's bound
# front, the op written as one function: search/evaluation, exporting/runtime/_binding.bind_plan), then the step.
# After the stage call and `bash benchmarks/gpu_setup_s11.sh` (PYTHONPATH=/tmp/site:/tmp/site3:/tmp/site5):
#   PHASE=tune1 bash benchmarks/gpu_run_s13.sh   # M = 1 keys into an empty store -> $OUT/store_m1.tgz; call paths
#   PHASE=tune4 STORE_TGZ=benchmarks/data/gpu_store_H200_s13_m1.tgz (setup) ... # + M = 4 keys -> $OUT/store_m4.tgz
#   PHASE=bench STORE_TGZ=benchmarks/data/gpu_store_H200_s13.tgz (setup) ...    # bench decode, 8 ops a commit
#   PHASE=pin4 STORE_TGZ=benchmarks/data/gpu_store_H200_s13_m1.tgz (setup) ...  # M = 4 at s11's configs, then the step
#   PHASE=final STORE_TGZ=benchmarks/data/gpu_store_H200_s13.tgz (setup) ...  # the step of record, REPS=2 runs
#   PHASE=ab (setup as bench) ...   # the step on the s11 and the s13 store, alternating (REPS=2), M = 1 and 4
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
  pin4)  # the M = 4 keys published at the eleventh session's configs (the step's faster set: PHASE=ab), each judged
    # by the final round as it now times, into the store of this session's M = 1 keys (STORE_TGZ=..._s13_m1.tgz)
    X="PATH=mma,QBITS=4,MB=8"
    while read -r fam shape cfg; do
      log="$OUT/pin_${fam}_${shape//,/x}.log"
      timeout 150 python3 -m kernsearch tune "$fam" --shape "$shape" --dtype float16 --trials 1 --finalists 1 \
        --start "$cfg" --backend cuda --publish --store /tmp/store > "$log" 2>&1
      echo "pin $fam $shape exit $?"; grep -E "^winner|beats|^artifact|^error" "$log" | cut -c1-300
    done <<PINS
rmsnorm_qmatvec 4,12288,4096,512,64 $X,TW=1,KS=4,RT=1,UNROLL=2
rmsnorm_swiglu_qmatvec 4,11008,4096,512,64 $X,TW=1,KS=2,RT=1,UNROLL=2
qmatvec_residual 4,4096,11008,1376,172 $X,TW=2,KS=4,RT=1,UNROLL=4
qmatvec_residual 4,4096,4096,512,64 $X,TW=4,KS=4,RT=1,UNROLL=2
mlp_block 4,4096,11008,512,64,1376,172 PATH=h2,QBITS=4,TW=1,KS=1,RT=1,UNROLL=2,MB=4,BPS=2
PINS
    tar czf "$OUT/store_pin4.tgz" -C /tmp store
    MLX_MAX_OPS_PER_BUFFER=8 PHASE=bench STORE=/tmp/store MS=1,4 ROUNDS=${ROUNDS:-20} LIMIT=${LIMIT:-200} OUT=$OUT \
      bash benchmarks/gpu_decode_step.sh 2>&1 | grep -E "sync:|pipelined:| us/call" | cut -c1-260 ;;
  final)  # the step of record on this session's store, twice (a call brings back at most 8 files)
    for i in $(seq "${REPS:-2}"); do
      MLX_MAX_OPS_PER_BUFFER=8 timeout "${LIMIT:-240}" python3 -m kernsearch bench decode --store /tmp/store --m 1,4 \
        --rounds "${ROUNDS:-20}" --json > "$OUT/step_$i.json" 2> "$OUT/step_$i.out.txt"
      echo "run $i exit $?"; grep -E "sync:|pipelined:| us/call" "$OUT/step_$i.out.txt" | cut -c1-200
    done ;;
  ab)  # the step on the eleventh session's store and on this one, alternating, in one process each, same machine
    for s in s11 s13; do rm -rf "/tmp/ab_$s"; mkdir -p "/tmp/ab_$s"; tar xzf "benchmarks/data/gpu_store_H200_$s.tgz" -C "/tmp/ab_$s"; done
    for i in $(seq "${REPS:-2}"); do
      for s in s13 s11; do
        MLX_MAX_OPS_PER_BUFFER=8 timeout "${LIMIT:-200}" python3 -m kernsearch bench decode --store "/tmp/ab_$s/store" \
          --m "${MS:-1,4}" --rounds "${ROUNDS:-16}" --json > "$OUT/step_${s}_$i.json" 2> "$OUT/step_${s}_$i.out.txt"
        echo "$s run $i exit $?"; grep -E "sync:|pipelined:" "$OUT/step_${s}_$i.out.txt" | cut -c1-130
      done
    done ;;
  *) echo "PHASE must be tune1, tune4, bench or ab" >&2; exit 2 ;;
esac
