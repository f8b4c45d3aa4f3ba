"""A family's parameters (``eps``) reach its CUDA kernels as compiled-in literals, not as reads of their 1-element
arrays: on MLX's CUDA back-end an array of at most 8 bytes lives in a managed pool in host memory, so every read of
it is a round trip over the bus (an H200's norm + Q/K/V kernel: 32 µs reading ``eps[0]``, 16 µs with the literal;
benchmarks/gpu_results.md, sixth session)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import builtin_families

from kernsearch import Space, get_chip, load_family, make_problem, render
from kernsearch.family._render import param_literals
from kernsearch.family._spec import Param

WITH_PARAMS = [n for n in builtin_families() if load_family(n).params]


def test_the_families_with_parameters_are_found() -> None:
    assert {"rmsnorm", "layernorm", "rmsnorm_qmatvec", "rmsnorm_swiglu_qmatvec", "mlp_block"} <= set(WITH_PARAMS)


@pytest.mark.parametrize("name", WITH_PARAMS)
def test_no_cuda_kernel_reads_a_parameter_from_memory(name: str) -> None:
    fam = load_family(name)
    chip = get_chip("H100")
    space = Space(make_problem(fam, ",".join(str(v) for v in fam.problem.default_shape), "float16", chip), chip)
    configs = space.enumerate().valid
    paths = {c.get("PATH") for c in configs}
    for path in paths:  # each code path of the family (the qmatvec core: mma, fma, h2)
        cfg = next(c for c in configs if c.get("PATH") == path)
        source = render(fam, cfg, "float16", "cuda").source
        for pname, literal in param_literals(fam).items():
            assert not re.search(rf"\b{pname}\s*\[", source), (name, path, pname)
            assert literal in source, (name, path, pname)


@pytest.mark.parametrize(("value", "dtype", "literal"), [
    (1e-5, "float32", "9.999999747e-06f"),
    (1e-6, "float32", "9.999999975e-07f"),
    (3, "int32", "3"),
    (-7, "int32", "-7"),
    (4000000000, "uint32", "4000000000u"),
])
def test_literals_are_the_arrays_values(value: float, dtype: str, literal: str) -> None:
    fam = load_family("rmsnorm").model_copy(update={"params": {"p": Param(value=value, dtype=dtype)}})
    got = param_literals(fam)["p"]
    assert got == literal
    if dtype == "float32":  # the literal parses back to the float32 the array holds
        assert np.float32(float(got[:-1])) == np.float32(value)
