# The tenth session's first GPU run (prepared on the CPU; the tenth session had no device time): the figures of
# record with the bench's chain feeding X from the previous output (a5a09a1), the check of issue 38 (mlp_block at
# M = 1 against its gate bound 1.53), then mlx-lm's generation; the same as gpu_run_s9_3.sh.
set -u
bash benchmarks/gpu_run_s9_3.sh
