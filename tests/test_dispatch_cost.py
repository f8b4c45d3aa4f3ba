"""Dispatch costs nothing (issue 26): a planned call of the exported package is the MLX function itself with its
constant arguments bound, not an expression walk; a call with weights seen before, and the bound form, look at the
activations alone. Timings are benchmarks (benchmarks/gpu_consumer.py); these tests check which Python frames run.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from test_export import import_package

from kernsearch import ArtifactStore, export
from kernsearch.evaluation._verify import make_inputs
from kernsearch.family._space import make_problem
from kernsearch.family._spec import load_family


@pytest.fixture(scope="module")
def pkg(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("cost")
    result = export(["qmatvec", "rmsnorm", "layernorm", "softmax", "gemm"], root / "dist",
                    ArtifactStore(root / "store"), package="ks_cost", version="1.0")
    return import_package(result.source_dir, "ks_cost")


def arrays(family: str, shape: tuple[int, ...]) -> list[mx.array]:
    fam = load_family(family)
    logical = make_inputs(make_problem(fam, shape, "float32"), 0)
    return [mx.array(logical[t.name]) for t in fam.inputs]


def frames(fn, *args) -> list[str]:
    """The Python functions entered while ``fn(*args)`` builds its graph (C functions are not frames)."""
    seen: list[str] = []

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        if event == "call":
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return seen


def test_a_planned_op_is_the_mlx_function_with_its_constants_bound(pkg) -> None:
    x = arrays("qmatvec", (1, 256, 256, 32, 4))
    want = mx.quantized_matmul(*x, transpose=True, group_size=64, bits=4)
    assert mx.array_equal(pkg.qmatvec(*x), want).item()  # planned here
    assert frames(pkg.qmatvec, *x) == ["run"]  # one frame: no evaluate, no plan, no wrapper
    d = pkg._dispatcher
    _, activations, fn, consts, _, shape, dtype, _ = next(iter(d._by_weights["qmatvec"].values()))  # its last plan
    assert activations == ((0, x[0].shape, None),) and shape == x[0].shape and dtype is None  # no kernel here: any dtype
    assert fn is mx.quantized_matmul and consts == (True, 64, 4)  # called positionally: no keyword merging
    r = arrays("rmsnorm", (4, 256))
    assert mx.allclose(pkg.rmsnorm(*r), mx.fast.rms_norm(*r, 1e-5)).item()
    assert frames(pkg.rmsnorm, *r) == ["run"]
    assert d._how["rmsnorm"][1] is mx.fast.rms_norm and d._how["rmsnorm"][2] == (pytest.approx(1e-5),)
    s = arrays("softmax", (4, 256))
    assert mx.allclose(pkg.softmax(*s), mx.softmax(*s, axis=-1, precise=True)).item()


def test_the_bound_form_plans_once_and_checks_the_activation_alone(pkg, monkeypatch) -> None:
    x, w, s, b = arrays("qmatvec", (1, 256, 256, 32, 4))
    bound = pkg.qmatvec.bind(w, s, b)
    want = mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)
    assert mx.array_equal(bound(x), want).item()
    assert frames(bound, x) == ["bound"]  # a check of x's shape, then the op with the weights appended: one frame
    x4 = mx.concatenate([x] * 4)
    assert mx.array_equal(bound(x4), mx.quantized_matmul(x4, w, s, b, group_size=64, bits=4)).item()  # re-planned
    assert "op_call" not in frames(bound, x)  # back to x: its kept plan (no planning), then the fast path again
    monkeypatch.setenv("KERNSEARCH_KERNELS", "off")
    assert frames(bound, x) == ["bound"]  # no kernel of the family can run here: no switch to read
    with pytest.raises(TypeError, match="takes 3 weight"):
        pkg.qmatvec.bind(w, s)
    # Refusals: the weights' own shapes when bound, the activations' once per shape (the op dies at 0 rows).
    with pytest.raises(ValueError, match="qmatvec: the weights do not fit together: NG is 4 and 3"):
        pkg.qmatvec.bind(w, s, b[:, :3])
    for rows, words in ((0, "X has 0 rows; this kernel takes 1 to 16"), (17, "X has 17 rows; this kernel takes 1 to 16")):
        with pytest.raises(ValueError, match=words):
            bound(mx.zeros((rows, 256)))
        with pytest.raises(ValueError, match=words):
            pkg.qmatvec(mx.zeros((rows, 256)), w, s, b)
    assert mx.array_equal(bound(x), want).item()  # the last good shape still runs
    assert not hasattr(pkg.softmax, "bind")  # no weight inputs: nothing to bind
    r = arrays("rmsnorm", (4, 256))
    assert mx.allclose(pkg.rmsnorm.bind(r[1])(r[0]), mx.fast.rms_norm(*r, 1e-5)).item()  # a norm's weight binds too


def test_weights_seen_before_are_held_weakly(pkg) -> None:
    d = pkg._dispatcher
    d._by_weights["qmatvec"].clear()
    x, w, s, b = arrays("qmatvec", (1, 256, 256, 32, 4))
    pkg.qmatvec(x, w, s, b)
    assert len(d._by_weights["qmatvec"]) == 1
    w2 = mx.array(np.array(w))  # equal values, another array: planned again under its own identity
    pkg.qmatvec(x, w2, s, b)
    assert frames(pkg.qmatvec, x, w2, s, b) == ["run"]
    assert len(d._by_weights["qmatvec"]) == 1  # filed under the last weight's identity: the newest set replaced the first
    pkg.qmatvec(x, w, s, b)
    del w2
    gc.collect()
    assert len(d._by_weights["qmatvec"]) == 1 and d._by_weights["qmatvec"][id(b)][0][0][1]() is w
    del w
    gc.collect()
    assert d._by_weights["qmatvec"] == {}  # the entry of dead weights is gone: their memory is not held
    w3, b3 = mx.zeros((256, 32), dtype=mx.uint32), mx.array(np.array(b))
    pkg.qmatvec(x, w3, s, b3)
    assert len(d._by_weights["qmatvec"]) == 1
    del b3  # the key's own weight dies: its entry goes (a live entry's key is its last weight's identity)
    gc.collect()
    assert d._by_weights["qmatvec"] == {}
    pkg.qmatvec(x, w3, s, b)
    with pytest.raises((ValueError, TypeError)):  # a call of another arity is not the fast path's
        pkg.qmatvec(b)


def test_the_gate_table_and_the_package_read_the_same_rule(tmp_path: Path) -> None:
    from kernsearch.exporting.runtime import _runtime

    assert _runtime.consumer_low({"graph": {"low": 1.2}, "eager": {"low": 0.9}}) == 0.9
    assert _runtime.modes_text({"graph": {"speedup": 1.5, "low": 1.4, "high": 1.6}}, ("graph",)) == \
        "1.50x (range 1.40-1.60) graph"
