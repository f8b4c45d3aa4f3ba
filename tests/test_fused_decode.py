"""The fused decode families on the shared quantized matrix-vector core: rmsnorm_qmatvec (Y = rms_norm(X, gamma,
eps)·dequant(W)ᵀ), qmatvec_residual (Y = R + X·dequant(W)ᵀ) and rmsnorm_swiglu_qmatvec (silu(n·Wgᵀ) ⊙ (n·Wuᵀ),
n = rms_norm(X, gamma, eps)). Their Metal twins on the interpreter against the float64 references at ragged N
and K (4 and 8 bits, groups of 32, 64 and 128, M = 1 and M in 2..16), and their specs: each qmatvec's (or
swiglu_qmatvec's) plus what the fusion adds. The CUDA twins are rendered and compiled in test_qmatvec_cuda.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import builtin_families
from covering import covering_sample as tway_sample
from test_gemv import _run_all
from test_qmatvec import FAMILIES as CORES
from test_qmatvec import M2, qshape

from kernsearch import Space, load_family, make_problem

#: Every built-in family built on the qmatvec core but the cores themselves (test_qmatvec.py): found in the
#: family folders, so a new fused family is tested here (and fails the spec test until FUSION describes it).
FUSED = tuple(f for f in builtin_families(built_on="qmatvec") if f not in CORES)
#: What each fused family adds to its core: (the core it extends, its extra inputs, its extra params).
FUSION = {"rmsnorm_qmatvec": ("qmatvec", ["gamma"], ["eps"]), "qmatvec_residual": ("qmatvec", ["R"], []),
          "rmsnorm_swiglu_qmatvec": ("swiglu_qmatvec", ["gamma"], ["eps"])}
#: (M, bits, group, groups, N, dtype): ragged N (off the 16-row tiles), K = 160, 192, 384 (off multiples of 128
#: but for the last), M = 1 and M of every other compiled row count but 16 (the fused pair holds too many
#: accumulators there), both widths, every group size and dtype.
PLAN = ((1, 4, 32, 5, 37, "float16"), (2, 8, 64, 3, 150, "bfloat16"), (3, 4, 128, 3, 29, "float32"),
        (5, 8, 32, 5, 37, "float16"), (1, 8, 128, 3, 29, "bfloat16"), (7, 4, 64, 3, 37, "float32"))


def _plan(fam, rows: tuple = PLAN, every: int = 5) -> list[tuple[dict, str, str]]:  # noqa: ANN001
    """For each row of ``rows``: every ``every``-th valid Apple config (offset by the row) at that shape."""
    plan = []
    for i, (m, bits, group, groups, n, dtype) in enumerate(rows):
        shape = qshape(m, n, bits, group, groups)
        valid = Space(make_problem(fam, shape, dtype, M2), M2).enumerate().valid
        assert valid, (fam.name, shape, dtype)
        plan += [(dict(c), dtype, shape) for c in valid[i % every::every]]
    return plan


@pytest.mark.parametrize("name", FUSED)
def test_a_config_of_each_fused_family_matches_the_float64_reference_at_ragged_shapes(name: str) -> None:
    """Fast lane: M = 3 in float16 at 8 bits, groups of 32 (K = 160: a partial step), N = 37 (off the tiles)."""
    fam = load_family(name)
    cfg = {**fam.default, "QBITS": 8, "MB": 4, "KS": 4, "TW": 1}
    runs, failures = _run_all(fam, [(cfg, "float16", qshape(3, 37, 8, 32, 5))], "fast")
    assert runs == 1 and not failures, failures


def _covering_plan(fam, rows: tuple) -> list[tuple[dict, str, str]]:  # noqa: ANN001
    """A 1-way covering sample of the valid Apple configs of every row of ``rows`` (the row counted as a knob):
    every row, and every value of every knob valid at some row, in the fewest variants."""
    candidates = []
    for i, (m, bits, group, groups, n, dtype) in enumerate(rows):
        shape = qshape(m, n, bits, group, groups)
        candidates += [{**c, "row": i} for c in Space(make_problem(fam, shape, dtype, M2), M2).enumerate().valid]
    plan = []
    for c in tway_sample(candidates, 1, seed=9):
        m, bits, group, groups, n, dtype = rows[c["row"]]
        plan.append(({k: v for k, v in c.items() if k != "row"}, dtype, qshape(m, n, bits, group, groups)))
    for knob in fam.knobs:
        assert {c[knob] for c, _, _ in plan} == {c[knob] for c in candidates}, knob
    return plan


@pytest.mark.slow
@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("sample", ["each_value", pytest.param("every_9th", marks=pytest.mark.e2e)])
def test_a_sweep_of_each_fused_family_matches_the_reference(name: str, sample: str) -> None:
    """Configs covering every knob value, at M = 1, 2, 3, 5, 7 and 16 (where valid), 4 and 8 bits, groups of 32,
    64 and 128, every dtype, ragged N and K; a few also in check mode (threadgroup races, unwritten reads: the
    norm's block reduction). ``make test``: a 1-way covering sample (every row of the plan, every knob value; ~7
    variants, 2-3 of them also in check mode; ~3 s of CPU a family); the e2e lane (CI: make test-all) every 9th
    valid config of each row (~26 variants, ~8 s), which runs the same lines."""
    fam = load_family(name)
    rows = PLAN + (((16, 8, 64, 3, 37, "float16"),) if "swiglu" not in name else ())
    plan = _covering_plan(fam, rows) if sample == "each_value" else _plan(fam, rows, every=9)
    assert {c["TW"] for c, _, _ in plan} == {1, 2, 4} and {c["KS"] for c, _, _ in plan} == {1, 2, 4}
    assert {s for _, _, s in plan} == {qshape(m, n, b, g, gs) for m, b, g, gs, n, _ in rows}
    runs, failures = _run_all(fam, plan, "fast")
    assert runs == len(plan) and not failures, failures[:5]
    runs, failures = _run_all(fam, plan[::3] if sample == "each_value" else plan[::7], "check")
    assert not failures, failures[:5]


def _without(tmp_path: Path, name: str, derived: str) -> object:
    """The built-in family ``name`` with one derived value set to 0 (a copy of its folder, extending its base)."""
    fam = load_family(name)
    folder = tmp_path / name
    shutil.copytree(fam.path, folder)
    spec = folder / "family.toml"
    text = spec.read_text()
    assert f'\n{derived} = "1"' in text
    spec.write_text(text.replace(f'\n{derived} = "1"', f'\n{derived} = "0"'))
    return load_family(str(folder))


@pytest.mark.parametrize(("name", "derived"), [("rmsnorm_qmatvec", "NORM"), ("qmatvec_residual", "RESID")])
def test_a_kernel_without_its_prologue_or_epilogue_fails_the_reference(tmp_path: Path, name: str,
                                                                        derived: str) -> None:
    """The reference sees the fusion: the core without the norm (X used as it is) or without the residual add
    is wrong, at the fast lane's shape."""
    fam = _without(tmp_path, name, derived)
    cfg = {**fam.default, "QBITS": 8, "MB": 4, "KS": 4, "TW": 1}
    runs, failures = _run_all(fam, [(cfg, "float16", qshape(3, 37, 8, 32, 5))], "fast")
    assert runs == 1 and len(failures) == 1 and "wrong" in failures[0], failures


