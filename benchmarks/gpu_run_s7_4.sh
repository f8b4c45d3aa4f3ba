# The seventh session's fourth GPU run: the include form through the search's back-end (verify) and the package
# (bench decode, both loops, M = 1 and 4), the pipelined loop's host split, and mlx-lm.
set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d) KERNSEARCH_KERNEL_CACHE=/tmp/ks-kernel-cache
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7b/store/. /tmp/store/
for args in "rmsnorm_qmatvec 1,12288,4096,512,64 PATH=h2,KS=1,MB=1,TW=1,RT=1,UNROLL=4" "mlp_block 4,4096,11008,512,64,1376,172 PATH=h2,KS=1,MB=4,TW=1,RT=1,UNROLL=4,BPS=2"; do
  set -- $args
  echo "verify $*: $(timeout 100 python3 -m kernsearch verify $1 --backend cuda --dtype float16 --shape $2 --config $3 2>&1 | tail -1)"
done | tee $OUT/verify_include.txt
ls /tmp/ks-kernel-cache | head -3; ls /tmp/ks-kernel-cache | wc -l
PHASE=bench STORE=/tmp/store MS=1,4 ROUNDS=12 LIMIT=240 OUT=$OUT bash benchmarks/gpu_decode_step.sh 2>&1 | grep -v "^built" | grep -E "exit|M=" 
timeout 100 python3 benchmarks/gpu_pipeline_probe.py --store /tmp/store --out $OUT --tag m1inc --m 1 --rounds 8 > $OUT/probe_m1inc.txt 2>&1
echo "probe exit $?"; grep -v "^built" $OUT/probe_m1inc.txt | tail -16
[[ -n ${MLXLM:-} ]] && STORE=/tmp/store ROUNDS=3 timeout 200 bash benchmarks/gpu_mlx_lm.sh > $OUT/mlx_lm.txt 2>&1; echo "mlx-lm exit $?"; grep -iE "tok|x \(|speedup|error" $OUT/mlx_lm.txt | tail -12
