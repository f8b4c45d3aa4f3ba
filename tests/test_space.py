"""The search space: valid-config counting, rejection reasons, config parsing, problems."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from test_model import TOY_SPEC

from kernsearch import KernsearchError, Space, get_chip, make_problem
from kernsearch._errors import ConfigError
from kernsearch.family._space import format_config


def _space(gemm, shape="4096,4096,4096", dtype="float16", chip="M2 Max") -> Space:  # noqa: ANN001
    c = get_chip(chip)
    return Space(make_problem(gemm, shape, dtype, c), c)


@pytest.mark.slow
def test_m2_max_4096_float16_space_is_large_and_explained(gemm) -> None:  # noqa: ANN001
    sp = _space(gemm)
    summary = sp.enumerate()
    assert summary.total == 4 * 4 * 3 * 3 * 3 * 3 * 2 * 2 * 4 * 3 * 2 * 2 * 2 * 5  # MMA x TSCOPE x TACC: 3 x 2 x 2; SPLIT_K: 5
    assert len(summary.valid) >= 1000
    # every rejected config is counted exactly once
    assert sum(summary.rejected.values()) == summary.total - len(summary.valid)
    assert {"simdgroup_fragments", "staging_knobs_need_staging"} <= set(summary.rejected)


@pytest.mark.slow
@pytest.mark.parametrize(("stride", "least"), [(97, 150), pytest.param(29, 500, marks=pytest.mark.e2e)])
def test_enumeration_agrees_with_per_config_check(gemm, stride: int, least: int) -> None:  # noqa: ANN001
    """The pruned walk and the plain per-config check select exactly the same configs, on every ``stride``-th config
    of the product (a prime to every knob's count of values, so the stride runs through each knob's values; every
    7th, checked before, took 97 s of CPU). ``make test``: every 97th (26,000 of 2.5 million, ~160 of them valid;
    ~10 s of CPU, ~4 s of it the walk through the product); the e2e lane (CI: make test-all) every 29th (86,000,
    ~24 s), which runs the same lines."""
    sp = _space(gemm, shape="33,65,7", dtype="float32")
    valid = {tuple(c.items()) for c in sp.enumerate().valid}
    sampled = list(itertools.islice(sp.iter_all(), 0, None, stride))
    brute = {tuple(c.items()) for c in sampled if sp.is_valid(c)}
    assert len(brute) > least
    for name in gemm.knobs:  # the stride ran through every knob's values, valid ones among them
        assert {c[name] for c in sampled} == set(gemm.knobs[name].values), name
    assert brute == valid & {tuple(c.items()) for c in sampled}


@pytest.mark.slow
def test_shape_and_chip_change_the_space(gemm) -> None:  # noqa: ANN001
    aligned = len(_space(gemm, "64,64,64").enumerate().valid)
    ragged = len(_space(gemm, "33,65,7").enumerate().valid)
    assert ragged < aligned  # vector loads need K (and N) divisible by VEC
    small_tg = get_chip("M2 Max").model_copy(update={"threadgroup_memory_bytes": 4096})
    sp = Space(make_problem(gemm, "64,64,64", "float32", small_tg), small_tg)
    summary = sp.enumerate()
    assert summary.rejected["threadgroup_memory"] > 0 and len(summary.valid) < aligned


def test_violations_name_every_broken_rule(gemm) -> None:  # noqa: ANN001
    sp = _space(gemm, "33,65,7")
    cfg = sp.parse_config("STAGE=none,VEC=4,MMA=simdgroup,BM=16,WM=4")
    names = {v.constraint for v in sp.violations(cfg)}
    assert {"staging_knobs_need_staging", "vector_alignment", "simdgroup_fragments"} <= names
    with pytest.raises(ConfigError, match="violates.*staging_knobs_need_staging"):
        sp.validate(cfg)


@pytest.mark.parametrize(("text", "message"), [
    ("BX=1", "unknown knob 'BX'"),
    ("BM=7", r"invalid value BM=7 \(allowed: 16, 32, 64, 128\)"),
    ("MMA=tensors", "invalid value MMA=tensors"),
    ("DOUBLE_BUFFER=maybe", "invalid value DOUBLE_BUFFER=maybe"),
    ("BM", "expected KNOB=VALUE"),
])
def test_bad_configs_are_one_line_errors(gemm, text: str, message: str) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match=message):
        _space(gemm).parse_config(text)


def test_partial_config_keeps_defaults(gemm) -> None:  # noqa: ANN001
    cfg = _space(gemm).parse_config("BM=64,DOUBLE_BUFFER=on")
    assert cfg["BM"] == 64 and cfg["DOUBLE_BUFFER"] is True and cfg["BN"] == gemm.default["BN"]


@pytest.mark.parametrize(("shape", "dtype", "chip", "message"), [
    ("0,4,4", None, None, "impossible shape: M=0"),
    ("4,4", None, None, "needs 3 sizes"),
    ("a,b,c", None, None, "bad shape"),
    (None, "float64", None, "dtype 'float64' not supported"),
    (None, "bfloat16", "M1", "no bfloat16"),
])
def test_bad_problems(gemm, shape, dtype, chip, message: str) -> None:  # noqa: ANN001
    with pytest.raises(KernsearchError, match=message):
        make_problem(gemm, shape, dtype, get_chip(chip) if chip else None)


def test_problem_counts(gemm) -> None:  # noqa: ANN001
    p = make_problem(gemm, "4096,4096,4096", "float16")
    assert p.flops() == 2 * 4096**3
    assert p.bytes() == 3 * 4096 * 4096 * 2


def _counting_evaluations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every evaluation of a derived value or a constraint (``Space._eval``) from now on."""
    count = [0]
    evaluate = Space._eval

    def counted(self: Space, *args: object) -> object:
        count[0] += 1
        return evaluate(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Space, "_eval", counted)
    return count


