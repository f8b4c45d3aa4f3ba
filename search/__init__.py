"""kernsearch: find the fastest correct variant of an MLX custom kernel for the chip it runs on.

The public API (``docs/api.md``) is what ``__all__`` lists; everything else is private and may change.
Names are imported on first use, so ``import kernsearch`` (and the CLI) stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # spec -> space -> render
    "load_family": "._spec", "Family": "._spec",
    "make_problem": "._space", "Problem": "._space", "Space": "._space",
    "render": "._render", "geometry": "._render", "KernelSource": "._render", "Geometry": "._render",
    # chips and back-ends
    "get_chip": "._chips", "detect_chip": "._chips", "Chip": "._chips",
    "get_backend": ".backends",
    # the search
    "tune": "._tune", "TuneResult": "._tune", "Verdict": "._tune",
    "run_study": "._study", "StudyResult": "._study", "Stop": "._study", "StopReason": "._study",
    "FinalRound": "._final", "FinalistCheck": "._final", "FinalistTime": "._final",
    # artifacts and the exported package
    "ArtifactStore": "._artifacts", "Candidate": "._artifacts", "export": "._export",
    "KernsearchError": "._errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kernsearch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
