# Issue 35 at M = 4: is each published config the fastest as a decode calls it, or did the tune's noise (48-67 %
# on these hosts) pick it? gpu_ab_configs.py: the published config's one-knob neighbours and the model's best of each
# PATH, verified against float64, each timed against the published config in paired chains (24 rounds, 32 calls).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
timeout "${LIMIT:-500}" python3 benchmarks/gpu_ab_configs.py --store /tmp/store --out "$OUT" --m "${M:-4}" \
  --per "${PER:-8}" --rounds "${ROUNDS:-24}" --max-seconds "${MAXS:-420}" 2>&1 | cut -c1-400
echo "ab exit ${PIPESTATUS[0]}"
