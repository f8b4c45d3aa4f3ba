#!/usr/bin/env bash
# Issue 35: the h2 path of the quantized matrix-vector core (templates/_lib/qmatvec.cu.j2) against the float64
# reference on the GPU, for every family built on it, at the Llama-7B shapes and at ragged ones (rows past a tile,
# K not a multiple of 32 chunks a lane, M not the compiled MB, 8 bits). One line per run; exit status = failures.
# On the GPU machine: PYTHONPATH=/tmp/site:/tmp/site3 bash benchmarks/gpu_h2_verify.sh | tee $OUT/h2_verify.txt
set -u
PY=${PY:-python3}
fails=0
run() {  # family shape config
  out=$("$PY" -m kernsearch verify "$1" --backend cuda --dtype float16 --shape "$2" --config "$3" 2>&1 | tail -1)
  echo "$1 $2 $3: $out"
  [[ $out == *PASS* || $out == *pass* ]] || fails=$((fails + 1))
}
H=PATH=h2,KS=1
run qmatvec 1,4096,4096,512,64 $H,MB=1,TW=1,RT=1,UNROLL=4
run qmatvec 3,4000,4032,504,63 $H,MB=4,TW=1,RT=1,UNROLL=2
run qmatvec 2,1000,2048,512,16 $H,QBITS=8,MB=2,TW=1,RT=2,UNROLL=2
run rmsnorm_qmatvec 1,12288,4096,512,64 $H,MB=1,TW=1,RT=1,UNROLL=4
run rmsnorm_qmatvec 3,1000,4032,504,63 $H,MB=4,TW=1,RT=2,UNROLL=2
run qmatvec_residual 1,4096,11008,1376,172 $H,MB=1,TW=1,RT=1,UNROLL=4
run qmatvec_residual 2,1000,2112,264,33 $H,MB=2,TW=1,RT=1,UNROLL=4
run qmatvec_residual 1,11008,4096,512,64 $H,MB=1,TW=1,RT=1,UNROLL=2
run rmsnorm_swiglu_qmatvec 1,11008,4096,512,64 $H,MB=1,TW=1,RT=1,UNROLL=4
run rmsnorm_swiglu_qmatvec 3,1000,4032,504,63 $H,MB=4,TW=1,RT=1,UNROLL=2
run mlp_block 1,4096,11008,512,64,1376,172 $H,MB=1,TW=1,RT=1,UNROLL=4,BPS=1
run mlp_block 1,4096,11008,512,64,1376,172 $H,MB=1,TW=1,RT=1,UNROLL=2,BPS=1
run mlp_block 3,4032,1984,504,63,248,31 $H,MB=4,TW=1,RT=1,UNROLL=2,BPS=1
run rmsnorm_qmatvec 1,12288,4096,512,64 $H,MB=1,TW=1,RT=2,UNROLL=4
run rmsnorm_swiglu_qmatvec 1,11008,4096,512,64 $H,MB=1,TW=1,RT=2,UNROLL=2
run qmatvec_residual 2,4095,11008,1376,172 $H,MB=2,TW=1,RT=2,UNROLL=2
run mlp_block 1,4096,11008,512,64,1376,172 $H,MB=1,TW=1,RT=2,UNROLL=2,BPS=1
run mlp_block 2,4032,1984,504,63,248,31 $H,MB=2,TW=1,RT=2,UNROLL=2,BPS=1
# X past 48 KB of shared memory (the opt-in): M = 4 against K = 11008, 2 threadgroups an SM
run qmatvec_residual 4,4096,11008,1376,172 $H,MB=4,TW=1,RT=1,UNROLL=2
run qmatvec_residual 3,4091,10944,1368,171 $H,MB=4,TW=1,RT=1,UNROLL=4
run mlp_block 4,4096,11008,512,64,1376,172 $H,MB=4,TW=1,RT=1,UNROLL=2,BPS=2
echo "h2 verify: $fails failed"
exit $fails
