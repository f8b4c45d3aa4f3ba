"""The corpus (tests/corpus/): kernels in the style of public Metal kernels (MLX's documentation and kernels,
llama.cpp's Metal kernels, public reductions, scans, histograms), each with a NumPy reference, run as written
in fast and check mode; classic races are expected detections."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from kernsearch import KernelSource
from kernsearch._errors import VariantFailure
from kernsearch.interp import fuzz_schedule, run_kernel

CORPUS = Path(__file__).parent / "corpus"
sys.path.insert(0, str(CORPUS))
FILES = sorted(p for p in CORPUS.glob("k*.py"))


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"corpus_{path.stem}", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def launch(case, name: str):
    kernel = KernelSource(name=name, target="metal", input_names=tuple(case.inputs), output_names=tuple(case.outputs),
                          header=case.header, source=case.source, template=case.template)
    args = dict(grid=case.grid, threadgroup=case.threadgroup, output_shapes=[s for s, _ in case.outputs.values()],
                output_dtypes=[d for _, d in case.outputs.values()], inputs=list(case.inputs.values()),
                dtype=case.dtype, init_value=case.init_value, input_dtypes=case.input_dtypes,
                atomic_outputs=case.atomic_outputs)
    return kernel, args


def test_corpus_is_documented_and_large_enough():
    assert len(FILES) >= 60  # issue 29: at least 60 kernels, 95 % of them run as written
    outside = 0
    for path in FILES:
        mod = load(path)
        assert mod.MODELLED_ON and mod.FEATURES, path.name
        case = mod.case()
        if case.expect == "outside":
            outside += 1
            assert case.reason, path.name
    assert outside <= len(FILES) * 0.05
    doc = " ".join((Path(__file__).resolve().parents[1] / "docs" / "msl-subset.md").read_text().split())
    n, ok = len(FILES), len(FILES) - outside
    assert f"holds {n} kernels" in doc and f"{ok} of {n} run as written ({100 * ok / n:.1f} %)" in doc


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "check"])
@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_corpus_kernel(path, mode):
    case = load(path).case()
    kernel, args = launch(case, path.stem)
    if case.expect == "outside":  # refused or a compile error, never a silent wrong answer; fast mode refuses
        try:
            r = run_kernel(kernel, mode=mode, **args)
        except VariantFailure as exc:
            assert exc.reason in ("unsupported", "compile")
            return
        assert mode != "fast", "a kernel documented outside the subset ran in fast mode"
        expected = case.reference(**{k: np.asarray(v) for k, v in case.inputs.items()})
        for got, want in zip(r.outputs, expected):
            np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol)
        return
    if case.expect == "order":
        r = fuzz_schedule(kernel, mode=mode, **args)
        assert r.order_dependent, "the schedule fuzz must report this kernel"
        return
    r = run_kernel(kernel, mode=mode, **args)
    errors = [d for d in r.diagnostics if d.severity == "error"]
    if case.expect == "race":
        if mode == "check":
            assert any(d.kind == "race" for d in errors), r.diagnostics
        return
    assert errors == [], errors
    if case.lockstep and mode == "check":
        assert any(d.kind == "simdgroup_synchronous" and d.severity == "warning" for d in r.diagnostics), r.diagnostics
    expected = case.reference(**{k: np.asarray(v) for k, v in case.inputs.items()})
    for name, got, want in zip(case.outputs, r.outputs, expected):
        want = np.asarray(want)
        if np.issubdtype(got.dtype, np.integer) or got.dtype == np.bool_:
            assert np.array_equal(got, want), name
        else:
            np.testing.assert_allclose(got, want, rtol=case.rtol, atol=case.atol, err_msg=name)
