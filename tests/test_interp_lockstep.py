"""Lockstep simdgroups: kernels that are correct only because the 32 lanes of a simdgroup run together get the
hardware's answer in fast mode and a named warning in check mode; races across simdgroups stay errors; the schedule
fuzz keeps reordering threadgroups (and simdgroups) without splitting a simdgroup's lockstep."""

from __future__ import annotations

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch.interp import fuzz_schedule, run_kernel
from kernsearch.interp._lockstep import find_loops, instrument, needs_lockstep, sync_lines

WARNING = "simdgroup-synchronous access without barrier: correct on Apple GPUs, undefined in MSL"

#: Patterns public kernels use, each correct only in lockstep (inputs 64 floats, two simdgroups of 32).
PATTERNS = {
    # a reduction tree across the lanes of each simdgroup, then every lane reads the result
    "tree": ("""
    threadgroup float buf[64];
    uint t = thread_index_in_threadgroup, lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
    buf[t] = inp[t];
    for (uint s = 16; s > 0; s >>= 1) {
        if (lane < s) buf[t] += buf[t + s];
    }
    out[t] = buf[sg * 32];
""", lambda a: np.repeat([a[:32].sum(), a[32:].sum()], 32)),
    # a shared slot written by one lane, read by every lane, reset right after
    "reset": ("""
    threadgroup float slot[2];
    uint t = thread_index_in_threadgroup, lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
    if (lane == 0) slot[sg] = inp[sg * 32];
    float v = slot[sg];
    if (lane == 0) slot[sg] = 0.0f;
    out[t] = v + slot[sg];
""", lambda a: np.repeat(a[[0, 32]], 32)),
    # an in-place inclusive scan of each simdgroup's values
    "scan": ("""
    threadgroup float s[64];
    uint t = thread_index_in_threadgroup, lane = thread_index_in_simdgroup;
    s[t] = inp[t];
    for (uint off = 1; off < 32; off <<= 1) {
        if (lane >= off) s[t] += s[t - off];
    }
    out[t] = s[t];
""", lambda a: np.concatenate([np.cumsum(a[:32]), np.cumsum(a[32:])])),
    # up-sweep, a write, down-sweep (a lane in the down-sweep must not run an iteration ahead of another)
    "blelloch": ("""
    threadgroup float s[64];
    uint lane = thread_index_in_simdgroup, base = simdgroup_index_in_threadgroup * 32;
    s[base + lane] = inp[base + lane];
    uint off = 1;
    for (uint d = 16; d > 0; d >>= 1) {
        if (lane < d) {
            uint ai = base + off * (2 * lane + 1) - 1, bi = base + off * (2 * lane + 2) - 1;
            s[bi] += s[ai];
        }
        off *= 2;
    }
    if (lane == 0) s[base + 31] = 0.0f;
    for (uint d = 1; d < 32; d *= 2) {
        off >>= 1;
        if (lane < d) {
            uint ai = base + off * (2 * lane + 1) - 1, bi = base + off * (2 * lane + 2) - 1;
            float tmp = s[ai];
            s[ai] = s[bi];
            s[bi] += tmp;
        }
    }
    out[base + lane] = s[base + lane];
""", lambda a: np.concatenate([np.cumsum(h) - h for h in (a[:32], a[32:])])),
}
X = (np.arange(64) % 7 + 1).astype(np.float64)


def run(name: str, src: str, mode: str, threads: int = 64, **kw):  # noqa: ANN201
    k = KernelSource(name, "metal", ("inp",), ("out",), "", src)
    return run_kernel(k, (threads, 1, 1), (threads, 1, 1), [(threads,)], ["float32"], [X[:threads]], "float32",
                      mode=mode, **kw)


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_a_kernel_relying_on_lockstep_gets_the_hardware_answer_and_a_named_warning(pattern):
    src, ref = PATTERNS[pattern]
    fast, check = run(pattern, src, "fast"), run(pattern, src, "check")
    assert fast.lockstep and check.lockstep
    np.testing.assert_array_equal(fast.outputs[0], ref(X))
    np.testing.assert_array_equal(check.outputs[0], ref(X))
    assert fast.diagnostics == []
    assert [d for d in check.diagnostics if d.severity == "error"] == []
    assert any(d.kind == "simdgroup_synchronous" and d.severity == "warning" and WARNING in d.message
               for d in check.diagnostics), check.diagnostics


