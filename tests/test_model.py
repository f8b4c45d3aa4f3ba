"""The ``model`` back-end: predictions move the right way for each effect, stay positive and finite, and are
labelled modeled. Isolated effects use a toy family whose ``[model]`` table exposes one effect per knob."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from kernsearch import Space, get_backend, get_chip, load_family, make_problem
from kernsearch._errors import BackendError, ConfigError, SpecError
from kernsearch.backends import Evidence
from kernsearch.backends._model import ModelBackend
from kernsearch.backends._model_columns import predict_many

TOY_SPEC = """
name = "toy"
description = "one model effect per knob"
reference = "A"
baseline = "A"

[problem]
dims = ["N"]
default_shape = [1048576]
dtypes = ["float32"]
default_dtype = "float32"
flops = "N"
bytes = "2 * N * dtype_size"

[[inputs]]
name = "A"
shape = "[N]"

[[outputs]]
name = "C"
shape = "[N]"

[templates]
metal = "toy.metal.j2"

[knobs.TILE]
kind = "tile"
values = [1024, 4096]
[knobs.READS]
kind = "other"
values = [1, 4]
[knobs.ARITH]
kind = "other"
values = [1, 256, 1024]
[knobs.TGMEM]
kind = "threadgroup_memory"
values = [0, 32768]
[knobs.DB]
kind = "buffering"
values = [false, true]
[knobs.VEC]
kind = "vector"
values = [1, 4]
[knobs.TGB]
kind = "other"
values = [0, 1]

[launch]
grid = "[ceil_div(N, TILE) * 256, 1, 1]"
threadgroup = "[256, 1, 1]"

[default]
TILE = 1024
READS = 1
ARITH = 1
TGMEM = 0
DB = false
VEC = 1
TGB = 0

