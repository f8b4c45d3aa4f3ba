"""A Metal Shading Language interpreter for the CPU: runs the exact source kernsearch hands to
``mx.fast.metal_kernel``, with barrier-divergence, race, bounds and uninitialised-memory checks.

MSL is compiled as C++ over a small shim (``shim/ks_shim.h``); every GPU thread is a cooperative fiber,
barriers and simd collectives are scheduling points, threadgroups run one after another. Results are
*interpreted* evidence: correctness only, never a timing. The supported subset: ``docs/msl-subset.md``.

Modes: ``fast`` (correctness; divergence, inactive-lane reads, partial-simdgroup matrices, threadgroup
memory over the chip's limit), ``check`` (adds the threadgroup race / uninitialised-read / bounds
detector), ``sanitize`` (device-buffer bounds through AddressSanitizer, in a child process).
Schedule fuzz (:func:`fuzz_schedule`): threadgroups reversed / shuffled, threads resumed in other orders; a
kernel whose output depends on the order is reported with the first differing element.
"""

from __future__ import annotations

from ._fuzz import FuzzResult, OrderDependence, fuzz_schedule
from ._interp import MODES, SCHEDULES, InterpResult, run_kernel
from ._linemap import TemplateLines, template_lines
from ._lint import lint
from ._source import mlx_source, signature

__all__ = ["MODES", "SCHEDULES", "FuzzResult", "InterpResult", "OrderDependence", "TemplateLines", "fuzz_schedule",
           "lint", "mlx_source", "run_kernel", "signature", "template_lines"]
