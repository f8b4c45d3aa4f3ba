"""The rules kernsearch and its exported packages share: imported by the core and shipped verbatim.

What is decided here is decided once, for the search, the store's gate and the exported dispatcher alike
(``export`` copies this file and the ``_rules_*.py`` modules beside it byte for byte into every package, beside
``_vocabulary.py``; ``tests/test_rules.py`` compares the bytes). One concept a module, every name read from here:

- ``_rules_targets``: the targets table (what each kind of kernel source is, which GPUs run it, how MLX builds it);
- ``_rules_include``: a CUDA text handed to MLX as an ``#include`` of a content-addressed file in a private cache
  folder (MLX rebuilds and hashes a custom kernel's whole text on every call);
- ``_rules_decision``: whether a measured result beats the MLX op (:func:`beats_op`, the margin, the consumer modes'
  lower bound), and the statistic that bound is (:func:`decide`: an interval of the median per-round ratio that
  narrows with rounds);
- ``_rules_chips``: a chip's lineage, its identification from ``mx.device_info()``, its name, and which chip
  results are for (:func:`choose_chip`, the one chip rule);
- ``_rules_expr``: the expression-tree evaluator: spec expressions as small JSON trees, evaluated by a closed set of
  operators and functions (never Python's ``eval``). kernsearch parses a spec's expressions into these trees and
  evaluates them here, bounded by its :class:`Guard` (``family/_expr.py``: hostile specs); the exported package
  evaluates the trees of its dispatch table here too;
- here: the timing identity (what, when it changes, voids a measured time), the hashes a kernel and a published
  version are known by, and the array vocabulary of a baseline (the MLX meaning of each name).

Standard library only, Python >= 3.9: the exported package runs on its consumer's Python with MLX alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable, Dict, List, Optional

from ._rules_chips import (
    MAX_CHIP_NAME,
    UNKNOWN_NVIDIA_SHARED_MEMORY,
    UnknownChip,
    chip_key,
    choose_chip,
    identify,
    lineage,
    named_chip,
)
from ._rules_decision import (
    CONFIDENCE,
    DEFAULT_MARGIN,
    FIRST_LOOK,
    LOOK_GROWTH,
    MAX_ROUNDS,
    NOT_DISPATCHED,
    Interval,
    beats_op,
    consumer_figures,
    consumer_low,
    consumer_verdict,
    decide,
    dispatch_figures,
    interval_text,
    looks,
    median_rank,
    mode_interval,
    modes_text,
    ratio_interval,
    speedup_text,
    valid_ratios,
)
from ._rules_expr import (
    ARRAY_ATTRIBUTES,
    BINARY,
    COMPARE,
    FUNCTIONS,
    KEYWORDS,
    MAX_INT_BITS,
    NO_GUARD,
    NODES,
    UNARY,
    ExpressionError,
    Guard,
    ceil_div,
    evaluate,
    is_array,
    is_pow2,
    names_in,
    round_up,
)
from ._rules_targets import (
    DEFAULT_TARGET,
    INTERPRETER_TARGET,
    SHARED_MEMORY_AT_BUILD,
    TARGETS,
    VENDOR_TARGETS,
    KernelTexts,
    TargetInfo,
    compact,
    factory_texts,
    kernel_factory,
    kernel_text,
    target_of,
)

#: Every rule's name, read from here by kernsearch and by the exported dispatcher alike.
__all__ = [
    "ARRAY_ATTRIBUTES", "ARRAY_FUNCTIONS", "BINARY", "COMPARE", "CONFIDENCE", "DEFAULT_MARGIN", "DEFAULT_TARGET",
    "ExpressionError", "FIRST_LOOK", "FUNCTIONS", "FUSED", "Guard", "IDENTITY_FIELDS", "INTERPRETER_TARGET",
    "Interval", "KEYWORDS", "LOOK_GROWTH", "MAX_CHIP_NAME", "MAX_INT_BITS", "MAX_ROUNDS", "NODES", "NOT_DISPATCHED",
    "NO_GUARD", "PLAIN", "SHARED_MEMORY_AT_BUILD", "TARGETS", "TargetInfo", "UNARY", "UNKNOWN_NVIDIA_SHARED_MEMORY",
    "UnknownChip", "VENDOR_TARGETS", "beats_op", "ceil_div", "chip_key", "choose_chip", "compact",
    "consumer_figures", "consumer_low", "consumer_verdict", "content_sha256", "cuda_driver_version", "decide",
    "dispatch_figures", "evaluate", "identify", "identity_changes", "interval_text", "is_array", "is_pow2",
    "kernel_factory", "kernel_text", "lineage", "looks", "median_rank", "mlx_namespace", "mode_interval",
    "modes_text", "named_chip", "names_in", "nvrtc_version", "ratio_interval", "round_up", "source_sha256",
    "speedup_text", "target_of", "timing_identity", "valid_ratios",
    "KernelTexts", "factory_texts",
]


# -- the timing identity ---------------------------------------------------------------------------------

#: What :func:`timing_identity` compares, in order.
IDENTITY_FIELDS = ("mlx", "os", "macos", "cuda_driver", "nvrtc")


def timing_identity(mlx_version: Optional[str], os_name: Optional[str], macos_version: Optional[str],
                    cuda_driver: Optional[str], nvrtc: Optional[str]) -> Dict[str, Optional[str]]:
    """What can move a measured kernel time when it changes (a measured result is void across a change): MLX minor
    version, OS, macOS major version (the Metal compiler ships with the OS), CUDA driver and NVRTC version."""
    def major_minor(v: Optional[str], parts: int) -> Optional[str]:
        return ".".join(v.split(".")[:parts]) if v else None

    return {"mlx": major_minor(mlx_version, 2), "os": os_name or None, "macos": major_minor(macos_version, 1),
            "cuda_driver": cuda_driver or None, "nvrtc": nvrtc or None}


def identity_changes(old: Dict[str, Any], new: Dict[str, Any], known_only: bool = True,
                     arrow: str = "->") -> List[str]:
    """``["mlx 0.29 -> 0.30", ...]``: the fields of two timing identities that differ (``known_only``: only
    where both know the field; the gate counts a field that became known or unknown as a change too)."""
    return [f"{k} {old.get(k)} {arrow} {new.get(k)}" for k in IDENTITY_FIELDS if old.get(k) != new.get(k)
            and (not known_only or (old.get(k) is not None and new.get(k) is not None))]


def cuda_driver_version() -> Optional[str]:
    """The NVIDIA kernel driver version (Linux), or None."""
    try:
        with open("/proc/driver/nvidia/version", "rb") as f:
            text = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9]+(?:\.[0-9]+)+)", text)
    return m.group(1) if m else None


def nvrtc_version() -> Optional[str]:
    """NVRTC's version (the compiler of ``mx.fast.cuda_kernel``), or None where there is no NVRTC."""
    import ctypes
    import ctypes.util

    names = [n for n in (ctypes.util.find_library("nvrtc"),) if n] + [f"libnvrtc.so.{v}" for v in (13, 12, 11)]
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        major, minor = ctypes.c_int(), ctypes.c_int()
        if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) == 0:
            return f"{major.value}.{minor.value}"
    return None