def test_the_models_sample_of_a_big_space_is_drawn_through_the_walk(gemm, monkeypatch) -> None:  # noqa: ANN001
    """The model's sample of a space too big to enumerate (gemm's 2.5 million configs, ~1 in 55 valid) is drawn
    knob by knob, each draw given up at its first failing constraint, each constraint evaluated once per
    combination of what it reads: fewer evaluations in all than one whole check of each config it returns (drawing
    whole configs and checking each took ~34 checks a config: ~15 s of a model-back-end `tune gemm`)."""
    from kernsearch.studies._objective import KernelObjective

    chip = get_chip("M2 Max")
    objective = KernelObjective(make_problem(gemm, None, None, chip), chip, "model")
    assert objective.space.total > 20000  # model_ranking samples this space: it does not enumerate it
    count = _counting_evaluations(monkeypatch)
    sample = objective._sample(200)
    one_check = len(gemm.derived) + len(gemm.constraints)  # the evaluations of one config's whole check
    assert 0 < count[0] < 200 * one_check, count[0]
    monkeypatch.undo()
    assert len({format_config(c) for c in sample}) == 200 and all(objective.space.is_valid(c) for c in sample[::10])
    assert objective._sample(200) == sample  # seeded: the model's verdict is the same every run


@pytest.mark.slow
def test_a_sample_is_uniform_over_the_valid_configs(gemm) -> None:  # noqa: ANN001
    """Each knob value's share of a 1,000-config sample is its share of the valid configs (the enumeration's),
    within 4.5 standard deviations: the early give-up changes the cost of a draw, not which configs come out.
    A space whose valid configs are too rare to draw (~1 in 1,100) is enumerated instead: asked for more configs
    than it has, a sample is every valid config."""
    sp = _space(gemm)
    valid = sp.enumerate().valid
    sample = sp.sample(1000, random.Random(7))
    assert len({format_config(c) for c in sample}) == 1000 and all(sp.is_valid(c) for c in sample[::7])
    for knob, values in sp.knobs.items():
        for value in values:
            share = sum(c[knob] == value for c in valid) / len(valid)
            drawn = sum(c[knob] == value for c in sample)
            assert abs(drawn - 1000 * share) <= 4.5 * math.sqrt(1000 * share * (1 - share)) + 1e-9, (knob, value)
    small = get_chip("M2 Max").model_copy(update={"threadgroup_memory_bytes": 1024})
    rare = Space(make_problem(gemm, "33,65,7", "float32", small), small)
    every = sorted(map(format_config, rare.enumerate().valid))
    assert 1000 * len(every) < rare.total
    assert sorted(map(format_config, rare.sample(len(every) + 5, random.Random(1)))) == every


# -- the enumeration a depth at a time (_enumerate) against the depth-first walk ------------------------------------

def _same_summary(a, b) -> bool:  # noqa: ANN001
    return a.total == b.total and a.valid == b.valid and list(a.rejected.items()) == list(b.rejected.items())


