"""The qmatvec and swiglu_qmatvec families (MLX affine quantization, bits 4/8, groups 32/64/128) on Apple: the
space, the Metal twin on the interpreter against the float64 dequantizing reference (ragged N and K, every
dtype, every compiled row count), the interpreter's problems the families declare, and the model. The CUDA
twins are checked in test_qmatvec_cuda.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from covering import covering_sample as tway_sample
from test_gemv import _run_all

from kernsearch import Space, geometry, get_backend, get_chip, load_family, make_problem
from kernsearch._errors import SpecError

REPO = Path(__file__).resolve().parents[1]
#: The cores on MLX's quantization tested here; every other family built on qmatvec is a fused decode family
#: (tests/test_fused_decode.py finds them).
FAMILIES = ("qmatvec", "swiglu_qmatvec")
M2 = get_chip("M2 Max")
H100 = get_chip("H100")
DTYPES = ("float16", "bfloat16", "float32")
#: One M per compiled row count MB of the fma path (M = 1 -> 1, 2 -> 2, 3 -> 4, 5 -> 8, 9 and 16 -> 16).
M_OF_MB = {1: (1,), 2: (2,), 4: (3,), 8: (5,), 16: (9, 16)}


def qshape(m: int, n: int, bits: int, group: int, groups: int) -> str:
    """The family's shape M,N,K,KW,NG for K = group * groups values of ``bits`` bits."""
    k = group * groups
    return f"{m},{n},{k},{k * bits // 32},{groups}"


#: (group, groups): K = 160, 192 (not multiples of 128: a partial step of four chunks) and 384.
GROUPS = ((32, 5), (64, 3), (128, 3))
#: N not a multiple of the 16-row tiles; 150 spans several threadgroups of every tile count.
NS = (37, 150, 29)


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request):  # noqa: ANN001, ANN201
    return load_family(request.param)


_VALID: dict[tuple[str, str, str, str], list[dict]] = {}


def _valid(fam, shape: str, chip=M2, dtype: str = "float16") -> list[dict]:  # noqa: ANN001
    """The valid configs (kept: the built-in families' spaces are enumerated by several tests)."""
    key = (str(fam.path), shape, chip.name, dtype)
    if key not in _VALID:
        _VALID[key] = Space(make_problem(fam, shape, dtype, chip), chip).enumerate().valid
    return [dict(c) for c in _VALID[key]]


# -- the templates and the space ----------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["metal", "cu"])
def test_both_families_render_the_one_shared_core(target: str) -> None:
    """No copy to keep in step: each family's template is the library's core (templates/_lib), and the render
    reads it from there; swiglu_qmatvec's spec is qmatvec's with a second matrix (extends)."""
    from kernsearch import render

    for name in FAMILIES:
        fam = load_family(name)
        text = (REPO / "templates" / name / f"{name}.{target}.j2").read_text()
        assert f'{{% import "_lib/qmatvec.{target}.j2" as core with context %}}' in text and len(text.splitlines()) < 6
        source = render(fam, dict(fam.default), "float16", "cuda" if target == "cu" else "metal").source
        assert ("Wu" in source) == (name == "swiglu_qmatvec")
    q, s = load_family("qmatvec"), load_family("swiglu_qmatvec")
    assert s.knobs == q.knobs and s.default == q.default and s.consumer_modes == q.consumer_modes
    assert [(c.name, c.expr.text) for c in s.constraints] == [(c.name, c.expr.text) for c in q.constraints]
    assert [t.name for t in s.inputs] == ["X", "W", "S", "Bq", "Wu", "Su", "Bu"] and s.bases == [q.path / "family.toml"]
    assert {k: v.text for k, v in s.derived.items() if k != "NMAT"} == {k: v.text for k, v in q.derived.items()
                                                                       if k != "NMAT"}


def test_apple_space_is_the_fma_path_with_the_problems_bits_and_rows(fam) -> None:  # noqa: ANN001
    for bits in (4, 8):
        for mb, ms in M_OF_MB.items():
            for m in ms:
                valid = _valid(fam, qshape(m, 64, bits, 64, 8))
                if fam.name == "swiglu_qmatvec" and mb == 16:
                    assert valid == []  # 2 x 2 x 16 accumulators per thread: over the register budget
                    continue
                assert valid and {c["PATH"] for c in valid} == {"fma"}
                assert {c["QBITS"] for c in valid} == {bits} and {c["MB"] for c in valid} == {mb}
    nvidia = [c for m, bits in ((1, 4), (2, 8), (3, 4), (16, 8)) for c in _valid(fam, qshape(m, 4096, bits, 64, 64), H100)]
    for name, knob in fam.knobs.items():
        assert {c[name] for c in nvidia} == set(knob.values), name
    assert dict(fam.default) in _valid(fam, qshape(1, 4096, 4, 64, 64))


