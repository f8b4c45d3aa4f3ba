# Issue 35 and 38, after gpu_run_s10_1.sh on the same (warm) machine: each artifact's best candidate whose interval
# against the published config clears 1.05 is offered to the gate by a short tune that starts from it and whose final
# round times its leader against the published version in paired rounds (docs/artifacts.md, rule 7); then the
# figures of record on the resulting store: `bench decode` M = 1 and 4, 20 rounds, MLX_MAX_OPS_PER_BUFFER=8, whose
# kernel rows carry issue 38's check (mlp_block at M = 1 against its gate bound 1.53, with the bench's chain now
# feeding X from the previous output). The store goes to $OUT/store.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
[ -d /tmp/store ] || { mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/; }
if [ "${PUBLISH:-1}" = 1 ] && ls /tmp/ab/gpu_ab_configs_*.json >/dev/null 2>&1; then
  timeout "${PLIMIT:-230}" python3 benchmarks/gpu_ab_publish.py --ab /tmp/ab/gpu_ab_configs_H200.json \
    --store /tmp/store --trials "${TRIALS:-4}" --timeout 200 2>&1 | cut -c1-700
fi
rm -rf "$OUT/store"; cp -r /tmp/store "$OUT/store"
MLX_MAX_OPS_PER_BUFFER=8 PHASE=bench STORE=/tmp/store MS=1,4 ROUNDS=${BROUNDS:-20} LIMIT=${BLIMIT:-230} OUT=$OUT/bench \
  bash benchmarks/gpu_decode_step.sh 2>&1 | grep -E "exit|M=[0-9]+ " | cut -c1-330