[tolerance.float32]
rtol = 0
atol = 0
"""

TOY_MODEL = """
[model]
threadgroups = "ceil_div(N, TILE)"
threadgroup_threads = "256"
threadgroup_memory = "TGMEM"
flops = "ARITH * TILE"
cache_bytes = "READS * 2 * TILE * dtype_size"
load_bytes = "VEC * dtype_size"
buffers = "2 if DB else 1"
threadgroup_bytes = "TGB * 4096 * TILE"
"""


def make_toy(folder: Path, model: str = TOY_MODEL) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "family.toml").write_text(TOY_SPEC + model)
    (folder / "toy.metal.j2").write_text("{% block header %}{% endblock %}{% block source %}"
                                         "C[0] = A[0];{% endblock %}\n")
    return folder


@pytest.fixture(scope="module")
def toy(tmp_path_factory: pytest.TempPathFactory):
    return load_family(make_toy(tmp_path_factory.mktemp("toy") / "toy"))


def space_for(family, chip: str = "M2 Max", shape=None, dtype=None) -> Space:
    c = get_chip(chip)
    return Space(make_problem(family, shape, dtype, c), c)


def predict(space: Space, **knobs) -> float:
    return ModelBackend().predict_ms(space, space.parse_config(knobs))


# -- the back-end's contract ------------------------------------------------------------------------------

def test_model_backend_is_labelled_modeled_and_runs_nothing(gemm):
    backend = get_backend("model")
    assert isinstance(backend, ModelBackend)
    assert backend.evidence is Evidence.MODELED and backend.name == "model" and backend.target is None
    space = space_for(gemm)
    assert backend.breakdown(space, dict(gemm.default))["evidence"] == "modeled"
    with pytest.raises(BackendError, match="runs no kernel"):
        backend.run(None, None, [], "float16")  # type: ignore[arg-type]
    with pytest.raises(BackendError, match="predict_ms"):
        backend.time(None, None, [], "float16")  # type: ignore[arg-type]


def test_invalid_or_incomplete_config_is_refused(gemm):
    space = space_for(gemm)
    with pytest.raises(ConfigError, match="threadgroup_memory"):
        ModelBackend().predict_ms(space, space.parse_config("BM=128,BN=128,BK=32,DOUBLE_BUFFER=1,PAD=4,WM=4,WN=4"))
    with pytest.raises(ConfigError, match="lacks knob"):
        ModelBackend().predict_ms(space, {"BM": 32})


# -- each effect, isolated on the toy family ------------------------------------------------------------

def test_more_operand_rereads_is_slower(toy):
    space = space_for(toy)
    assert predict(space, READS=4) > 2 * predict(space, READS=1)
    assert predict(space, READS=4, ARITH=256) > predict(space, READS=1, ARITH=256)


def test_idle_cores_in_the_last_wave_cost_a_whole_wave(toy):
    cores = get_chip("M2 Max").gpu_cores
    backend = ModelBackend()
    per_tg = {}
    for tgs in (4 * cores, 4 * cores + 1):
        space = space_for(toy, shape=(tgs * 4096,))
        b = backend.breakdown(space, space.parse_config("TILE=4096,ARITH=1024"))
        assert b["threadgroups"] == tgs
        per_tg[tgs] = b["time_ms"] / tgs
    # One extra threadgroup adds a partial wave on one core: far more than 1/(4·cores) more time.
    assert per_tg[4 * cores + 1] > 1.1 * per_tg[4 * cores]


def test_threadgroup_memory_traffic_is_a_roofline_of_its_own(toy):
    space = space_for(toy)
    backend = ModelBackend()
    quiet = backend.breakdown(space, space.parse_config("TGB=0"))
    busy = backend.breakdown(space, space.parse_config("TGB=1"))
    assert busy["bound"] == "threadgroup memory" and busy["time_ms"] > 2 * quiet["time_ms"]


def test_threadgroup_memory_that_cuts_occupancy_is_slower(toy):
    space = space_for(toy)
    backend = ModelBackend()
    small = backend.breakdown(space, space.parse_config("TGMEM=0"))
    big = backend.breakdown(space, space.parse_config("TGMEM=32768"))
    assert big["resident_per_core"] < small["resident_per_core"]
    assert big["occupancy_limit"] == "threadgroup memory"
    assert big["time_ms"] > small["time_ms"]


@pytest.mark.parametrize("arith", [1, 256])
def test_double_buffering_and_vector_loads_help_memory_bound_cases(toy, arith):
    space = space_for(toy)
    backend = ModelBackend()
    for occupancy in ("TGMEM=0", "TGMEM=32768"):
        base = backend.breakdown(space, space.parse_config(f"READS=4,ARITH={arith},{occupancy}"))
        assert base["bound"] == "cache bandwidth"
        assert predict(space, READS=4, ARITH=arith, TGMEM=int(occupancy[6:]), DB=True) < base["time_ms"]
    # Wider loads keep more bytes in flight: they matter where few threads are resident.
    low = backend.breakdown(space, space.parse_config(f"READS=4,ARITH={arith},TGMEM=32768"))
    assert low["bandwidth_efficiency"] < 1
    assert predict(space, READS=4, ARITH=arith, TGMEM=32768, VEC=4) < low["time_ms"]


def test_predictions_scale_with_chip_size(toy, gemm):
    tiers = ["M1", "M1 Pro", "M1 Max", "M1 Ultra"]
    for family, config in ((toy, "ARITH=256"), (gemm, None)):
        times = [ModelBackend().predict_ms(s := space_for(family, chip), s.parse_config(config)) for chip in tiers]
        assert times == sorted(times, reverse=True) and times[-1] < times[0] / 4, (family.name, times)


def test_chip_argument_overrides_the_space_chip(gemm):
    space = space_for(gemm, "M2 Max")
    config = dict(gemm.default)
    ultra = ModelBackend(chip="M2 Ultra")
    assert ultra.breakdown(space, config)["chip"] == "M2 Ultra"
    assert ultra.predict_ms(space, config) < ModelBackend().predict_ms(space, config)


# -- GEMM: the spec's [model] expressions -------------------------------------------------------------------

def test_gemm_smaller_tiles_and_unstaged_operands_reread_more_and_run_slower(gemm):
    space = space_for(gemm, dtype="float32")
    backend = ModelBackend()
    big = backend.breakdown(space, space.parse_config("BM=64,BN=64,WM=2,WN=2"))
    small = backend.breakdown(space, space.parse_config("BM=16,BN=16,WM=2,WN=2"))
    assert small["cache_bytes"] > 3 * big["cache_bytes"] and small["time_ms"] > big["time_ms"]
    staged = backend.breakdown(space, space.parse_config("STAGE=AB,PAD=4"))  # conflict-free staging
    direct = backend.breakdown(space, space.parse_config("STAGE=none"))
    assert direct["cache_bytes"] > staged["cache_bytes"] and direct["time_ms"] > staged["time_ms"]


def test_gemm_padding_helps_where_unpadded_rows_conflict(gemm):
    space = space_for(gemm)
    wide = "BM=64,BN=128,BK=32,WM=2,WN=4"
    b = ModelBackend().breakdown(space, space.parse_config(wide))
    assert b["bound"] == "compute"
    assert predict(space, **dict(kv.split("=") for kv in wide.split(",")), PAD="4") < b["time_ms"]


def test_gemm_simdgroup_matrix_beats_scalar_at_equal_tiles(gemm):
    space = space_for(gemm)
    assert predict(space, MMA="simdgroup") < predict(space, MMA="scalar")


@pytest.mark.slow
@pytest.mark.parametrize("chip,shape", [("M2 Max", "4096,4096,4096"), ("H100", "17,4099,33")])
@pytest.mark.parametrize("stride", [7, pytest.param(1, marks=pytest.mark.e2e, id="every")])
def test_every_valid_gemm_config_gets_a_positive_finite_time(gemm, chip, shape, stride):
    """Every valid config (``make test``: every 7th, every value of every knob among them; the e2e lane, CI's make
    test-all: every one, ~45,000 on the M2 Max, which runs the same lines) gets a positive, finite time."""
    space = space_for(gemm, chip, shape)
    every = space.enumerate().valid
    valid = every[::stride]
    for name in gemm.knobs:
        assert {c[name] for c in valid} == {c[name] for c in every}, name
    backend = ModelBackend()
    times = [backend.predict_ms(space, c) for c in valid]
    bad = [(c, t) for c, t in zip(valid, times) if not (math.isfinite(t) and t > 0)]
    assert valid and not bad, bad[:3]
    # Memoised evaluation gives the same answers in any order and on a fresh back-end.
    fresh = ModelBackend()
    step = max(1, len(valid) // 200)
    assert [fresh.predict_ms(space, c) for c in reversed(valid[::step])] == list(reversed(times[::step]))
    # The problem's FLOPs at the chip's peak bound every prediction from below.
    floor = space.problem.flops() / (get_chip(chip).peak_tflops(space.problem.dtype) * 1e9)
    assert min(times) > floor


def _one_by_one(space: Space, configs: list[dict]) -> list:
    """The model's prediction of each config, inf where it refuses one (what the ranking did config by config)."""
    from kernsearch._errors import KernsearchError
    from kernsearch._records import Prediction

    backend, out = ModelBackend(), []
    for c in configs:
        try:
            out.append(backend.predict(space, c))
        except KernsearchError:
            out.append(Prediction(math.inf, math.inf))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("chip", ["M2 Max", "H100"])
