"""The kernel a search's worker compiles ahead is the very kernel its timing then launches: the same name, template
arguments, source, header and signature (the input and output dtypes MLX generates it from), in every way the
worker launches it (the compile, the verification run, the consumer call the timing makes). MLX finds a compiled
custom kernel by its name, template arguments and a hash of that generated source (``docs/timing.md``): a
difference is another kernel, compiled again on the timing path. Checked on the CPU with a recording stand-in for
``mx.fast.cuda_kernel``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest


class _Recorder:
    """Stands in for ``mx.fast.cuda_kernel``: records what MLX would build its kernel (and cache key) from."""

    def __init__(self, mx: Any, seen: list[tuple], **spec: Any) -> None:
        self.mx, self.seen, self.spec = mx, seen, spec

    def __call__(self, *, inputs: list, template: list, grid: tuple, threadgroup: tuple, output_shapes: list,
                 output_dtypes: list, init_value: float | None = None) -> list:
        spec = self.spec
        self.seen.append((spec["name"], spec["source"], spec["header"], tuple(spec["input_names"]),
                          tuple(spec["output_names"]), tuple((k, str(v)) for k, v in template),
                          tuple((str(a.dtype), a.ndim > 0) for a in inputs), tuple(map(str, output_dtypes))))
        return [self.mx.zeros(tuple(s), dtype=d) for s, d in zip(output_shapes, output_dtypes)]


@pytest.mark.parametrize(("family", "shape"), [("gemm", "64,64,64"), ("layernorm", "8,256"),
                                               ("qmatvec", "1,256,512,64,8")])
def test_the_compile_the_verification_and_the_consumer_call_build_one_kernel(family, shape, monkeypatch) -> None:
    import mlx.core as mx

    from kernsearch import Space, geometry, get_chip, load_family, make_problem, render
    from kernsearch.backends import _mlx_base
    from kernsearch.backends._mlx_cuda import CudaBackend
    from kernsearch.evaluation._verify import kernel_inputs, make_inputs
    from kernsearch.hardware import _targets

    seen: list[tuple] = []
    fast = SimpleNamespace(cuda_kernel=lambda **spec: _Recorder(mx, seen, **spec))
    shim = SimpleNamespace(**{n: getattr(mx, n) for n in dir(mx) if not n.startswith("__")})
    shim.fast = fast
    monkeypatch.setattr(_mlx_base, "mx_core", lambda: shim)
    # the kernel is built by its target row's factory (``_targets.kernel_factory``): the recorder stands in for it
    monkeypatch.setattr(_targets, "kernel_factory", lambda target: fast.cuda_kernel)
    monkeypatch.setattr(CudaBackend, "check_available", lambda self: None)

    chip = get_chip("H100")
    fam = load_family(family)
    problem = make_problem(fam, shape, "float16", chip)
    space = Space(problem, chip)
    cfg = dict(fam.default) if space.is_valid(dict(fam.default)) else space.enumerate().valid[0]
    geo = geometry(space, cfg)
    kernel = render(fam, cfg, "float16", "cuda")
    logical = make_inputs(problem, 0)
    inputs = kernel_inputs(problem, logical, geo)

    backend = CudaBackend()  # the worker's: the compile, then in the same process the verification and timing
    backend.precompile(kernel, geo, [tuple(x.shape) for x in inputs], "float16")
    backend.run(kernel, geo, inputs, "float16")
    backend.consumer_kernel(kernel, geo, fam, problem, [logical])(0)
    # the verification launches twice (NaN-filled, then poison-filled: the guard zones), one kernel throughout
    assert len(seen) == 4
    assert all(s == seen[0] for s in seen), [s[6] for s in seen]
