"""Replay: recorded KernelTuner landscapes as the objective (../shared/landscapes, or $KERNSEARCH_LANDSCAPES).

The landscapes are read-only shared data, never copied into the repository; a test that needs them
skips with the reason only when the folder is absent (in CI it sits beside the clone)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from kernsearch import KernsearchError, StopReason, get_backend, run_study
from kernsearch._errors import BackendError, VariantFailure
from kernsearch.studies._landscape import Landscape, LandscapeWriter
from kernsearch.studies._replay import Replay
from kernsearch.studies._study import EVALUATED, open_study

REPO = Path(__file__).resolve().parents[1]
LANDSCAPES = Path(os.environ.get("KERNSEARCH_LANDSCAPES", REPO.parent / "shared" / "landscapes"))
PNPOLY = LANDSCAPES / "pnpoly_RTX_3090.json.gz"
needs_landscapes = pytest.mark.skipif(not PNPOLY.is_file(), reason=f"recorded landscapes not found in {LANDSCAPES}")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """A 341-config slice of the pnpoly landscape (between_method = use_method = 0), written with our writer."""
    if not PNPOLY.is_file():
        pytest.skip(f"recorded landscapes not found in {LANDSCAPES}")
    full = Landscape.load(PNPOLY)
    path = tmp_path_factory.mktemp("land") / "pnpoly_slice.json.gz"
    writer = LandscapeWriter(path, full.knobs, device_name=full.device_name, kernel_name=full.kernel_name,
                             problem_size=full.problem_size)
    for entry in full.entries.values():
        if entry["between_method"] == 0 and entry["use_method"] == 0:
            config = full.config_of(entry)
            if full.failed(entry):
                writer.add(config, failure=entry["time"])
            else:
                writer.add(config, entry["times"], compile_time=entry.get("compile_time"))
    writer.save()
    return path


def test_writer_round_trip_in_both_encodings(tmp_path):
    knobs = {"BM": [16, 32], "MMA": ["simdgroup", "scalar"], "DB": [False, True]}
    for name in ("land.json", "land.json.gz"):
        w = LandscapeWriter(tmp_path / name, knobs, device_name="NVIDIA H100", problem_size=[64, 64, 64])
        w.add({"BM": 16, "MMA": "scalar", "DB": True}, [1.0, 2.0, 3.0], compile_time=12.5)
        w.add({"BM": 32, "MMA": "scalar", "DB": False}, failure="CompileFailedConfig")
        w.save()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left
        land = Landscape.load(tmp_path / name)
        assert land.knobs == knobs and land.device_name == "NVIDIA H100" and len(land) == 2
        assert land.samples({"BM": 16, "MMA": "scalar", "DB": True}) == [1.0, 2.0, 3.0]
        assert land.entry({"BM": 16, "MMA": "scalar", "DB": True})["time"] == 2.0
        assert land.samples({"BM": 32, "MMA": "scalar", "DB": False}) is None  # failed
        assert land.samples({"BM": 32, "MMA": "simdgroup", "DB": False}) is None  # absent
        assert land.optimum() == ({"BM": 16, "MMA": "scalar", "DB": True}, 2.0)
    raw = json.loads(gzip.open(tmp_path / "land.json.gz", "rt").read())
    assert raw["tune_params_keys"] == ["BM", "MMA", "DB"] and "16,scalar,True" in raw["cache"]


def test_writer_refuses_incomplete_entries(tmp_path):
    w = LandscapeWriter(tmp_path / "x.json", {"a": [1, 2]})
    with pytest.raises(KernsearchError, match="lacks knob"):
        w.add({}, [1.0])
    with pytest.raises(ValueError):
        w.add({"a": 1})


def test_unreadable_landscapes_are_one_line_errors(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "other.json").write_text(json.dumps({"hello": 1}))
    for name in ("bad.json", "other.json", "missing.json"):
        with pytest.raises(KernsearchError, match="KernelTuner|no such"):
            Landscape.load(tmp_path / name)
    with pytest.raises(BackendError, match="needs a landscape file"):
        Replay()
    with pytest.raises(BackendError, match="unknown back-end 'replay'"):  # an objective, not a device (issue 12)
        get_backend("replay")


@pytest.mark.parametrize(("data", "message"), [
    ({"tune_params_keys": ["A", "B"], "tune_params": {"A": [1]}, "cache": {}}, "no list of values for B"),
    ({"tune_params": {"A": [1, 2]}, "cache": {"1": {"time": 1.0}}}, "cache entry '1' lacks knob"),
    ({"tune_params": {"A": [1, 2]}, "cache": {"1": [1, 2]}}, "cache entry '1' is not an object"),
])
def test_malformed_landscape_contents_are_one_line_errors(tmp_path, data, message):
    path = tmp_path / "land.json"
    path.write_text(json.dumps(data))
    with pytest.raises(KernsearchError, match=message):
        Landscape.load(path)


def test_replay_draws_recorded_times_and_refuses_absent_or_failed(small):
    backend = Replay(small, seed=0)
    land = backend.landscape
    ok = next(land.config_of(e) for e in land.entries.values() if not land.failed(e))
    draws = backend.sample(ok)
    assert set(draws) <= set(land.samples(ok)) and len(draws) == backend.draws
    failed = [land.config_of(e) for e in land.entries.values() if land.failed(e)]
    with pytest.raises(VariantFailure) as exc:
        backend.sample({**ok, "use_method": 1})  # outside the slice: absent
    assert exc.value.reason == "invalid"
    if failed:
        with pytest.raises(VariantFailure) as exc:
            backend.sample(failed[0])
        assert exc.value.reason == "failed"
    objective = backend.objective()
    assert objective.violation({**ok, "use_method": 1}) == "absent_from_landscape"
    assert objective.violation(ok) is None and objective.size() == len(land)


@pytest.mark.slow
@needs_landscapes
def test_search_finds_the_optimum_of_a_small_landscape(small, tmp_path):
    land = Landscape.load(small)
    optimum, best_time = land.optimum()
    times = sorted(land.samples(optimum))
    objective = Replay(small, seed=0).objective()
    evaluated, evaluate = [], objective.evaluate_against

    def recorded(config, race):  # noqa: ANN001, ANN202 - the configs measured, in memory (a study in a file costs
        evaluated.append(dict(config))  # ~60 % of this search's time in SQL; the storage is tested elsewhere)
        return evaluate(config, race)

    objective.evaluate_against = recorded
    result = run_study(objective, trials=90, seed=0, storage=":memory:")
    assert optimum in evaluated, "the optimum was never evaluated"
    picked = float(land.entry(result.best.config)["time"])
    # The pick is made on noisy replayed times (as on a GPU): it is the optimum, or a config whose
    # recorded time lies within the optimum's own measured spread (p10..p90 of its repetitions).
    spread = (times[int(0.9 * len(times))] - times[int(0.1 * len(times))]) / best_time
    assert picked <= best_time * (1 + spread), (result.best.config, picked, best_time, spread)
    assert result.evidence == "measured" and "not here" in result.final.note


@pytest.mark.slow
@needs_landscapes
def test_resume_after_interruption_continues_the_same_study(small, tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    first_obj = Replay(small, seed=1).objective()
    calls = {"n": 0}
    real = first_obj.evaluate_against

    def evaluate(config, race):
        calls["n"] += 1
        if calls["n"] == 12:
            raise KeyboardInterrupt  # Ctrl-C in the middle of trial 12
        return real(config, race)

    first_obj.evaluate_against = evaluate
    first = run_study(first_obj, trials=40, seed=1, storage=url)
    assert first.stop.reason is StopReason.INTERRUPTED and first.stop_reason.startswith("interrupted")
    assert first.evaluated == 11
    second = run_study(Replay(small, seed=2).objective(), trials=40, seed=2, storage=url)
    assert second.study_name == first.study_name and second.evaluated == 40
    import optuna

    study = optuna.load_study(study_name=first.study_name, storage=url)
    done = [str(t.user_attrs["config"]) for t in study.trials if t.user_attrs.get("status") in EVALUATED]
    assert len(done) == 40 and len(set(done)) == 40  # nothing lost, nothing measured twice
    assert Counter(t.user_attrs.get("status") for t in study.trials)["interrupted"] == 1


@pytest.mark.slow
@needs_landscapes
def test_two_processes_share_one_study_without_duplicates(small, tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    open_study(Replay(small).objective(), url, "shared", "tpe", 0)  # created before the workers start
    script = textwrap.dedent(f"""
        import sys
        from kernsearch import run_study
        from kernsearch.studies._replay import Replay
        seed = int(sys.argv[1])
        backend = Replay({str(small)!r}, seed=seed)
        r = run_study(backend.objective(), trials=40, seed=seed, storage={url!r}, study_name="shared")
        print(backend.calls)  # configs this process evaluated
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(seed)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for seed in (11, 12)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    import optuna

    study = optuna.load_study(study_name="shared", storage=url)
    done = [t for t in study.trials if t.user_attrs.get("status") in EVALUATED]
    keys = [str(sorted(t.user_attrs["config"].items())) for t in done]
    assert len(keys) == len(set(keys)), "a config was measured by both processes"
    assert 40 <= len(done) <= 42  # one shared budget (a last trial may be in flight in each process)
    mine = [int(o[0].split()[-1]) for o in outs]
    assert all(n > 0 for n in mine) and sum(mine) == len(done), mine  # both did part of the work


