"""`bench decode`'s second yardstick (search/bench/_call_stream.py): the streaming read called and chained as the
package's fused call is. Its Metal kernel runs on the interpreter (every weight byte folded, nothing read out of
bounds, the output of the call's shape written from X), its CUDA kernel compiles with nvcc, names from a family
spec reach the source only as identifiers, and a kernel row's chain feeds it as it feeds the package's call."""

from __future__ import annotations

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch._errors import KernsearchError
from kernsearch.bench._call_stream import CallShape, call_stream_source

MAGIC = 0x9E3779B9
NAMES = ("X", "W", "S", "Bq", "R")


def _fold(arrays: dict[str, np.ndarray]) -> int:
    """What the kernel folds of the weights: their 16-byte words by 32-bit lanes, then their tail bytes."""
    out = 0
    for name in ("W", "S", "Bq"):
        raw = arrays[name].tobytes()
        whole = len(raw) // 16 * 16
        for word in np.frombuffer(raw[:whole], dtype=np.uint32):
            out ^= int(word)
        for byte in raw[whole:]:
            out ^= byte
    return out


def _arrays(fold_to_magic: bool) -> dict[str, np.ndarray]:
    """A residual call's inputs: X [2, 40] and R [2, 6] float16; W [6, 5] uint32 (120 bytes: 7 words and a tail
    of 8 bytes), S and Bq [6, 3] float16 (36 bytes: 2 words and 4). Where ``fold_to_magic``, W's first word is set
    so that everything the kernel folds XORs to the magic value (then the kernel's thread 0 says so in Y[0])."""
    rng = np.random.default_rng(3)
    a = {"X": rng.standard_normal((2, 40)).astype(np.float16),
         "W": rng.integers(0, 2**32, (6, 5), dtype=np.uint64).astype(np.uint32),
         "S": rng.standard_normal((6, 3)).astype(np.float16), "Bq": rng.standard_normal((6, 3)).astype(np.float16),
         "R": rng.standard_normal((2, 6)).astype(np.float16)}
    a["W"][0, 0] = 0
    if fold_to_magic:
        a["W"][0, 0] = MAGIC ^ _fold(a)
        assert _fold(a) == MAGIC
    else:
        assert _fold(a) != MAGIC
    return a


def _shape() -> CallShape:
    return CallShape(NAMES, {"W": 120, "S": 36, "Bq": 36}, 80, "Y", (2, 6))


@pytest.mark.parametrize("fold_to_magic", [False, True])
def test_the_metal_read_folds_every_weight_byte_and_writes_the_calls_output(fold_to_magic: bool) -> None:
    from kernsearch.interp import run_kernel

    arrays = _arrays(fold_to_magic)
    kernel = KernelSource("call_stream", "metal", NAMES, ("Y",), "", call_stream_source("metal", _shape()))
    for grid in (1, 64):  # one thread reads everything (its fold is the whole fold), then a grid-stride loop
        got = run_kernel(kernel, (grid, 1, 1), (min(grid, 32), 1, 1), [(2, 6)], ["float16"], list(arrays.values()),
                         "float16", mode="sanitize")
        assert [d for d in got.diagnostics if d.severity == "error"] == []  # no read outside any input
        want = np.resize(arrays["X"].reshape(-1), 12).reshape(2, 6)
        if fold_to_magic and grid == 1:
            want.reshape(-1)[0] = arrays["X"].reshape(-1)[-1]
        assert np.array_equal(got.outputs[0], want), (grid, got.outputs[0], want)


def test_the_cuda_read_compiles() -> None:
    from nvcc import NVCC, nvcc

    if NVCC is None:
        pytest.skip("no nvcc here")
    types = {"X": "__half", "W": "uint32_t", "S": "__half", "Bq": "__half", "R": "__half"}
    args = ", ".join([f"const {types[n]}* {n}" for n in NAMES] + ["__half* Y"])
    unit = (f"#include <cuda_fp16.h>\n#include <cstdint>\n__global__ void k({args}) {{\n"
            f"{call_stream_source('cuda', _shape())}}}\n")
    done = nvcc(["--ptx", "-arch=sm_90"], unit)
    assert done.returncode == 0, done.stderr[:2000]


