"""Transfer: a new study starts from the best configs of the same family's other studies in its storage."""

from __future__ import annotations

import pytest

from kernsearch import get_chip, load_family, make_problem, run_study
from kernsearch.studies._objective import KernelObjective
from kernsearch.studies._transfer import TRANSFER_LIMIT, completed_with, nearest_valid, transfer_configs


def _objective(shape: str, chip: str = "H100") -> KernelObjective:
    c = get_chip(chip)
    return KernelObjective(make_problem(load_family("swiglu"), shape, "float16", c), c, "model", verify="none")


@pytest.mark.slow
def test_a_new_shape_starts_from_the_best_configs_of_the_family_at_another_shape(tmp_path):
    url = f"sqlite:///{tmp_path / 't.db'}"
    source = run_study(_objective("4096,11008"), trials=25, sampler="random", seed=0, storage=url)
    target = _objective("2048,8192")
    best = [t.config for t in source.top if t.config != target.default()][:TRANSFER_LIMIT]
    assert len(best) == TRANSFER_LIMIT and all(target.violation(c) is None for c in best)
    result = run_study(target, trials=4, sampler="random", seed=1, storage=url)
    import optuna

    trials = optuna.load_study(study_name=result.study_name, storage=url).trials
    # trial 0 is the family default, then the other shape's leaders, fastest first (the default not again)
    assert [t.user_attrs["config"] for t in trials[1:1 + TRANSFER_LIMIT]] == best
    # another chip's study (modeled, too) transfers as well; a study in memory has nothing to transfer from
    other_chip = run_study(_objective("4096,11008", "H200"), trials=3, sampler="random", seed=2, storage=url)
    first = optuna.load_study(study_name=other_chip.study_name, storage=url).trials[1]
    assert first.user_attrs["config"] in [t.config for t in source.top] + [t.config for t in result.top]


def test_transferred_configs_are_mapped_onto_this_space_only():
    knobs = {"A": [1, 2, 4], "B": ["x", "y"]}
    valid = [{"A": a, "B": b} for a in (1, 2, 4) for b in ("x", "y") if (a, b) != (4, "x")]
    near = nearest_valid(knobs, valid)
    assert near({"A": 4, "B": "x", "C": 9}) in ({"A": 4, "B": "y"}, {"A": 1, "B": "x"})  # never the invalid one
    assert near({"Z": 1}) is None  # nothing shared: nothing transferred
    filled = completed_with(knobs, {"A": 1, "B": "x"}, lambda c: None if c in valid else "invalid")
    assert filled({"A": 2, "B": "bogus"}) == {"A": 2, "B": "x"}  # a value this space lacks takes the default
    assert filled({"A": 4}) is None  # {"A": 4, "B": "x"} is not valid here
    ranked = [[{"A": 2, "B": "y"}, {"A": 1, "B": "y"}], [{"A": 2, "B": "y"}, {"A": 4, "B": "y"}]]
    assert transfer_configs(ranked, near, limit=3) == [{"A": 2, "B": "y"}, {"A": 1, "B": "y"}, {"A": 4, "B": "y"}]