def test_a_race_across_simdgroups_still_fails_check_mode():
    """The tree of "tree" over all 64 threads: lanes 0-31 read what lanes 32-63 (another simdgroup) write."""
    src = PATTERNS["tree"][0].replace("s = 16", "s = 32").replace("lane < s", "t < s").replace("buf[sg * 32]", "buf[0]")
    r = run("crossrace", src, "check")
    assert any(d.kind == "race" and d.severity == "error" for d in r.diagnostics), r.diagnostics


def test_lanes_writing_one_element_in_one_instruction_is_a_race():
    src = "threadgroup float slot;\nslot = inp[thread_index_in_simdgroup];\nout[thread_index_in_simdgroup] = 0.0f;\n"
    r = run("sameinstr", src, "check", threads=32)
    assert any(d.kind == "race" and "one instruction" in d.message for d in r.diagnostics), r.diagnostics


def test_check_mode_runs_again_in_full_lockstep_where_the_translator_saw_no_passing():
    """Lanes pass values through two pointers into one array: the translator (per name) does not mark the lines, so
    fast mode runs the threads one after another; check mode sees the passing, warns, and runs every access in
    lockstep: the hardware's answer."""
    src = """
    threadgroup float buf[64];
    uint t = thread_index_in_threadgroup, lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
    threadgroup float* mine = buf + sg * 32;
    threadgroup float* all = buf;
    mine[lane] = inp[t];
    out[t] = all[sg * 32 + (lane ^ 1u)];
"""
    assert not needs_lockstep("", src)
    r = run("alias", src, "check")
    np.testing.assert_array_equal(r.outputs[0], X.reshape(-1, 2)[:, ::-1].reshape(-1))
    assert {(d.kind, d.severity) for d in r.diagnostics} == {("simdgroup_synchronous", "warning")}


def test_fast_mode_keeps_one_thread_after_another_for_kernels_with_barriers_between_lanes(gemm):
    """The GEMM family (every layout of its template: MMA, staging, vector width, double-buffered tiles, B layout,
    split K) passes no value between lanes without a barrier: fast mode compiles it as before (no lockstep build,
    no extra cost)."""
    import itertools

    from kernsearch import render

    structure = ("MMA", "STAGE", "VEC", "DOUBLE_BUFFER", "LAYOUT_B", "SPLIT_K")
    for values in itertools.product(*(gemm.knobs[k].values[:2] if k == "SPLIT_K" else gemm.knobs[k].values
                                      for k in structure)):
        cfg = {**gemm.default, **dict(zip(structure, values))}
        k = render(gemm, cfg, "float32")
        assert not needs_lockstep(k.header, k.source), cfg


@pytest.mark.parametrize("pattern", ["tree", "blelloch"])
def test_the_schedule_fuzz_reorders_simdgroups_but_never_splits_one(pattern):
    src, ref = PATTERNS[pattern]
    k = KernelSource(pattern, "metal", ("inp",), ("out",), "", src)
    r = fuzz_schedule(k, (128, 1, 1), (64, 1, 1), [(64,)], ["float32"], [X], "float32")
    assert not r.order_dependent, r.dependence
    for res in r.runs.values():
        np.testing.assert_array_equal(res.outputs[0], ref(X))


