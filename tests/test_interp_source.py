"""The interpreter builds kernels exactly as MLX does, and every kernsearch template stays in its subset."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from kernsearch import Space, get_chip, load_family, make_problem, render
from kernsearch.family._spec import builtin_family_names
from kernsearch.interp import lint, mlx_source, signature

# Runs in a child: MLX writes the source it generates into the exported .mlxfn file.
_EXPORT = r"""
import json, sys, tempfile, os
import mlx.core as mx
spec = json.loads(sys.argv[1])
dt = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16, "int32": mx.int32}
k = mx.fast.metal_kernel(name=spec["name"], input_names=spec["inputs"], output_names=["C"],
                         source=spec["source"], header=spec["header"])
tmpl = [(n, dt[v] if isinstance(v, str) else v) for n, v in spec["template"]]
def f(*xs):
    return k(inputs=list(xs), template=tmpl or None, grid=(32, 1, 1), threadgroup=(32, 1, 1),
             output_shapes=[(4,)], output_dtypes=[dt[spec["out"]]])
args = [mx.zeros(tuple(s), dtype=dt[d]) for s, d in zip(spec["shapes"], spec["dtypes"])]
path = os.path.join(tempfile.mkdtemp(), "k.mlxfn")
mx.export_function(path, f, *args)
data = open(path, "rb").read()
start = data.index(spec["header"].encode())
end = data.index(b"\n}\n", start) + 3
if spec["template"]:
    end = data.index(b";\n", end) + 2