def test_a_space_predicted_at_once_is_each_configs_prediction(chip):
    """The ranking predicts a whole space a column at a time (predict_many: gemm's 44,004 valid configs in ~0.4 s,
    were ~4 s): the same numbers, byte for byte, as config by config, in every built-in family; a batch with an
    invalid config in it is predicted config by config (inf for the invalid ones)."""
    import random

    from conftest import builtin_families

    for name in builtin_families():
        space = space_for(load_family(name), chip)
        sample = space.sample(150, random.Random(0))
        assert predict_many(ModelBackend(), space, sample) == _one_by_one(space, sample), name
        mixed = sample[:20] + random.Random(1).sample(list(itertools.islice(space.iter_all(), 5000)), 20)
        assert predict_many(ModelBackend(), space, mixed) == _one_by_one(space, mixed), name


def test_the_columns_combinations_are_the_configs_distinct_tuples_of_what_an_entry_reads():
    """predict_many evaluates an entry once per combination of the values it reads, numbered by NumPy (mixed radix,
    renumbered before the product of the columns' sizes would overflow int64): the same grouping, and the same first
    configs, as the tuples a loop over the configs would build. Six columns of 2,048 values: unrenumbered, the row
    (512, 0, 0, 0, 0, 0) would be 512 * 2048**5 = 2**64, the number of (0, 0, 0, 0, 0, 0)."""
    from kernsearch.family._columns import Column, combinations

    rows = [(i,) * 6 for i in range(2048)] + [(512, 0, 0, 0, 0, 0), (7,) * 6]
    codes, first = combinations([Column.of(list(c)) for c in zip(*rows)], len(rows))
    firsts: dict[tuple[int, ...], int] = {}
    for i, row in enumerate(rows):
        firsts.setdefault(row, i)
    assert sorted(first.tolist()) == sorted(firsts.values())
    assert [rows[first[code]] for code in codes.tolist()] == rows


