"""A win is what the consumer gets (issue 26): the search, the final round and the gate time a kernel as the
exported package calls it, not as a launch timed alone.

A simulated GPU (the interpreter runs every variant for correctness; a clock advanced by made-up costs times
them) where the timing of separate launches flatters a candidate: timed as consumers call it, it loses to the op,
and nothing is published (before issue 26 the search ranked it first and the gate published it).
"""

from __future__ import annotations

import textwrap

import pytest
from test_faults import SimulatedGPU

from kernsearch import ArtifactStore, load_family, make_problem, run_study
from kernsearch.hardware._chips import chip_from_device_info
from kernsearch.studies._objective import KernelObjective

FAMILY = """
name = "judged"
description = "C = 2·A, a layout knob: the kernel may take A transposed"
reference = "A * 2"
baseline = "A * 2"

[problem]
dims = ["M", "N"]
default_shape = [16, 32]
dtypes = ["float32"]
default_dtype = "float32"
flops = "M * N"
bytes = "2 * M * N * dtype_size"

[[inputs]]
name = "A"
shape = "[M, N]"
weight = true
transposed = "LAYOUT == 't'"

[[outputs]]
name = "C"
shape = "[M, N]"

[templates]
metal = "judged.metal.j2"

[knobs.LAYOUT]
kind = "layout"
values = ["n", "t"]

[knobs.TG]
kind = "threadgroup_size"
values = [32, 64]

[launch]
grid = "[M * N, 1, 1]"
threadgroup = "[TG, 1, 1]"

[default]
LAYOUT = "n"
TG = 32

[tolerance.float32]
rtol = 1e-6
atol = 1e-6
"""

TEMPLATE = """
{% block header %}{% endblock %}
{% block source %}
    uint i = thread_position_in_grid.x;
{% if LAYOUT == 't' %}
    uint N = A_shape[0], M = A_shape[1];  // A given as [N, M]
    if (i < M * N) {
        C[i] = 2 * A[(i % N) * M + i / N];
{% else %}
    uint M = A_shape[0], N = A_shape[1];
    if (i < M * N) {
        C[i] = 2 * A[i];
{% endif %}
    }
{% endblock %}
"""

OP_MS = 2.0


def _costs(alone: dict, consumer: dict):
    """A simulated GPU whose separate launches cost ``alone[(LAYOUT?, TG)]`` and whose consumer calls cost
    ``consumer[...]`` ms; the op costs OP_MS either way."""

    class Sim(SimulatedGPU):
        def _key(self, geometry):
            return ("t" if geometry.transposed_inputs else "n", geometry.threadgroup[0])

        def launcher(self, kernel, geometry, inputs, dtype, sets=None):
            return self._launcher(alone[self._key(geometry)])

        def baseline_launcher(self, family, problem, logical, sets=None):
            return self._launcher(OP_MS)

        def consumer_kernel(self, kernel, geometry, family, problem, sets):
            return self._call(consumer[self._key(geometry)])

        def consumer_op(self, family, problem, sets):
            return self._call(OP_MS)

    return Sim


#: Alone: TG=64 at 1 ms, twice as fast as the op; called as consumers call it (graph or eager): 3 ms.
AloneOnly = _costs({("n", 32): 2.5, ("n", 64): 1.0, ("t", 32): 2.5, ("t", 64): 2.5},
                   {("n", 32): 2.5, ("n", 64): 3.0, ("t", 32): 2.5, ("t", 64): 2.5})
#: LAYOUT=t on pre-transposed inputs: 1 ms; with its transposition inside the call, as the package pays it: 3 ms.
PackedOutside = _costs({("n", 32): 2.5, ("n", 64): 2.5, ("t", 32): 1.0, ("t", 64): 1.0},
                       {("n", 32): 2.5, ("n", 64): 2.5, ("t", 32): 3.0, ("t", 64): 3.0})


@pytest.fixture
def judged(tmp_path):
    folder = tmp_path / "judged"
    folder.mkdir()
    (folder / "family.toml").write_text(textwrap.dedent(FAMILY))
    (folder / "judged.metal.j2").write_text(TEMPLATE)
    return folder


def _tune_and_publish(folder, backend, tmp_path):
    chip = chip_from_device_info({"architecture": "applegpu_g14c", "device_name": "Apple M2 Max"})  # "detected"
    problem = make_problem(load_family(str(folder)), "16,32", None, chip)
    objective = KernelObjective(problem, chip, backend, timeout=30.0)
    result = run_study(objective, trials=4, sampler="grid", finalists=4, seed=0,
                       storage=f"sqlite:///{tmp_path / 's.db'}")
    store = ArtifactStore(tmp_path / "store")
    outcome = objective.publish(result, store)
    objective.close()
    return result, store, outcome


