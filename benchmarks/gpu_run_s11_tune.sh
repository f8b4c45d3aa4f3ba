# The eleventh session's store (the seventh's, .gpustore7b, was not kept with the checkout): every call of the
# Llama-7B-shaped step tuned afresh on this machine with the current code and published into /tmp/store, M = $M
# (1 or 4), one `kernsearch tune --publish` per key, 30 s of search each. Each tune evaluates first the configs the
# earlier sessions' tunes published (gpu_tune_fused1_h200_s6b.log, gpu_tune_fused4_h200_s7.log, gpu_tune_fix4_h200_s7.log,
# gpu_tune_norm4_half2_h200_s9.log) and the h2 core's, then searches. The store goes to $OUT/store_m$M.tgz.
# DRY=1 runs the same tunes on the CPU (model back-end, no publish): it checks the commands and the start configs.
set -u
export PYTHONUNBUFFERED=1 COLUMNS=160 KERNSEARCH_HOME=${KERNSEARCH_HOME:-$(mktemp -d)} KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
M=${M:?M=1 or M=4}
OUT=${OUT:-/tmp/gpu_s11}; mkdir -p "$OUT" /tmp/store
H="PATH=h2,QBITS=4,KS=1,TW=1"
run=(--backend cuda --publish --store /tmp/store); [[ -n ${DRY:-} ]] && run=(--backend model --chip H200 --trials 3)
tune() {
  local fam=$1 shape=$2 log; shift 2; local starts=(); for c in "$@"; do starts+=(--start "$c"); done
  log="$OUT/tune_${fam}_${shape//,/x}.log"
  timeout "${TLIMIT:-120}" python3 -m kernsearch tune "$fam" --shape "$shape" --dtype float16 --trials 200 \
    --finalists 3 --time-budget "${TUNE:-30s}" "${starts[@]}" "${run[@]}" > "$log" 2>&1
  echo "tune $fam $shape exit $?"
  grep -E "^study|^winner|^artifact|^the winner|lead over|^error" "$log" | cut -c1-420
}
if [[ $M == 1 ]]; then
  tune rmsnorm_qmatvec 1,12288,4096,512,64 "$H,MB=1,RT=1,UNROLL=4" "$H,MB=1,RT=1,UNROLL=2" "$H,MB=1,RT=2,UNROLL=2"
  tune rmsnorm_swiglu_qmatvec 1,11008,4096,512,64 "$H,MB=1,RT=1,UNROLL=2" "$H,MB=1,RT=1,UNROLL=4" "$H,MB=1,RT=2,UNROLL=2"
  tune qmatvec_residual 1,4096,11008,1376,172 "$H,MB=1,RT=2,UNROLL=2" "$H,MB=1,RT=1,UNROLL=2" "$H,MB=1,RT=1,UNROLL=4"
  tune qmatvec_residual 1,4096,4096,512,64 "$H,MB=1,RT=2,UNROLL=2" "$H,MB=1,RT=1,UNROLL=2" "$H,MB=1,RT=1,UNROLL=4"
  tune mlp_block 1,4096,11008,512,64,1376,172 "$H,MB=1,RT=1,UNROLL=2,BPS=4" "$H,MB=1,RT=1,UNROLL=4,BPS=3"
else
  X="PATH=mma,QBITS=4,MB=8"
  tune rmsnorm_qmatvec 4,12288,4096,512,64 "$X,TW=1,KS=2,RT=1,UNROLL=4" "$X,TW=1,KS=4,RT=1,UNROLL=2" "$H,MB=4,RT=1,UNROLL=4"
  tune rmsnorm_swiglu_qmatvec 4,11008,4096,512,64 "$X,TW=1,KS=2,RT=1,UNROLL=2" "$X,TW=1,KS=2,RT=1,UNROLL=4" "$H,MB=4,RT=1,UNROLL=4"
  tune qmatvec_residual 4,4096,11008,1376,172 "$X,TW=2,KS=4,RT=1,UNROLL=4" "$X,TW=1,KS=4,RT=1,UNROLL=4" "$H,MB=4,RT=1,UNROLL=4"
  tune qmatvec_residual 4,4096,4096,512,64 "$X,TW=1,KS=4,RT=2,UNROLL=4" "$X,TW=2,KS=4,RT=1,UNROLL=2" "$H,MB=4,RT=1,UNROLL=4"
  tune mlp_block 4,4096,11008,512,64,1376,172 "$H,MB=4,RT=1,UNROLL=4,BPS=2" "$H,MB=4,RT=1,UNROLL=2,BPS=2"
fi
[[ -z ${DRY:-} ]] && tar czf "$OUT/store_m$M.tgz" -C /tmp store
echo "done M=$M"
