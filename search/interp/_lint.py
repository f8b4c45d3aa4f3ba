"""The MSL subset the interpreter runs; anything outside it is rejected with one line before compiling.

``docs/msl-subset.md`` describes the subset in words; keep the two in step.
"""

from __future__ import annotations

import re

from ._syntax import _TG_ARRAY, _TG_ARRAY_MD, _TG_CAST, _TG_CAST_NAMED, _TG_POINTER, _TG_ROW_POINTER, _TG_SCALAR

#: simd / simdgroup / quad functions the shim implements (ks_shim.h, ks_simd.h).
_GROUP_COMMON = ("all", "any", "ballot", "and", "or", "xor", "prefix_inclusive_product", "prefix_exclusive_product",
                 "broadcast_first", "shuffle_rotate_up", "shuffle_rotate_down", "shuffle_and_fill_up",
                 "shuffle_and_fill_down", "is_first", "sum", "max", "min", "product", "prefix_inclusive_sum",
                 "prefix_exclusive_sum", "shuffle", "shuffle_xor", "shuffle_up", "shuffle_down", "broadcast")
SIMD_FUNCTIONS = frozenset({
    *(f"simd_{n}" for n in _GROUP_COMMON), *(f"quad_{n}" for n in _GROUP_COMMON), "simd_active_threads_mask",
    "simdgroup_barrier", "simdgroup_matrix", "simdgroup_load", "simdgroup_store", "simdgroup_multiply",
    "simdgroup_multiply_accumulate", "simdgroup_float8x8", "simdgroup_half8x8", "simdgroup_bfloat8x8",
    "make_filled_simdgroup_matrix",
})

#: metal:: (and metal::fast:: / metal::precise::) names the shim implements (ks_shim.h, ks_math.h, ks_atomic.h).
MATH_FUNCTIONS = frozenset({
    "exp", "exp2", "exp10", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "cbrt", "sin", "cos", "tan",
    "sinh", "cosh", "tanh", "asin", "acos", "atan", "atan2", "asinh", "acosh", "atanh", "sinpi", "cospi", "tanpi",
    "sincos", "erf", "erfc", "lgamma", "tgamma", "floor", "ceil", "round", "rint", "trunc", "fract", "fmod", "modf",
    "frexp", "ldexp", "copysign", "sign", "step", "smoothstep", "saturate", "fabs", "abs", "max", "min", "fmax",
    "fmin", "fmax3", "fmin3", "max3", "min3", "fmedian3", "median3", "fdim", "hypot", "nextafter", "clamp", "pow",
    "powr", "fma", "mad", "recip", "dot", "cross", "length", "length_squared", "distance", "normalize", "select",
    "mix", "divide", "precise_divide", "isnan", "isinf", "isfinite", "isnormal", "signbit", "isordered",
    "isunordered", "any", "all", "popcount", "clz", "ctz", "rotate", "mulhi", "absdiff", "hadd", "rhadd", "addsat",
    "subsat", "extract_bits", "insert_bits", "reverse_bits", "as_type", "numeric_limits", "transpose",
})
ATOMIC_NAMES = frozenset({
    "atomic", "atomic_int", "atomic_uint", "atomic_bool", "atomic_float", "atomic_ulong", "atomic_load_explicit",
    "atomic_store_explicit", "atomic_exchange_explicit", "atomic_compare_exchange_weak_explicit",
    "atomic_compare_exchange_strong_explicit", "atomic_fetch_add_explicit", "atomic_fetch_sub_explicit",
    "atomic_fetch_and_explicit", "atomic_fetch_or_explicit", "atomic_fetch_xor_explicit", "atomic_fetch_min_explicit",
    "atomic_fetch_max_explicit", "atomic_thread_fence", "memory_order", "memory_order_relaxed", "thread_scope",
})
#: Matrix types (ks_matrix.h).
MATRIX_NAMES = frozenset({"matrix", *(f"{t}{c}x{r}" for t in ("float", "half") for c in "234" for r in "234")})
METAL_NAMES = frozenset({
    *MATH_FUNCTIONS, *MATRIX_NAMES, *ATOMIC_NAMES, "fast", "precise", "mem_flags", "threadgroup_barrier", "simd_vote",
    *SIMD_FUNCTIONS,
})
#: What MLX's utilities header gives every kernel body (ks_mlx.h).
MLX_NAMES = frozenset({"Limits", "WorkPerThread", "ceildiv", "elem_to_loc", "elem_to_loc_1", "elem_to_loc_2",
                       "elem_to_loc_3", "elem_to_loc_2_nd", "elem_to_loc_3_nd", "LoopedElemToLoc", "float16_t",
                       "bfloat16_t", "cast_to", "complex64_t", "ConditionalType", "bfloat16_to_uint16",
                       "uint16_to_bfloat16", "MAX_REDUCE_SPECIALIZED_DIMS", "REDUCE_N_READS", "REDUCE_N_WRITES",
                       "SOFTMAX_N_READS", "RMS_N_READS", "RMS_LOOPED_LIMIT"})

_HEADERS = re.compile(r"#\s*include\s*[<\"]([^>\"]+)[>\"]")
_ALLOWED_HEADERS = frozenset({"metal_stdlib", "metal_math", "metal_simdgroup", "metal_simdgroup_matrix",
                              "metal_compute", "metal_integer", "metal_common", "metal_relational", "metal_tensor",
                              "metal_atomic", "metal_geometric", "metal_types",
                              "MetalPerformancePrimitives/MetalPerformancePrimitives.h"})
