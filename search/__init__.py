"""kernsearch: find the fastest correct variant of an MLX custom kernel for the chip it runs on.

The subpackages follow the data path: ``family`` (spec → space → render) → ``backends`` → ``evaluation``
(→ verify → measure) → ``studies`` (→ study) → ``artifacts`` (→ artifact) → ``exporting`` (→ export);
``hardware`` holds the chips and targets every stage reads, ``interp`` the Metal interpreter behind the
``cpu`` back-end. The public API (``docs/api.md``) is what ``__all__`` lists; everything else is private and
may change. Names are imported on first use, so ``import kernsearch`` (and the CLI) stays fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # family: spec -> space -> render
    "load_family": ".family._spec", "Family": ".family._spec",
    "make_problem": ".family._space", "Problem": ".family._space", "Space": ".family._space",
    "render": ".family._render", "geometry": ".family._render", "KernelSource": ".family._render",
    "Geometry": ".family._render",
    # hardware and back-ends
    "get_chip": ".hardware._chips", "detect_chip": ".hardware._chips", "Chip": ".hardware._chips",
    "get_backend": ".backends",
    # studies: the search
    "tune": ".studies._tune", "TuneResult": ".studies._tune", "Verdict": ".studies._tune",
    "run_study": ".studies._study", "StudyResult": ".studies._study", "Stop": ".studies._study",
    "StopReason": ".studies._study",
    "FinalRound": ".studies._final", "FinalistCheck": ".studies._final", "FinalistTime": ".studies._final",
    # artifacts and the exported package
    "ArtifactStore": ".artifacts._artifacts", "Candidate": ".artifacts._artifacts", "export": ".exporting._export",
    "KernsearchError": "._errors", "VariantFailure": "._errors",
    # a variant on the interpreter: the test API of a family's author
    "run": ".variants._run", "VariantRun": ".variants._run",
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
