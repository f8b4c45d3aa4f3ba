"""The back-end contract is declared on ``BaseBackend`` (issue 42): callers ask a back-end's declared capabilities,
never ``hasattr``. A back-end times variants as consumers call them only where it declares ``times_as_consumers``;
one that does not is timed by separate launches, whatever methods it happens to have; a class whose methods and
declaration disagree is refused when it is made, and by the registry in one line."""

from __future__ import annotations

from typing import Any

import pytest
from test_faults import FAMILY, TEMPLATE, SimulatedGPU

from kernsearch._errors import BackendError
from kernsearch.backends import BACKENDS, backend_class
from kernsearch.backends._base import CONSUMER_METHODS, BaseBackend


class LaunchTimed(SimulatedGPU):
    """Has the consumer methods (inherited) but declares it is timed by launches: they must never be called."""

    times_as_consumers = False

    def consumer_kernel(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("timed as consumers call it, though the back-end declares it is not")


@pytest.fixture
def planted(tmp_path):  # noqa: ANN001, ANN201
    import textwrap

    folder = tmp_path / "planted"
    folder.mkdir()
    (folder / "family.toml").write_text(textwrap.dedent(FAMILY))
    (folder / "planted.metal.j2").write_text(textwrap.dedent(TEMPLATE).lstrip())
    return folder


def _task(folder: Any, backend: str) -> Any:
    from kernsearch.variants._tasks import VariantTask

    return VariantTask(family=str(folder), shape=(64,), dtype="float32", chip="M2 Max", backend=backend,
                       config={"FAULT": "none", "TG": 64}, finalists=[{"FAULT": "none", "TG": 64}],
                       options={"timeout": 30.0})


def test_a_back_end_that_does_not_declare_consumer_timing_is_timed_by_launches(planted) -> None:  # noqa: ANN001
    from kernsearch.variants._tasks import final_round, measure_variant, prepare_variant

    task = _task(planted, "test_backend_contract:LaunchTimed")
    prepare_variant(task)
    assert measure_variant(task).median_ms == pytest.approx(1.0, abs=0.05)  # by launches (TG=64: 1 ms)
    final = final_round(task)
    assert final.modes == {} and final.launches is not None  # no consumer modes: never shipped as a win


def test_a_back_end_that_declares_it_is_timed_as_consumers_call_it(planted) -> None:  # noqa: ANN001
    from kernsearch.variants._tasks import final_round

    final = final_round(_task(planted, "test_faults:SimulatedGPU"))
    assert final.modes and final.launches is None


def test_methods_and_declaration_that_disagree_are_refused_when_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="declares times_as_consumers but does not define consumer_kernel"):
        type("Half", (BaseBackend,), {"times_as_consumers": True, "run": lambda self: None})
    with pytest.raises(TypeError, match="does not declare times_as_consumers"):
        type("Guessed", (BaseBackend,), {"consumer_kernel": lambda self: None, "run": lambda self: None})


def test_the_registry_refuses_a_plug_in_that_breaks_the_contract_in_one_line(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    (tmp_path / "broken_plugin.py").write_text("from kernsearch.backends._base import BaseBackend\n\n\n"
                                               "class B(BaseBackend):\n    def sync(self):\n        pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BackendError, match="cannot load back-end 'broken_plugin:B'.*does not declare") as exc:
        backend_class("broken_plugin:B")
    assert "\n" not in str(exc.value)


def test_every_back_end_declares_the_contract() -> None:
    """Each registered class (and the test's simulations) says whether it times as consumers call it, and one
    that says so defines the consumer methods itself; the others refuse them plainly."""
    classes = [backend_class(name) for name in BACKENDS] + [SimulatedGPU, LaunchTimed]
    for cls in classes:
        assert isinstance(cls.times_as_consumers, bool), cls
        overridden = {m for m in CONSUMER_METHODS if getattr(cls, m) is not getattr(BaseBackend, m)}
        assert overridden == set(CONSUMER_METHODS) if cls.times_as_consumers else True, cls
    assert {n for n in BACKENDS if backend_class(n).times_as_consumers} == {n for n in BACKENDS
                                                                           if backend_class(n).measures_device}
    with pytest.raises(NotImplementedError, match="does not time kernels as consumers"):
        backend_class("cpu")().sync()