def test_the_schedule_fuzz_still_reorders_threadgroups():
    """Threadgroup 1 reads what threadgroup 0 wrote to device memory (no flag): order-dependent, as before."""
    src = """
    uint g = threadgroup_position_in_grid.x, lane = thread_index_in_simdgroup;
    threadgroup float acc[32];
    acc[lane] = inp[g * 32 + lane] + (g > 0 ? out[(g - 1) * 32 + lane] : 0.0f);
    out[g * 32 + lane] = acc[lane];
"""
    k = KernelSource("chain", "metal", ("inp",), ("out",), "", src)
    for mode in ("fast", "check"):
        r = fuzz_schedule(k, (64, 1, 1), (32, 1, 1), [(64,)], ["float32"], [X], "float32", mode=mode, init_value=0.0)
        assert r.order_dependent and r.dependence.schedule in ("reversed", "shuffled"), mode


def test_loops_get_an_iteration_counter_without_moving_a_line():
    text = ("for (int i = 0; i < n; ++i) {\n  while (x < 3) x++;\n}\ndo {\n  y--;\n} while (y > 0);\n"
            "for (;;) { break; }\nfor (float v : buf) { s += v; }\n")
    out, loops = instrument(text)
    assert out.count("\n") == text.count("\n")
    assert [(lp.start, lp.end, lp.parent) for lp in loops] == [(1, 3, -1), (2, 2, 0), (4, 6, -1), (7, 7, -1),
                                                                (8, 8, -1)]
    assert "ks::tick(0) && ( i < n)" in out and "ks::tick(1) && (x < 3)" in out and "do { ks::tick(2);" in out
    assert "for (;; ks::tick(3))" not in out and "for (; ks::tick(3);" in out and "{ ks::tick(4); s += v;" in out
    assert find_loops("// for (x) {}\nconst char* s = \"while (1)\";\n") == []


def test_the_translator_marks_only_lines_where_lanes_may_pass_values():
    src = """threadgroup float a[64];
threadgroup float b[64];
a[t] = x;
threadgroup_barrier(mem_flags::mem_threadgroup);
y = a[t ^ 1];
b[t] = y;
z = b[t ^ 1];
"""
    assert sync_lines(src) == {6, 7}
    assert sync_lines(src.replace("b[t] = y;", "b[t] = y;\nsimd_sum(y);")) == set()  # a collective orders them
    assert sync_lines("threadgroup float b[64];\nb[l] = x;\nfloat y = 2.0f * b[l ^ 1];\n") == {2, 3}
    # a device pointer parameter named like a threadgroup pointer is another variable, not an access
    assert sync_lines("threadgroup float* p;\ninline float f(const device float* p, uint i) { return p[i]; }\n") == set()


@pytest.mark.slow
def test_sanitize_mode_runs_a_lockstep_kernel_in_lockstep_and_still_finds_device_overflows():
    src, ref = PATTERNS["reset"]
    r = run("san", src, "sanitize")
    assert r.lockstep
    np.testing.assert_array_equal(r.outputs[0], ref(X))
    assert r.diagnostics == []
    r = run("sanoob", src.replace("inp[sg * 32]", "inp[sg * 32 + 64]"), "sanitize")
    assert any(d.kind == "device_bounds" for d in r.diagnostics), r.diagnostics


@pytest.mark.slow
def test_the_analysis_is_linear_in_the_kernel_text():
    """A kernel of 4000 loops, barriers and pointers (600 KB): the lockstep analysis, the loop counters and the
    checked translation (which fast mode now uses for lockstep kernels) take well under the time a quadratic scan
    would (the analysis took 17 s, the translation minutes)."""
    import time

    from kernsearch.interp._source import translate

    unit = ("for (int i = 0; i < n; ++i) {{\n  threadgroup float* q{k} = buf + {k};\n  buf[i] = q{k}[i + 1] * y;\n"
            "  threadgroup_barrier(mem_flags::mem_threadgroup);\n}}\n")
    src = "threadgroup float buf[64];\n" + "".join(unit.format(k=k) for k in range(4000))
    start = time.process_time()
    lines = sync_lines(src)
    text, loops = instrument(src)
    translate(src, check=True)
    assert time.process_time() - start < 5
    assert lines == set() and len(loops) == 64 and text.count("\n") == src.count("\n")