# -- hashes ----------------------------------------------------------------------------------------------

def source_sha256(header: str, source: str, template: Any = (), input_names: Any = (),
                  output_names: Any = ()) -> str:
    """The hash of everything a back-end compiles (a kernel's name carries its first 12 digits; artifacts and
    exported packages check it before a kernel is used)."""
    blob = json.dumps([header, source, [list(t) for t in template], list(input_names), list(output_names)])
    return hashlib.sha256(blob.encode()).hexdigest()


def content_sha256(manifest: str, header: str, source: str) -> str:
    """The content hash the store's index records when a version is published: the manifest's exact text (every
    field a decision rests on: config, geometry, chip, evidence, measurements, correctness, template hash) and
    both kernel files. The exported dispatcher checks the same before an artifact's first use."""
    blob = json.dumps({"format": 1, "manifest": manifest, "header": header, "source": source}, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# -- the array vocabulary of a baseline ------------------------------------------------------------------

#: Plain array functions (same name in NumPy and MLX).
PLAIN = ("matmul", "einsum", "transpose", "exp", "log", "sqrt", "tanh", "maximum", "minimum", "sum", "max",
         "min", "mean", "where", "abs", "square", "reshape", "concatenate")
#: Fused or composite ops, defined for both libraries (NumPy's in ``family/_vocab.py``).
FUSED = ("softmax", "rms_norm", "layer_norm", "silu", "sigmoid", "gelu", "split", "dequantize",
         "quantized_matmul", "rsqrt")
#: Every name a reference or baseline expression may call.
ARRAY_FUNCTIONS = PLAIN + FUSED


def mlx_namespace(mx: Any) -> Dict[str, Callable[..., Any]]:
    """The vocabulary as MLX ops (``mx`` is ``mlx.core``, imported by the caller): the op a kernel must beat."""
    ns: Dict[str, Callable[..., Any]] = {name: getattr(mx, name) for name in PLAIN if hasattr(mx, name)}
    ns.update(
        softmax=lambda x, axis=-1: mx.softmax(x, axis=axis, precise=True),
        rms_norm=lambda x, w, eps: mx.fast.rms_norm(x, w, float(eps)),
        layer_norm=lambda x, w, b, eps: mx.fast.layer_norm(x, w, b, float(eps)),
        sigmoid=mx.sigmoid,
        silu=lambda x: x * mx.sigmoid(x),  # what mlx.nn.silu computes
        gelu=lambda x: x * (1 + mx.erf(x / 2 ** 0.5)) / 2,  # mlx.nn.gelu
        split=lambda x, parts, axis=-1: mx.split(x, parts, axis=axis),
        dequantize=lambda w, scales, biases, group_size=64, bits=4: mx.dequantize(
            w, scales, biases, group_size=group_size, bits=bits),
        quantized_matmul=lambda x, w, scales, biases, transpose=True, group_size=64, bits=4: mx.quantized_matmul(
            x, w, scales, biases, transpose=transpose, group_size=group_size, bits=bits),
        rsqrt=mx.rsqrt,
    )
    return ns
