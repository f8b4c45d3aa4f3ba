"""Graph mode is a chain (issue 38): each call of a ``graph`` sample takes its activation from the previous call's
output, so the calls run one after the other, as a decode step does; the derivation is the same op for a
candidate and the MLX op. Checked on MLX's CPU back-end through its graph export (``mx.export_to_dot``)."""

from __future__ import annotations

import io
import re
from typing import Any

import mlx.core as mx
import pytest

from kernsearch.backends._mlx_metal import MetalBackend
from kernsearch.evaluation._chain import chain_position
from kernsearch.evaluation._consumer import ConsumerPlan, chain, consumer_samples, timed_modes
from kernsearch.family._render import geometry, render
from kernsearch.family._space import Space, make_problem
from kernsearch.family._spec import load_family
from kernsearch.hardware._chips import get_chip

K_CALLS = 6


@pytest.fixture(autouse=True)
def _uncompiled() -> Any:
    """Each call's primitives as their own graph nodes (a compiled call shares its primitive objects between
    calls, and ``export_to_dot`` names nodes by them); the dependencies are the same either way."""
    mx.disable_compile()
    yield
    mx.enable_compile()


def dot_graph(outputs: Any) -> tuple[dict[str, str], dict[str, set[str]]]:
    """The graph MLX would evaluate for ``outputs``: primitive node id -> its label, and node -> successors."""
    buf = io.StringIO()
    mx.export_to_dot(buf, outputs)
    labels = dict(re.findall(r'(\w+) \[label ="(\w+)"', buf.getvalue()))
    succ: dict[str, set[str]] = {}
    for a, b in re.findall(r'"?(\w+)"? -> "?(\w+)"?', buf.getvalue()):
        succ.setdefault(a, set()).add(b)
    return labels, succ


def reaches(succ: dict[str, set[str]], a: str, b: str) -> bool:
    seen, todo = set(), [a]
    while todo:
        n = todo.pop()
        if n == b:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(succ.get(n, ()))
    return False


def one_path(labels: dict[str, str], succ: dict[str, set[str]], primitive: str) -> bool:
    """Whether the nodes of ``primitive`` lie on one path (each reaches the next: they can only run in turn)."""
    nodes = [n for n, lab in labels.items() if lab == primitive]
    order = sorted(nodes, key=lambda n: sum(reaches(succ, m, n) for m in nodes))
    return all(reaches(succ, a, b) for a, b in zip(order, order[1:]))


class CpuBackend(MetalBackend):
    """The Metal back-end's consumer calls on the CPU: a kernel object whose launch is MLX's own quantized matmul
    with a marker op (``Sign``), so the candidate's calls are told apart from the op's in the graph."""

    def check_available(self) -> None:
        pass

    def _make_kernel(self, source: Any, geo: Any) -> Any:
        def launch(inputs: list[Any], output_shapes: Any, **_: Any) -> list[Any]:
            x, w, s, b = inputs[:4]
            bits = 32 * w.shape[1] // x.shape[1]
            y = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=x.shape[1] // s.shape[1], bits=bits)
            return [mx.sign(y) * y]

        return launch


def consumer_calls(family: str = "qmatvec", shape: str = "1,128,256,32,4") -> tuple[Any, Any, Any, Any]:
    fam = load_family(family)
    chip = get_chip("M2 Max")
    space = Space(make_problem(fam, shape, "float16", chip), chip)
    config = dict(fam.default)
    kernel, geo = render(fam, config, "float16", "metal"), geometry(space, config)
    from kernsearch.evaluation._verify import make_inputs

    sets = [make_inputs(space.problem, 3)]
    backend = CpuBackend()
    return (backend, fam, backend.consumer_kernel(kernel, geo, fam, space.problem, sets),
            backend.consumer_op(fam, space.problem, sets))


