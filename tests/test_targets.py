"""Targets as data (issue 12): one table says which vendor runs a target, its source suffix, its MLX
constructor and whether the interpreter runs it. It is one of the shared rules (``kernsearch._rules``): the exported
dispatcher reads the same rows (tests/test_rules.py)."""

from __future__ import annotations

from typing import get_args

import pytest

from kernsearch import KernsearchError
from kernsearch.backends import BACKENDS, backend_class
from kernsearch.hardware._chips import registry
from kernsearch.hardware._targets import TARGETS, TargetName, chip_target, get_target, interpretable, target_of


def test_the_table_answers_what_callers_ask() -> None:
    assert target_of("apple") == "metal" and target_of("nvidia") == "cuda" and target_of("cpu") is None
    assert chip_target("cpu") == "metal"  # no GPU here: commands render the default target
    assert interpretable("metal") and not interpretable("cuda")
    assert get_target("cuda").suffix == "cu" and get_target("metal").factory == "mlx.core:fast.metal_kernel"
    with pytest.raises(KernsearchError, match="unknown target 'vulkan'"):
        get_target("vulkan")


def test_the_validated_type_and_the_registry_name_the_table_s_targets() -> None:
    assert set(get_args(TargetName)) == set(TARGETS)
    vendors = {chip.vendor for chip in registry().values()}
    assert {t.vendor for t in TARGETS.values()} <= vendors  # every target runs on chips the registry knows
    # every target has a back-end that measures it; every back-end's target is in the table
    measured = {backend_class(n).target for n in BACKENDS if backend_class(n).measures_device}
    assert measured == set(TARGETS)
    assert {backend_class(n).target for n in BACKENDS} - {None} <= set(TARGETS)


def test_each_row_names_its_kernel_factory_and_callers_build_through_it() -> None:
    from kernsearch.hardware._targets import kernel_factory

    mx = pytest.importorskip("mlx.core")
    assert kernel_factory("metal") is mx.fast.metal_kernel and kernel_factory("cuda") is mx.fast.cuda_kernel
    assert kernel_factory("unknown") is mx.fast.metal_kernel  # a record naming no known target: the default's
    assert {t.language for t in TARGETS.values()} == {"Metal", "CUDA"}
