"""One kernel run on the interpreter: lint, translate, compile (cached), launch in a child, map diagnostics."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import VariantFailure
from ._compile import Compiled, compile_unit
from ._linemap import TemplateLines
from ._lint import lint
from ._lockstep import needs_lockstep
from ._run import RawDiag, run_forked, run_sanitized
from ._source import DTYPES, NUMPY_DTYPES, Signature, cpp_unit, from_storage, mlx_source, signature, to_storage

MODES = ("fast", "check", "sanitize")
#: Schedules of the schedule fuzz: (threadgroup order, thread resume order); 0 in order, 1 reversed, 2 shuffled.
SCHEDULES: dict[str, tuple[int, int]] = {"in-order": (0, 0), "reversed": (1, 1), "shuffled": (2, 2)}
#: Threadgroup memory limit when no chip is given: every Apple GPU kernsearch knows has 32 KiB.
DEFAULT_TG_LIMIT = 32768


@dataclass
class InterpDiagnostic:
    kind: str
    severity: str
    message: str
    line: int | None  # line of the full kernel (as MLX builds it)
    template_line: str | None
    count: int
    code: str = ""  # the offending line of the kernel


@dataclass
class InterpResult:
    outputs: list[np.ndarray]
    diagnostics: list[InterpDiagnostic] = field(default_factory=list)
    compile_seconds: float = 0.0
    cached: bool = False
    kernel_text: str = ""  # the full kernel as MLX builds it
    lockstep: bool = False  # the lanes of each simdgroup ran in lockstep (check mode; fast mode where needed)


def _input_dtype(a: np.ndarray, dtype: str, given: str | None = None) -> str:
    """The MLX dtype of one input: ``given`` when the caller names it; else a float array takes the
    kernel's ``dtype`` (the historic rule) and an integer or bool array keeps its own width exactly."""
    if given is not None:
        if given not in DTYPES:
            raise ValueError(f"unknown input dtype {given!r} (known: {', '.join(DTYPES)})")
        return given
    if np.issubdtype(a.dtype, np.floating):
        return dtype
    name = NUMPY_DTYPES.get(a.dtype)
    if name is None:
        raise ValueError(f"inputs of NumPy dtype {a.dtype} have no Metal buffer type")
    return name


def _fill(shape: tuple[int, ...], dtype: str, init_value: float | None) -> np.ndarray:
    """An output buffer before the kernel runs: ``init_value`` (NaN poison for floats when None / NaN;
    integers cannot hold NaN and are poisoned with their most negative (unsigned: largest) value)."""
    np_type = np.dtype(DTYPES[dtype][1])
    value = np.nan if init_value is None else init_value
    if dtype != "bfloat16" and np_type.kind in "iub":
        if not np.isfinite(value):
            value = np.iinfo(np_type).min if np_type.kind == "i" else (np.iinfo(np_type).max if np_type.kind == "u"
                                                                         else 1)
        return np.full(shape, value, dtype=np_type)
    return np.full(shape, value, dtype=np.float64)


def _filled(shape: tuple[int, ...], dtype: str, init_value: float | None) -> np.ndarray:
    """An output buffer as the kernel reads it (flat): :func:`_fill`'s value in storage, in every element. The value
    is converted once, not a float64 array of the whole output (a 4096x11008 output: 360 MB, seconds)."""
    size = math.prod(shape)
    one = np.ascontiguousarray(to_storage(_fill((min(size, 1),), dtype, init_value), dtype)).reshape(-1)
    return np.full(size, one[0], dtype=one.dtype) if size else one