def test_equal_keys_are_evaluated_at_the_first_config_that_has_one():
    """Keys a memo takes for one (True and 1): a loop over the configs evaluates at the first config with one of
    them, with its own value, and the others get that value; ``evaluated`` does the same whatever the columns'
    numbering (here 1 is numbered before True, but True's config comes first)."""
    from kernsearch.family._columns import Column, evaluated

    col = Column(np.array([1, 0, 1], dtype=np.intp), [1, True])  # configs: True, 1, True
    seen: list[list[object]] = []
    got = evaluated(["X"], {"X": col}, 3, {}, lambda read: seen.append(read) or repr(read[0]))
    assert seen == [[True]] and [got.values[c] for c in got.codes] == ["True"] * 3


def test_a_batch_with_a_knob_of_several_types_is_predicted_as_one_by_one(tmp_path):
    """Configs whose knob holds equal values of two types (1 and True, as a config from elsewhere might), read by an
    entry whose value tells them apart ("1" or "True"): the batch is predicted config by config, each read as it is
    (a column would number 1 and True alike and read the first one's value for both)."""
    fam = load_family(make_toy(tmp_path / "typed", model=TOY_MODEL + 'barriers = "len(DB ~ \'\') * READS"\n'))
    space = space_for(fam)
    configs = [dict(c) for c in space.iter_all()]
    mixed = [{**c, "DB": int(c["DB"])} if c["READS"] == 1 else c for c in configs]
    assert {type(c["DB"]) for c in mixed} == {bool, int}
    got = predict_many(ModelBackend(), space, mixed)
    assert got == _one_by_one(space, mixed)
    assert len({p.time_ms for p in got}) > len({p.time_ms for p in predict_many(ModelBackend(), space, configs)}) / 2


def test_a_value_the_model_refuses_is_inf_in_a_batch_as_alone(tmp_path):
    """A [model] value the model refuses for some configs (negative here) makes those inf, the others predicted:
    the batch is predicted config by config, as it was."""
    fam = load_family(make_toy(tmp_path / "neg", model=TOY_MODEL + 'barriers = "ARITH - 2"\n'))
    space = space_for(fam)
    configs = [dict(c) for c in space.iter_all()]
    got = predict_many(ModelBackend(), space, configs)
    assert got == _one_by_one(space, configs)
    assert {math.isinf(p.time_ms) for p in got} == {True, False}
    assert all(math.isinf(p.time_ms) == (c["ARITH"] == 1) for p, c in zip(got, configs))


# -- families without a model, and malformed model tables ------------------------------------------------

def test_family_without_model_table_gets_a_plain_roofline(tmp_path):
    fam = load_family(make_toy(tmp_path / "plain", model=""))
    backend = ModelBackend()
    chip = get_chip("M2 Max")
    b = backend.breakdown(space_for(fam, shape=(1 << 24,)), dict(fam.default))
    assert b["model"] == "roofline" and b["bound"] == "memory"
    assert b["time_ms"] == pytest.approx(2 * 4 * (1 << 24) / (chip.memory_bandwidth_gbs * 1e9) * 1e3
                                         + b["launch_ms"])
    assert backend.predict_ms(space_for(fam, shape=(1 << 25,)), dict(fam.default)) > b["time_ms"]