@pytest.mark.slow
def test_the_enumeration_a_depth_at_a_time_is_the_walks_in_every_family(monkeypatch: pytest.MonkeyPatch) -> None:
    """Space.enumerate finds a space a depth at a time (``_enumerate``: each derived value and constraint evaluated
    once per combination of what it reads; gemm's 2.5 million configs at 64x64x64: ~0.37 -> ~0.24 s): the same valid
    configs in the same order, and the same rejections in the same order, as the depth-first walk (Space.walk) in
    every built-in family on an Apple and an NVIDIA chip, at its default shape and its ragged one; it gives up on
    none of them; a product walked a first-knob value at a time (above MAX_AT_ONCE) says the same."""
    from conftest import builtin_families

    from kernsearch import load_family
    from kernsearch.family import _enumerate

    checked = 0
    for name in builtin_families():
        fam = load_family(name)
        for chip in (get_chip("M2 Max"), get_chip("H100")):
            problem = make_problem(fam, None, None, chip)
            for shape in {problem.shape, problem.ragged_shape() or problem.shape}:
                space = Space(make_problem(fam, shape, None, chip), chip)
                assert _enumerate.by_levels(space, lambda _: None) is not None, (name, chip.name, shape)
                assert _same_summary(space.enumerate(), space.walk(lambda _: None)), (name, chip.name, shape)
                checked += 1
    assert checked > 2 * len(builtin_families())  # the default shapes, and the ragged ones families declare
    gemm = load_family("gemm")
    space = _space(gemm, "33,65,7", "float32")
    monkeypatch.setattr(_enumerate, "MAX_AT_ONCE", 1000)
    advanced: list[int] = []
    found = _enumerate.by_levels(space, advanced.append)
    assert found is not None and advanced == [(i + 1) * space.total // 4 for i in range(4)]  # BM's 4 values
    walked = space.walk(lambda _: None)
    assert (found[0], list(found[1].items())) == (walked.valid, list(walked.rejected.items()))


# test_model's toy family's problem (one dimension, A in, C out, a Metal template), with knobs of its own
MIXED = TOY_SPEC[:TOY_SPEC.index("[knobs.")].replace('name = "toy"', 'name = "mixed"', 1) + """
[knobs.P]
kind = "other"
values = [1, 2, 3, 4]
[knobs.Q]
kind = "other"
values = [0, 1, 2]
[knobs.S]
kind = "other"
values = ["x", "yy"]
[knobs.F]
kind = "other"
values = [true, false]

[launch]
grid = "[N, 1, 1]"
threadgroup = "[32, 1, 1]"

[default]
P = 1
Q = 0
S = "x"
F = false

[derived]
H = "P / 2 if F else P // 2"
W = "(H == 1) if Q == 2 else H"
Z = "-(0.0) if S == 'yy' else 0.0"
U = "S ~ Z"
V = "W ~ F"

[[constraints]]
name = "small"
expr = "P * Q < 7"
why = "-"

[[constraints]]
name = "weighted"
expr = "W != 0 and W != 1.5"
why = "-"

[[constraints]]
name = "signed"
expr = "len(U) < 6"
why = "-"

[[constraints]]
name = "joined"
expr = "len(V) < 8"
why = "-"

[tolerance.float32]
rtol = 0
atol = 0
"""


def _mixed(tmp_path, extra: str = ""):  # noqa: ANN001, ANN202
    from kernsearch import load_family

    folder = tmp_path / "mixed"
    folder.mkdir()
    (folder / "family.toml").write_text(MIXED + extra)
    (folder / "toy.metal.j2").write_text("{% block header %}{% endblock %}{% block source %}C[0] = A[0];{% endblock %}\n")
    fam = load_family(folder)
    chip = get_chip("M2 Max")
    return Space(make_problem(fam, None, None, chip), chip)


def test_values_equal_across_types_are_read_as_the_walk_reads_them(tmp_path) -> None:  # noqa: ANN001
    """Derived values equal but not the same (1, 1.0 and True: ``W``; 0.0 and -0.0: ``Z``, so ``U`` is "x0.0" or
    "yy-0.0") and rows pruned in between; ``V`` (of ``W`` and ``F``) meets equal keys, (1, False) and (True, False),
    which the walk's memo takes for one: the enumeration a depth at a time evaluates each expression at the config
    where the walk first does, with that config's own values, so its configs and rejections are the walk's."""
    from kernsearch.family import _enumerate

    space = _mixed(tmp_path)
    assert _enumerate.by_levels(space, lambda _: None) is not None
    found, walked = space.enumerate(), space.walk(lambda _: None)
    assert _same_summary(found, walked) and found.valid and set(found.rejected) == {"small", "weighted", "signed", "joined"}


def test_an_expression_that_fails_is_reported_where_the_walk_meets_it(tmp_path) -> None:  # noqa: ANN001
    """An expression that fails for some configs: the enumeration a depth at a time gives up (None) and the walk
    reports it, with the config's expression and the error, as it always did."""
    from kernsearch.family import _enumerate

    space = _mixed(tmp_path, '\n[[constraints]]\nname = "divides"\nexpr = "Q // (P - 3) >= 0"\nwhy = "-"\n')
    assert _enumerate.by_levels(space, lambda _: None) is None
    with pytest.raises(KernsearchError) as walked:
        space.walk(lambda _: None)
    with pytest.raises(KernsearchError) as found:
        space.enumerate()
    assert str(found.value) == str(walked.value) and "divides" in str(found.value)