@pytest.mark.parametrize("shape", ["1,128,256,32,4", "1,512,256,32,4"])  # the output shorter, longer
def test_graph_mode_is_one_path_through_the_calls(shape: str) -> None:
    _, _, kernel, op = consumer_calls(shape=shape)
    for call, primitive in ((op, "QuantizedMatmul"), (kernel, "Sign")):
        mx.eval(call(0))  # inputs on the device: the graph below holds the calls alone
        labels, succ = dot_graph(chain(call, 0, K_CALLS))
        assert sum(lab == primitive for lab in labels.values()) == K_CALLS
        assert one_path(labels, succ, primitive)
        # The old graph mode (now batch): independent calls, no path between them.
        labels, succ = dot_graph([call(i) for i in range(K_CALLS)])
        assert sum(lab == primitive for lab in labels.values()) == K_CALLS
        assert not one_path(labels, succ, primitive)


def test_a_kernel_with_weights_is_timed_through_the_packages_bound_front(monkeypatch: pytest.MonkeyPatch) -> None:
    """The final round times a candidate as a consumer of ``family.bind(*weights)`` calls it (issue 38: the planned
    call alone skipped the front a decode pays every call): one binding per input set, planned by the package's
    own code on the set's first call, its fast path after (no planning: each call one launch of the kernel)."""
    from kernsearch.exporting.runtime import _binding

    planned: list[int] = []
    real = _binding._Binding.planned

    def counted(self: Any, *acts: Any) -> Any:
        planned.append(len(acts))
        return real(self, *acts)

    monkeypatch.setattr(_binding._Binding, "planned", counted)
    _, _, kernel, _ = consumer_calls()
    assert planned == [1]  # X alone (the weights are bound), planned once before any timing
    labels, _ = dot_graph(chain(kernel, 0, K_CALLS))
    assert sum(lab == "Sign" for lab in labels.values()) == K_CALLS
    assert planned == [1]  # every timed call took the front's fast path


def test_the_derivation_is_the_same_op_for_candidate_and_baseline() -> None:
    backend, fam, kernel, op = consumer_calls()
    derived: list[tuple[str, tuple[int, ...]]] = []
    link = backend.consumer_link(fam)
    original = link.derive

    def spy(previous: Any, activation: Any) -> Any:
        out = original(previous, activation)
        derived.append((type(previous).__name__, tuple(out.shape)))
        return out

    object.__setattr__(link, "derive", spy)  # the one Link both calls hold
    between: list[list[str]] = []
    for call, marker in ((kernel, "Sign"), (op, "QuantizedMatmul")):
        mx.eval(call(0))
        labels, succ = dot_graph(chain(call, 0, 3))
        calls = [n for n, lab in labels.items() if lab == marker]
        first = min(calls, key=lambda n: sum(reaches(succ, m, n) for m in calls))
        second = min((c for c in calls if c != first), key=lambda n: sum(reaches(succ, m, n) for m in calls))
        # The primitives on the way from the first call's result to the second call's activation (its own
        # primitives excluded): the derivation.
        inside = sorted(lab for n, lab in labels.items() if n not in calls and reaches(succ, first, n)
                        and reaches(succ, n, second) and lab not in ("QuantizedMatmul", "Multiply", "Sign"))
        between.append(inside)
    assert between[0] == between[1] and "Concatenate" in between[0]  # N < K: the output is padded
    assert len(derived) == 4 and len(set(derived)) == 1 and derived[0][1] == (1, 256)


def test_a_family_with_several_activations_chains_its_first() -> None:
    swiglu = load_family("swiglu")
    assert [t.weight for t in swiglu.inputs] == [False, False] and chain_position(swiglu.inputs) == 0
    layernorm = load_family("layernorm")
    assert chain_position(layernorm.inputs) == 0 and layernorm.inputs[0].name == "x"


def test_consumer_samples_build_a_chain_in_graph_mode_and_independent_calls_in_batch() -> None:
    seen: list[tuple[int, Any]] = []

    def call(i: int, previous: Any = None) -> Any:
        seen.append((i, previous))
        return i

    consumer_samples({"k": call}, lambda out: None, lambda: None,
                     ConsumerPlan(calls=4, rounds=1, warmup=0, modes=("graph",)))
    assert seen == [(0, None), (1, 0), (2, 1), (3, 2)]
    seen.clear()
    consumer_samples({"k": call}, lambda out: None, lambda: None,
                     ConsumerPlan(calls=4, rounds=1, warmup=0, modes=("batch",)))
    assert seen == [(0, None), (1, None), (2, None), (3, None)]


