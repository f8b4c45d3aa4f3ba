"""A poisoned guard zone after every output of a verification run on the device (the metal and cuda back-ends).

A kernel that writes past an output's end at a ragged shape writes where nothing is compared (on the GPU, into
whatever buffer lies there). For a verification run each output is therefore declared as one flat buffer of its
elements and a guard zone after them (``output_shapes``); MLX fills the whole buffer with the run's
``init_value``, and the guard must hold exactly that fill afterwards: a changed element is a ``device_bounds``
error naming the output. A NaN fill cannot show a NaN written past the end (a read past an input's end on the
GPU finds whatever lies there, often a NaN-filled buffer of an earlier run), so such a run is followed by one
filled with :data:`POISON`, whose guard zones are checked instead. A zero fill is kept (a kernel that accumulates
into its outputs, or counts tiles in them, needs it: a persistent kernel would wait forever on poisoned counters),
so a zero written past such an output is not seen. The kernel reads
nothing of an output's declared shape (MLX passes ``X_shape`` for inputs only, outputs as bare ``T*``), and
outputs are row-contiguous, so a flat, longer declaration changes no index it computes.

What the device cannot do: run threadgroups in a chosen order (a late write past a tile's edge inside the
buffer may be overwritten by the next tile's right value) nor see reads outside a buffer; the interpreter does
both (reversed threadgroups, the sanitizer build) on the family's Metal template.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from .._vocabulary import Severity
from ..family._render import Geometry
from ._base import Diagnostic

#: Bytes of every guard zone at least (the interpreter's too); a zone also spans one slice of the output's first
#: dim (a whole row past the end: an off-by-one in the row count), up to :data:`MAX_GUARD_ELEMENTS`.
GUARD_BYTES = 4096
MAX_GUARD_ELEMENTS = 1 << 22
#: Bytes per element of an output dtype (``Geometry.output_dtypes``).
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "uint32": 4, "int32": 4}
#: The fill of a guard-checking run: exact (and normal) in float16, bfloat16 and float32; no kernel writes it by chance.
POISON = -1.6875 * 2.0**-10  # normal in float16 (no flush to zero), -0.00164794921875


def guard_elements(shape: tuple[int, ...], dtype: str) -> int:
    """How many elements the guard zone after an output of ``shape`` and ``dtype`` holds."""
    row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return min(max(GUARD_BYTES // _ITEMSIZE.get(dtype, 4), row), MAX_GUARD_ELEMENTS)


@dataclass(frozen=True)
class OutputGuard:
    """The guarded launch of one verification run: :attr:`geometry` declares every output flat with its guard
    zone; :meth:`split` takes the outputs back to their shapes and reports each guard zone that changed.
    ``fill``: the output dtype's value of ``init_value`` as the back-end reads it back (what the zone must hold);
    with ``init_value`` None the outputs are not filled and nothing is guarded."""

    logical: Geometry
    init_value: float | None

    @property
    def geometry(self) -> Geometry:
        if self.init_value is None:
            return self.logical
        shapes = tuple((int(np.prod(s)) + guard_elements(tuple(s), d),)
                       for s, d in zip(self.logical.output_shapes, self.logical.output_dtypes))
        return replace(self.logical, output_shapes=shapes)

    def split(self, outputs: list[np.ndarray], names: tuple[str, ...] = ()
              ) -> tuple[list[np.ndarray], list[Diagnostic]]:
        """(each output in its declared shape, a ``device_bounds`` error per changed guard zone)."""
        shaped: list[np.ndarray] = []
        found: list[Diagnostic] = []
        for k, (out, shape, dtype) in enumerate(zip(outputs, self.logical.output_shapes, self.logical.output_dtypes)):
            flat = np.asarray(out).reshape(-1)
            n = int(np.prod(shape))
            shaped.append(flat[:n].reshape(tuple(shape)))
            want = filled(self.init_value, dtype) if self.init_value is not None else None
            if want is None:  # unfilled, or an integer output (NaN's cast to it is the platform's): not guarded
                continue
            zone = flat[n:]
            changed = ~np.isnan(zone) if np.isnan(want) else zone != want
            if changed.any():
                name = names[k] if k < len(names) else f"#{k}"
                found.append(Diagnostic(
                    "device_bounds", f"a write past the end of output {name} on the device (element "
                    f"{int(np.argmax(changed))} of the poisoned guard zone after it changed; {int(changed.sum())} of "
                    f"{zone.size}): a write outside the output buffer", None, None, Severity.ERROR))
        return shaped, found


def filled(value: float, dtype: str) -> float | None:
    """What an output of ``dtype`` filled with ``value`` reads back as (float64); None for integer outputs."""
    from ..evaluation._verify import round_to_dtype

    if dtype not in ("float16", "bfloat16", "float32"):
        return None
    return float(round_to_dtype(np.array([value], dtype=np.float64), dtype)[0])


def guarded_run(launch: Callable[[Geometry, float | None], list[np.ndarray]], geometry: Geometry,
                init_value: float | None, names: tuple[str, ...] = ()) -> tuple[list[np.ndarray], list[Diagnostic]]:
    """``launch(geometry, init_value)`` (the outputs as NumPy arrays) with every output guarded: (the outputs of the
    run asked for, each in its declared shape; a ``device_bounds`` error per output whose guard zone changed). A NaN
    fill, which cannot show a NaN written, is followed by a run filled with :data:`POISON`, checked instead."""
    asked = OutputGuard(geometry, init_value)
    outputs, found = asked.split(launch(asked.geometry, init_value), names)
    if init_value is not None and np.isnan(init_value):
        poisoned = OutputGuard(geometry, POISON)
        found = poisoned.split(launch(poisoned.geometry, POISON), names)[1]
    return outputs, found
