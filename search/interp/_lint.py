"""The MSL subset the interpreter runs; anything outside it is rejected with one line before compiling.

``docs/msl-subset.md`` describes the subset in words; keep the two in step.
"""

from __future__ import annotations

import re

from ._source import _TG_ARRAY, _TG_POINTER, _TG_SCALAR

#: simd / simdgroup functions the shim implements.
SIMD_FUNCTIONS = frozenset({
    "simd_sum", "simd_max", "simd_min", "simd_product", "simd_prefix_inclusive_sum", "simd_prefix_exclusive_sum",
    "simd_shuffle", "simd_shuffle_xor", "simd_shuffle_up", "simd_shuffle_down", "simd_broadcast",
    "simdgroup_barrier", "simdgroup_matrix", "simdgroup_load", "simdgroup_store", "simdgroup_multiply",
    "simdgroup_multiply_accumulate", "simdgroup_float8x8", "simdgroup_half8x8", "simdgroup_bfloat8x8",
    "simdgroup_index_in_threadgroup", "simdgroups_per_threadgroup", "simd_size",
})

#: metal:: (and metal::fast:: / metal::precise::) names the shim implements.
METAL_NAMES = frozenset({
    "exp", "exp2", "exp10", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf",
    "floor", "ceil", "round", "trunc", "fabs", "abs", "max", "min", "fmax", "fmin", "clamp", "pow", "powr", "fma",
    "dot", "select", "mix", "divide", "precise_divide", "isnan", "isinf", "isfinite", "numeric_limits", "fast",
    "precise", "mem_flags", "threadgroup_barrier", "simdgroup_barrier", "as_type", *SIMD_FUNCTIONS,
})

_HEADERS = re.compile(r"#\s*include\s*[<\"]([^>\"]+)[>\"]")
_ALLOWED_HEADERS = frozenset({"metal_stdlib", "metal_math", "metal_simdgroup", "metal_simdgroup_matrix",
                              "metal_compute", "metal_integer", "metal_common", "metal_relational", "metal_tensor",
                              "MetalPerformancePrimitives/MetalPerformancePrimitives.h"})
#: A tensor view's element type names its address space: `tensor<threadgroup T, ...>`.
_TENSOR_SPACE = re.compile(r"\btensor\s*<\s*(?:const\s+)?(?:threadgroup|device|constant)\b")
_REJECT = [
    (re.compile(r"\b(?:texture[123]d\w*|texture_buffer|depth2d\w*|sampler)\b"), "textures and samplers"),
    (re.compile(r"\bimageblock\w*|threadgroup_imageblock"), "imageblocks"),
    (re.compile(r"\bquad_\w+\b"), "quad-group functions"),
    (re.compile(r"\[\["), "attributes ([[...]]) inside the kernel source or header"),
    (re.compile(r"\bmem_texture\b"), "texture memory fences"),
    (re.compile(r"\b(?:visible_function_table|intersection_function_table|raytracing)\b"), "function tables"),
    (re.compile(r"\bdouble\b"), "double (Metal has no 64-bit floats)"),
]
_SIMD_IDENT = re.compile(r"\b(simd(?:group)?_\w+)\b")
_METAL_QUALIFIED = re.compile(r"\bmetal::(?:(?:fast|precise)::)?(\w+)")
_MATRIX = re.compile(r"\bsimdgroup_matrix\s*<\s*\w+\s*,\s*(\d+)\s*,\s*(\d+)\s*>")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def lint(header: str, source: str) -> str | None:
    """The first construct outside the supported subset, as a one-line message, or None."""
    for part, text in (("header", header), ("source", source)):
        code = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)

        def where(pos: int, part: str = part, code: str = code) -> str:
            return f"{part} line {code.count(chr(10), 0, pos) + 1}"

        for m in _HEADERS.finditer(code):
            if m.group(1) not in _ALLOWED_HEADERS:
                return f"{where(m.start())}: #include <{m.group(1)}> is outside the interpreter's MSL subset"
        for pattern, what in _REJECT:
            hit = pattern.search(code)
            if hit:
                return f"{where(hit.start())}: {what} ({hit.group(0)!r}) are outside the interpreter's MSL subset"
        for m in _SIMD_IDENT.finditer(code):
            if m.group(1) not in SIMD_FUNCTIONS:
                return f"{where(m.start())}: {m.group(1)} is outside the interpreter's MSL subset"
        for m in _METAL_QUALIFIED.finditer(code):
            if m.group(1) not in METAL_NAMES:
                return f"{where(m.start())}: metal::{m.group(1)} is outside the interpreter's MSL subset"
        for m in _MATRIX.finditer(code):
            if (m.group(1), m.group(2)) != ("8", "8"):
                return f"{where(m.start())}: simdgroup_matrix of {m.group(1)}x{m.group(2)} (only 8x8 is supported)"
        rest = _TENSOR_SPACE.sub("", _TG_POINTER.sub("", _TG_SCALAR.sub("", _TG_ARRAY.sub("", code))))
        found = re.search(r"\bthreadgroup\b(?!_)", rest)
        if found:
            return (f"{where(found.start())}: this threadgroup declaration is outside the interpreter's MSL subset "
                    "(use a 1-D array `threadgroup T name[N];` or a pointer `threadgroup T* p`)")
    return None
