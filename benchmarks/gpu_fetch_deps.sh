#!/usr/bin/env bash
# The package's pure-Python dependencies that the lent GPU machine lacks (it has numpy, jinja2, pyyaml, torch, CuPy,
# but not these; found in the eleventh session), as wheels for Python 3.12 on x86-64, beside the MLX wheels of
# ../shared/device/fetch-gpu-wheels.sh: .gpuwheels/c (small: carried with .gpuwheels/b) and .gpuwheels/d (plotly,
# for the HTML report only: b, c and the working tree fit in one call's 64 MiB only without it).
# Run from the project's root; then benchmarks/gpu_setup_s11.sh installs them on the device.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.gpuwheels/' .git/info/exclude 2>/dev/null || echo '/.gpuwheels/' >> .git/info/exclude
rm -rf .gpuwheels/c .gpuwheels/d && mkdir -p .gpuwheels/c .gpuwheels/d
plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q "${plat[@]}" -d .gpuwheels/c pydantic pydantic-core annotated-types typing-inspection \
  typing-extensions tenacity typer click shellingham rich markdown-it-py mdurl pygments packaging flit_core
python3 -m pip download -q "${plat[@]}" -d .gpuwheels/d plotly narwhals
du -sh .gpuwheels/c .gpuwheels/d
