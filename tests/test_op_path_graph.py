"""The op path adds nothing (issue 37): where the exported package runs the MLX op, the graph its call builds holds
the op's primitives and nothing else (no copy, no cast, no reshape), for every built-in family, both where no kernel
can run (no GPU: the op itself) and where one could but none was tuned at the call's shape (the planned op).
Checked on MLX's CPU back-end through its graph export (``mx.export_to_dot``)."""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from test_export import H100

from kernsearch import ArtifactStore, export
from kernsearch.evaluation._verify import make_inputs
from kernsearch.exporting.runtime import _runtime
from kernsearch.family._space import make_problem
from kernsearch.family._spec import load_family

REPO = Path(__file__).resolve().parents[1]
#: Small shapes no artifact was tuned at.
SHAPES = {"qmatvec": (2, 256, 256, 32, 4), "swiglu_qmatvec": (2, 256, 256, 32, 4), "gemv": (2, 256, 256),
          "gemm": (32, 64, 64), "rmsnorm": (4, 256), "layernorm": (4, 256), "softmax": (4, 256), "swiglu": (4, 256)}


def by_hand(family: str, dims: dict[str, int]) -> Any:
    """The family's op as a consumer writes it without kernsearch."""
    if family in ("qmatvec", "swiglu_qmatvec"):
        gs, bits = dims["K"] // dims["NG"], 32 * dims["KW"] // dims["K"]

        def qmm(x: Any, w: Any, s: Any, b: Any) -> Any:
            return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=gs, bits=bits)

        if family == "qmatvec":
            return qmm
        return lambda x, w, s, b, wu, su, bu: (lambda g: g * mx.sigmoid(g))(qmm(x, w, s, b)) * qmm(x, wu, su, bu)
    return {"gemm": mx.matmul, "gemv": mx.matmul,
            "rmsnorm": lambda x, w: mx.fast.rms_norm(x, w, 1e-5),
            "layernorm": lambda x, w, b: mx.fast.layer_norm(x, w, b, 1e-5),
            "softmax": lambda x: mx.softmax(x, axis=-1, precise=True),
            "swiglu": lambda a, b: a * mx.sigmoid(a) * b}[family]


def primitives(outputs: Any) -> Counter[str]:
    buf = io.StringIO()
    mx.export_to_dot(buf, outputs)
    return Counter(re.findall(r'\[label ="(\w+)"', buf.getvalue()))


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built-in families exported from an empty store and from the repository's."""
    root = tmp_path_factory.mktemp("op_path")
    families = list(SHAPES)
    empty = export(families, root / "empty", ArtifactStore(root / "store"), package="ks_none", version="1.0")
    repo = export(families, root / "repo", ArtifactStore(REPO / "artifacts"), package="ks_repo_ops", version="1.0")
    return {"no-gpu": empty.source_dir / "ks_none", "h100-untuned": repo.source_dir / "ks_repo_ops"}


@pytest.mark.slow
@pytest.mark.parametrize("situation", ["no-gpu", "h100-untuned"])
def test_where_the_package_runs_the_op_its_graph_is_the_ops(packages: dict[str, Path], situation: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    mx.disable_compile()  # a compiled baseline (swiglu_qmatvec's) as its primitives, by hand and in the package
    try:
        if situation == "h100-untuned":
            monkeypatch.setattr(_runtime, "_gpu_available", lambda: True)
        d = _runtime.Dispatcher(packages[situation], device_info=H100 if situation == "h100-untuned" else None)
        for family, shape in SHAPES.items():
            fam = load_family(family)
            problem = make_problem(fam, shape, "float16")
            logical = make_inputs(problem, 1)
            arrays = [mx.array(logical[t.name]).astype(getattr(mx, t.resolved_dtype("float16"))) for t in fam.inputs]
            mx.eval(arrays)
            assert d.explain(family, *arrays).level == "mlx op"
            fn = d.function(family)
            for _ in range(2):  # planned, then with everything seen before
                got = fn(*arrays)
                assert primitives(got) == primitives(by_hand(family, dict(problem.dims))(*arrays)), family
            weights = [a for a, t in zip(arrays, fam.inputs) if t.weight]
            if weights:
                bound = d.bind(family, *weights)
                free = [a for a, t in zip(arrays, fam.inputs) if not t.weight]
                for _ in range(2):
                    got = bound(*free)
                    assert primitives(got) == primitives(by_hand(family, dict(problem.dims))(*arrays)), family
    finally:
        mx.enable_compile()