def run_kernel(kernel: Any, grid: tuple[int, int, int], threadgroup: tuple[int, int, int],
               output_shapes: list[tuple[int, ...]], output_dtypes: list[str], inputs: list[np.ndarray],
               dtype: str, init_value: float | None = float("nan"), mode: str = "fast", timeout: float = 30.0,
               tg_limit: int = DEFAULT_TG_LIMIT, lines: TemplateLines | None = None,
               stack_kb: int = 0, threadgroups: list[tuple[int, int, int]] | None = None,
               input_dtypes: list[str | None] | None = None, atomic_outputs: bool = False,
               schedule: str = "in-order", seed: int = 1) -> InterpResult:
    """Run ``kernel`` (a :class:`~kernsearch.family._render.KernelSource`) on ``inputs``; outputs come back
    pre-filled with ``init_value`` where the kernel did not write. A variant that cannot run raises
    :class:`VariantFailure` (``unsupported``, ``compile``, ``crash``, ``timeout``). ``threadgroups``
    (positions in the grid) runs only those threadgroups (fast and check modes): big problems are verified
    on a sample of their tiles.

    ``input_dtypes`` names each input's MLX dtype (``None`` entries: the default rule, where float arrays
    take ``dtype`` and integer arrays keep their own dtype), so one kernel can read uint32 words beside
    float16 scales and a float32 input. Integer buffers are passed exactly, never converted.
    ``atomic_outputs`` is MLX's flag: outputs are ``device atomic<T>*``. ``schedule`` ("in-order",
    "reversed", "shuffled" with ``seed``) changes the order threadgroups run and threads are resumed in
    (fast and check modes); :func:`kernsearch.interp.fuzz_schedule` compares them."""
    _check_arguments(kernel, mode, schedule, threadgroups, inputs, input_dtypes, output_dtypes)
    given = list(input_dtypes) if input_dtypes is not None else [None] * len(inputs)
    in_dtypes = [_input_dtype(np.asarray(a), dtype, g) for a, g in zip(inputs, given)]
    shapes = [tuple(np.shape(a)) for a in inputs]
    atomic = atomic_outputs or bool(getattr(kernel, "atomic_outputs", False))
    sig = signature(kernel.name, kernel.input_names, kernel.output_names, kernel.source, in_dtypes, shapes,
                    list(output_dtypes), tuple(kernel.template), atomic_outputs=atomic)
    text = mlx_source(sig, kernel.header, kernel.source)
    # The lanes of a simdgroup run in lockstep, as the hardware runs them, where the translator finds threadgroup
    # memory they may pass values through between barriers (fast and check mode share the object; sanitize mode
    # builds its own; the detector runs in check mode only, and when it finds such passing elsewhere the kernel
    # runs again with every access in lockstep). Elsewhere threads run one after another: the same results, faster.
    lockstep = mode == "check" or needs_lockstep(kernel.header, kernel.source)
    compiled = _compile(sig, kernel, mode, lockstep, lines)

    def launch() -> tuple[list[np.ndarray], list[int]]:
        return _launch_args(sig, inputs, in_dtypes, shapes, output_shapes, output_dtypes, init_value)

    args, out_index = launch()
    stack = stack_kb or (512 if mode == "sanitize" else 128)
    grid3 = (int(grid[0]), int(grid[1]), int(grid[2]))
    tg3 = (int(threadgroup[0]), int(threadgroup[1]), int(threadgroup[2]))
    if mode == "sanitize":
        ran = run_sanitized(compiled.path, args, out_index, grid3, tg3, int(tg_limit), stack, timeout)
    else:
        extra = _forked_options(kernel, mode, threadgroups, schedule, seed, lockstep)
        ran = run_forked(compiled.path, args, out_index, grid3, tg3, int(tg_limit), stack, timeout, **extra)
        if ran.unsynced:  # lanes passed values on lines the translator had not marked: all accesses synchronise now
            args, out_index = launch()
            ran = run_forked(compiled.path, args, out_index, grid3, tg3, int(tg_limit), stack, timeout, sync_all=True,
                             **extra)
    outputs = [from_storage(args[i], odt).reshape(shape)
               for i, odt, shape in zip(out_index, output_dtypes, output_shapes)]
    return InterpResult(outputs, [_diagnostic(d, sig, kernel, text, lines) for d in ran.diags], compiled.seconds,
                        compiled.cached, text, lockstep)


def _compile(sig: Signature, kernel: Any, mode: str, lockstep: bool, lines: TemplateLines | None) -> Compiled:
    """The kernel's unit compiled for ``mode``; a compile error names its template file:line first, when known."""
    try:
        return compile_unit(cpp_unit(sig, kernel.header, kernel.source, check=mode == "check", lockstep=lockstep),
                            mode, lockstep)
    except VariantFailure as exc:
        m = re.match(r"line (\d+): (.*)", exc.detail, re.S)
        tmpl = _template_line(int(m.group(1)), sig, kernel, lines) if m else None
        if m is None or tmpl is None:
            raise
        raise VariantFailure(exc.reason, f"{tmpl}: {m.group(2)} (kernel line {m.group(1)})") from None


