# The eleventh session's install on a warm machine after `install-gpu-wheels.sh stage` (../shared/device/README.md):
# MLX from .gpuwheels/b; the package's pure-Python dependencies the machine lacks from .gpuwheels/c (pydantic,
# tenacity, typer, rich, flit_core) and plotly from .gpuwheels/d where carried (both fetched here by
# benchmarks/gpu_fetch_deps.sh; b, c and the tree fit in a call's 64 MiB only without d); kernsearch itself; and
# the store this session tuned (gpu_run_s11_tune.sh's tarball, kept in benchmarks/data) in /tmp/store.
# Then: export PYTHONPATH=/tmp/site:/tmp/site3:/tmp/site5 PATH=$PATH:/usr/local/cuda/bin
[ -d /tmp/site/mlx ] || bash /tmp/gpuwheels/install-gpu-wheels.sh install >/dev/null 2>&1
rm -rf /tmp/site3 /tmp/site5
python3 -m pip install -q --no-index --no-deps --target /tmp/site5 .gpuwheels/c/*.whl $(ls .gpuwheels/d/*.whl 2>/dev/null) >/dev/null 2>&1
PYTHONPATH=/tmp/site python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site3 . >/dev/null 2>&1
rm -rf /tmp/store; tar xzf "${STORE_TGZ:-benchmarks/data/gpu_store_H200_s11.tgz}" -C /tmp  # the store this session tuned
PYTHONPATH=/tmp/site:/tmp/site3:/tmp/site5 python3 -c "import mlx.core as mx, kernsearch, optuna, pydantic, tenacity; print('mlx', mx.__version__)"
ls /tmp/store
