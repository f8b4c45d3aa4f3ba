"""Planted bugs: each one must be caught by the interpreter with the expected diagnostic (or failure)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kernsearch import Geometry, KernelSource, Space, geometry, get_backend, make_problem, render
from kernsearch._errors import VariantFailure
from kernsearch.backends import Evidence
from kernsearch.evaluation._verify import kernel_inputs, make_inputs, verify_kernel

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"


def kernel(source: str, name: str = "bug", inputs: tuple[str, ...] = ("A",)) -> KernelSource:
    return KernelSource(name=name, target="metal", input_names=inputs, output_names=("C",), header=HEADER,
                        source=source, template=(("T", "float32"),))


def run(source: str, n: int = 64, tg: int = 64, mode: str = "fast", **kw):
    geo = Geometry(grid=(n, 1, 1), threadgroup=(tg, 1, 1), output_shapes=((n,),), output_dtypes=("float32",))
    a = np.arange(n, dtype=np.float64)
    return get_backend("cpu").run(kernel(source), geo, [a], "float32", mode=mode, **kw)


def kinds(result) -> set[str]:
    return {d.kind for d in result.diagnostics}


@pytest.fixture(scope="module")
def cpu():
    backend = get_backend("cpu")
    assert backend.evidence is Evidence.INTERPRETED and backend.target == "metal"
    return backend


def test_clean_kernel_has_no_diagnostics_in_check_mode():
    r = run("""
    threadgroup float buf[64];
    uint t = thread_index_in_threadgroup;
    buf[t] = A[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    C[thread_position_in_grid.x] = buf[63 - t];
""", n=128, mode="check")
    assert r.diagnostics == []
    assert np.array_equal(r.outputs[0], np.concatenate([np.arange(63, -1, -1), np.arange(127, 63, -1)]))


def test_missing_barrier_is_a_race():
    r = run("""
    threadgroup float buf[64];
    uint t = thread_index_in_threadgroup;
    buf[t] = A[t];
    C[t] = buf[63 - t];
""", mode="check")
    races = [d for d in r.diagnostics if d.kind == "race"]
    assert races and races[0].line is not None and "buf" in races[0].message
    assert "buf[t] = A[t];" in races[0].message  # the conflicting access: the write after a read


def test_loader_that_skips_an_element_reads_uninitialised_memory():
    src = """
    threadgroup float buf[64];
    uint t = thread_index_in_threadgroup;
    if (t != 5) {
        buf[t] = A[t];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    C[t] = buf[t ^ 1u];
"""
    r = run(src, mode="check")
    assert "uninitialized" in kinds(r) and "race" not in kinds(r)
    # fast mode: the poisoned (NaN) threadgroup memory reaches the output element that read it
    fast = run(src, mode="fast")
    assert np.isnan(fast.outputs[0][4]) and np.isnan(fast.outputs[0]).sum() == 1


def test_threadgroup_index_past_the_end():
    r = run("""
    threadgroup float buf[32];
    uint t = thread_index_in_threadgroup;
    buf[t] = A[t];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    C[t] = buf[t % 32];
""", mode="check")
    bounds = [d for d in r.diagnostics if d.kind == "threadgroup_bounds"]
    assert bounds and "buf[0:32]" in bounds[0].message


def test_device_write_past_the_end_under_sanitize():
    src = """
    uint t = thread_position_in_grid.x;
    C[t + 1] = A[t];
"""
    r = run(src, mode="sanitize")
    bad = [d for d in r.diagnostics if d.kind == "device_bounds"]
    assert bad and "overflow" in bad[0].message and "C[t + 1] = A[t];" in bad[0].message


def test_early_return_before_a_barrier_is_divergence():
    r = run("""
    threadgroup float buf[64];
    uint t = thread_index_in_threadgroup;
    if (t >= 16) {
        return;
    }
    buf[t] = A[t];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    C[t] = buf[15 - t];
""")
    div = [d for d in r.diagnostics if d.kind == "divergence"]
    assert div and div[0].severity == "error" and "16 of 64" in div[0].message


def test_simdgroup_matrix_in_a_partial_simdgroup():
    r = run("""
    simdgroup_matrix<float, 8, 8> a = make_filled_simdgroup_matrix<float, 8, 8>(1.0f);
    simdgroup_matrix<float, 8, 8> acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_multiply_accumulate(acc, a, a, acc);
    C[thread_position_in_grid.x] = acc.thread_elements()[0];
""", n=16, tg=16)
    assert "partial_simdgroup" in kinds(r)


def test_simdgroup_matrix_full_simdgroup_multiplies():
    r = run("""
    uint l = thread_index_in_simdgroup;
    const int row = ((l / 4) & 4) + (l / 2) % 4, col = ((l / 4) & 2) * 2 + (l % 2) * 2;
    simdgroup_matrix<float, 8, 8> a, b;
    a.thread_elements()[0] = A[row * 8 + col];
    a.thread_elements()[1] = A[row * 8 + col + 1];
    b.thread_elements()[0] = float(row == col);
    b.thread_elements()[1] = float(row == col + 1);
    b.thread_elements()[0] *= 2.0f;
    b.thread_elements()[1] *= 2.0f;
    simdgroup_matrix<float, 8, 8> acc = make_filled_simdgroup_matrix<float, 8, 8>(0.5f);
    simdgroup_multiply_accumulate(acc, a, b, acc);
    C[row * 8 + col] = acc.thread_elements()[0];
    C[row * 8 + col + 1] = acc.thread_elements()[1];
""", n=64, tg=32)  # C = A·(2I) + 0.5, over the first 32 threads' 64 elements
    assert r.diagnostics == []
    assert np.array_equal(r.outputs[0][:64], 2 * np.arange(64) + 0.5)


def test_threadgroup_memory_over_32k():
    r = run("""
    threadgroup float big[9000];
    uint t = thread_index_in_threadgroup;
    big[t] = A[t];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    C[t] = big[t];
""")
    over = [d for d in r.diagnostics if d.kind == "threadgroup_limit"]
    assert over and "36000" in over[0].message and "32768" in over[0].message


def test_partial_simd_sum_sums_active_lanes_and_warns():
    r = run("""
    uint l = thread_index_in_simdgroup;
    float s = -1.0f;
    if (l < 16) {
        s = simd_sum(A[thread_position_in_grid.x]);
    }
    C[thread_position_in_grid.x] = s;
""", n=32, tg=32)
    warn = [d for d in r.diagnostics if d.kind == "partial_collective"]
    assert warn and warn[0].severity == "warning"
    assert np.all(r.outputs[0][:16] == sum(range(16))) and np.all(r.outputs[0][16:] == -1)


def test_shuffle_from_an_inactive_lane_is_reported():
    r = run("""
    uint l = thread_index_in_simdgroup;
    float s = 0.0f;
    if (l < 8) {
        s = simd_shuffle(A[l], ushort(l + 8));
    }
    C[thread_position_in_grid.x] = s;
""", n=32, tg=32)
    assert "inactive_lane" in kinds(r)


def test_full_simd_collectives_compute():
    r = run("""
    uint g = thread_position_in_grid.x;
    float v = A[g];
    C[g] = simd_sum(v) + simd_shuffle_xor(v, ushort(1)) * 1000.0f + simd_max(v) * 1000000.0f;
""", n=64, tg=64)
    a = np.arange(64)
    sums = np.repeat([a[:32].sum(), a[32:].sum()], 32)
    maxes = np.repeat([31, 63], 32)
    assert r.diagnostics == []
    assert np.array_equal(r.outputs[0], sums + (a ^ 1) * 1000 + maxes * 1e6)


def test_output_element_never_written_shows_as_unwritten(gemm):
    from kernsearch import get_chip

    chip = get_chip("M2 Max")
    problem = make_problem(gemm, "32,32,16", "float32", chip)
    space = Space(problem, chip)
    cfg = space.validate(space.parse_config("MMA=scalar"))
    good = render(gemm, cfg, "float32")
    planted = good.source.replace("C[r * N + c] = T(acc[i][j]);", "if (r * N + c != 37) C[r * N + c] = T(acc[i][j]);")
    assert planted != good.source
    bad = KernelSource(good.name + "_bug", "metal", good.input_names, good.output_names, good.header, planted,
                       good.template)
    check, _ = verify_kernel(get_backend("cpu"), bad, geometry(space, cfg), problem)
    assert not check.ok and check.reason == "unwritten" and "(1, 5)" in check.detail
    # its one line names the reason and where, with no error figures (there are none for an unwritten element)
    assert check.summary() == f"FAIL (unwritten): {check.detail}" and "max abs err" not in check.summary()


def test_infinite_loop_is_stopped_and_the_suite_goes_on():
    start = time.monotonic()
    with pytest.raises(VariantFailure) as exc:
        run("""
    uint t = thread_position_in_grid.x;
    float x = A[t];
    while (x < 1.0e9f) {
        x = x * 1.0f;
        C[t] = x;
    }
""", timeout=1.0)
    assert exc.value.reason == "timeout"
    assert time.monotonic() - start < 10
    assert run("C[thread_position_in_grid.x] = 2.0f * A[thread_position_in_grid.x];").outputs[0][3] == 6.0


def test_segfault_is_a_crash_of_the_variant():
    with pytest.raises(VariantFailure) as exc:
        run("""
    device float* p = (device float*)16;
    p[thread_position_in_grid.x] = A[0];
    C[0] = 1.0f;
""")
    assert exc.value.reason == "crash" and "SIGSEGV" in exc.value.detail


def test_compile_error_names_the_kernel_line():
    with pytest.raises(VariantFailure) as exc:
        run("uint t = thread_position_in_grid.x;\nC[t] = undefined_name + A[t];\n")
    assert exc.value.reason == "compile" and "undefined_name" in exc.value.detail
    # header 2 lines, template 1, "[[kernel]] void" 1, 3 parameter lines: body line 2 is kernel line 9
    assert exc.value.detail.startswith("line 9:")


def test_outside_the_subset_is_rejected_before_compiling():
    with pytest.raises(VariantFailure) as exc:
        run("texture2d<float> tex;\nC[0] = 1.0f;\n")
    assert exc.value.reason == "unsupported" and "\n" not in str(exc.value) and "texture" in str(exc.value)


def test_race_diagnostic_names_the_template_line(gemm):
    """GEMM with the barrier after the tile loads removed: a race, named at its template line."""
    from kernsearch import get_chip
    from kernsearch.interp import template_lines

    chip = get_chip("M2 Max")
    problem = make_problem(gemm, "32,32,16", "float32", chip)
    space = Space(problem, chip)
    cfg = space.validate(space.parse_config("MMA=scalar"))
    good = render(gemm, cfg, "float32")
    barrier = "        threadgroup_barrier(mem_flags::mem_threadgroup);\n"
    assert good.source.count(barrier) == 2
    planted = good.source.replace(barrier, "        // (barrier removed)\n", 1)
    bad = KernelSource(good.name, "metal", good.input_names, good.output_names, good.header, planted, good.template)
    lines = template_lines(gemm, cfg, "float32")
    assert lines is not None
    geo = geometry(space, cfg)
    inputs = kernel_inputs(problem, make_inputs(problem), geo)
    r = get_backend("cpu").run(bad, geo, inputs, "float32", mode="check", lines=lines)
    races = [d for d in r.diagnostics if d.kind == "race"]
    assert races and races[0].template_line and races[0].template_line.startswith("gemm.metal.j2:")
    tmpl_line = int(races[0].template_line.split(":")[1])
    template_text = (gemm.path / "gemm.metal.j2").read_text().split("\n")[tmpl_line - 1]
    assert "_tile" in template_text or "dst" in template_text  # a tile load or a tile read


def test_ucontext_fallback_gives_the_same_results(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNSEARCH_CACHE", str(tmp_path))  # a cold cache: both objects are built here
    src = """
    threadgroup float buf[64];
    uint t = thread_index_in_threadgroup;
    buf[t] = A[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    C[thread_position_in_grid.x] = buf[63 - t] + simd_sum(buf[t]);
"""
    native = run(src, n=100)
    monkeypatch.setenv("KERNSEARCH_INTERP_UCONTEXT", "1")
    fallback = run(src, n=100)
    assert fallback.compile_seconds > 0  # another object: built with the ucontext switch
    assert np.array_equal(native.outputs[0], fallback.outputs[0], equal_nan=True)
    assert not np.isnan(native.outputs[0][:64]).any()