def test_constraints_refuse_what_the_kernels_cannot_do(fam) -> None:  # noqa: ANN001
    space = Space(make_problem(fam, qshape(1, 4096, 4, 64, 64), "float16", M2), M2)
    assert "compiled_bits" in {v.constraint for v in space.violations({**fam.default, "QBITS": 8})}
    assert "tensor_cores" in {v.constraint for v in space.violations({**fam.default, "PATH": "mma", "MB": 8})}
    assert "rows_compiled" in {v.constraint for v in space.violations({**fam.default, "MB": 2})}
    bad_group = Space(make_problem(fam, "1,4096,4096,512,256", "float16", M2), M2)  # groups of 16
    assert "quantization" in {v.constraint for v in bad_group.violations(dict(fam.default))}
    h100_bf16_8bit = Space(make_problem(fam, qshape(1, 4096, 8, 64, 64), "bfloat16", H100), H100)
    assert "tensor_cores" in {v.constraint for v in h100_bf16_8bit.violations(
        {**fam.default, "QBITS": 8, "PATH": "mma", "MB": 8})}
    words = ("uint32",) * (1 if fam.name == "qmatvec" else 2)
    dtypes = geometry(space, dict(fam.default)).input_dtypes
    assert dtypes.count("uint32") == len(words) and dtypes[0] == "float16" and len(dtypes) == 1 + 3 * len(words)


def test_the_metal_template_refuses_the_nvidia_path(fam) -> None:  # noqa: ANN001
    from kernsearch import render

    source = render(fam, {**fam.default, "PATH": "mma", "MB": 8}, "float16", "metal")
    assert '#error "PATH=mma is NVIDIA-only' in source.header
    assert "#error" not in render(fam, dict(fam.default), "float16", "metal").header


# -- the Metal twin on the interpreter ----------------------------------------------------------------------

def test_a_config_of_each_family_matches_the_reference_at_ragged_n_and_k() -> None:
    """Fast lane: one fused and one plain kernel, K off a multiple of 128 (a partial step), N off the tiles."""
    q, s = load_family("qmatvec"), load_family("swiglu_qmatvec")
    for fam, cfg, dtype, shape in (
            (q, {**q.default, "QBITS": 8, "MB": 4, "KS": 4, "RT": 2}, "float16", qshape(3, 37, 8, 32, 5)),
            (s, {**s.default, "TW": 1, "UNROLL": 4}, "bfloat16", qshape(1, 29, 4, 64, 3))):
        runs, failures = _run_all(fam, [(cfg, dtype, shape)], "fast")
        assert runs == 1 and not failures, failures


def _sweep_candidates(fam) -> list[dict]:  # noqa: ANN001
    """Every valid Apple config at each M of its compiled row count, with every group size, N and dtype (M, group,
    N and dtype as knobs of the candidate)."""
    return [{**cfg, "M": m, "group": group, "N": n, "dtype": dtype}
            for bits in (4, 8) for ms in M_OF_MB.values() for m in ms
            for cfg in _valid(fam, qshape(m, 64, bits, 64, 8))
            for group in (g for g, _ in GROUPS) for n in NS for dtype in DTYPES]


def _sweep_plan(fam, strength: int = 3, seed: int = 5) -> list[tuple[dict, str, str]]:  # noqa: ANN001
    """(config, dtype, shape) of a ``strength``-way covering sample of :func:`_sweep_candidates`: every combination
    of three values of the knobs, M, the group size, N and the dtype that the Apple space has, in ~85 qmatvec and
    ~60 swiglu_qmatvec variants (the whole space once, every group, N and dtype in turn, was ~310 and ~200)."""
    groups = dict(GROUPS)
    plan = []
    for c in tway_sample(_sweep_candidates(fam), strength, seed=seed):
        cfg = {k: v for k, v in c.items() if k in fam.knobs}
        plan.append((cfg, c["dtype"], qshape(c["M"], c["N"], cfg["QBITS"], c["group"], groups[c["group"]])))
    return plan


