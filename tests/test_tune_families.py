"""Issue 24 must hold: ``kernsearch tune F`` succeeds (exit 0, a verified winner) for every built-in family at its
default shape and at one ragged shape, on a machine without a GPU; and the finalists are verified at the smallest
shapes where the family's constraints hold for them, derived from the spec (a fixed cap of 96 broke rmsnorm,
layernorm and qmatvec: their configs are invalid there).

The runs are short (a few trials, two finalists) but whole: the CLI's entry point, the model back-end, the
interpreter at the finalists' small shapes, the winner's check at the tuned shape and at a ragged one. gemm at its
default shape is `make tune`'s own job: tests/test_ux.py::test_make_tune_through_a_pipe_... runs it whole. The other
families' default-shape cases are in the e2e lane (CASES says why); `make test` tunes each at its ragged shape.
"""

from __future__ import annotations

import json
import random

import pytest
from conftest import builtin_families

from kernsearch.family._shapes import MIN_SIDE, ragged_shape, smallest_shape
from kernsearch.family._space import Space, make_problem
from kernsearch.family._spec import load_family
from kernsearch.hardware._chips import default_apple_chip

#: A shape per family whose sizes are multiples of no tile (the quantized dims K, KW, NG stay tied). mlp_block's is a
#: quarter of an LLM layer (H 960 = 15 groups of 64, F 2752 = 43): at 3x4032x11008 (one group less than its default
#: in each) its winner's float64 check took ~16 s of CPU, ~6 at this size, through the same code; the e2e lane tunes
#: it at its default shape.
RAGGED = {"gemm": "1000,1003,999", "gemv": "3,4095,4093", "qmatvec": "3,4093,4096,512,64", "rmsnorm": "1023,1001",
          "layernorm": "1023,1001", "softmax": "1023,1001", "swiglu": "1023,11007",
          "swiglu_qmatvec": "3,4093,4096,512,64", "rmsnorm_qmatvec": "3,4093,4096,512,64",
          "qmatvec_residual": "3,4093,4096,512,64", "rmsnorm_swiglu_qmatvec": "3,4093,4096,512,64",
          "mlp_block": "3,960,2752,120,15,344,43"}

#: The fast lane keeps one (the cheapest at its default shape); the others are slow. `make test` tunes every family
#: whole at its ragged shape: LLM-sized like the default but mlp_block's (so the winner's check samples threadgroups
#: there too) and off every tile, so its finalists' small shapes, the tuned-shape check and the ragged check run the same code as at
#: the default shape, and the edges besides. The default-shape cases are the e2e lane's (CI runs them: make test-all):
#: at the default shape they run that code again (~70 s of CPU); the default shapes' own small and ragged shapes are
#: derived and checked for every family by test_every_familys_configs_get_a_valid_small_shape_and_a_ragged_one, and
#: gemm's default shape is tuned whole by `make tune` (tests/test_ux.py).
CASES = [pytest.param("gemv", None, id="gemv-default")] + [
    pytest.param(name, shape, id=f"{name}-{'ragged' if shape else 'default'}",
                 marks=[pytest.mark.slow] + ([pytest.mark.e2e] if shape is None else []))
    for name in sorted(RAGGED) for shape in (None, RAGGED[name])
    if (name, shape) not in (("gemv", None), ("gemm", None))]


def test_every_builtin_family_has_a_ragged_case() -> None:
    assert sorted(RAGGED) == builtin_families()


def _tune(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:
    """``kernsearch tune ARGS --json`` through the console script's entry point, in this process."""
    from kernsearch.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["tune", *args, "--json"])
    captured = capsys.readouterr()
    return int(exited.value.code or 0), json.loads(captured.out) if captured.out.strip() else {}, captured.err


@pytest.mark.parametrize(("family", "shape"), CASES)
def test_tune_finds_a_verified_winner_without_a_gpu(family: str, shape: str | None,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc, data, err = _tune(capsys, family, *(["--shape", shape] if shape else []), "--trials", "4",
                          "--finalists", "2")
    assert rc == 0, err[-3000:]
    tuned = "x".join(map(str, make_problem(load_family(family), shape).shape))
    winner = data["winner"]
    assert winner is not None and data["final"]["winner"] == winner["number"], data["final"]
    check = data["final"]["checks"][str(winner["number"])]
    assert check["ok"], check
    # proven where it will run: at the tuned shape (a sample of its threadgroups) and a ragged shape besides
    assert check["also"][0] == tuned and len(check["also"]) == 2, check
    for number, other in data["final"]["checks"].items():  # every finalist at a shape valid for its config
        assert other["ok"], (number, other)
        assert all(small <= big for small, big in zip(other["shape"], make_problem(load_family(family), shape).shape))


def test_finalists_shapes_hold_every_constraint_where_a_fixed_cap_does_not() -> None:
    """The configs the cap of 96 refused: a row held in registers (needs a row longer than 2048) and qmatvec's
    tied dims (KW * 32 == K * BITS, K a multiple of the group)."""
    chip = default_apple_chip()
    rms = load_family("rmsnorm")
    held = {"TG": 64, "ROWS": 1, "VEC": 4, "UNROLL": 16, "HOLD": "registers", "REDUCE": "simd", "ACC": "float32"}
    capped = Space(make_problem(rms, (96, 96), "float16", chip), chip)
    assert not capped.is_valid(held)  # what the cap verified at: FAIL (invalid)
    small = smallest_shape(rms, "float16", chip, held, (4096, 4096))
    assert Space(make_problem(rms, small, "float16", chip), chip).is_valid(held)
    assert 2048 < small[1] < 4096 and small[0] == MIN_SIDE, small  # as small as the constraints allow
    ragged = ragged_shape(rms, "float16", chip, held, small)
    assert ragged is not None and Space(make_problem(rms, ragged, "float16", chip), chip).is_valid(held)
    assert all(r < s for r, s in zip(ragged, small))

    q = load_family("qmatvec")
    space = Space(make_problem(q, None, None, chip), chip)
    cfg = space.enumerate().valid[0]
    small = smallest_shape(q, "float16", chip, cfg, (1, 4096, 4096, 512, 64))
    m, n, k, kw, ng = small
    assert 32 * kw // k == 4 and k // ng == 64, small  # the tuned problem's bits and group size, kept
    assert n < 4096 and Space(make_problem(q, small, "float16", chip), chip).is_valid(cfg)


@pytest.mark.slow
def test_every_familys_configs_get_a_valid_small_shape_and_a_ragged_one() -> None:
    chip = default_apple_chip()
    rng = random.Random(0)
    for name in builtin_families():
        fam = load_family(name)
        problem = make_problem(fam, None, None, chip)
        for cfg in rng.sample(Space(problem, chip).enumerate().valid, 3) if name != "gemm" else \
                [dict(fam.default)]:
            small = smallest_shape(fam, problem.dtype, chip, cfg, problem.shape)
            assert Space(make_problem(fam, small, problem.dtype, chip), chip).is_valid(cfg), (name, cfg, small)
            assert all(s <= d for s, d in zip(small, problem.shape)) and small != problem.shape, (name, small)
            ragged = ragged_shape(fam, problem.dtype, chip, cfg, small)
            assert ragged is not None and Space(make_problem(fam, ragged, problem.dtype, chip), chip).is_valid(cfg)