@needs_landscapes
@pytest.mark.parametrize("name,configs,knobs", [("gemm_clblast_RTX_3090", 17956, 15), ("convolution_A100", 4362, 10),
                                                ("dedispersion_A100", 11130, 8), ("pnpoly_RTX_3090", 4092, 4)])
@pytest.mark.slow
def test_the_shared_landscapes_read_as_their_readme_says(name, configs, knobs):
    land = Landscape.load(LANDSCAPES / f"{name}.json.gz")
    assert len(land) == configs and len(land.knobs) == knobs
    config, best = land.optimum()
    assert land.samples(config) and best == min(float(e["time"]) for e in land.entries.values() if not land.failed(e))
    assert all(land.key(land.config_of(e)) == k for k, e in list(land.entries.items())[:50])  # keys as KernelTuner's


H100_GEMM = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "gemm_H100_float16_2048x2048x2048.json"


def test_auto_strategy_proposes_only_valid_unevaluated_configs():
    """The valid set is indexed: no trial goes to an invalid or already evaluated config."""
    backend = Replay(H100_GEMM, seed=3)
    objective = backend.objective()
    objective.prior = lambda configs: None  # the space-filling start and the GP, without the model
    result = run_study(objective, trials=60, sampler="auto", seed=3, storage=":memory:")
    assert result.invalid == 0 and result.evaluated == 60 and backend.calls == 60
    _, optimum = backend.landscape.optimum()
    assert optimum / float(backend.landscape.entry(result.best.config)["time"]) > 0.9