@pytest.mark.parametrize("model,message", [
    ('[model]\nthreadgroups = "1"\nflops = "TILE"\n', "missing entry 'cache_bytes'"),
    (TOY_MODEL + 'treadgroups = "2"\n', "model.treadgroups: not a model input"),
    (TOY_MODEL + 'registers = "-1"\n', "model.registers: expected a non-negative number"),
    (TOY_MODEL.replace('"ARITH * TILE"', '"ARITH / (TILE - TILE)"'), "model.flops"),
    (TOY_MODEL + 'barriers = "ARITH * 1e300 * 1e300"\n', "model.barriers: expected a non-negative number"),
    (TOY_MODEL.replace('threadgroup_memory = "TGMEM"', 'threadgroup_memory = "TGMEM + concurrent"'),
     "model.threadgroup_memory: sets the occupancy"),
])
def test_malformed_model_inputs_are_one_line_spec_errors(tmp_path, model, message):
    fam = load_family(make_toy(tmp_path / "bad", model=model))
    with pytest.raises(SpecError, match=message):
        ModelBackend().predict_ms(space_for(fam), dict(fam.default))


@pytest.mark.parametrize("model,message", [
    (TOY_MODEL + 'extra = "NOPE * 2"\n', "model.extra: unknown name"),
    (TOY_MODEL + 'TILE = "1"\n', "model.TILE: name is taken"),
    (TOY_MODEL + 'later = "concurrent * 2"\n', None),  # `concurrent` is supplied by the model
])
def test_model_table_names_are_checked_on_load(tmp_path, model, message):
    folder = make_toy(tmp_path / "names", model=model)
    if message is None:
        assert "later" in load_family(folder).model
        return
    with pytest.raises(SpecError, match=message):
        load_family(folder)


# -- benchmarks/model_vs_measured.py on synthetic landscapes -------------------------------------------

@pytest.mark.slow
@pytest.mark.e2e
def test_model_vs_measured_script_ranks_a_landscape(tmp_path, gemm):
    """benchmarks/model_vs_measured.py ranks a landscape the model recorded itself (Spearman 1) and its reverse (-1).
    The e2e lane's (CI: make test-all), with the GPU scripts' dry runs: a benchmark script run end to end over the
    model's predictions, which make test's own model tests run (its line coverage of kernsearch is the same without
    it)."""
    import importlib.util

    from conftest import REPO

    from kernsearch.studies._landscape import LandscapeWriter

    spec = importlib.util.spec_from_file_location("model_vs_measured", REPO / "benchmarks" / "model_vs_measured.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # type: ignore[union-attr]
    assert list(script.ranks(np.array([3.0, 1.0, 3.0, 2.0]))) == [3.5, 1.0, 3.5, 2.0]

    space = space_for(gemm, "H100", "512,512,512")
    configs = [c for c in itertools.islice(space.iter_all(), 0, None, 97) if space.is_valid(c)]
    model = ModelBackend()
    times = [model.predict_ms(space, c) for c in configs]
    for name, recorded in (("same", times), ("reversed", [1.0 / t for t in times])):
        writer = LandscapeWriter(tmp_path / f"{name}_gemm.json", {k: v.values for k, v in
                                 gemm.knobs.items()}, device_name="synthetic", problem_size=[512, 512, 512])
        for c, t in zip(configs, recorded):
            writer.add(c, [t, t])
        writer.add(configs[0] | {"BM": 999}, failure="RuntimeFailedConfig")  # not a known config key
        result = script.compare(writer.save(), "H100", None, "float16")
        assert result["configs"] == len(configs) and result["failed"] == 1
        expected = 1.0 if name == "same" else -1.0
        assert result["spearman"] == pytest.approx(expected, abs=0.02)
        if name == "same":
            assert result["pick_vs_best"] == pytest.approx(1.0)


@pytest.mark.slow
def test_cli_predict_labels_its_figure_modeled():
    import json
    import subprocess
    import sys

    def ks(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kernsearch", *args], capture_output=True, text=True, timeout=60)

    res = ks("predict", "gemm", "--config", "BM=64,BN=64", "--chip", "M2 Ultra", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["evidence"] == "modeled" and data["chip"] == "M2 Ultra" and data["config"]["BM"] == 64
    res = ks("predict", "gemm", "--shape", "256,256,256")
    assert res.returncode == 0 and "ms modeled" in res.stdout and "M2 Max" in res.stdout
    res = ks("predict", "gemm", "--config", "BM=128,BN=128,BK=32,DOUBLE_BUFFER=1,PAD=4")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "threadgroup_memory" in res.stderr
