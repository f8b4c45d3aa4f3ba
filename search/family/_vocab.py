"""The array vocabulary of a family's ``reference`` and ``baseline``: each name's NumPy and MLX meaning.

A spec names its reference and its MLX baseline op as expressions over this closed vocabulary
(``rms_norm(x, w, eps)``, ``silu(a) * b``, ``matmul(A, B)``). The meaning of each name lives here, in
kernsearch: the NumPy one (float64, the ground truth of verification) and the MLX one (the op a kernel must
beat — ``mx.fast.rms_norm``, ``mx.softmax(precise=True)``...). Nothing in a spec is ever run as code. The names
and their MLX meaning are shared rules (``_rules.ARRAY_FUNCTIONS``, ``_rules.mlx_namespace``: the exported package
calls the same ops); their NumPy meaning is here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._rules import ARRAY_FUNCTIONS, FUSED, PLAIN, mlx_namespace

__all__ = ["ARRAY_FUNCTIONS", "FUSED", "MLX_NAMES", "PLAIN", "mlx_namespace", "numpy_namespace", "unpack"]

#: How users know the MLX op behind a vocabulary name (verdicts, ``explain``).
MLX_NAMES = {"rms_norm": "mx.fast.rms_norm", "layer_norm": "mx.fast.layer_norm", "softmax": "mx.softmax",
             "silu": "nn.silu", "sigmoid": "mx.sigmoid", "gelu": "nn.gelu", "dequantize": "mx.dequantize",
             "quantized_matmul": "mx.quantized_matmul", "split": "mx.split", "rsqrt": "mx.rsqrt"}


# -- NumPy (float64 reference) ---------------------------------------------------------------------------

def _np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return np.asarray(e / e.sum(axis, keepdims=True))


def _np_rms_norm(x: np.ndarray, w: Any, eps: float) -> np.ndarray:
    y = x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
    return np.asarray(y if w is None else y * w)


def _np_layer_norm(x: np.ndarray, w: Any, b: Any, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(np.square(x - mu).mean(-1, keepdims=True) + eps)
    y = y if w is None else y * w
    return np.asarray(y if b is None else y + b)


def _np_sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * x)))  # no overflow warning for large |x|


def _np_gelu(x: np.ndarray) -> np.ndarray:
    from math import erf

    return np.asarray(x * 0.5 * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0))))


def unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """``bits``-wide unsigned fields of uint32 words, low bits first (MLX's packing), as integers."""
    if bits not in (2, 4, 8):
        raise ValueError(f"bits must be 2, 4 or 8, not {bits}")
    w = np.asarray(words)
    word = np.dtype(np.uint32 if w.dtype == np.uint32 else np.uint64)  # uint32 words: half the memory, same fields
    w = w.astype(word, copy=False)
    per = 32 // bits
    shifts = np.arange(0, per * bits, bits, dtype=word)
    fields: np.ndarray = (w[..., None] >> shifts) & np.asarray((1 << bits) - 1, dtype=word)
    return fields.reshape(*w.shape[:-1], w.shape[-1] * per).astype(np.float64)


def _np_dequantize(w: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int = 64,
                   bits: int = 4) -> np.ndarray:
    q = unpack(w, bits)
    rows, cols = q.shape[-2], q.shape[-1]
    if cols % group_size:
        raise ValueError(f"{cols} columns are not whole groups of {group_size}")
    g = q.reshape(rows, cols // group_size, group_size)
    s, b = np.asarray(scales)[..., None], np.asarray(biases)[..., None]
    if np.broadcast_shapes(g.shape, s.shape, b.shape) != g.shape or np.result_type(g, s, b) != g.dtype:
        return np.asarray((g * s + b).reshape(rows, cols))
    g *= s  # in place (q is this call's own array): the same products and sums without two temporaries
    g += b
    return np.asarray(g.reshape(rows, cols))


class _Dequantized:
    """``dequantize`` that keeps each weight matrix it expands, by the identity of its arrays, for one evaluation: an
    expression has no names for its values, so a fused family's reference repeats a weight's product (mlp_block's:
    11 dequantizations of 4 matrices, ~0.7 s each at 4096x11008). The arrays are the evaluation's inputs, which it
    does not change; a kept entry holds them, so no other array can take their identity."""

    def __init__(self) -> None:
        self.kept: dict[tuple[int, ...], tuple[tuple[Any, ...], np.ndarray]] = {}

    def __call__(self, w: np.ndarray, scales: np.ndarray, biases: np.ndarray, group_size: int = 64,
                 bits: int = 4) -> np.ndarray:
        arrays = (w, scales, biases)
        key = (*map(id, arrays), group_size, bits)
        try:
            kept = self.kept.get(key)
        except TypeError:  # an unhashable size: nothing kept (the expansion says what is wrong with it)
            return _np_dequantize(w, scales, biases, group_size, bits)
        if kept is not None and all(a is b for a, b in zip(kept[0], arrays)):
            return kept[1]
        d = _np_dequantize(w, scales, biases, group_size, bits)
        self.kept[key] = (arrays, d)
        return d

    def matmul(self, x: np.ndarray, w: np.ndarray, scales: np.ndarray, biases: np.ndarray, transpose: bool = True,
               group_size: int = 64, bits: int = 4) -> np.ndarray:
        """``x`` times the dequantized ``w`` (transposed: MLX's default), its dequantization kept."""
        d = self(w, scales, biases, group_size, bits)
        return np.asarray(np.matmul(x, d.T if transpose else d))


def numpy_namespace() -> dict[str, Callable[..., Any]]:
    """The NumPy meaning of every vocabulary name, for one evaluation (dequantized weights are kept in it)."""
    ns: dict[str, Callable[..., Any]] = {name: getattr(np, name) for name in PLAIN}
    dequantize = _Dequantized()
    ns.update(softmax=_np_softmax, rms_norm=_np_rms_norm, layer_norm=_np_layer_norm, sigmoid=_np_sigmoid,
              silu=lambda x: x * _np_sigmoid(x), gelu=_np_gelu,
              split=lambda x, parts, axis=-1: np.split(x, parts, axis=axis),
              dequantize=dequantize, quantized_matmul=dequantize.matmul, rsqrt=lambda x: 1.0 / np.sqrt(x))
    return ns
