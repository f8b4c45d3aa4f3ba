"""Replay: a recorded landscape (KernelTuner cache file) as a study objective, standing in for the GPU.

Not a back-end: nothing is rendered or run, so it lives beside the study loop, not in ``backends/``
(``--backend replay`` selects it).

The space is the file's knobs; a config absent from the file is invalid (rejected before "compiling"),
a config recorded as failed fails with the recorded reason, and any other config's time is the median of
a few draws from its recorded repeated ``times``, so the search sees the same noise a real GPU showed.
The figures were measured on the GPU named in the file (``device_name``), not here; results say so.
Used to test and benchmark search strategies without a GPU.

Racing (``racing``, on by default, as on a GPU): the draws come one by one, and a config whose first
``RACE_AFTER`` draws lose against the incumbent's (``kernsearch.evaluation._race``) stops there and is
told to the search as not winning: a measured, slower time, never a finalist.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import BackendError, VariantFailure
from .._vocabulary import Evidence, TrialStatus
from ..backends._select import REPLAY
from ..evaluation._measure import spread
from ..evaluation._race import Race
from ._landscape import Landscape
from ._storage import StudyKey


class Replay:
    """Recorded times of a landscape's configs, drawn as a GPU would show them (evidence: measured, on the
    file's GPU)."""

    evidence = Evidence.MEASURED  # recorded measurements of the file's GPU, replayed

    def __init__(self, path: str | Path | None = None, seed: int | None = 0, draws: int = 5,
                 landscape: Landscape | None = None, racing: bool = True) -> None:
        if landscape is None and path is None:
            raise BackendError("replay needs a landscape file (KernelTuner cache format)")
        self.landscape = landscape if landscape is not None else Landscape.load(path)  # type: ignore[arg-type]
        self.rng = random.Random(seed)
        self.draws = draws
        self.racing = racing
        self.calls = 0

    def sample(self, config: dict[str, Any]) -> list[float]:
        """Noisy timing of ``config``: ``draws`` values drawn (with replacement) from its recorded times."""
        return self.sample_against(config, None)[0]

    def sample_against(self, config: dict[str, Any], race: Race | None) -> tuple[list[float], bool]:
        """:meth:`sample` one draw at a time, stopped as soon as ``race`` is lost: (draws, not winning)."""
        self.calls += 1
        entry = self.landscape.entry(config)
        if entry is None:
            raise VariantFailure(TrialStatus.INVALID, "config not in the landscape (it was not valid there)")
        if self.landscape.failed(entry):
            raise VariantFailure(TrialStatus.FAILED, f"recorded as {entry.get('time')}")
        times = self.landscape.samples(config) or []
        out: list[float] = []
        for _ in range(self.draws):
            out.append(self.rng.choice(times))
            if race is not None and race.lost(out):
                return out, True
        return out, False

    def objective(self, name: str | None = None) -> Any:
        """This landscape as a study objective (see ``_study.run_study``)."""
        from ._final import FinalistTime, FinalRound
        from ._objective_base import Objective
        from ._trial import Record

        backend = self
        land = self.landscape
        label = name or (Path(land.path).name.split(".")[0] if land.path else land.kernel_name or "landscape")

        class ReplayObjective(Objective):
            evidence = Evidence.MEASURED

            def __init__(self) -> None:
                self.backend = REPLAY
                self._valid = list(land.configs())
                self._keys = {land.key(c) for c in self._valid}

            @property
            def knobs(self) -> dict[str, list[Any]]:
                return land.knobs

            @property
            def study_key(self) -> StudyKey:
                dtype = str(land.meta.get("dtype") or "unknown-dtype")
                return StudyKey(label, replay_chip_name(land.device_name), dtype,
                                "x".join(map(str, np.atleast_1d(land.problem_size or [0]))), REPLAY)

            def violation(self, config: dict[str, Any]) -> str | None:
                return None if land.key(config) in self._keys else "absent_from_landscape"

            def valid_configs(self) -> list[dict[str, Any]]:
                return self._valid

            @property
            def races(self) -> bool:
                return backend.racing

            def evaluate(self, config: dict[str, Any]) -> Record:
                return self.evaluate_against(config, None)

            def evaluate_against(self, config: dict[str, Any], race: Race | None) -> Record:
                samples, lost = backend.sample_against(config, race if backend.racing else None)
                # recorded on the file's GPU and never run here: no proof (a replayed study publishes nothing)
                return Record(float(np.median(samples)), self.evidence, tuple(samples), spread(samples),
                              not_winning=lost)

            def prior(self, configs: list[dict[str, Any]]) -> list[float] | None:
                return _family_prior(land, configs)

            def finalize(self, top: list[Any]) -> FinalRound:
                """The final round: finalists re-measured with every recorded repetition, fastest median wins."""
                medians = {t.number: float(np.median(land.samples(t.config) or [math.inf])) for t in top}
                winner = min(medians, key=lambda n: (medians[n], n)) if medians else None
                return FinalRound(winner, finalists={n: FinalistTime(m) for n, m in medians.items()},
                                  note=f"replayed from {land.path}; measured on "
                                       f"{land.device_name or 'an unnamed GPU'}, not here")

        return ReplayObjective()


def _family_prior(land: Landscape, configs: list[dict[str, Any]]) -> list[float] | None:
    """For a landscape kernsearch recorded of one of its own families (``kernel_name`` "kernsearch FAMILY
    (...)", with ``chip``, ``dtype`` and ``problem_size``): the performance model's predictions, which a
    real tune of that family has before measuring anything. Knobs the file fixed take the family default."""
    name = str(land.kernel_name or "")
    chip_name, dtype = land.meta.get("chip"), land.meta.get("dtype")
    if not name.startswith("kernsearch ") or not chip_name or not dtype or land.problem_size is None:
        return None
    try:
        from ..family._space import Space, make_problem
        from ..family._spec import load_family
        from ..hardware._chips import get_chip
        from ._kernel import model_prior

        family = load_family(name.split()[1])
        chip = get_chip(str(chip_name))
        shape = ",".join(str(int(d)) for d in np.atleast_1d(land.problem_size))
        space = Space(make_problem(family, shape, str(dtype), chip), chip)
        full = [{**dict(family.default), **c} for c in configs]
        return model_prior(space, full)
    except Exception:  # noqa: BLE001 - not a family of this checkout, unknown chip: no prior
        return None


def replay_chip_name(device: str) -> str:
    """The recording GPU as a study key names a chip: the registry's name when it knows the device (``NVIDIA
    H100 80GB HBM3`` → ``H100``), else the device string without vendor words (``NVIDIA GeForce RTX 3090`` →
    ``RTX 3090``)."""
    import re

    from ..hardware._chips import registry

    for chip in registry().values():
        if chip.vendor != "cpu" and chip.device_match and chip.device_match in device:
            return chip.name
    short = re.sub(r"^(NVIDIA|AMD|Apple|Intel)\s+|^(GeForce|Radeon|Tesla|Quadro)\s+", "", device.strip())
    short = re.sub(r"^(GeForce|Radeon|Tesla|Quadro)\s+", "", short)
    return " ".join(short.split())[:60] or "unknown GPU"
