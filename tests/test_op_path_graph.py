"""The op path adds nothing (issue 37): where the exported package runs the MLX op, the graph its call builds holds
the op's primitives and nothing else — no ``mx.compile``d baseline, no shared subexpression computed twice, no copy,
cast or reshape — for every built-in family with a baseline, by the plain call (planned, then with everything seen
before) and by the bound form: where no kernel can run (no GPU: every call the op), on a GPU with no artifact of
the family (the op with no opt-in read), and on one where kernels exist but none was tuned at the call's shape.
Checked on MLX's CPU back-end through its graph export (``mx.export_to_dot``), compile left on."""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from test_dispatch_cost import frames
from test_export import H100, H200

from kernsearch import ArtifactStore, export
from kernsearch.evaluation._verify import make_inputs
from kernsearch.exporting.runtime import _runtime
from kernsearch.family._space import make_problem
from kernsearch.family._spec import load_family

REPO = Path(__file__).resolve().parents[1]
EPS = 1e-5
#: Small shapes no artifact was tuned at.
SHAPES = {"qmatvec": (2, 256, 256, 32, 4), "swiglu_qmatvec": (2, 256, 256, 32, 4), "gemv": (2, 256, 256),
          "gemm": (32, 64, 64), "rmsnorm": (4, 256), "layernorm": (4, 256), "softmax": (4, 256), "swiglu": (4, 256),
          "rmsnorm_qmatvec": (2, 128, 256, 32, 4), "qmatvec_residual": (2, 256, 256, 32, 4),
          "rmsnorm_swiglu_qmatvec": (2, 128, 256, 32, 4), "mlp_block": (2, 256, 512, 32, 4, 64, 8)}


def test_every_builtin_family_has_a_shape_and_an_op_by_hand_here() -> None:
    """The families are found in the family folders: a new one fails here until its shape (and its op written by
    hand, below) lets the graph tests take it through the package too."""
    from conftest import builtin_families

    assert sorted(SHAPES) == builtin_families()


def by_hand(family: str, dims: dict[str, int]) -> Any:
    """The family's op as a consumer writes it without kernsearch: plain MLX calls, each value computed once."""
    q = ("K", "NG", "KW") if "NG" in dims else ("H", "NGH", "KWH")  # qmatvec's quantization, or mlp_block's along H
    k, ng, kw = (dims.get(name, 1) for name in q)

    def qmm(x: Any, w: Any, s: Any, b: Any, k: Any = k, ng: Any = ng, kw: Any = kw) -> Any:
        return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=k // ng, bits=32 * kw // k)

    def swiglu(g: Any, u: Any) -> Any:
        return g * mx.sigmoid(g) * u

    def rmsnorm_swiglu_qmatvec(x: Any, w: Any, s: Any, b: Any, wu: Any, su: Any, bu: Any, gamma: Any) -> Any:
        h = mx.fast.rms_norm(x, gamma, EPS)
        return swiglu(qmm(h, w, s, b), qmm(h, wu, su, bu))

    def mlp_block(x: Any, wo: Any, so: Any, bo: Any, r: Any, gamma: Any, *mlp: Any) -> Any:
        x1 = r + qmm(x, wo, so, bo)
        n = mx.fast.rms_norm(x1, gamma, EPS)
        g = swiglu(qmm(n, *mlp[0:3]), qmm(n, *mlp[3:6]))
        y = x1 + qmm(g, *mlp[6:9], k=dims["F"], ng=dims["NGF"], kw=dims["KWF"])
        m = dims["M"]
        return y, mx.concatenate([mx.reshape(x1, [m * dims["H"]]), mx.reshape(g, [m * dims["F"]]), 0 * x[0, :8]],
                                 axis=0)

    return {"qmatvec": qmm, "gemm": mx.matmul, "gemv": mx.matmul,
            "swiglu_qmatvec": lambda x, w, s, b, wu, su, bu: swiglu(qmm(x, w, s, b), qmm(x, wu, su, bu)),
            "rmsnorm": lambda x, w: mx.fast.rms_norm(x, w, EPS),
            "layernorm": lambda x, w, b: mx.fast.layer_norm(x, w, b, EPS),
            "softmax": lambda x: mx.softmax(x, axis=-1, precise=True),
            "swiglu": swiglu,
            "rmsnorm_qmatvec": lambda x, w, s, b, gamma: qmm(mx.fast.rms_norm(x, gamma, EPS), w, s, b),
            "qmatvec_residual": lambda x, w, s, b, r: r + qmm(x, w, s, b),
            "rmsnorm_swiglu_qmatvec": rmsnorm_swiglu_qmatvec, "mlp_block": mlp_block}[family]


def graph(outputs: Any) -> Counter[str]:
    """The graph's primitives by name, and its number of edges (an op computed twice, or fed twice, shows)."""
    buf = io.StringIO()
    mx.export_to_dot(buf, *(outputs if isinstance(outputs, tuple) else (outputs,)))
    text = buf.getvalue()
    found = Counter(re.findall(r'\[label ="(\w+)"', text))
    found["(edges)"] = text.count("->")
    return found


def problem_arrays(family: str) -> tuple[list[Any], dict[str, int], list[bool]]:
    fam = load_family(family)
    problem = make_problem(fam, SHAPES[family], "float16")
    logical = make_inputs(problem, 1)
    arrays = [mx.array(logical[t.name]).astype(getattr(mx, t.resolved_dtype("float16"))) for t in fam.inputs]
    mx.eval(arrays)
    return arrays, dict(problem.dims), [t.weight for t in fam.inputs]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built-in families exported from an empty store and from the repository's."""
    root = tmp_path_factory.mktemp("op_path")
    families = list(SHAPES)
    empty = export(families, root / "empty", ArtifactStore(root / "store"), package="ks_none", version="1.0")
    repo = export(families, root / "repo", ArtifactStore(REPO / "artifacts"), package="ks_repo_ops", version="1.0")
    return {"no-gpu": empty.source_dir / "ks_none", "repo": repo.source_dir / "ks_repo_ops"}


