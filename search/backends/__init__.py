"""Back-ends: where a rendered kernel runs (or is predicted)."""

from ._base import BaseBackend, Diagnostic, Evidence, RunResult, Timing

__all__ = ["BaseBackend", "Diagnostic", "Evidence", "RunResult", "Timing"]