@pytest.mark.slow
def test_a_kernel_faster_only_when_launched_alone_is_not_published(judged, tmp_path):
    result, store, outcome = _tune_and_publish(judged, "test_consumer_judging:AloneOnly", tmp_path)
    assert all(t.time_ms >= 2.5 for t in result.top)  # the search times as consumers call too: no 1 ms anywhere
    final = result.final.figures
    assert final.speedup is not None and final.speedup < 1.0  # in the package's call path it loses
    assert set(final.modes) == {"graph", "eager"} and all(f.speedup < 1.0 for f in final.modes.values())
    assert not outcome.published and "not dispatched" in outcome.reason
    assert not list(store.current_artifacts("judged"))  # recorded in the journal, no version made


@pytest.mark.slow
def test_a_layout_faster_only_when_packed_outside_the_timed_call_is_not_published(judged, tmp_path):
    result, store, outcome = _tune_and_publish(judged, "test_consumer_judging:PackedOutside", tmp_path)
    assert result.top[0].config["LAYOUT"] == "n"  # packing paid in every timing: the packed layout ranks last
    final = result.final.figures
    assert result.best.config["LAYOUT"] == "n" and all(t.time_ms >= 2.5 for t in result.top)
    assert final.speedup_low < 1.0 and not outcome.published
    assert not list(store.current_artifacts("judged"))  # recorded in the journal, no version made


#: Every config 1.5 ms as consumers call it, against the op's 2 ms: a 1.33x win in every mode.
Faster = _costs({k: 1.5 for k in [("n", 32), ("n", 64), ("t", 32), ("t", 64)]},
                {k: 1.5 for k in [("n", 32), ("n", 64), ("t", 32), ("t", 64)]})


@pytest.mark.slow
def test_a_win_is_decided_by_paired_rounds_and_their_ratios_travel_to_the_manifest(judged, tmp_path):
    from kernsearch._rules import consumer_low, looks

    result, store, outcome = _tune_and_publish(judged, "test_consumer_judging:Faster", tmp_path)
    final = result.final.figures
    assert all(len(f.ratios) == looks()[0] for f in final.modes.values())  # decided at the first look
    assert final.speedup_low == pytest.approx(2.0 / 1.5, rel=0.01) and outcome.published
    (current,) = store.current_artifacts("judged")
    modes = {m: t.model_dump() for m, t in current.manifest.measurements.modes.items()}
    assert all(len(t["ratios"]) == looks()[0] for t in modes.values())
    assert consumer_low(modes) == pytest.approx(2.0 / 1.5, rel=0.01)


#: TG=64 20 % faster than TG=32 as consumers call them; both beat the op (2 ms).
Improved = _costs({("n", 32): 1.5, ("n", 64): 1.2, ("t", 32): 2.5, ("t", 64): 2.5},
                  {("n", 32): 1.5, ("n", 64): 1.2, ("t", 32): 2.5, ("t", 64): 2.5})


@pytest.mark.slow
def test_a_publishing_search_times_its_leader_against_the_current_version_and_the_gate_reads_those_rounds(
        judged, tmp_path):
    """v1 (TG=32) is published; a later search that publishes to the same store times its leader (TG=64) against v1
    in paired rounds of its final round, and the gate replaces v1 on those rounds, which the manifest keeps. A
    current version this template no longer renders to its published source is not timed (it cannot be)."""
    from kernsearch._rules import looks

    chip = chip_from_device_info({"architecture": "applegpu_g14c", "device_name": "Apple M2 Max"})
    store = ArtifactStore(tmp_path / "store")
    backend = "test_consumer_judging:Improved"

    def objective():
        return KernelObjective(make_problem(load_family(str(judged)), "16,32", None, chip), chip, backend,
                               timeout=30.0)

    first = objective()
    assert first.against_current(store) is None  # nothing published yet
    result = run_study(first, trials=1, sampler="grid", finalists=1, seed=0, storage=f"sqlite:///{tmp_path / 'a.db'}")
    assert result.best.config == {"LAYOUT": "n", "TG": 32} and first.publish(result, store).published
    first.close()
    second = objective()
    current = second.against_current(store)
    assert current is not None and (current.version, current.config) == ("v1", {"LAYOUT": "n", "TG": 32})
    result = run_study(second, trials=4, sampler="grid", finalists=4, seed=0, storage=f"sqlite:///{tmp_path / 'b.db'}")
    versus = result.final.figures.versus
    assert result.best.config == {"LAYOUT": "n", "TG": 64} and versus is not None and versus.version == "v1"
    assert set(versus.modes) == {"graph", "eager"}
    assert all(len(r) == looks()[0] and min(r) == pytest.approx(1.5 / 1.2, rel=0.01) for r in versus.modes.values())
    outcome = second.publish(result, store)
    second.close()
    assert outcome.published and outcome.version == "v2" and "in paired rounds of one run" in outcome.reason
    assert store.load(store.keys()[0]).manifest.measurements.versus == versus
    changed = tmp_path / "changed" / "judged"  # the same family, its template changed since v2 was published
    changed.mkdir(parents=True)
    (changed / "family.toml").write_text((judged / "family.toml").read_text())
    (changed / "judged.metal.j2").write_text(TEMPLATE.replace("2 * A", "A + A"))
    later = KernelObjective(make_problem(load_family(str(changed)), "16,32", None, chip), chip, backend, timeout=30.0)
    assert later.family.name == "judged" and later.against_current(store) is None