@pytest.mark.slow
@pytest.mark.parametrize("situation", ["no-gpu", "h200-none", "h100-untuned"])
def test_where_the_package_runs_the_op_its_graph_is_the_ops(packages: dict[str, Path], situation: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    if situation != "no-gpu":  # the injected chip is the running GPU
        monkeypatch.setattr(_runtime, "_gpu_available", lambda: True)
    info = {"no-gpu": None, "h200-none": H200, "h100-untuned": H100}[situation]
    d = _runtime.Dispatcher(packages["no-gpu" if situation == "no-gpu" else "repo"], device_info=info)
    for family in SHAPES:
        arrays, dims, weight = problem_arrays(family)
        want = graph(by_hand(family, dims)(*arrays))
        assert d.explain(family, *arrays).level == "mlx op"
        fn = d.function(family)
        for _ in range(2):  # planned, then with everything seen before
            assert graph(fn(*arrays)) == want, (situation, family)
        assert not {"evaluate", "call", "_plan"} & set(frames(fn, *arrays)), (situation, family)  # no walk, no plan
        if situation == "h200-none":  # H100 kernels of qmatvec, gemv...: no level takes them here (no transfer)
            assert d._how[family][0] is not _runtime._KERNELS, family
        if any(weight):
            bound = d.bind(family, *[a for a, w in zip(arrays, weight) if w])
            free = [a for a, w in zip(arrays, weight) if not w]
            for _ in range(2):
                assert graph(bound(*free)) == want, (situation, family, "bound")
            assert not {"evaluate", "planned", "_plan"} & set(frames(bound, *free)), (situation, family)


def test_the_op_is_the_baselines_plain_calls(tmp_path: Path) -> None:
    """Fast-lane companion of the test above: the fused decode families' op, by the plain call and bound, on a
    machine where nothing can run (each shared value once: rms_norm(X) feeds both projections)."""
    families = ["rmsnorm_swiglu_qmatvec", "qmatvec_residual"]
    result = export(families, tmp_path / "dist", ArtifactStore(tmp_path / "store"), package="ks_few", version="1.0")
    d = _runtime.Dispatcher(result.source_dir / "ks_few")
    for family in families:
        arrays, dims, weight = problem_arrays(family)
        want = by_hand(family, dims)(*arrays)
        got = d.function(family)(*arrays)
        bound = d.bind(family, *[a for a, w in zip(arrays, weight) if w])
        assert graph(got) == graph(want), family
        assert graph(bound(*[a for a, w in zip(arrays, weight) if not w])) == graph(want), family
        assert "evaluate" not in frames(bound, *[a for a, w in zip(arrays, weight) if not w])
        assert mx.allclose(got, want).item()  # (evaluated: its graph is gone)


#: MLX calls of each fused op as a consumer writes it (qmm, rms_norm, sigmoid, *, +, reshape, slice, concatenate).
MLX_CALLS = {"rmsnorm_swiglu_qmatvec": 6, "qmatvec_residual": 2, "mlp_block": 15}


def test_the_op_path_calls_mlx_as_a_consumer_writes_it(tmp_path: Path) -> None:
    """The host cost of the op path (issue 37): a plain call with weights seen before and a bound call run the op
    with at most one Python frame per MLX call plus two (the call's own, the shared values'), no comprehension;
    they return what the plain ops return, take NumPy activations as the first call does, and, past their fast
    paths, still refuse activations out of the family's range (17 rows) in the consumer's words."""
    families = list(MLX_CALLS)
    result = export(families, tmp_path / "dist", ArtifactStore(tmp_path / "store"), package="ks_calls", version="1.0")
    d = _runtime.Dispatcher(result.source_dir / "ks_calls")
    for family in families:
        arrays, dims, weight = problem_arrays(family)
        want = by_hand(family, dims)(*arrays)
        fn = d.function(family)
        bound = d.bind(family, *[a for a, w in zip(arrays, weight) if w])
        free = [a for a, w in zip(arrays, weight) if not w]
        for form, args in ((fn, arrays), (bound, free)):
            got = form(*args)
            got = form(*args)  # the fast path: weights seen before, the last activation shapes
            for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                assert mx.array_equal(g, w).item(), family
            seen = frames(form, *args)
            assert len(seen) <= MLX_CALLS[family] + 2, (family, seen)
            assert not [name for name in seen if name.startswith("<") and name != "<lambda>"], (family, seen)
            numpy = [np.array(a) if not w else a for a, w in zip(arrays, weight)]  # a consumer's NumPy activations
            got = form(*(numpy if form is fn else [a for a, w in zip(numpy, weight) if not w]))
            assert mx.array_equal(got[0] if isinstance(got, tuple) else got, want[0] if isinstance(want, tuple)
                                  else want).item(), family  # converted, past the fast path as on the first call
            rows = [mx.zeros((17, *a.shape[1:]), dtype=a.dtype) if not w else a for a, w in zip(arrays, weight)]
            with pytest.raises(ValueError, match="has 17 rows; this kernel takes 1 to 16"):
                form(*(rows if form is fn else [a for a, w in zip(rows, weight) if not w]))