def test_auto_strategy_starts_from_the_performance_models_ranking():
    """A landscape kernsearch recorded of its own family gets the model's predictions a real tune has:
    with 7 trials (1 % of the space) the search reaches the optimum's neighbourhood."""
    from kernsearch.studies._replay import _family_prior

    backend = Replay(H100_GEMM, seed=0)
    configs = list(backend.landscape.configs())
    prior = _family_prior(backend.landscape, configs)
    assert prior is not None and len(prior) == len(configs)
    scores = []
    for seed in range(3):
        backend = Replay(H100_GEMM, seed=seed)
        result = run_study(backend.objective(), trials=7, sampler="auto", seed=seed, storage=":memory:")
        _, optimum = backend.landscape.optimum()
        scores.append(optimum / float(backend.landscape.entry(result.best.config)["time"]))
    assert min(scores) > 0.95, scores


def test_not_measured_configs_are_absent_not_failed(tmp_path):
    """A sweep that ran out of time writes ``NotMeasured``: that says nothing about the config, so replay
    leaves it out of the space instead of failing it (a search would learn to avoid it)."""
    from kernsearch.studies._landscape import NOT_MEASURED

    path = tmp_path / "partial.json"
    writer = LandscapeWriter(path, {"a": [1, 2, 3]}, device_name="NVIDIA H100 80GB HBM3")
    writer.add({"a": 1}, [2.0, 2.1])
    writer.add({"a": 2}, failure="RuntimeFailedConfig")
    writer.add({"a": 3}, failure=NOT_MEASURED)
    writer.save()
    land = Landscape.load(path)
    assert len(land) == 2 and land.meta["not_measured"] == 1
    assert [c["a"] for c in land.configs()] == [1, 2]
    backend = Replay(landscape=land)
    with pytest.raises(VariantFailure) as exc:
        backend.sample({"a": 3})
    assert exc.value.reason == "invalid"
    with pytest.raises(VariantFailure) as exc:
        backend.sample({"a": 2})
    assert exc.value.reason == "failed"


def test_auto_strategy_learns_where_kernels_fail():
    """Half of a 12 x 12 space fails (a < 6) and the working half is nearly flat: the model counts a failure
    as slow, so after its start it keeps proposing where kernels work (blind to failures, about half of its
    proposals went to the failing half)."""
    from types import SimpleNamespace

    from kernsearch.family._space import format_config
    from kernsearch.studies._strategy import ValidSetSearch

    knobs = {"a": list(range(12)), "b": list(range(12))}
    valid = [{"a": a, "b": b} for a in knobs["a"] for b in knobs["b"]]
    into_failures = []
    for seed in range(4):
        search = ValidSetSearch(knobs, valid, seed=seed, budget=40)
        known: dict[str, SimpleNamespace] = {}
        for trial in range(40):
            config = search.propose(known, set())
            assert config is not None
            fails = config["a"] < 6
            known[format_config(config)] = SimpleNamespace(value=None if fails else 1.0 + 0.01 * config["b"])
            if trial >= search.n_init:
                into_failures.append(fails)
    assert sum(into_failures) / len(into_failures) < 0.2, sum(into_failures) / len(into_failures)


def test_a_fifo_or_a_link_is_refused_never_waited_on(tmp_path):
    """``--landscape`` names a file someone else may have made: a FIFO would block a plain open for ever."""
    fifo = tmp_path / "land.json"
    os.mkfifo(fifo)
    with pytest.raises(KernsearchError, match="FIFO"):
        Landscape.load(fifo)
    (tmp_path / "real.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "real.json")
    with pytest.raises(KernsearchError, match="symbolic link"):
        Landscape.load(tmp_path / "link.json")
