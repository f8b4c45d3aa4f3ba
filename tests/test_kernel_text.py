"""What reaches MLX's kernel factory: a CUDA source without its comments, indentation and blank lines (MLX's CUDA
back-end rebuilds and hashes the whole source on every call: host time per KB), handed over as an ``#include`` of
a file holding it (tests/test_kernel_include.py), from the search's device runs and from the exported package alike;
the store keeps the source as rendered, readable."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kernsearch import Space, get_chip, load_family, make_problem, render
from kernsearch._rules import compact, factory_texts, kernel_text
from kernsearch.backends._mlx_base import MLXBackend
from kernsearch.exporting.runtime import _runtime
from kernsearch.family._render import geometry


def test_compact_drops_comments_indentation_and_blank_lines_only() -> None:
    text = ('    // a comment line\n\n#pragma unroll\n        for (int i = 0; i < N; ++i) {  // why\n'
            '            asm volatile("ld.global.u32 %0, [%1]; // kept: inside a string" : "=r"(v) : "l"(p));\n'
            '        }\n')
    assert compact(text) == ('#pragma unroll\nfor (int i = 0; i < N; ++i) {\n'
                             'asm volatile("ld.global.u32 %0, [%1]; // kept: inside a string" : "=r"(v) : "l"(p));\n'
                             '}\n')


def _text(handed: str) -> str:
    """The text the factory was handed: the file an ``#include`` line names, else the text itself."""
    found = re.match(r'#include "([^"]+)"\n', handed)
    return Path(found.group(1)).read_text() if found else handed


def _qmatvec() -> tuple[Any, Any, Any]:
    fam = load_family("qmatvec")
    chip = get_chip("H200")
    space = Space(make_problem(fam, "1,4096,4096,512,64", "float16", chip), chip)
    config = space.parse_config("PATH=h2,KS=1,TW=1,RT=2,UNROLL=2,MB=1")
    return fam, space, config


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_the_factory_gets_compact_cuda_and_the_metal_source_as_rendered(monkeypatch, target: str) -> None:  # noqa: ANN001
    fam, space, config = _qmatvec()
    if target == "metal":
        config = space.family.default
    source = render(fam, config, "float16", target)
    assert "//" in source.source  # the stored source stays readable
    seen: dict[str, Any] = {}

    def factory(**kwargs: Any) -> str:
        seen.update(kwargs)
        return "kernel"

    monkeypatch.setattr(_runtime, "kernel_factory", lambda _target: factory)
    record = {"name": source.name, "input_names": source.input_names, "output_names": source.output_names,
              "source": source.source, "header": source.header, "target": target}
    assert _runtime._mlx_kernel(record, 1024) == "kernel"
    want = compact if target == "cuda" else (lambda t: t)
    assert _text(seen["source"]) == want(source.source) and _text(seen["header"]) == want(source.header)
    assert _text(seen["source"]) == kernel_text(target, source.source)
    assert seen["source"] == factory_texts(target, source.header, source.source).source


@pytest.mark.slow
def test_the_search_builds_its_device_kernels_from_the_same_text(monkeypatch) -> None:  # noqa: ANN001
    from kernsearch.hardware import _targets

    fam, space, config = _qmatvec()
    source = render(fam, config, "float16", "cuda")
    seen: dict[str, Any] = {}
    monkeypatch.setattr(_targets, "kernel_factory", lambda _target: lambda **kw: seen.update(kw) or "kernel")
    backend = object.__new__(MLXBackend)
    assert backend._make_kernel(source, geometry(space, config)) == "kernel"
    assert _text(seen["source"]) == compact(source.source) and len(compact(source.source)) < 0.8 * len(source.source)
    assert seen["source"].startswith("#include") and len(seen["source"]) < 200