sys.stdout.write(data[start:end].decode())
"""

CASES = [
    # name, header, source, inputs, shapes, dtypes, template, output dtype
    ("plain", "// h1\n", "uint i = thread_position_in_grid.x;\nC[i] = A[i];", ["A"], [[64]], ["float32"], [],
     "float32"),
    ("templ", "#include <metal_stdlib>\nusing namespace metal;\n",
     "uint i = thread_position_in_grid.x + threadgroup_position_in_grid.x * threads_per_threadgroup.x;\n"
     "C[i] = A[i] * s + B[0] + A_shape[0] + A_strides[0] + A_ndim + thread_index_in_simdgroup;",
     ["A", "B", "s"], [[8, 4], [7], []], ["float16", "float16", "float16"], [["T", "float16"], ["N", 3], ["F", True]],
     "float16"),
    ("bf", "// bf\n", "C[thread_index_in_threadgroup + simdgroup_index_in_threadgroup + grid_size.x] = X[0] + Y[n];",
     ["X", "Y", "n"], [[3, 3], [100], []], ["bfloat16", "bfloat16", "int32"], [["T", "bfloat16"]], "bfloat16"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_signature_matches_mlx_export(case):
    import json

    name, header, source, inputs, shapes, dtypes, template, out = case
    spec = {"name": name, "header": header, "source": source, "inputs": inputs, "shapes": shapes,
            "dtypes": dtypes, "template": template, "out": out}
    proc = subprocess.run([sys.executable, "-c", _EXPORT, json.dumps(spec)], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0 and "export_function" in proc.stderr and "not" in proc.stderr:
        pytest.skip(f"this MLX build cannot export custom kernels: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    sig = signature(name, tuple(inputs), ("C",), source, dtypes, [tuple(s) for s in shapes], [out],
                    tuple((k, v) for k, v in template))
    assert mlx_source(sig, header, source) == proc.stdout


def test_gemm_signature_matches_mlx_export(gemm):
    """The rendered GEMM kernel, as MLX compiles it (float16, ragged shape)."""
    import json

    chip = get_chip("M2 Max")
    space = Space(make_problem(gemm, "33,65,7", "float16", chip), chip)
    kernel = render(gemm, space.validate(dict(gemm.default)), "float16")
    spec = {"name": kernel.name, "header": kernel.header, "source": kernel.source, "inputs": list(kernel.input_names),
            "shapes": [[33, 7], [7, 65]], "dtypes": ["float16", "float16"], "template": [["T", "float16"]],
            "out": "float16"}
    proc = subprocess.run([sys.executable, "-c", _EXPORT, json.dumps(spec)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    sig = signature(kernel.name, kernel.input_names, kernel.output_names, kernel.source, ["float16"] * 2,
                    [(33, 7), (7, 65)], ["float16"], kernel.template)
    assert mlx_source(sig, kernel.header, kernel.source) == proc.stdout


@pytest.mark.parametrize("family", builtin_family_names())
@pytest.mark.slow
def test_every_template_stays_inside_the_subset(family):
    fam = load_family(family)
    if "metal" not in fam.templates:
        pytest.skip(f"{family} has no Metal template")
    chip = get_chip("M2 Max")
    shape = ",".join("64" for _ in fam.problem.dims) if hasattr(fam.problem, "dims") else None
    space = Space(make_problem(fam, shape, None, chip), chip)
    valid = space.enumerate().valid
    sample = random.Random(0).sample(valid, min(len(valid), 400))
    for dtype in ("float32", "float16", "bfloat16"):
        for cfg in sample[:: 3 if dtype != "float32" else 1]:
            kernel = render(fam, cfg, dtype)
            assert lint(kernel.header, kernel.source) is None, (cfg, lint(kernel.header, kernel.source))


@pytest.mark.parametrize("snippet,word", [
    ("imageblock<float> b;", "imageblock"),
    ("threadgroup float tile[4][8][2][2];", "threadgroup declaration"),
    ("float q = quad_rotate_everything(1.0f);", "quad_rotate_everything"),
    ("float v = simd_vote_majority(true);", "simd_vote_majority"),
    ("simdgroup_matrix<float, 4, 4> m;", "4x4"),
    ("texture2d<float> t;", "texture"),
    ("float3 y = metal::reflect(a, b);", "metal::reflect"),
])
def test_lint_rejects_outside_the_subset_in_one_line(snippet, word):
    message = lint("", snippet)
    assert message is not None and word in message and "\n" not in message and message.startswith("source line 1")


def test_storage_round_trips_bfloat16():
    from kernsearch.interp._source import from_storage, to_storage

    x = np.array([1.0, -2.5, 0.0078125, 3.140625, np.nan], dtype=np.float64)
    back = from_storage(to_storage(x, "bfloat16"), "bfloat16")
    assert np.array_equal(back[:4], x[:4]) and np.isnan(back[4])


@pytest.mark.slow
def test_compiled_objects_are_cached_by_source_flags_and_place(tmp_path, monkeypatch):
    from kernsearch import Geometry, KernelSource, get_backend

    monkeypatch.setenv("KERNSEARCH_CACHE", str(tmp_path / "one"))
    geo = Geometry(grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=((8,),), output_dtypes=("float32",))
    k = KernelSource("cached", "metal", ("A",), ("C",), "", "C[thread_position_in_grid.x] = A[0] + 1.0f;",
                     (("T", "float32"),))
    cpu = get_backend("cpu")
    a = [np.ones(8)]
    first = cpu.run(k, geo, a, "float32")
    assert first.compile_seconds > 0 and list((tmp_path / "one" / "interp").glob("*.so"))
    again = cpu.run(k, geo, a, "float32")
    assert again.compile_seconds == 0.0 and np.array_equal(again.outputs[0], first.outputs[0])
    assert cpu.run(k, geo, a, "float32", mode="check").compile_seconds > 0  # other flags: another object
    changed = KernelSource("cached", "metal", ("A",), ("C",), "", k.source.replace("1.0f", "2.0f"), k.template)
    assert cpu.run(changed, geo, a, "float32").outputs[0][0] == 3.0
    monkeypatch.setenv("KERNSEARCH_CACHE", str(tmp_path / "two"))
    assert cpu.run(k, geo, a, "float32").compile_seconds > 0


@pytest.mark.slow
def test_kernels_link_with_gold_only_where_the_compiler_links_with_it(tmp_path, monkeypatch):
    """A kernel (its shared object, and the sanitizer's executable) is linked by GNU gold where the compiler links
    with it (faster; the same code), by the default linker elsewhere (a compiler that cannot, no ld.gold): a kernel
    built either way runs the same."""
    import shutil

    from kernsearch import Geometry, KernelSource, get_backend
    from kernsearch.interp import _compile

    def linker(cxx: str | None) -> tuple[str, ...]:
        _compile.compiler.cache_clear()
        _compile.link_flags.cache_clear()
        if cxx is None:
            monkeypatch.delenv("KERNSEARCH_CXX", raising=False)
        else:
            monkeypatch.setenv("KERNSEARCH_CXX", cxx)
        return _compile.link_flags()

    k = KernelSource("linked", "metal", ("A",), ("C",), "", "C[thread_position_in_grid.x] = A[0] * 2.0f;",
                     (("T", "float32"),))
    geo = Geometry(grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=((8,),), output_dtypes=("float32",))
    outputs = []
    found = _compile.link_flags
    try:
        other = tmp_path / "bin" / "c++-without-gold"  # a compiler that cannot link with gold (it fails)
        other.parent.mkdir()
        other.write_text("#!/bin/sh\nexit 1\n")
        other.chmod(0o755)
        monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}{os.environ['PATH']}")
        assert linker(other.name) == ()
        gold = linker(None)
        if shutil.which("g++") and shutil.which("ld.gold"):
            assert gold == ("-fuse-ld=gold",)
        monkeypatch.setenv("KERNSEARCH_CACHE", str(tmp_path / "cache"))
        for links in (gold, ()):  # the linker is part of the cache key: each builds its own
            monkeypatch.setattr(_compile, "link_flags", lambda links=links: links)
            for mode in ("fast", "sanitize"):
                ran = get_backend("cpu").run(k, geo, [np.full(8, 1.5)], "float32", mode=mode)
                assert ran.compile_seconds > 0 and not ran.diagnostics, ran.diagnostics
                outputs.append(ran.outputs[0].tolist())
    finally:  # found again under the test's own environment (restored after it)
        _compile.compiler.cache_clear()
        found.cache_clear()
    assert outputs == [[3.0] * 8] * 4


@pytest.mark.slow
def test_wheel_carries_the_shim_and_runs_a_kernel_outside_the_repo(tmp_path, kernsearch_wheel):
    """The shim headers are package data: an installed kernsearch interprets kernels without the repo."""
    import zipfile

    whl = kernsearch_wheel
    names = set(zipfile.ZipFile(whl).namelist())
    for f in ("shim/ks_shim.h", "shim/ks_runtime.inc", "shim/metal_stdlib", "_launcher.py"):
        assert f"kernsearch/interp/{f}" in names, f
    site = tmp_path / "site"
    zipfile.ZipFile(whl).extractall(site)
    code = (f"import sys; sys.path.insert(0, {str(site)!r});"
            "import numpy as np, kernsearch.interp as ki; from kernsearch.family._render import Geometry, KernelSource;"
            "from kernsearch.backends import get_backend;"
            "assert ki.__file__.startswith(sys.path[0]), ki.__file__;"
            "k = KernelSource('w', 'metal', ('A',), ('C',), '#include <metal_stdlib>\\n', "
            "'C[thread_position_in_grid.x] = A[thread_position_in_grid.x] * 3.0f;', (('T', 'float32'),));"
            "g = Geometry((8, 1, 1), (8, 1, 1), ((8,),), ('float32',));"
            "print(get_backend('cpu').run(k, g, [np.arange(8.0)], 'float32').outputs[0].tolist());"
            # the run was forked by the launcher, which the wheel carries (not by this process)
            "from kernsearch.interp import _run; assert _run._launcher_here().runs == 1")
    # -I: no PYTHONPATH, no user site; the extracted wheel comes first on sys.path (not the editable repo)
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([3.0 * i for i in range(8)])
