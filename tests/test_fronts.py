"""The exported package's per-arity fronts (``_fronts._front4`` ... ``_front_residual``, issue 37's fast path): a
call runs its filed plan only where each weight is the very array it was filed with (``is``: an equal copy is
another weight, and MLX's ``==`` is elementwise), its activations' shapes (and dtypes, where filed) are the
planned ones, the mode, the switch and the opt-in allow it and no argument is extra; every other call, and one of
arrays that are not MLX's, goes to the general path. The plan and the general path are recorders here: which one
a call reaches is what each test checks, one condition at a time (dropping any one of them fails a test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from kernsearch import ArtifactStore, export
from kernsearch.evaluation._verify import make_inputs
from kernsearch.exporting.runtime import _fronts, _runtime
from kernsearch.family._space import make_problem
from kernsearch.family._spec import load_family

#: Family -> (its front's layout in ``_fronts._FRONTS``, its weights' positions, its activations' positions).
FAMILIES = {"qmatvec": (4, (1, 2, 3), (0,)),
            "rmsnorm_qmatvec": (5, (1, 2, 3, 4), (0,)),
            "swiglu_qmatvec": (7, (1, 2, 3, 4, 5, 6), (0,)),
            "rmsnorm_swiglu_qmatvec": (8, (1, 2, 3, 4, 5, 6, 7), (0,)),
            "qmatvec_residual": (-1, (1, 2, 3), (0, 4))}
SHAPE = (1, 256, 256, 32, 4)
MODES = ("planned", "kernels")
KEY = _fronts._ENV_KEY


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fronts")
    result = export(list(FAMILIES), tmp / "dist", ArtifactStore(tmp / "store"), package="ks_fronts", version="1.0")
    return Path(result.source_dir) / "ks_fronts"


class Front:
    """A family's front over a dispatcher's mode cell and table, the call's arrays filed there by the package's own
    call; its plan and its general path replaced by recorders, its switch a table of its own (unset)."""

    def __init__(self, root: Path, family: str, mode: str) -> None:
        fam = load_family(family)
        logical = make_inputs(make_problem(fam, SHAPE, "float32"), 0)
        self.args = [mx.array(logical[t.name]) for t in fam.inputs]
        d = _runtime.Dispatcher(root)
        self.how = d._how_cell(family)
        if mode == "kernels":  # where a kernel may run: the switch and the opt-in read, dtypes filed
            self.how[:] = [_fronts._KERNELS, None, ()]
        mx.eval(d.function(family)(*self.args))
        assert self.how[0] is (_fronts._KERNELS if mode == "kernels" else _fronts._OP_PLANNED)
        layout, weights, _ = FAMILIES[family]
        self.entry = d._by_weights[family][id(self.args[weights[-1]])]
        assert (self.entry[6] is None) == (mode == "planned")
        self.entry[2:4] = (self.plan, None)
        self.env: dict[Any, Any] = {}
        self.run = _fronts._FRONTS[layout](self.how, d._by_weights[family], self.general, self.env, KEY)
        self.took: list[tuple[str, tuple[Any, ...], Any]] = []

    def plan(self, xs: tuple[Any, ...]) -> str:
        self.took.append(("plan", xs, None))
        return "plan"

    def general(self, *xs: Any, modeled: bool = False) -> str:
        self.took.append(("general", xs, modeled))
        return "general"

    def __call__(self, *args: Any, **kw: Any) -> str:
        """Which path ``run(*args, **kw)`` took (each array handed on is the very one given)."""
        self.took.clear()
        out = self.run(*args, **kw)
        (path, xs, modeled), = self.took
        assert path == out and len(xs) == len(args) and all(a is b for a, b in zip(xs, args))
        assert path == "plan" or modeled is kw.get("modeled", False)
        return out


@pytest.fixture(scope="module")
def fronts(root: Path) -> dict[tuple[str, str], Front]:
    return {(family, mode): Front(root, family, mode) for family in FAMILIES for mode in MODES}


def with_(args: list[Any], i: int, value: Any) -> list[Any]:
    return [value if j == i else a for j, a in enumerate(args)]


def copy(a: mx.array) -> mx.array:
    return mx.array(np.array(a))  # equal values, another array


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_of_the_filed_weights_and_shapes_runs_its_plan(fronts, family: str, mode: str) -> None:
    f = fronts[family, mode]
    assert f(*f.args) == "plan"
    assert f(*f.args, modeled=False) == "plan"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("family", "position"), [(f, i) for f, (_, ws, _) in FAMILIES.items() for i in ws])
def test_an_equal_copy_of_any_one_weight_is_another_weight(fronts, family: str, position: int, mode: str) -> None:
    f = fronts[family, mode]
    assert f(*with_(f.args, position, copy(f.args[position]))) == "general"  # no `==` on the arrays either
    assert f(*f.args) == "plan"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_weights_with_no_entry_go_to_the_general_path(fronts, family: str, mode: str) -> None:
    f = fronts[family, mode]
    _, weights, _ = FAMILIES[family]
    fresh = [copy(a) if i in weights else a for i, a in enumerate(f.args)]
    assert f(*fresh) == "general"
    assert f(f.args[0]) == "general"  # no weights given: the general path says what is missing
    assert f(*f.args[:-1]) == "general"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("family", "position"), [(f, i) for f, (_, _, acts) in FAMILIES.items() for i in acts])
def test_another_shape_of_any_one_activation_goes_to_the_general_path(fronts, family: str, position: int,
                                                                      mode: str) -> None:
    f = fronts[family, mode]
    a = f.args[position]
    assert f(*with_(f.args, position, mx.concatenate([a, a]))) == "general"
    assert f(*with_(f.args, position, a.reshape(-1))) == "general"


@pytest.mark.parametrize(("family", "position"), [(f, i) for f, (_, _, acts) in FAMILIES.items() for i in acts])
def test_another_dtype_of_any_one_activation_goes_to_the_general_path_where_dtypes_are_filed(
        fronts, family: str, position: int) -> None:
    other = with_(fronts[family, "kernels"].args, position, fronts[family, "kernels"].args[position].astype(mx.float16))
    assert fronts[family, "kernels"](*other) == "general"
    planned = fronts[family, "planned"]  # the op planned per shape: any dtype (none filed)
    assert planned(*with_(planned.args, position, planned.args[position].astype(mx.float16))) == "plan"


class ShapeOnly:
    """An array-like with a shape and no dtype."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("family", "position"), [(f, i) for f, (_, _, acts) in FAMILIES.items() for i in acts])
