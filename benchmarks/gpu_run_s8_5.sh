# The eighth session's last GPU run: bench decode (M = 1 and 4, 10 rounds) with each kernel row also timed as
# compiled chains, so that the kernels' share of the streaming read is seen with and without the host's graph building.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
PHASE=bench STORE=/tmp/store MS=1,4 ROUNDS=${ROUNDS:-10} LIMIT=300 OUT=$OUT bash benchmarks/gpu_decode_step.sh 2>&1 \
  | grep -v "^built" | grep -E "exit|M="
