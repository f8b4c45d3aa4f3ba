"""docs/msl-subset.md, the lint's lists and the shim agree: the document's lists are generated from the lint,
and every name the lint lets through is defined by the shim."""

from __future__ import annotations

import re
from pathlib import Path

from kernsearch.interp._compile import SHIM_DIR
from kernsearch.interp._lint import ATOMIC_NAMES, MATH_FUNCTIONS, MLX_NAMES, SIMD_FUNCTIONS, lint, render_subset_doc

DOC = Path(__file__).resolve().parents[1] / "docs" / "msl-subset.md"


def shim_text() -> str:
    text = "\n".join(p.read_text() for p in sorted(SHIM_DIR.iterdir()) if p.is_file())
    text += "".join(f" atomic_fetch_{n}_explicit(" for n in re.findall(r"KS_ATOMIC_RMW\((\w+),", text))
    for name in re.findall(r"\bP##_(\w+)\(", text):
        text += f" simd_{name}( quad_{name}("
    return text


def test_the_document_lists_are_generated_from_the_lint():
    text = DOC.read_text()
    assert render_subset_doc(text) == text, "run: python -m kernsearch.interp._lint docs/msl-subset.md"
    for name in MATH_FUNCTIONS | {n for n in SIMD_FUNCTIONS if not n.endswith("8x8") and n != "simdgroup_matrix"}:
        assert f"`{name}`" in text, name


def test_every_name_the_lint_allows_is_defined_by_the_shim():
    text = shim_text()
    missing = [n for n in sorted(MATH_FUNCTIONS | SIMD_FUNCTIONS | ATOMIC_NAMES | MLX_NAMES)
               if not re.search(rf"(?:\b{n}\s*[(<{{]|KS_(?:UNARY|BINARY)\({n},|typedef [^;]*\b{n};|struct {n}\b|"
                                rf"\b{n}\s*=|enum {n}\b)", text)]
    assert missing == []


def test_lint_accepts_simd_variable_names_and_own_helpers_but_not_unknown_calls():
    assert lint("", "uint simd_lane_id = thread_index_in_simdgroup; uint simd_group_id = 0; uint quad_id = 1;") is None
    assert lint("float simd_reduce(float x) { return simd_sum(x); }", "float y = simd_reduce(1.0f);") is None
    assert "simd_frobnicate" in (lint("", "float y = simd_frobnicate(1.0f);") or "")
