# Issue 35: is each published decode config the fastest as a decode calls it, or did the tune's noise (48-67 % on
# these hosts) pick it? (The ninth session's Nsight pass: M = 4 kernels at 14-22 % of DRAM peak, O and down on 128
# threadgroups for 132 SMs.) gpu_ab_configs.py: the published config's one-knob neighbours and the model's best of
# each PATH, verified against float64, each timed against the published config in paired chains (24 rounds, 32
# calls). The JSON is kept in /tmp/ab for gpu_run_s10_2.sh (the machine stays warm between calls).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/ab; mkdir -p /tmp/ab
[ -d /tmp/store ] || { mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/; }  # the store of this machine's tunes where there is one
MS=${MS:-4,1}  # M = 4 first (Nsight found it slow), then M = 1 while time remains
# the step's four calls (mlp_block is not in the step's fastest form)
FAMS="--family rmsnorm_qmatvec --family qmatvec_residual --family rmsnorm_swiglu_qmatvec"
timeout "${LIMIT:-500}" python3 benchmarks/gpu_ab_configs.py --store /tmp/store --out "$OUT" ${MS:+--m ${MS//,/ --m }} $FAMS \
  --per "${PER:-8}" --rounds "${ROUNDS:-24}" --max-seconds "${MAXS:-430}" 2>&1 | cut -c1-400
echo "ab exit ${PIPESTATUS[0]}"
cp "$OUT"/gpu_ab_configs_*.json /tmp/ab/
