# The seventh session's fifth GPU run: bench decode (both loops, M = 1 and 4) through the package as landed,
# mlx-lm with and without patch(model), and the op-path consumer sweep of qmatvec (issue 37).
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
PHASE=bench STORE=/tmp/store MS=1,4 ROUNDS=15 LIMIT=200 OUT=$OUT bash benchmarks/gpu_decode_step.sh 2>&1 | grep -v "^built" | grep -E "exit|M=" 
STORE=/tmp/store ROUNDS=3 OUT=$OUT/mlx_lm timeout 200 bash benchmarks/gpu_mlx_lm.sh > $OUT/mlx_lm.txt 2>&1; echo "mlx-lm exit $?"; tail -30 $OUT/mlx_lm.txt | grep -vE "^\s+-|exact chip|skipped" | tail -14
timeout 150 python3 benchmarks/gpu_consumer.py --out $OUT --families qmatvec --rounds 33 > $OUT/consumer.txt 2>&1; echo "consumer exit $?"; tail -12 $OUT/consumer.txt
