"""The full kernel exactly as MLX builds it, and its C++ translation for the interpreter.

``mx.fast.metal_kernel`` wraps the body in a generated signature (``mlx/backend/metal/custom_kernel.cpp``):
inputs as ``const device T*`` (``const constant T*`` below 8 elements, ``const constant T&`` when 0-d),
``NAME_shape`` / ``NAME_strides`` / ``NAME_ndim`` only when the body mentions them, outputs as
``device T*``, and the thread attributes the body mentions (substring search), in alphabetical order.
The C++ translation keeps every line where MLX puts it, so ``__LINE__`` is the line of the full kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._lockstep import instrument, loop_tables, sync_lines
from ._syntax import (
    _EXPRESSION_WORDS,
    _TG_ARRAY,
    _TG_ARRAY_MD,
    _TG_CAST,
    _TG_CAST_NAMED,
    _TG_POINTER,
    _TG_ROW_POINTER,
    _TG_SCALAR,
    _VOLATILE_TG,
)

#: Metal thread attributes MLX can pass to a custom kernel: name -> type.
ATTRIBUTES: dict[str, str] = {
    "dispatch_quadgroups_per_threadgroup": "uint",
    "dispatch_simdgroups_per_threadgroup": "uint",
    "dispatch_threads_per_threadgroup": "uint3",
    "grid_origin": "uint3",
    "grid_size": "uint3",
    "quadgroup_index_in_threadgroup": "uint",
    "quadgroups_per_threadgroup": "uint",
    "simdgroup_index_in_threadgroup": "uint",
    "simdgroups_per_threadgroup": "uint",
    "thread_execution_width": "uint",
    "thread_index_in_quadgroup": "uint",
    "thread_index_in_simdgroup": "uint",
    "thread_index_in_threadgroup": "uint",
    "thread_position_in_grid": "uint3",
    "thread_position_in_threadgroup": "uint3",
    "threadgroup_position_in_grid": "uint3",
    "threadgroups_per_grid": "uint3",
    "threads_per_grid": "uint3",
    "threads_per_simdgroup": "uint",
    "threads_per_threadgroup": "uint3",
}

#: How each attribute is computed inside the interpreter (C++ expressions over the launch state).
_ATTRIBUTE_VALUES: dict[str, str] = {
    "dispatch_quadgroups_per_threadgroup": "uint((_n + 3) / 4)",
    "dispatch_simdgroups_per_threadgroup": "uint((_n + 31) / 32)",
    "dispatch_threads_per_threadgroup": "uint3(L->tgsize[0], L->tgsize[1], L->tgsize[2])",
    "grid_origin": "uint3(0u)",
    "grid_size": "uint3(L->grid[0], L->grid[1], L->grid[2])",
    "quadgroup_index_in_threadgroup": "uint(f->tid / 4)",
    "quadgroups_per_threadgroup": "uint((_n + 3) / 4)",
    "simdgroup_index_in_threadgroup": "uint(f->tid / 32)",
    "simdgroups_per_threadgroup": "uint((_n + 31) / 32)",
    "thread_execution_width": "32u",
    "thread_index_in_quadgroup": "uint(f->tid % 4)",
    "thread_index_in_simdgroup": "uint(f->tid % 32)",
    "thread_index_in_threadgroup": "uint(f->tid)",
    "thread_position_in_grid": "uint3(L->cur_tg[0] * L->tgsize[0] + _tp[0], L->cur_tg[1] * L->tgsize[1] + _tp[1], "
                               "L->cur_tg[2] * L->tgsize[2] + _tp[2])",
    "thread_position_in_threadgroup": "uint3(_tp[0], _tp[1], _tp[2])",
    "threadgroup_position_in_grid": "uint3(L->cur_tg[0], L->cur_tg[1], L->cur_tg[2])",
    "threadgroups_per_grid": "uint3(L->tgcount[0], L->tgcount[1], L->tgcount[2])",
    "threads_per_grid": "uint3(L->grid[0], L->grid[1], L->grid[2])",
    "threads_per_simdgroup": "32u",
    "threads_per_threadgroup": "uint3(L->tgext[0], L->tgext[1], L->tgext[2])",
}

#: MLX dtype name -> Metal type name (as MLX writes it) and NumPy storage dtype.
DTYPES: dict[str, tuple[str, Any]] = {
    "float32": ("float", np.float32),
    "float16": ("float16_t", np.float16),
    "bfloat16": ("bfloat16_t", np.uint16),  # stored as the upper 16 bits of a float32
    "int8": ("int8_t", np.int8),
    "uint8": ("uint8_t", np.uint8),
    "int16": ("int16_t", np.int16),
    "uint16": ("uint16_t", np.uint16),
    "int32": ("int32_t", np.int32),
    "uint32": ("uint32_t", np.uint32),
    "int64": ("int64_t", np.int64),
    "uint64": ("uint64_t", np.uint64),
    "bool": ("bool", np.bool_),
}

#: NumPy dtype -> MLX dtype name, for inputs that carry their own dtype (exact, never converted).
NUMPY_DTYPES: dict[Any, str] = {np.dtype(v[1]): k for k, v in DTYPES.items() if k != "bfloat16"}


def to_storage(values: np.ndarray, dtype: str) -> np.ndarray:
    """NumPy values -> the bytes a kernel of ``dtype`` reads (bfloat16: round to nearest even).
    Integer dtypes are exact: a value the dtype cannot hold is a ``ValueError``, never wrapped or rounded."""
    if dtype == "bfloat16":
        f = np.ascontiguousarray(values, dtype=np.float32)
        bits = f.view(np.uint32).astype(np.uint64)
        nan = np.isnan(f)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
        bits[nan] = 0x7FC0
        return bits
    target = np.dtype(DTYPES[dtype][1])
    values = np.asarray(values)
    if target.kind in "iu" and values.dtype != target and values.size:
        if values.dtype.kind == "f" and not np.all(np.isfinite(values) & (values == np.round(values))):
            raise ValueError(f"non-integer values for a {dtype} buffer")
        info = np.iinfo(target)
        lo, hi = values.min(), values.max()
        if values.dtype.kind in "iu":
            bad = int(lo) < info.min or int(hi) > info.max
        else:
            bad = float(lo) < info.min or float(hi) > info.max
        if bad:
            raise ValueError(f"values outside the range of {dtype} [{info.min}, {info.max}]")
    with np.errstate(over="ignore"):  # a float beyond a narrower float's range is inf, as on the GPU
        return np.ascontiguousarray(values, dtype=target)


def from_storage(data: np.ndarray, dtype: str) -> np.ndarray:
    """Kernel bytes -> NumPy values (float32 for the float types)."""
    if dtype == "bfloat16":
        return (data.astype(np.uint32) << 16).view(np.float32)
    if dtype in ("float16", "float32"):
        return data.astype(np.float32)
    return data


@dataclass(frozen=True)
class Param:
    """One parameter of the generated kernel signature, in buffer order."""

    name: str
    decl: str  # as MLX writes it, e.g. "const device float* A"
    role: str  # "input", "shape", "strides", "ndim", "output"
    index: int  # input / output index
    cast: str  # C++ expression turning ``args[i]`` (void*) into the parameter


@dataclass(frozen=True)
class Signature:
    kernel_name: str
    params: tuple[Param, ...]
    attributes: tuple[str, ...]
    template: tuple[tuple[str, str, str], ...]  # (name, C++ value, declared kind: typename / int / bool)


def _template_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value][0]
    name = getattr(value, "__str__", lambda: repr(value))()
    text = str(name).removeprefix("mlx.core.")
    if text in DTYPES:
        return DTYPES[text][0]
    raise ValueError(f"unsupported template argument {value!r}")


def _input_params(i: int, inp: str, dt: str, shape: tuple[int, ...], source: str) -> tuple[list[Param], str]:
    """Input ``i``'s buffers as MLX declares them (a scalar by reference, a small array in constant memory; its
    shape, strides and ndim only where the source reads them) and its part of the kernel name."""
    ctype = DTYPES[dt][0]
    size = int(np.prod(shape)) if shape else 1
    params: list[Param] = []
    if len(shape) == 0:
        params.append(Param(inp, f"const constant {ctype}& {inp}", "input", i, f"*(const {ctype}*)"))
        name_part = f"_{ctype}s"
    else:
        space = "constant" if size < 8 else "device"
        params.append(Param(inp, f"const {space} {ctype}* {inp}", "input", i, f"(const {ctype}*)"))
        name_part = f"_{ctype}{'c' if space == 'constant' else ''}"
    if f"{inp}_shape" in source:
        params.append(Param(f"{inp}_shape", f"const constant int* {inp}_shape", "shape", i, "(const int*)"))
    if f"{inp}_strides" in source:
        params.append(Param(f"{inp}_strides", f"const constant int64_t* {inp}_strides", "strides", i,
                            "(const int64_t*)"))
    if f"{inp}_ndim" in source:
        params.append(Param(f"{inp}_ndim", f"const constant int& {inp}_ndim", "ndim", i, "*(const int*)"))
    return params, name_part


def signature(name: str, input_names: tuple[str, ...], output_names: tuple[str, ...], source: str,
              input_dtypes: list[str], input_shapes: list[tuple[int, ...]], output_dtypes: list[str],
              template: tuple[tuple[str, Any], ...] = (), atomic_outputs: bool = False) -> Signature:
    """The signature MLX generates for this kernel call (buffer order, attributes, kernel name);
    ``atomic_outputs`` (MLX's flag of the same name) declares outputs ``device atomic<T>*``."""
    params: list[Param] = []
    name_parts = [f"custom_kernel_{name}"]
    tmpl = tuple((k, _template_value(v), _template_kind(v)) for k, v in template)
    if tmpl:
        name_parts.append("_" + "".join(f"_{v}" for _, v, _ in tmpl))
    for i, (inp, dt, shape) in enumerate(zip(input_names, input_dtypes, input_shapes)):
        input_params, name_part = _input_params(i, inp, dt, shape, source)
        params += input_params
        name_parts.append(name_part)
    for i, (out, dt) in enumerate(zip(output_names, output_dtypes)):
        ctype = DTYPES[dt][0]
        ptype = f"atomic<{ctype}>" if atomic_outputs else ctype
        params.append(Param(out, f"device {ptype}* {out}", "output", i, f"({ptype}*)"))
        name_parts.append(f"_{ctype}")
    attrs = tuple(a for a in ATTRIBUTES if a in source)
    return Signature("".join(name_parts), tuple(params), attrs, tmpl)


def mlx_source(sig: Signature, header: str, source: str) -> str:
    """The Metal source MLX compiles for this call (the text ``mx.export_function`` records)."""
    lines = [f"  {p.decl} [[buffer({i})]]" for i, p in enumerate(sig.params)]
    lines += [f"  {ATTRIBUTES[a]} {a} [[{a}]]" for a in sig.attributes]
    text = header
    if sig.template:
        text += "template <" + ", ".join(f"{kind} {k}" for k, _, kind in sig.template) + ">\n"
    text += f"[[kernel]] void {sig.kernel_name}(\n" + ",\n".join(lines) + ") {\n" + source + "\n}\n"
    if sig.template:
        args = ", ".join(v for _, v, _ in sig.template)
        text += (f"\ntemplate [[host_name(\"{sig.kernel_name}\")]] [[kernel]] decltype({sig.kernel_name}<{args}>) "
                 f"{sig.kernel_name}<{args}>;\n")
    return text


def _template_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    return "int" if isinstance(value, int) else "typename"


# -- C++ translation ------------------------------------------------------------------------------------

_SWIZZLE = re.compile(r"\.([xyzw]{2,4}|[rgba]{2,4})\b(\s*(?:<<|>>|[-+*/%&|^])?=(?!=))?")
#: Half and bfloat literals (``1.0h``, ``2.5bf``): C++ has no such suffix.
_HALF_LITERAL = re.compile(r"(?<![\w.])((?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)(h|H|bf|BF)\b")
_STRING_OR_COMMENT = re.compile(r'"(?:[^"\\\n]|\\.)*"|//[^\n]*|/\*.*?\*/', re.S)


def _swizzle(match: re.Match[str]) -> str:
    letters = "xyzw" if match.group(1)[0] in "xyzw" else "rgba"
    idx = ",".join(str(letters.index(c)) for c in match.group(1))
    if match.group(2):  # assigned to: a reference into the vector
        return f".template swz<{idx}>(){match.group(2)}"
    return f".template swv<{idx}>()"  # read: a vector value, which templates deduce


def _literal(match: re.Match[str]) -> str:
    num = match.group(1)
    if not any(c in num for c in ".eE"):
        num += ".0"
    return f"{'half' if match.group(2) in 'hH' else 'bfloat'}({num}f)"


def _dims(text: str) -> list[str]:
    return re.findall(r"\[([^\]\n]+)\]", text)


def _inner_extents(dims: str) -> str:
    """``int64_t(d1), int64_t(d2)...``: the extents after the first of a ``[d0][d1]...`` declaration."""
    return ", ".join("int64_t(" + d + ")" for d in _dims(dims)[1:])


def _extents(dims: str) -> str:
    """``int64_t(d0), int64_t(d1)...``: every extent of a ``[d0][d1]...`` declarator."""
    return ", ".join("int64_t(" + d + ")" for d in _dims(dims))


def _element_count(dims: str) -> str:
    """``(d0) * (d1) * ...``: the element count of a ``[d0][d1]...`` declaration."""
    return " * ".join("(" + d + ")" for d in _dims(dims))


def _code_only(text: str, fn: Any) -> str:
    """Apply ``fn`` to the code between strings and comments (which keep their text and lines)."""
    out, pos = [], 0
    for m in _STRING_OR_COMMENT.finditer(text):
        out.append(fn(text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(fn(text[pos:]))
    return "".join(out)


_ASSIGNED = re.compile(r"\s*((?:<<|>>|[-+*/%&|^])?=(?!=)|\+\+|--)")
_MEMBER = re.compile(r"\s*\.\s*(?:template\s+(sw[vz])<[\d,]*>\(\)|[A-Za-z_]\w*)")
#: Words after which `name[i]` is an expression, not a declaration of `name`.


_OPEN = re.compile(r"\s*\[")
_INDEXED_NAME = re.compile(r"\b[A-Za-z_]\w*(?=\s*\[)")


def _brackets_end(code: str, pos: int) -> int | None:
    """Index after the ``[...]`` groups that start at ``code[pos] == "["`` (None when unbalanced)."""
    while (m := _OPEN.match(code, pos)) is not None:
        depth = 0
        for k in range(m.end() - 1, len(code)):
            depth += {"[": 1, "]": -1}.get(code[k], 0)
            if depth == 0:
                break
        else:
            return None
        pos = k + 1
    return pos


def _operand_end(code: str, pos: int) -> int | None:
    """End of the operand a C-style cast at ``pos`` applies to: ``(...)``, or ``[&]name[...]``."""
    pos = len(code) - len(code[pos:].lstrip()) if code[pos:pos + 1].isspace() else pos
    if code.startswith("(", pos):
        depth = 0
        for k in range(pos, len(code)):
            depth += {"(": 1, ")": -1}.get(code[k], 0)
            if depth == 0:
                return k + 1
        return None
    name = re.compile(r"&?\s*[A-Za-z_]\w*").match(code, pos)
    return None if name is None else _brackets_end(code, name.end())


def _checked_casts(code: str) -> str:
    """Check mode: casts to threadgroup pointers become ``ks::tg_cast<T>(...)``, a view of the same checked array."""
    code = _TG_CAST_NAMED.sub(lambda m: f"ks::tg_cast<{m[1]}>", code)
    out: list[str] = []
    pos = 0
    while (m := _TG_CAST.search(code, pos)) is not None:
        end = _operand_end(code, m.end())
        if end is None:
            break
        out.append(f"{code[pos:m.start()]}ks::tg_cast<{m[1]}>({_checked_casts(code[m.end():end]).strip()})")
        pos = end
    out.append(code[pos:])
    return "".join(out)


def _member_chain(code: str, end: int) -> tuple[int, str | None]:
    """The member / component / index chain after an element ending at ``end``: where it ends, and its first
    member's name (``"member"`` for an unnamed one; None: no member, so an index alone is not part of it)."""
    chain_end, first = end, None
    while True:
        member = _MEMBER.match(code, chain_end)
        if member is not None:
            first = first or member[1] or "member"
            chain_end = member.end()
        elif first is not None and _OPEN.match(code, chain_end):
            after = _brackets_end(code, chain_end)
            if after is None:
                break
            chain_end = after
        else:
            break
    return chain_end, first


def _kept_as_reference(before: str, first: str | None, assigned: re.Match[str] | None) -> bool:
    """An element :func:`_wrap_elements` leaves as the checked reference, from the tokens ``before`` it and its
    member chain: its address taken, incremented, an operand or a declaration, swizzled, or assigned directly."""
    word = re.search(r"\w+$", before)
    operand = before[:-1].rstrip()
    unary_amp = before.endswith("&") and not before.endswith("&&") and (
        not re.search(r"[\w)\]]$", operand) or re.search(r"\breturn$", operand) is not None)
    return bool(unary_amp or before.endswith(("++", "--")) or (before.endswith((">", "*")) and first is None)
                or first in ("swz", "swv")
                or (word is not None and word[0] not in _EXPRESSION_WORDS) or (first is None and assigned is not None))


def _wrap_elements(code: str, names: set[str]) -> str:
    """Check mode: each threadgroup element ``name[i]...`` wrapped for the way it is used (``ks::rd`` read,
    ``ks::wr`` / ``ks::rw`` a member assigned; see ks_shim.h). Left as the checked reference: an element
    assigned directly, one whose address is taken or that is incremented, one after ``>`` or ``*`` with no
    member after it (an operand of a binary operator, or a declaration of a same-named local array), one after
    a type name (a declaration), one swizzled (the reference has swizzles)."""
    out: list[str] = []
    pos = 0
    while (m := _INDEXED_NAME.search(code, pos)) is not None:
        if m[0] not in names:  # any identifier, then the set: linear however many names there are
            out.append(code[pos:m.end()])
            pos = m.end()
            continue
        end = _brackets_end(code, m.end())
        if end is None:
            break
        element = m[0] + _wrap_elements(code[m.end():end], names)
        before = code[max(0, m.start() - 256):m.start()].rstrip()  # its last tokens (bounded: linear time)
        chain_end, first = _member_chain(code, end)
        assigned = _ASSIGNED.match(code, chain_end)
        if _kept_as_reference(before, first, assigned):
            wrapped = element
        elif first is None or assigned is None:
            wrapped = f"ks::rd({element})"
        else:
            wrapped = f"ks::{'wr' if assigned[1] == '=' else 'rw'}({element})"
        out.append(code[pos:m.start()] + wrapped)
        pos = end
    out.append(code[pos:])
    return "".join(out)


def translate(text: str, check: bool) -> str:
    """MSL text -> C++ over the shim; keeps every line in place."""
    text = _code_only(text, lambda code: _HALF_LITERAL.sub(_literal, _SWIZZLE.sub(_swizzle, code)))
    text = _VOLATILE_TG.sub("threadgroup", text)  # volatile threadgroup pointers: every access is checked anyway
    if check:
        names = {m[2] for pat in (_TG_ARRAY, _TG_ARRAY_MD, _TG_POINTER, _TG_ROW_POINTER) for m in pat.finditer(text)}
        text = _code_only(text, _checked_casts)
        text = _TG_ARRAY_MD.sub(lambda m: f"ks::tgmd<{m[1]}, {_inner_extents(m[3])}> "
                                          f"{m[2]} = ks::tgmd<{m[1]}, {_inner_extents(m[3])}>"
                                          f"{{ks::tg_alloc_checked<{m[1]}>(({_element_count(m[3])}), "
                                          f"\"{m[2]}\", __LINE__)}};", text)
        text = _TG_ARRAY.sub(lambda m: f"ks::tgptr<{m[1]}> {m[2]} = ks::tg_alloc_checked<{m[1]}>(({m[3]}), "
                                       f"\"{m[2]}\", __LINE__);", text)
        text = _TG_SCALAR.sub(lambda m: f"ks::tgref<{m[1]}> {m[2]} = ks::tg_alloc_checked<{m[1]}>(1, \"{m[2]}\", "
                                        f"__LINE__)[0];", text)
        text = _TG_POINTER.sub(lambda m: f"ks::tgptr<{m[1]}> {m[2]}", text)
        text = _TG_ROW_POINTER.sub(lambda m: f"ks::tgmd<{m[1]}, {_extents(m[3])}> {m[2]}", text)
        if names:
            text = _code_only(text, lambda code: _wrap_elements(code, names))
    else:
        text = _TG_ARRAY_MD.sub(lambda m: f"{m[1]} (&{m[2]}){m[3].strip()} = "
                                          f"*reinterpret_cast<{m[1]} (*){m[3].strip()}>("
                                          f"ks::tg_alloc(sizeof({m[1]}{m[3].strip()}), "
                                          f"({_element_count(m[3])}), sizeof({m[1]}), "
                                          f"\"{m[2]}\", __LINE__));", text)
        text = _TG_ARRAY.sub(lambda m: f"{m[1]} (&{m[2]})[{m[3]}] = *reinterpret_cast<{m[1]} (*)[{m[3]}]>("
                                       f"ks::tg_alloc(sizeof({m[1]}) * ({m[3]}), ({m[3]}), sizeof({m[1]}), "
                                       f"\"{m[2]}\", __LINE__));", text)
        text = _TG_SCALAR.sub(lambda m: f"{m[1]}& {m[2]} = *reinterpret_cast<{m[1]}*>(ks::tg_alloc(sizeof({m[1]}), 1, "
                                        f"sizeof({m[1]}), \"{m[2]}\", __LINE__));", text)
    return text


def cpp_unit(sig: Signature, header: str, source: str, check: bool, lockstep: bool = False) -> str:
    """The translation unit compiled for the interpreter: shim, kernel (MLX line layout), thread entry. ``check``
    (check mode) and ``lockstep`` (fast mode for a kernel that may rely on lockstep simdgroups) build the checked
    translation, whose simdgroups run in lockstep on the lines :func:`~._lockstep.sync_lines` finds."""
    lines = [f"  {p.decl}" for p in sig.params] + [f"  {ATTRIBUTES[a]} {a}" for a in sig.attributes]
    body = header
    if sig.template:
        body += "template <" + ", ".join(f"{kind} {k}" for k, _, kind in sig.template) + ">\n"
    body += f"void {sig.kernel_name}(\n" + ",\n".join(lines) + ") {\n" + source + "\n}\n"
    tables = ""
    if check or lockstep:  # every loop counts its iterations (see _lockstep)
        sync = sync_lines(body)
        body, loops = instrument(body)
        tables = loop_tables(loops, body.count("\n") + 1, sync)
        check = True
    call_args = [f"{p.cast}args[{i}]" for i, p in enumerate(sig.params)] + list(sig.attributes)
    targs = f"<{', '.join(v for _, v, _ in sig.template)}>" if sig.template else ""
    entry = (
        "\n#line 100000 \"ks_entry\"\n" + tables +
        "void ks_thread_main(ks::Launch* L, ks::Fiber* f) {\n"
        "  void** args = L->args;\n"
        "  const uint _n = L->tgext[0] * L->tgext[1] * L->tgext[2];\n"
        "  const uint _tp[3] = {f->tid % L->tgext[0], (f->tid / L->tgext[0]) % L->tgext[1],"
        " f->tid / (L->tgext[0] * L->tgext[1])};\n"
        "  (void)_n; (void)_tp;\n"
        + "".join(f"  const {ATTRIBUTES[a]} {a} = {_ATTRIBUTE_VALUES[a]};\n" for a in sig.attributes)
        + f"  {sig.kernel_name}{targs}({', '.join(call_args)});\n"
        "}\n"
    )
    return ("#include \"ks_shim.h\"\nusing namespace metal;\n#line 1 \"kernel.metal\"\n"
            + translate(body, check) + entry)