def test_modes_timed_are_graph_and_eager_and_the_declared_others() -> None:
    assert timed_modes(["graph"]) == ("graph", "eager")
    assert timed_modes(["batch", "eager"]) == ("graph", "eager", "batch")
    for name in ("qmatvec", "swiglu_qmatvec", "gemv"):
        assert load_family(name).consumer_modes == ["graph"], name  # decode families: judged by the chain


def test_graph_figures_recorded_before_chains_read_as_batch() -> None:
    from kernsearch._rules import consumer_figures

    old = {"modes": {"graph": {"low": 1.5}, "eager": {"low": 1.2}}}
    assert consumer_figures(old) == {"batch": {"low": 1.5}, "eager": {"low": 1.2}}
    new = {**old, "chain_calls": 8}
    assert consumer_figures(new) == old["modes"] and consumer_figures({}) is None


@pytest.mark.slow
def test_committed_decode_artifacts_timed_before_chains_are_rejudged_and_never_dispatched(tmp_path: Any) -> None:
    """The repository's H100 qmatvec artifacts were timed as independent calls (their graph figures read as batch)
    and no H100 has been lent since to re-time them in the chain: ``rejudge`` invalidated them, saying why, and the
    exported package runs the op there, saying why."""
    import shutil
    from pathlib import Path

    from test_export import H100, import_package

    from kernsearch import ArtifactStore, export

    store_dir = tmp_path / "artifacts"
    shutil.copytree(Path(__file__).resolve().parents[1] / "artifacts", store_dir)
    store = ArtifactStore(store_dir)
    key = next(k for k in store.keys() if k.path == "qmatvec/H100/float16/1x11008x4096x512x64")
    m = store.load(key, store.versions(key)[-1]).manifest
    assert m.measurements is not None and m.measurements.modes is not None
    assert sorted(m.measurements.modes) == ["batch", "eager"] and m.measurements.chain_calls is None
    why = (store.pointer(key) or pytest.fail("no pointer")).invalidated or ""
    assert "has no graph figures" in why and "batch" in why and "re-timed in the chain" in why
    assert store.rejudge() == []  # already re-judged in the repository: nothing left to invalidate
    decode = [k for k in store.keys() if k.family in ("qmatvec", "swiglu_qmatvec", "gemv") and store.pointer(k)]
    assert decode and all((store.pointer(k) or pytest.fail()).invalidated for k in decode)
    result = export(["qmatvec"], tmp_path / "dist", store, package="ks_chain", version="1.0")
    pkg = import_package(result.source_dir, "ks_chain")
    x = mx.zeros((1, 4096), dtype=mx.float16)
    w, s, b = mx.zeros((11008, 512), dtype=mx.uint32), mx.zeros((11008, 64), mx.float16), mx.zeros((11008, 64), mx.float16)
    decision = pkg.qmatvec.explain(x, w, s, b, chip=H100)
    assert decision.level == "mlx op", str(decision)
    assert "has no graph figures" in str(decision), str(decision)


def test_a_version_timed_before_chains_is_not_dispatched_by_the_package_and_it_says_why(tmp_path: Any) -> None:
    """A store never re-judged (a user's, from before chains): the package itself reads the version's graph figures
    as batch and declines it for a family judged by the chain."""
    from kernsearch.exporting.runtime._decision import Chooser

    entry = {"evidence": "measured", "modes": {"batch": {"speedup": 1.6, "low": 1.4, "high": 1.7},
                                               "eager": {"speedup": 1.2, "low": 1.1, "high": 1.3}}}
    chooser = object.__new__(Chooser)
    chooser._integrity = lambda a: ""  # type: ignore[method-assign]  # (the record's integrity: tests of its own)
    why = chooser._unusable(entry, {"modes": ["graph"]}, None, (), {}, "float16", "op", False)
    assert why.startswith("not timed in graph mode, which judges this family") and "1.60x" in why and "batch" in why
    assert "re-time it" in why
