"""mlp_block: the post-attention half of a decoding layer in one persistent kernel (templates/mlp_block).

The interpreter proves it against the float64 reference (every output: Y, the scratch X1 and G, the counters
back at 0), every threadgroup resident at once (a persistent launch) at ragged shapes, 4 and 8 bits, groups 32/64/128, M = 1 and M > 1, under every schedule (whichever
threadgroup runs first takes the tiles); the CUDA twin renders for the Llama-7B layer on an H200 and, where nvcc
is installed, compiles for sm_90 as MLX wraps a body."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from nvcc import NVCC, nvcc

from kernsearch import Space, get_chip, load_family, make_problem, render
from kernsearch.evaluation._verify import compare, kernel_inputs, make_inputs, reference
from kernsearch.family._render import geometry, render_context
from kernsearch.interp import run_kernel

H200 = get_chip("H200")
M2 = get_chip("M2 Max")
LLAMA = "1,4096,11008,512,64,1376,172"
BASE = {"PATH": "fma", "QBITS": 4, "TW": 2, "KS": 2, "RT": 1, "UNROLL": 2, "MB": 1, "BPS": 2}


def qshape(m: int, h: int, f: int, bits: int, group: int) -> str:
    """A problem shape from the hidden and FFN sizes, bits and group (the quantization dims tied to them)."""
    return f"{m},{h},{f},{h * bits // 32},{h // group},{f * bits // 32},{f // group}"


def test_the_llama_layer_has_configs_of_both_paths_on_an_h200() -> None:
    fam = load_family("mlp_block")
    problem = make_problem(fam, None, "float16", H200)
    assert problem.shape == (1, 4096, 11008, 512, 64, 1376, 172) and [t.name for t in fam.inputs] == [
        "X", "Wo", "So", "Bo", "R", "gamma", "Wg", "Sg", "Bg", "Wu", "Su", "Bu", "Wd", "Sd", "Bd"]
    assert [t.name for t in fam.outputs] == ["Y", "S"]  # S: X1, G and the counters (one fill at launch)
    valid = Space(problem, H200).enumerate().valid
    assert {c["PATH"] for c in valid} == {"mma", "fma", "h2"}
    for cfg in valid:
        geo = geometry(Space(problem, H200), cfg)
        ctx = render_context(fam, cfg, "float16")
        blocks = geo.grid[0] // geo.threadgroup[0]
        # a persistent grid: at most SMs x BPS blocks, never more blocks than tiles
        tiles = 2 * -(-4096 // ctx["ROWS_TG"]) + -(-11008 // ctx["ROWS_TG"])
        assert blocks == min(132 * cfg["BPS"], tiles) and geo.zero_outputs
        assert cfg["BPS"] * ctx["threads"] * ctx["regs"] <= 65536


@pytest.mark.parametrize("target", ["metal", "cuda"])
def test_each_phase_is_the_shared_core_on_its_arrays(target: str) -> None:
    fam = load_family("mlp_block")
    src = render(fam, BASE, "float16", target).source
    # three tiles of the core (one per phase), each bound to its tile index, none left to return from the kernel
    assert src.count("const int row_base = (int(ks_tile) * TW + tw) * (16 * RT);") == 3
    assert "return;" not in src and src.count("continue; /* the next tile */" if target == "cuda" else "continue;  // the next tile") == 3
    assert src.count("const device uint4* W4 = " if target == "metal" else "reinterpret_cast<const uint4*>(W)") >= 3
    assert src.count("ninv[") >= 2 and src.count("Wu") >= 1  # phase 2 alone: the norm and the second matrix
    # the phases in order (the CUDA source is rendered without its comments: its phases by what each sets)
    assert re.search(r"phase 1.*phase 2.*phase 3" if target == "metal" else r"ks_prev = 0;.*ks_prev = 1;.*ks_prev = 2;",
                     src, re.S)


def _run(shape: str, cfg: dict, dtype: str = "float16", schedule: str = "in-order") -> tuple[list, list, object]:
    fam = load_family("mlp_block")
    problem = make_problem(fam, shape, dtype, M2)
    space = Space(problem, M2)
    assert space.is_valid(cfg), cfg
    geo = geometry(space, cfg)
    logical = make_inputs(problem, 0)
    result = run_kernel(render(fam, cfg, dtype, "metal"), geo.grid, geo.threadgroup, list(geo.output_shapes),
                        list(geo.output_dtypes), kernel_inputs(problem, logical, geo), dtype, init_value=0.0,
                        input_dtypes=list(geo.input_dtypes) or None, schedule=schedule, seed=3)
    return result.outputs, reference(problem, logical), problem


#: (M, bits, group, dtype, knobs) at H = 5 groups, F = 7 groups: rows past H and F in the last tile (a tile of
#: 2 or 4 groups of rows), chunks past K in the last step (5 and 7 groups of 32 values), both widths, every group
#: and dtype, M = 1 and M > 1, each knob moved once.
CASES = [
    (1, 4, 32, "float16", {"RT": 2}),
    (3, 8, 128, "float16", {"MB": 4, "KS": 8, "TW": 1}),
    (5, 4, 32, "bfloat16", {"MB": 8, "KS": 1, "TW": 4}),
    (2, 8, 64, "float32", {"MB": 2, "RT": 2, "TW": 4, "KS": 1}),
    (1, 4, 128, "float16", {"UNROLL": 4, "TW": 4, "KS": 1, "BPS": 1}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("m", "bits", "group", "dtype", "knobs"), CASES)
def test_the_interpreter_proves_every_output_against_float64(m: int, bits: int, group: int, dtype: str,
                                                             knobs: dict) -> None:
    shape = qshape(m, 5 * group, 7 * group, bits, group)
    cfg = {**BASE, "QBITS": bits, **knobs}
    rows = render_context(load_family("mlp_block"), cfg, dtype)["ROWS_TG"]
    assert group == 128 or (5 * group % rows and 7 * group % rows)  # the last tile of each phase is partial
    outputs, refs, problem = _run(shape, cfg, dtype)
    check = compare(problem, outputs, refs)
    assert check.ok, check.detail
    assert outputs[1][-8:].tolist() == [0] * 8  # the last block to leave set the counters back


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["reversed", "shuffled"])
def test_whichever_threadgroup_runs_first_takes_the_tiles_in_order(schedule: str) -> None:
    shape = qshape(2, 192, 320, 4, 64)
    cfg = {**BASE, "MB": 2}
    outputs, refs, problem = _run(shape, cfg, schedule=schedule)
    check = compare(problem, outputs, refs)
    assert check.ok, check.detail
    assert outputs[1][-8:].tolist() == [0] * 8


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed (the CUDA twin is compiled where it is)")
def test_the_cuda_twin_compiles_for_sm90_as_mlx_wraps_it(tmp_path: Path) -> None:
    from test_qmatvec_cuda import MLX_PRELUDE, _code, mlx_kernel_text

    fam = load_family("mlp_block")
    space = Space(make_problem(fam, LLAMA, "float16", H200), H200)
    picks = [c for c in space.enumerate().valid if c["PATH"] == "mma"][::17][:2] + [
        c for c in space.enumerate().valid if c["PATH"] == "fma"][::29][:2]
    headers, bodies, names = set(), [], []
    for i, cfg in enumerate(picks):
        kernel = render(fam, cfg, "float16", "cuda")
        header, body = mlx_kernel_text(fam, kernel, "float16", f"mlp_block_{i}")
        headers.add(_code(header))
        bodies.append(body)
        names.append(f"mlp_block_{i}")
    assert len(headers) == 1
    done = nvcc(["-arch=sm_90", "-std=c++17", "--resource-usage", "--cubin"],  # device code only, as MLX builds it
                MLX_PRELUDE + headers.pop() + "\n" + "".join(bodies))
    assert done.returncode == 0, done.stderr[:3000]
    assert not re.search(r"[1-9]\d* bytes spill stores", done.stderr), done.stderr[:2000]
    used: dict[str, int] = {}
    current = None
    for line in done.stderr.splitlines():  # ptxas's report, entry by entry (the mangled name holds the plain one)
        entry = re.search(r"Compiling entry function '(\w+)'", line)
        if entry:
            current = next(n for n in names if f"{len(n)}{n}" in entry.group(1))
        regs = re.search(r"Used (\d+) registers", line)
        if current and regs:
            used[current] = int(regs.group(1))
    assert set(used) == set(names), done.stderr[:2000]
    for cfg, name in zip(picks, names):  # the mma path within the estimate's ~10 % (the residency rule reads it)
        estimate = render_context(fam, cfg, "float16")["regs"]
        assert used[name] <= 255 and (cfg["PATH"] == "fma" or used[name] <= 1.1 * estimate), (cfg, used[name])


@pytest.mark.slow
def test_the_exported_package_runs_it_as_plain_mlx_where_no_kernel_can(tmp_path: Path) -> None:
    """Exported, bound in the documented input order, called as a user calls it (MLX's CPU back-end: the op
    path), it returns Y and the scratch (X1, G, the counters), Y and X1 equal to the chain written in plain MLX."""
    import os
    import sys

    from kernsearch import ArtifactStore, export

    built = export(["mlp_block"], tmp_path / "dist", ArtifactStore(tmp_path / "store"), version="1.0.0")
    script = tmp_path / "layer.py"
    script.write_text('''
import mlx.core as mx
import kernsearch_kernels as kk

H, F, group, bits, M = 256, 512, 64, 4, 2


def quantized(n, k, seed):
    return mx.quantize(0.02 * mx.random.normal((n, k), key=mx.random.key(seed)), group_size=group, bits=bits)


o, gate, up, down = quantized(H, H, 1), quantized(F, H, 2), quantized(F, H, 3), quantized(H, F, 4)
gamma = mx.ones((H,))
x, r = mx.random.normal((M, H), key=mx.random.key(7)), mx.random.normal((M, H), key=mx.random.key(8))
y, s = kk.mlp_block(x, *o, r, gamma, *gate, *up, *down)
x1 = s[:M * H].reshape(M, H)  # the scratch: X1, G, the counters


def mm(h, w):
    return mx.quantized_matmul(h, *w, transpose=True, group_size=group, bits=bits)


p1 = r + mm(x, o)
n = mx.fast.rms_norm(p1, gamma, 1e-5)
a = mm(n, gate)
print(y.shape, s.shape)
print(mx.max(mx.abs(y - (p1 + mm(a * mx.sigmoid(a) * mm(n, up), down)))).item(), mx.max(mx.abs(x1 - p1)).item())
''')
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False,
                       env={**os.environ, "PYTHONPATH": str(built.source_dir)})
    assert r.returncode == 0, r.stderr[-3000:]
    shapes, errors = r.stdout.splitlines()[:2]
    assert shapes == "(2, 256) (1544,)"
    assert [float(e) for e in errors.split()] == [0.0, 0.0]