def _forked_options(kernel: Any, mode: str, threadgroups: list[tuple[int, int, int]] | None, schedule: str,
                    seed: int, lockstep: bool) -> dict[str, Any]:
    """:func:`run_forked`'s options beyond the launch: the sampled threadgroups, the schedule, the lockstep
    detector (check mode), the output names, a persistent kernel's co-residency."""
    extra: dict[str, Any] = {}
    if threadgroups:
        extra["threadgroups"] = [tuple(int(v) for v in t) for t in threadgroups]
    if schedule != "in-order":
        extra["schedule"] = (*SCHEDULES[schedule], int(seed) & 0xFFFFFFFFFFFFFFFF)
    if lockstep:
        extra["detect"] = mode == "check"
    extra["output_names"] = list(kernel.output_names)
    if getattr(kernel, "persistent", False):
        extra["persistent"] = True
    return extra


def _check_arguments(kernel: Any, mode: str, schedule: str, threadgroups: list[tuple[int, int, int]] | None,
                     inputs: list[np.ndarray], input_dtypes: list[str | None] | None, output_dtypes: list[str]) -> None:
    """Bad arguments are a ``ValueError``; a kernel outside the subset or given the wrong inputs a variant failure."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if schedule != "in-order" and mode == "sanitize":
        raise ValueError("sanitize mode runs the grid in order (no schedule fuzz)")
    if threadgroups is not None and mode == "sanitize":
        raise ValueError("sanitize mode runs the whole grid (no threadgroups selection)")
    if mode not in MODES:
        raise ValueError(f"unknown interpreter mode {mode!r} (known: {', '.join(MODES)})")
    problem = lint(kernel.header, kernel.source)
    if problem:
        raise VariantFailure("unsupported", problem)
    if len(inputs) != len(kernel.input_names):
        raise VariantFailure("crash", f"{len(inputs)} inputs given, the kernel takes {len(kernel.input_names)}")
    if input_dtypes is not None and len(input_dtypes) != len(inputs):
        raise ValueError(f"{len(input_dtypes)} input dtypes given for {len(inputs)} inputs")
    for odt in output_dtypes:
        if odt not in DTYPES:
            raise ValueError(f"unknown output dtype {odt!r} (known: {', '.join(DTYPES)})")


def _launch_args(sig: Any, inputs: list[np.ndarray], in_dtypes: list[str], shapes: list[tuple[int, ...]],
                 output_shapes: list[tuple[int, ...]], output_dtypes: list[str],
                 init_value: float | None) -> tuple[list[np.ndarray], list[int]]:
    """The kernel's buffers in signature order (outputs pre-filled) and the indices of the outputs among them."""
    args: list[np.ndarray] = []
    out_index: list[int] = []
    for p in sig.params:
        if p.role == "input":
            args.append(np.ascontiguousarray(to_storage(np.asarray(inputs[p.index]), in_dtypes[p.index])))
        elif p.role == "shape":
            args.append(np.asarray(shapes[p.index], dtype=np.int32).reshape(-1))
        elif p.role == "strides":
            shape = shapes[p.index]
            strides = [int(np.prod(shape[k + 1:])) for k in range(len(shape))]
            args.append(np.asarray(strides, dtype=np.int64).reshape(-1))
        elif p.role == "ndim":
            args.append(np.asarray([len(shapes[p.index])], dtype=np.int32))
        else:
            shape, odt = output_shapes[p.index], output_dtypes[p.index]
            out_index.append(len(args))
            args.append(_filled(tuple(shape), odt, init_value))
    for i, a in enumerate(args):  # empty shape / strides arrays still need an address
        if a.size == 0:
            args[i] = np.zeros(1, dtype=a.dtype)
    return args, out_index


def _template_line(line: int, sig: Any, kernel: Any, lines: TemplateLines | None) -> str | None:
    """``file:line`` of the template line that produced ``line`` of the full kernel, when known."""
    if lines is None:
        return None
    header_lines = kernel.header.count("\n")
    source_start = header_lines + (1 if sig.template else 0) + 1 + max(len(sig.params) + len(sig.attributes), 1) + 1
    if line <= header_lines and line in lines.header:
        return f"{lines.file}:{lines.header[line]}"
    if line >= source_start and line - source_start + 1 in lines.source:
        return f"{lines.file}:{lines.source[line - source_start + 1]}"
    return None


def _diagnostic(d: RawDiag, sig: Any, kernel: Any, text: str, lines: TemplateLines | None) -> InterpDiagnostic:
    code = ""
    tmpl = None
    if d.line is not None:
        all_lines = text.split("\n")
        if 0 < d.line <= len(all_lines):
            code = all_lines[d.line - 1].strip()
        tmpl = _template_line(d.line, sig, kernel, lines)
    count = f" ({d.count} times)" if d.count > 1 else ""
    return InterpDiagnostic(d.kind, d.severity, d.message + count, d.line, tmpl, d.count, code)