def test_the_specs_are_the_base_familys_plus_the_fusion() -> None:
    assert sorted(FUSION) == sorted(FUSED) and len(FUSED) >= 3
    for name, (core, extra, params) in FUSION.items():
        fam, base = load_family(name), load_family(core)
        assert fam.knobs == base.knobs and fam.default == base.default and fam.consumer_modes == base.consumer_modes
        assert [c.name for c in fam.constraints] == [c.name for c in base.constraints]
        assert [t.name for t in fam.inputs] == [t.name for t in base.inputs] + extra and list(fam.params) == params
        # The op a consumer writes: plain ops, not mx.compile'd (docs/timing.md); the link of a decode's chain.
        assert not fam.compile_baseline and fam.bases[0] == base.path / "family.toml"
        assert fam.chain_inputs == (("R", "X") if "R" in extra else ("X",))
        assert [t.name for t in fam.outputs] == ["Y"]
        assert {d: (t.rtol.text, t.atol.text) for d, t in fam.tolerance.items()} == {
            d: (t.rtol.text, t.atol.text) for d, t in base.tolerance.items()}
    gamma = next(t for t in load_family("rmsnorm_qmatvec").inputs if t.name == "gamma")
    assert gamma.weight and gamma.shape.text == "[K]"


@pytest.mark.parametrize("name", FUSED)
def test_the_norm_adds_its_threadgroup_memory_to_the_budget(name: str) -> None:
    """The norm's partial sums (one per simdgroup and row) and inverses count against threadgroup memory."""
    from kernsearch.family._render import render_context

    fam = load_family(name)
    for cfg in ({**fam.default, "KS": 1}, {**fam.default, "KS": 4, "TW": 4, "MB": 8}):
        ctx = render_context(fam, cfg, "float16")
        part = (cfg["KS"] - 1) * cfg["TW"] * 32 * ctx["PER"] * 4
        norm = (cfg["TW"] * cfg["KS"] * cfg["MB"] + cfg["MB"]) * 4 if name.startswith("rmsnorm_") else 0
        assert ctx["tg_bytes"] == part + norm