def test_activations_that_are_not_mlx_arrays_go_to_the_general_path(fronts, family: str, position: int,
                                                                    mode: str) -> None:
    f = fronts[family, mode]
    a = f.args[position]
    assert f(*with_(f.args, position, np.array(a).tolist())) == "general"  # no shape: AttributeError
    if mode == "kernels":  # a shape and no dtype: AttributeError where the dtype is read
        assert f(*with_(f.args, position, ShapeOnly(a.shape))) == "general"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_plan_that_refuses_the_arrays_hands_the_call_to_the_general_path(fronts, family: str, mode: str) -> None:
    f = fronts[family, mode]

    def refuses(xs: tuple[Any, ...]) -> None:
        f.took.append(("refused", xs, None))
        raise TypeError("not MLX arrays")

    f.entry[2] = refuses
    try:
        f.took.clear()
        assert f.run(*f.args) == "general"
        assert [p for p, _, _ in f.took] == ["refused", "general"]
    finally:
        f.entry[2] = f.plan


@pytest.mark.parametrize("family", FAMILIES)
def test_the_mode_the_switch_and_the_opt_in_as_the_general_path_reads_them(fronts, family: str) -> None:
    planned, kernels = fronts[family, "planned"], fronts[family, "kernels"]
    for f in planned, kernels:
        assert f(*f.args, f.args[0]) == "general"  # an extra argument: the general path refuses it
    # The op planned per shape reads no opt-in.
    assert planned(*planned.args, modeled=True) == "plan"
    planned.env[KEY] = b"off"
    try:
        assert planned(*planned.args) == "plan"
    finally:
        del planned.env[KEY]
    # Where a kernel may run, a modeled call, or a set switch, is planned by the general path.
    assert kernels(*kernels.args, modeled=True) == "general"
    assert kernels(*kernels.args, modeled=1) == "general"
    assert kernels(*kernels.args, modeled=0) == "plan"
    for value in (b"off", b"", b"modeled"):
        kernels.env[KEY] = value
        try:
            assert kernels(*kernels.args) == "general"
            assert kernels(*kernels.args, modeled=True) == "general"
        finally:
            del kernels.env[KEY]
    assert kernels(*kernels.args) == "plan"
    # The op for every call, or no mode decided yet: the general path.
    for f in planned, kernels:
        mode = f.how[0]
        for other in (_fronts._OP, None):
            f.how[0] = other
            try:
                assert f(*f.args) == "general"
            finally:
                f.how[0] = mode
        assert f(*f.args) == "plan"


def test_the_package_switch_is_read_on_every_call(fronts, monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw table a front reads by default (``os.environ``'s own): set and unset between calls."""
    f = fronts["qmatvec", "kernels"]
    run = _fronts._FRONTS[4](f.how, {id(f.args[3]): f.entry}, f.general, _fronts._ENV, KEY)
    f.took.clear()
    assert run(*f.args) == "plan"
    monkeypatch.setenv(_fronts.DISABLE_VAR, "off")
    assert run(*f.args) == "general"
    monkeypatch.delenv(_fronts.DISABLE_VAR)
    assert run(*f.args) == "plan"
