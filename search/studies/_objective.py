"""Kernel variants as a study objective: ``KernelObjective(problem, chip, backend, ...)``.

A back-end that predicts (the model) gives the modeled objective (``_modeled``: predicted times, proven on the
CPU interpreter); one that measures (metal, cuda, a plug-in or a test's simulated GPU) the measured objective
(``_measured``: built, verified and timed in isolated workers, the finalists re-timed against the MLX op as
consumers call it). What both share (the space, warm start, the model's ranking, the winner they publish through
``Candidate.from_winner``) is ``_kernel.KernelVariants``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._kernel import PICKS, TUNED_SAMPLE, KernelVariants, model_prior, roofline, roofline_pct
from ._measured import MeasuredObjective
from ._modeled import ModeledObjective

if TYPE_CHECKING:
    from ..family._space import Problem
    from ..hardware._chips import Chip

__all__ = ["PICKS", "TUNED_SAMPLE", "KernelObjective", "KernelVariants", "MeasuredObjective", "ModeledObjective",
           "model_prior", "roofline", "roofline_pct"]


def KernelObjective(problem: Problem, chip: Chip, backend: str, **options: Any) -> KernelVariants:  # noqa: N802
    """The objective of ``problem``'s variants on ``chip``, evaluated by ``backend``: modeled where the back-end
    predicts (``verify``: ``all``, ``finalists`` or ``none`` on the interpreter), measured where it times kernels
    (``compile_workers``, ``racing``, ``search_plan``). Options both take: ``seed``, ``timeout`` (seconds per
    variant), ``verify``, ``verify_shape``, ``verify_mode``, ``backend_options``."""
    from ..backends import backend_class

    if backend_class(backend).predicts:
        options = {k: v for k, v in options.items() if k not in ("compile_workers", "racing", "search_plan")}
        return ModeledObjective(problem, chip, backend, **options)
    return MeasuredObjective(problem, chip, backend, **options)
