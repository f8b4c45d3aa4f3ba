"""Back-ends: where a rendered kernel runs (or is predicted).

``get_backend(name)`` imports a back-end only when it is asked for (MLX and compilers are heavy);
``backend_class(name)`` says what one can do without opening a device; ``select_backend`` turns a
``--backend`` choice into a back-end and the chip its results are for (``hardware.resolve_chip``: the one chip rule).
"""

from __future__ import annotations

from .._vocabulary import Evidence
from ._base import BaseBackend, Diagnostic, RunResult, Timing
from ._registry import BACKENDS, backend_class, get_backend
from ._select import INTERPRETER, PREDICTOR, Selection, evidence_label, replays, select_backend

__all__ = ["BACKENDS", "INTERPRETER", "PREDICTOR", "BaseBackend", "Diagnostic", "Evidence", "RunResult", "Selection",
           "Timing", "backend_class", "evidence_label", "get_backend", "replays", "select_backend"]
