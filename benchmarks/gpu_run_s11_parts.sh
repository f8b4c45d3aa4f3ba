# Issue 35: what a fused call's time in the bench's chain is made of (gpu_chain_parts.py): the published configs'
# kernels against a null kernel of the same launch, and the streaming read against its null, M = 1 then M = 4.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
for m in ${MS:-1 4}; do
  timeout "${LIMIT:-200}" python3 benchmarks/gpu_chain_parts.py --out "$OUT" --m "$m" --rounds "${ROUNDS:-20}" 2>&1 | grep -v "^built"
  echo "parts M=$m exit ${PIPESTATUS[0]}"
done
