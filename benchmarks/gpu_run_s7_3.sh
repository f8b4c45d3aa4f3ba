set -u
export PYTHONUNBUFFERED=1 KERNSEARCH_HOME=$(mktemp -d)
rm -rf /tmp/store; mkdir -p /tmp/store; cp -r .gpustore7/store/. /tmp/store/
H=PATH=h2,KS=1
for args in "qmatvec_residual 4,4096,11008,1376,172 $H,MB=4,TW=1,RT=1,UNROLL=2" "qmatvec_residual 3,4091,10944,1368,171 $H,MB=4,TW=1,RT=1,UNROLL=4" "mlp_block 4,4096,11008,512,64,1376,172 $H,MB=4,TW=1,RT=1,UNROLL=2,BPS=2"; do
  set -- $args
  echo "verify $*: $(timeout 100 python3 -m kernsearch verify $1 --backend cuda --dtype float16 --shape $2 --config $3 2>&1 | tail -1)"
done | tee $OUT/h2_verify_s7.txt
KERNSEARCH_ARTIFACTS=/tmp/store timeout 200 python3 benchmarks/gpu_tune_decode.py --group fix4 --out $OUT --budget 150 --trials 200 --time-budget 30s --h2-start | tail -4
for m in 1 4; do
  timeout 100 python3 benchmarks/gpu_pipeline_probe.py --store /tmp/store --out $OUT --tag m$m --m $m --rounds 10 > $OUT/probe_m$m.txt 2>&1
  echo "probe M=$m exit $?"; grep -v "^built" $OUT/probe_m$m.txt | tail -13
done
tar czf $OUT/store.tgz -C /tmp store