def test_the_sweep_covers_every_3_way_interaction_of_the_apple_space_ms_groups_ns_and_dtypes(fam) -> None:  # noqa: ANN001
    candidates = _sweep_candidates(fam)
    plan = _sweep_plan(fam)
    assert len(plan) < len(candidates) // 50, len(plan)
    for cfg, dtype, shape in plan:
        assert Space(make_problem(fam, shape, dtype, M2), M2).is_valid(cfg), (cfg, shape)
    sizes = [tuple(map(int, s.split(","))) for _, _, s in plan]
    assert {m for m, *_ in sizes} == ({1, 2, 3, 5, 9, 16} if fam.name == "qmatvec" else {1, 2, 3, 5})
    assert {n for _, n, *_ in sizes} == set(NS) and {k % 128 for _, _, k, _, _ in sizes} == {0, 32, 64}
    met = {(d, k // ng, 32 * kw // k) for (_, d, _), (_, _, k, kw, ng) in zip(plan, sizes)}
    assert met == {(d, g, b) for d in DTYPES for g in (32, 64, 128) for b in (4, 8)}
    for name, knob in fam.knobs.items():
        unused = {"mma", "h2"} | ({16} if name == "MB" and fam.name == "swiglu_qmatvec" else set())  # NVIDIA-only paths
        assert {c[name] for c, _, _ in plan} == set(knob.values) - unused, name
    keys = sorted(candidates[0])  # every 3 of the candidates' dimensions: each combination of values they hold
    chosen = [{**c, "M": m, "group": k // ng, "N": n, "dtype": d} for (c, d, _), (m, n, k, _, ng) in zip(plan, sizes)]
    for trio in ((a, b, c) for i, a in enumerate(keys) for j, b in enumerate(keys[i + 1:], i + 1) for c in keys[j + 1:]):
        assert {tuple(x[k] for k in trio) for x in chosen} == {tuple(x[k] for k in trio) for x in candidates}, trio


@pytest.mark.slow
@pytest.mark.parametrize("strength", [2, pytest.param(3, marks=pytest.mark.e2e)])
def test_every_t_way_interaction_of_the_apple_space_matches_the_reference(fam, strength: int) -> None:  # noqa: ANN001
    """A 3-way covering sample of the family's Apple space (every combination of three values of the knobs, M,
    the group size, N and the dtype that the space has; ~0.2 s a variant) in fast mode, a 2-way one also in check
    mode (races, reads of unwritten threadgroup memory). Before: every valid config once (~310 qmatvec and ~200
    swiglu_qmatvec variants, 108 s of CPU), which ran no 3-way interaction of the rotated group, N and dtype that
    this misses.

    ``make test`` runs a 2-way sample in fast mode and the 2-way one in check mode; the 3-way sample in fast mode is
    the e2e lane's (CI: make test-all; ~36 s of CPU for both families with the check-mode half), which runs the same
    lines. test_the_sweep_covers_every_3_way_interaction_... checks the 3-way plan in the fast lane."""
    plan = _sweep_plan(fam, strength)
    runs, failures = _run_all(fam, plan, "fast")
    assert runs == len(plan) and not failures, failures[:5]
    if strength == 3:
        return  # the check-mode half runs in make test's case
    checked = _sweep_plan(fam, 2, seed=6)
    runs, failures = _run_all(fam, checked, "check")
    assert runs == len(checked) >= 10 and not failures, failures[:5]


def _mutated(fam, tmp_path: Path, *edits: tuple[str, str]):  # noqa: ANN001, ANN202
    """``fam`` with the shared core's Metal text edited: a copy of the folder with its own ``_lib`` (a folder's own
    library stands for the built-in one)."""
    folder = tmp_path / fam.name
    shutil.copytree(fam.path, folder)
    shutil.copytree(REPO / "templates" / "_lib", folder / "_lib")
    tmpl = folder / "_lib" / "qmatvec.metal.j2"
    text = tmpl.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    tmpl.write_text(text)
    return load_family(str(folder))


@pytest.mark.slow
def test_wrong_unpacking_and_a_missing_tail_guard_are_caught(tmp_path: Path) -> None:
    """High bits first is wrong everywhere; a kernel without its guard past the last chunk of a row is right
    where K fills whole steps and wrong where it leaves a partial one (K = 160 at groups of 32): why the
    sweep's K are off multiples of 128."""
    q = load_family("qmatvec")
    bad = _mutated(q, tmp_path / "a", ("(QB * f)", "(QB * (VPW - 1 - f))"))
    runs, failures = _run_all(bad, [(dict(bad.default), "float32", qshape(1, 40, 4, 64, 4))], "fast")
    assert runs == 1 and len(failures) == 1 and "wrong" in failures[0]
    unguarded = _mutated(q, tmp_path / "b", ("const bool ok = chunk < CH;", "const bool ok = true;"),
                         ("if (chunk >= CH) {", "if (false) {"))
    # M = 2: the first row of X read past its end is the second row (drawn values), so the wrong sums do not depend
    # on what memory lies past X. With M = 1 they did: where that memory held zeros the product past the row added
    # nothing and the kernel passed (the suite's whole runs failed this test now and then).
    cfg = {**unguarded.default, "KS": 1, "UNROLL": 2, "MB": 2}
    runs, failures = _run_all(unguarded, [(cfg, "float32", qshape(2, 40, 4, 32, 8))], "fast")  # K = 256
    assert runs == 1 and not failures, failures
    runs, failures = _run_all(unguarded, [(cfg, "float32", qshape(2, 40, 4, 32, 5))], "fast")  # K = 160
    # past the row it reads the next row of W and of X: wrong values (NaN where the last row's reads find NaN)
    assert runs == 1 and len(failures) == 1 and ("FAIL (wrong)" in failures[0] or "FAIL (nan)" in failures[0]), failures


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["--check", "--sanitize"])
def test_the_cli_verifies_the_fused_family_with_races_and_bounds_checked(tmp_path: Path, mode: str) -> None:
    """Check mode (threadgroup races, unwritten reads) and AddressSanitizer (device reads past a row of W, X or
    the scales) at ragged N and K."""
    import os

    env = {**os.environ, "KERNSEARCH_HOME": str(tmp_path)}

    def verify(family: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kernsearch", "verify", family, "--config",
                               "PATH=fma,QBITS=8,TW=2,KS=4,RT=2,UNROLL=2,MB=2", "--shape", qshape(2, 37, 8, 32, 5),
                               "--dtype", "float32", mode], capture_output=True, text=True, env=env, timeout=300)

    done = verify("swiglu_qmatvec")
    assert done.returncode == 0 and "pass" in done.stdout, done.stdout + done.stderr
    if mode == "--sanitize":  # rows past N read unclamped: right values (never written), reads past W
        unclamped = _mutated(load_family("swiglu_qmatvec"), tmp_path, (
            "const int row = min(row_base + rt * 16 + g + 8 * h, N - 1);",
            "const int row = row_base + rt * 16 + g + 8 * h;"))
        done = verify(str(unclamped.path))
        assert done.returncode == 1 and "heap-buffer-overflow" in done.stdout, done.stdout + done.stderr


def test_the_fused_familys_reference_stays_inside_float16_at_real_sizes() -> None:
    """The product of two K-long sums grows with K and the field width: with qmatvec's scales (and 8 bits at
    K = 4096) it passed 65504, so every float16 check of a correct kernel failed (inf against a finite value)."""
    import numpy as np

    from kernsearch.evaluation._verify import make_inputs, reference

    fam = load_family("swiglu_qmatvec")
    for shape in (qshape(1, 32, 8, 64, 64), qshape(4, 32, 4, 32, 128)):
        problem = make_problem(fam, shape, "float16")
        (y,) = reference(problem, make_inputs(problem, 0))
        assert float(np.abs(y).max()) < 65504 / 4, shape


# -- the interpreter's problems: small and ragged, the quantization kept ------------------------------------

def test_the_family_declares_a_small_problem_and_a_ragged_one_that_keep_the_quantization(fam) -> None:  # noqa: ANN001
    """Cutting each size alone (K to 96, KW to 96...) makes no valid quantized problem: the family says how."""
    from kernsearch.studies._objective import KernelObjective

    tuned = make_problem(fam, qshape(1, 4096, 4, 64, 64), "float16", M2)
    assert tuned.verify_shape() == (1, 96, 192, 24, 3)
    assert make_problem(fam, tuned.verify_shape(), "float16").ragged_shape() == (1, 91, 128, 16, 2)
    eight = make_problem(fam, qshape(9, 11008, 8, 128, 32), "bfloat16", M2)
    assert eight.verify_shape() == (9, 96, 384, 96, 3)
    objective = KernelObjective(tuned, M2, "model")
    for cfg in Space(tuned, M2).enumerate().valid:
        assert objective.verify_shape(cfg) == (1, 96, 192, 24, 3)
        assert objective.ragged_shape(cfg) == (1, 91, 128, 16, 2)
        # the device's ragged check runs just below the tuned shape: one group and 5 rows less
        assert objective.ragged_shape(cfg, near=tuned.shape) == (1, 4091, 4032, 504, 63)


def test_a_nightly_job_checks_its_winner_on_the_familys_ragged_problem(tmp_path: Path) -> None:
    from kernsearch.flows._jobs import load_jobs

    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[[jobs]]\nfamily = "swiglu_qmatvec"\nshapes = ["3,11008,4096,1024,32"]\nchips = ["M2 Max"]\n'
                    '[[jobs]]\nfamily = "gemm"\nshapes = ["4096,4096,4096"]\nchips = ["M2 Max"]\n')
    fused, gemm = load_jobs(jobs).units("M2 Max")
    assert fused.verify_shapes == () and gemm.verify_shapes == ()  # derived from each winner's config
    from kernsearch.family._shapes import ragged_shape, smallest_shape

    fam = load_family("swiglu_qmatvec")
    cfg = Space(make_problem(fam, (3, 11008, 4096, 1024, 32), "float16", M2), M2).enumerate().valid[0]
    small = smallest_shape(fam, "float16", M2, cfg, (3, 11008, 4096, 1024, 32))
    assert small == (3, 96, 384, 96, 3)  # the family's declared small problem: the quantization kept
    assert ragged_shape(fam, "float16", M2, cfg, small) == (3, 91, 256, 64, 2)  # one group and 5 rows less


def test_a_declared_shape_that_is_not_sizes_is_a_spec_error(tmp_path: Path) -> None:
    folder = tmp_path / "qmatvec"
    shutil.copytree(REPO / "templates" / "qmatvec", folder)
    spec = folder / "family.toml"
    text = spec.read_text()
    spec.write_text(text.replace('verify_shape = "[M,', 'verify_shape = "[M, M,'))
    fam = load_family(str(folder))
    with pytest.raises(SpecError, match="problem.verify_shape: expected 5 integer sizes"):
        make_problem(fam, qshape(1, 4096, 4, 64, 64)).verify_shape()
    spec.write_text(text.replace('verify_shape = "[M, min(N, 96),', 'verify_shape = "[M, 2 * N,'))
    with pytest.raises(SpecError, match=r"problem.verify_shape: \[1, 8192, .* is larger than the problem"):
        make_problem(load_family(str(folder)), qshape(1, 4096, 4, 64, 64)).verify_shape()
    spec.write_text(text.replace('verify_shape = "[M,', 'verify_shape = "[BOGUS,'))
    with pytest.raises(SpecError, match="problem.verify_shape: unknown name"):
        load_family(str(folder))


# -- the model ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chip", ["M2 Max", "H100"])
def test_the_model_ranks_the_space_not_a_tie(fam, chip: str) -> None:  # noqa: ANN001
    """A finite prediction for every valid config, mostly distinct even where the DRAM floor binds (M = 1 at
    14336 rows: the weights stream at DRAM bandwidth, so occupancy and balance over the cores decide); the
    8-bit problem (twice the weight bytes) predicted slower at its best."""
    model = get_backend("model", chip=chip)
    best = {}
    for bits in (4, 8):
        space = Space(make_problem(fam, qshape(1, 14336, bits, 64, 64), "float16", get_chip(chip)), get_chip(chip))
        times = [model.predict_ms(space, c) for c in space.enumerate().valid]
        assert all(0 < t < 10 for t in times) and len({round(t, 9) for t in times}) > len(times) // 2
        best[bits] = min(times)
    assert best[4] < best[8]


def test_the_model_streams_the_weights_and_the_fused_pass_reads_twice_the_bytes() -> None:
    model = get_backend("model", chip="H100")
    q, s = load_family("qmatvec"), load_family("swiglu_qmatvec")
    shape = qshape(1, 14336, 4, 64, 64)
    sq = Space(make_problem(q, shape, "float16", H100), H100)
    ss = Space(make_problem(s, shape, "float16", H100), H100)
    # 112 threadgroups of 128 rows for 132 SMs: some SMs idle, the busy ones stream at their share of DRAM
    few = {"PATH": "fma", "QBITS": 4, "TW": 4, "KS": 1, "RT": 2, "UNROLL": 2, "MB": 1}
    b = model.breakdown(sq, few)
    assert b["stream_bytes"] == pytest.approx(14336 * (2048 + 4 * 64)) and b["threadgroups"] == 112
    assert b["core_ms"] > 1.5 * b["dram_ms"] and b["bound"] == "dram"  # the busy SMs' share of it
    best_q = min(model.predict_ms(sq, c) for c in sq.enumerate().valid)
    best_s = min(model.predict_ms(ss, c) for c in ss.enumerate().valid)
    assert 1.6 * best_q < best_s < 2.4 * best_q
