"""Which back-end a command runs on: ``--backend`` choices (``auto`` included) as one decision, shared by
the CLI and the nightly flow, so neither compares back-end names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._registry import BACKENDS, backend_class

if TYPE_CHECKING:
    from ..hardware._chips import Chip

#: ``--backend auto``: measure on the GPU here when results are wanted for it, else predict.
AUTO = "auto"
#: ``--backend replay``: no device but a recorded landscape replayed as the objective
#: (:mod:`kernsearch.studies._replay`); studies of one carry this name as their back-end.
REPLAY = "replay"
#: What ``auto`` falls back to: the per-chip performance model.
PREDICTOR = "model"
#: What ``kernsearch verify`` runs by default: the Metal interpreter (correctness only).
INTERPRETER = "cpu"


@dataclass(frozen=True)
class Selection:
    """The back-end a command runs on and the chip its results are for."""

    backend: str
    chip: Chip
    #: Why ``auto`` predicts instead of measuring (one line, rich markup), else None.
    note: str | None = None
    #: Why this choice cannot give results for the chip asked (a measuring back-end, another GPU), else None.
    refusal: str | None = None


def replays(choice: str | None) -> bool:
    """Whether a ``--backend`` choice (or a study's stored back-end) is a replayed landscape."""
    return choice == REPLAY


def evidence_label(evidence: str, backend: str | None) -> str:
    """The evidence kind as users read it: a replayed landscape was measured on the GPU that recorded it,
    never here, so its label says so."""
    return f"{evidence}, replayed" if replays(backend) else evidence


def measuring_backend(chip: Chip) -> str | None:
    """The back-end that measures ``chip`` when it is the GPU here (its vendor's target), None for none."""
    from ..hardware._targets import target_of

    target = target_of(chip.vendor)
    for name in BACKENDS:
        cls = backend_class(name)
        if cls.measures_device and cls.target == target:
            return name
    return None


def _named_selection(choice: str, wanted: Chip | None, detected: Chip | None) -> Selection:
    """A back-end the user named: one that measures gives results for the GPU here, refused (``refusal``) when
    another chip was asked for; one that does not measures nothing, so it takes the chip asked for."""
    from ..hardware._chips import resolve_chip

    cls = backend_class(choice)
    chip = resolve_chip(wanted, measures=cls.measures_device, target=cls.target, default=True, detected=detected)
    if not cls.measures_device:
        return Selection(choice, chip)
    here = chip
    refusal = None
    if wanted is not None and here.vendor != "cpu" and wanted.name != here.name:
        refusal = (f"the {choice} back-end measures the GPU here ({here.name}), not {wanted.name}; "
                   f"use --backend {PREDICTOR} to predict for another chip")
    return Selection(choice, here, refusal=refusal)


def select_backend(choice: str, chip: str | Chip | None = None, *, detected: Chip | None = None,
                   verify: str = "finalists") -> Selection:
    """The back-end for ``choice`` and the chip its results are for (``hardware.resolve_chip``: the one chip rule).

    ``auto``: measure (metal on Apple GPUs, cuda on NVIDIA) when ``chip`` is the GPU here or none is named,
    else predict with the performance model for ``chip`` (default: an M-series chip), with a note. A back-end
    that measures gives results for the GPU here (``refusal`` says so when ``chip`` names another). ``verify``
    (``all``, ``finalists``, ``none``): what the model's note says the interpreter checks."""
    from ..hardware._chips import resolve_chip
    from ..hardware._targets import chip_target, interpretable

    wanted = resolve_chip(chip, detected=detected) if chip is not None else None  # an unknown name: refused here
    if choice != AUTO:
        return _named_selection(choice, wanted, detected)
    here = resolve_chip(detected=detected)
    measuring = measuring_backend(here)
    if measuring is not None and (wanted is None or wanted.name == here.name):
        return Selection(measuring, here)
    target = resolve_chip(wanted, target=backend_class(PREDICTOR).target, default=True, detected=here)
    why = f"{here.name} is not the chip to tune for" if here.vendor != "cpu" else "no GPU here"
    checked = [] if interpretable(chip_target(target.vendor)) else [
        "its CUDA kernels cannot run on the CPU Metal interpreter, so nothing is verified or published"]
    if verify == "all":
        checked.append("every variant is verified on the CPU Metal interpreter")
    elif verify == "none":
        checked.append("[yellow]nothing is verified[/] (--verify none)")
    elif not checked:
        checked.append("the winner and top finalists are verified on the CPU Metal interpreter")
    return Selection(PREDICTOR, target, (f"{why}: times are predicted by the performance model for {target.name} "
                                         f"([bold]modeled[/], not measured); {'; '.join(checked)}"))