@pytest.mark.parametrize("bad", ["X; system(0)", "W[0]", "Wé", ""])
def test_a_name_that_is_not_an_identifier_never_reaches_the_source(bad: str) -> None:
    with pytest.raises(KernsearchError, match="not a plain identifier"):
        call_stream_source("cuda", CallShape(("X", bad), {bad: 16}, 4, "Y", (1, 4)))
    with pytest.raises(KernsearchError, match="not a plain identifier"):
        call_stream_source("metal", CallShape(("X", "W"), {"W": 16}, 4, bad, (1, 4)))


def test_a_kernel_row_chains_the_call_stream_as_it_chains_the_package() -> None:
    """The yardstick's chain is the package call's: the same link feeds X (and R for the residual calls) from the
    previous output; its arrays are the layer's own weights and the family's parameters; the row reads its time."""
    import mlx.core as mx

    from kernsearch.bench._decode import COMPILED, KernelChains, kernel_row
    from kernsearch.bench._step import Call, StepShape, build_layers, call_inputs
    from kernsearch.evaluation._chain import fed_from

    shape = StepShape(hidden=64, ffn=128, layers=3)
    layers = build_layers(mx, shape, 0, lambda s: None)
    seen: dict[str, list[tuple[object, object]]] = {"package": [], "call_stream": []}
    given: list[list[object]] = []

    def package(X, R):  # noqa: ANN001, ANN202, N803
        seen["package"].append((X, R))
        return R + 1 + mx.sum(X)

    def read(arrays):  # noqa: ANN001, ANN202
        given.append(list(arrays))
        x, r = arrays[0], arrays[4]
        seen["call_stream"].append((x, r))
        return r + 1 + mx.sum(x)

    call = Call("down", "qmatvec_residual", 64, 128)
    names = ("X", "W", "S", "Bq", "R")
    chains = KernelChains(mx, shape, layers, [{"down": package}] * 3, None, None,
                          lambda c, m: (names, {}, read))
    forms = chains.forms(call, 2)
    assert "call_stream" in forms and "call_stream" + COMPILED in forms
    mx.eval(forms["package"](), forms["call_stream"]())
    for calls in seen.values():
        assert len(calls) == 3
        for (x0, r0), (x1, r1) in zip(calls, calls[1:]):
            y = r0 + 1 + mx.sum(x0)
            assert mx.array_equal(r1, y).item() and mx.array_equal(x1, fed_from(mx, y, calls[0][0])).item()
    for lay, arrays in zip(layers, given):
        own = call_inputs(lay, "down")
        assert all(arrays[i] is own[n] for i, n in enumerate(names) if n in own)  # the layer's own weights
    t = {"op": [4.0, 4.0], "package": [2.0, 2.0], "call_stream": [1.5, 1.5]}
    row = kernel_row(call, shape, 2, t, 3, "v1")
    assert row.pct_of_call_stream == pytest.approx(75.0) and row.call_stream_us == pytest.approx(500.0)


def test_a_fused_family_whose_eps_is_not_the_steps_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's plain-MLX side normalises with eps 1e-5: a family with another eps would compute another layer.
    (The check read the spec's Param record as if it were the number, so it never refused.)"""
    from kernsearch.bench import _run
    from kernsearch.bench._step import BenchError, StepShape
    from kernsearch.family._spec import load_family

    def other_eps(name: str):  # noqa: ANN202
        fam = load_family(name)
        if "eps" not in fam.params:
            return fam
        return fam.model_copy(update={"params": {"eps": fam.params["eps"].model_copy(update={"value": 1e-6})}})

    assert set(_run.fused_families(StepShape()))  # the shipped families pass
    monkeypatch.setattr(_run, "load_family", other_eps)
    with pytest.raises(BenchError, match="eps 1e-06 is not the step's 1e-05"):
        _run.fused_families(StepShape())