#: A tensor view's element type names its address space: `tensor<threadgroup T, ...>`.
_TENSOR_SPACE = re.compile(r"\btensor\s*<\s*(?:const\s+)?(?:threadgroup|device|constant)\b")
_REJECT = [
    (re.compile(r"\b(?:texture[123]d\w*|texture_buffer|depth2d\w*|sampler)\b"), "textures and samplers"),
    (re.compile(r"\bimageblock\w*|threadgroup_imageblock"), "imageblocks"),
    (re.compile(r"\[\["), "attributes ([[...]]) inside the kernel source or header"),
    (re.compile(r"\bmem_texture\b"), "texture memory fences"),
    (re.compile(r"\b(?:visible_function_table|intersection_function_table|raytracing)\b"), "function tables"),
    (re.compile(r"\bdouble\b"), "double (Metal has no 64-bit floats)"),
]
#: Only calls are checked: `simd_lane_id`, `simd_group_id` ... are variable names in real kernels.
_SIMD_IDENT = re.compile(r"\b((?:simd|simdgroup|quad)_\w+)\s*(?:<[^;<>()]*>\s*)?\(")
_METAL_QUALIFIED = re.compile(r"\bmetal::(?:(?:fast|precise)::)?(\w+)")
#: A function the kernel defines itself (`float simd_reduce(float x) {`), which the lint must not reject.
_DEFINITION = re.compile(r"\b(\w+)[\s>&*]+((?:simd|simdgroup|quad)_\w+)\s*\(")
_NOT_TYPES = frozenset({"return", "else", "case", "do", "co_return", "throw"})
_MATRIX = re.compile(r"\bsimdgroup_matrix\s*<\s*\w+\s*,\s*(\d+)\s*,\s*(\d+)\s*>")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def lint(header: str, source: str) -> str | None:
    """The first construct outside the supported subset, as a one-line message, or None."""
    defined = {d.group(2) for d in _DEFINITION.finditer(_COMMENT.sub("", header + "\n" + source))
               if d.group(1) not in _NOT_TYPES}
    for part, text in (("header", header), ("source", source)):
        code = _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        found = _first_outside(code, defined)
        if found is not None:
            return f"{part} line {code.count(chr(10), 0, found[0]) + 1}: {found[1]}"
    return None


def _first_outside(code: str, defined: set[str]) -> tuple[int, str] | None:
    """The first construct of one part (comments blanked) outside the subset: (where in ``code``, what)."""
    for m in _HEADERS.finditer(code):
        if m.group(1) not in _ALLOWED_HEADERS:
            return m.start(), f"#include <{m.group(1)}> is outside the interpreter's MSL subset"
    for pattern, what in _REJECT:
        hit = pattern.search(code)
        if hit:
            return hit.start(), f"{what} ({hit.group(0)!r}) are outside the interpreter's MSL subset"
    for m in _SIMD_IDENT.finditer(code):
        if m.group(1) not in SIMD_FUNCTIONS and m.group(1) not in defined:
            return m.start(), f"{m.group(1)} is outside the interpreter's MSL subset"
    for m in _METAL_QUALIFIED.finditer(code):
        if m.group(1) not in METAL_NAMES:
            return m.start(), f"metal::{m.group(1)} is outside the interpreter's MSL subset"
    for m in _MATRIX.finditer(code):
        if (m.group(1), m.group(2)) != ("8", "8"):
            return m.start(), f"simdgroup_matrix of {m.group(1)}x{m.group(2)} (only 8x8 is supported)"
    rest = code
    for declared in (_TG_ARRAY_MD, _TG_ARRAY, _TG_SCALAR, _TG_ROW_POINTER, _TG_POINTER, _TG_CAST, _TG_CAST_NAMED,
                     _TENSOR_SPACE):
        rest = declared.sub("", rest)
    found = re.search(r"\bthreadgroup\b(?!_)", rest)
    if found:
        return found.start(), ("this threadgroup declaration is outside the interpreter's MSL subset "
                               "(use a 1-D array `threadgroup T name[N];` or a pointer `threadgroup T* p`)")
    return None


def subset_lists() -> dict[str, str]:
    """The generated lists of ``docs/msl-subset.md`` (between ``<!-- name -->`` markers), from the sets above."""
    import textwrap

    def fmt(names: frozenset[str]) -> str:
        return textwrap.fill(" ".join(f"`{n}`" for n in sorted(names)), 110, initial_indent="  ",
                             subsequent_indent="  ")
    return {"math": fmt(MATH_FUNCTIONS), "simd": fmt(SIMD_FUNCTIONS - {"simdgroup_matrix", "simdgroup_float8x8",
                                                                      "simdgroup_half8x8", "simdgroup_bfloat8x8"}),
            "mlx": fmt(MLX_NAMES)}


def render_subset_doc(text: str) -> str:
    """``text`` (the subset document) with its generated lists brought up to date."""
    for name, body in subset_lists().items():
        def fill(m: re.Match[str], body: str = body) -> str:
            return m.group(1) + "\n" + body + "\n  " + m.group(2)

        text = re.sub(rf"(<!-- {name} -->).*?(<!-- /{name} -->)", fill, text, flags=re.S)
    return text


if __name__ == "__main__":  # python -m kernsearch.interp._lint docs/msl-subset.md: regenerate the lists
    import sys
    from pathlib import Path

    doc = Path(sys.argv[1])
    doc.write_text(render_subset_doc(doc.read_text()))
