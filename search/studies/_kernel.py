"""What every objective over a family's kernel variants shares: the space of one problem on one chip, the warm
start, the model's ranking of the space, where the interpreter proves a config, the worker that runs variants,
and the winner a search hands to the store. The measured objective (``_measured``) and the modeled one
(``_modeled``) differ only in how a variant is evaluated and how the final round judges the leaders."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._errors import BackendError, KernsearchError, VariantFailure
from .._records import Figures, Prediction, Proof, Winner
from .._vocabulary import Evidence, Verifier
from ..family._space import Config
from ..hardware._targets import chip_target
from ._final import FinalistCheck, FinalRound
from ._objective_base import Objective
from ._storage import StudyKey
from ._trial import Record, Trial

#: Configs of its own a search evaluates where the performance model cannot rank the space: the best-predicted
#: ones, as many as the final round verifies by default.
PICKS = 3
#: Threadgroups of the tuned shape a winner runs on the interpreter before publishing (corners, edges,
#: random interior ones): a big problem cannot run whole on the CPU, a sample of its tiles can.
TUNED_SAMPLE = 12
#: The back-end that runs the interpreter's checks (the CPU Metal interpreter).
INTERPRETER_BACKEND = "cpu"

if TYPE_CHECKING:
    from ..artifacts._artifacts import ArtifactStore, PublishOutcome
    from ..backends._base import BaseBackend
    from ..family._render import KernelSource
    from ..family._space import Problem, Space
    from ..hardware._chips import Chip
    from ..variants._tasks import VariantTask
    from ._ranking import Ranking
    from ._study import StudyResult


@dataclass(frozen=True)
class Incumbent:
    """The key's current version, which a measured final round times its leader against: its version, and its config
    (which the objective renders to the very source the store holds)."""

    version: str
    config: Config


class KernelVariants(Objective):
    """A family's kernel variants on one problem and chip, evaluated by a back-end (``KernelObjective`` makes the
    measured or the modeled one). Configs are verified at ``verify_shape`` (default: the smallest shape where the
    family's constraints hold for the config, :func:`kernsearch.family._shapes.smallest_shape`)."""

    impl: BaseBackend

    def __init__(self, problem: Problem, chip: Chip, backend: str, *, seed: int = 0, timeout: float = 120.0,
                 verify: str = "finalists", verify_shape: tuple[int, ...] | None = None,
                 verify_mode: str = "fast", backend_options: dict[str, Any] | None = None) -> None:
        from ..backends import backend_class
        from ..family._space import Space

        self.problem, self.chip, self.backend, self.seed = problem, chip, backend, seed
        self.space: Space = Space(problem, chip)
        self.family = problem.family
        self.backend_options = dict(backend_options or {})
        cls = backend_class(backend)
        cls.check_tunable()
        self.backend_class = cls
        self.impl = self._make_backend()
        self.impl.check_available()
        self.evidence = self.impl.evidence
        # The model predicts the kernel the chip would run: Metal on Apple GPUs, CUDA on NVIDIA ones.
        self.target = self.impl.target or chip_target(chip.vendor)
        if self.target not in self.family.templates:  # a twin is optional: the family runs where it has one
            runs = " or ".join(sorted(self.family.templates))
            raise BackendError(f"family {self.family.name} has no {self.target} template ({self._runs_what()}); it "
                               f"has {runs} only: add templates.{self.target} to its family.toml, or tune it for a "
                               f"chip that runs {runs}")
        self.verify = verify
        self.verifier = cls.verifier()  # the back-end whose runs prove a config (itself, or the interpreter)
        self._verify_shape = tuple(verify_shape) if verify_shape else None
        self._small: dict[str, tuple[int, ...]] = {}  # config key -> its verification shape
        self.verify_mode = verify_mode
        self.timeout = timeout
        self._valid: list[Config] | None = None
        self._ranking: tuple[Ranking, list[Config]] | None = None
        self._ranked = False  # _ranking computed
        self._valid_predictions: list[Prediction] | None = None  # the model's, of every valid config (prior's too)
        self._start: list[Config] = []  # tune --start: configs evaluated first (start_with)
        self._worker: Any = None
        self._family_sha: str | None = None

    def _make_backend(self) -> BaseBackend:
        return self.backend_class(**self.backend_options)

    def _runs_what(self) -> str:
        return f"the {self.backend} back-end runs {self.target} kernels"

    # -- the space --------------------------------------------------------------------------------
    @property
    def knobs(self) -> dict[str, list[Any]]:
        return self.space.knobs

    @property
    def study_key(self) -> StudyKey:
        return StudyKey(self.family.name, self.chip.name, self.problem.dtype, self.problem.shape_text, self.backend)

    def family_sha256(self) -> str:
        if self._family_sha is None:
            from ..family._identity import family_sha256

            self._family_sha = family_sha256(self.family)
        return self._family_sha

    def rendered_sha256(self, config: Config) -> str | None:
        try:
            return self.render(config).sha256
        except VariantFailure:
            return None

    def violation(self, config: Config) -> str | None:
        bad = self.space.violations(config)
        return bad[0].constraint if bad else None

    def valid_configs(self) -> list[Config]:
        if self._valid is None:
            self._valid = self.space.enumerate().valid
        return self._valid

    def size(self) -> int | None:
        """Enumerating a large space takes long and only matters when a search could exhaust it."""
        return len(self.valid_configs()) if self.space.total <= 20000 else None

    def render(self, config: Config) -> KernelSource:
        """The variant's kernel; a config its template cannot render is this variant's failure ("render")."""
        from ..family._render import render

        try:
            return render(self.family, config, self.problem.dtype, self.target)
        except KernsearchError as exc:
            raise VariantFailure("render", str(exc)) from None

    def with_figures(self, rec: Record) -> Record:
        """``rec`` with the throughput and the share of the roofline its time means on this problem and chip."""
        flops = self.problem.flops()
        return replace(rec, gflops=flops / (rec.time_ms * 1e-3) / 1e9 if rec.time_ms > 0 else None,
                       peak_pct=roofline_pct(self.chip, self.problem, rec.time_ms))

    def default(self) -> Config | None:
        cfg = dict(self.family.default)
        return cfg if self.space.is_valid(cfg) else None

    def start_with(self, texts: list[str]) -> None:
        """``tune --start``: each text a config (``"PATH=h2,RT=2"``; knobs not given keep the family default),
        checked against this problem's space (an unknown knob, a bad value or a broken constraint is one line)."""
        self._start = [self.space.validate(self.space.parse_config(t)) for t in texts]

    def first_configs(self) -> list[Config]:
        return list(self._start)

    def against_current(self, store: ArtifactStore) -> Incumbent | None:
        """Have the final round time its leader against the key's current version in ``store`` (a measured search's,
        :class:`~kernsearch.studies._measured.MeasuredObjective`); a modeled or interpreted search times none."""
        return None

    def in_domain(self, config: Config) -> bool:
        """A stored config (a published version's) names this family's knobs with values of their domains: the
        family's domains may have changed since it was stored."""
        return set(config) == set(self.knobs) and all(
            type(config[k]) is type(values[0]) and config[k] in values for k, values in self.knobs.items())

    def warm_start(self, store: Any = None, limit: int = 5) -> list[Config]:
        """Configs of current published artifacts of this family, closest first: same chip and shape,
        same chip, same shape, then the rest (same dtype before others). A broken store never stops a
        search: it just gives no published configs (the model's picks still come)."""
        from ..artifacts._candidate import chip_slug

        try:
            from ..artifacts._artifacts import ArtifactStore

            artifacts = list((store or ArtifactStore()).current_artifacts(self.family.name))
        except Exception:  # noqa: BLE001 - no store, unreadable store: no published configs
            artifacts = []
        me = chip_slug(self.chip.name)

        def distance(a: Any) -> tuple[int, int, int]:
            return (a.key.chip != me, tuple(a.key.shape) != tuple(self.problem.shape),
                    a.key.dtype != self.problem.dtype)

        out: list[Config] = []
        for a in sorted(artifacts, key=distance):
            cfg = dict(a.manifest.config)
            if self.in_domain(cfg) and self.space.is_valid(cfg) and cfg not in out:
                out.append(cfg)
        out = out[:limit]
        ranked = self.model_ranking() if self.unrankable() else None
        for pick in ranked[1] if ranked is not None else []:  # nothing else will be searched: the model's picks
            if pick not in out:
                out.append(pick)
        return out

    # -- the model's view of the space --------------------------------------------------------------
    def prior(self, configs: list[Config]) -> list[float] | None:
        """The chip's performance model's predicted times (no measurement): the ``auto`` strategy's start; None
        where the model cannot rank the space (a flat prior would only make the start arbitrary)."""
        ranked = self.model_ranking()
        if ranked is not None and ranked[0].flat:
            return None
        if configs is self._valid and self._valid_predictions is not None:  # ranked already: predicted once
            return [p.time_ms for p in self._valid_predictions]
        return model_prior(self.space, configs)

    def model_ranking(self, *, whole: bool = False) -> tuple[Ranking, list[Config]] | None:
        """Whether the chip's performance model can rank this space, and its picks (the best-predicted valid
        configs, ties broken by headroom, then by closeness to the default: ``_ranking``), over every valid config
        (a sample of a space too big to enumerate, unless ``whole``: the search enumerates it anyway, for the
        ``auto`` prior, which then reuses these predictions); None where the model has nothing to say. Computed
        once."""
        if not self._ranked:
            from ._ranking import ranking

            self._ranked = True
            sampled = not whole and self._valid is None and self.space.total > 20000
            configs = self._sample(1000) if sampled else self.valid_configs()
            predictions = (model_predictions(self.space, configs) if sampled else self._predict_valid()) \
                if configs else None
            if predictions is not None:
                default = self.family.default
                order = sorted(range(len(configs)), key=lambda i: (
                    *predictions[i].key, sum(configs[i].get(k) != v for k, v in default.items())))
                self._ranking = (ranking(predictions, sampled=sampled, roofline=not self.family.model),
                                 [configs[i] for i in order[:PICKS]])
        return self._ranking

    def _predict_valid(self) -> list[Prediction] | None:
        """The model's predictions of every valid config (once: the ranking and the prior share them)."""
        if self._valid_predictions is None:
            self._valid_predictions = model_predictions(self.space, self.valid_configs())
        return self._valid_predictions

    def _sample(self, n: int) -> list[Config]:
        """Up to ``n`` distinct valid configs, uniform over the valid ones (a fixed seed: the verdict is the same
        every run), drawn through the space's pruned walk (:meth:`Space.sample`)."""
        import random

        from .._steps import step

        with step(f"sampling {n:,} valid configs of the {self.space.total:,} of {self.family.name} for the model",
                  total=n) as progress:
            return self.space.sample(n, random.Random(0), progress.advance)

    def model_note(self, *, whole: bool = False) -> str | None:
        """What `tune` says before searching when the model cannot rank this space (None when it can); ``whole``:
        see :meth:`model_ranking`."""
        ranked = self.model_ranking(whole=whole)
        if ranked is None or not ranked[0].flat:
            return None
        return self._flat_note(ranked[0].text())

    def _flat_note(self, verdict: str) -> str:
        return f"{verdict}; the search measures without its guidance"

    # -- running variants ---------------------------------------------------------------------------
    def _task(self, config: Config, backend: str, shape: tuple[int, ...] | None = None, **extra: Any) -> VariantTask:
        from ..variants._tasks import VariantTask

        return VariantTask(family=str(self.family.path), shape=tuple(shape or self.problem.shape),
                           dtype=self.problem.dtype, chip=self.chip.name, backend=backend, config=config,
                           seed=self.seed, backend_options=self.backend_options if backend == self.backend else {},
                           **extra)

    def worker(self) -> Any:
        if self._worker is None:
            from ..evaluation._worker import Worker

            self._worker = Worker(timeout=self.timeout)
        return self._worker

    def verify_shape(self, config: Config) -> tuple[int, ...]:
        """Where the interpreter proves ``config``: the given ``verify_shape``, else the smallest shape at which
        the family's constraints hold for it (the family's declared ``problem.verify_shape`` first; a config tuned
        for a big shape is often invalid at a small one)."""
        if self._verify_shape is not None:
            return self._verify_shape
        from ..family._shapes import smallest_shape
        from ..family._space import format_config

        key = format_config(config)
        if key not in self._small:
            self._small[key] = smallest_shape(self.family, self.problem.dtype, self.chip, config,
                                              tuple(self.problem.shape))
        return self._small[key]

    def ragged_shape(self, config: Config, near: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
        """A shape a little smaller than ``near`` (default: the config's verification shape) whose sizes are not
        multiples of the tiles, on which ``config`` is still valid (the family's declared ``problem.ragged_shape``
        first)."""
        from ..family._shapes import ragged_shape

        return ragged_shape(self.family, self.problem.dtype, self.chip, config,
                            tuple(near or self.verify_shape(config)))

    def verify_at(self, config: Config, shape: tuple[int, ...], *, backend: str | None = None,
                  within: float | None = None, **options: Any) -> Proof:
        """``config`` run on ``backend`` (default: the verifier) at ``shape`` against the float64 reference, in the
        worker (given ``within`` seconds, default its timeout); ``options`` go to the back-end's ``run`` (the
        interpreter's ``mode``, ``timeout``, ``sample_threadgroups``). Raises :class:`VariantFailure`."""
        from ..variants._tasks import verify_variant

        task = self._task(config, backend or self.verifier, shape, options=options)
        proof: Proof = self.worker().call(verify_variant, task, timeout=within)
        return proof

    def interpreter_ragged(self, config: Config, where: str = "a ragged shape") -> Proof:
        """The interpreter's out-of-bounds checks of ``config``'s Metal template at a ragged shape near its verification
        shape (every size off the tiles): check mode (races, missing barriers, uninitialized reads) with threadgroups
        in reverse order (a late write past a tile's edge is then not overwritten by the next tile's right value) and a
        poisoned guard zone after every output, then the sanitizer build (a read or write outside any buffer names its
        template line). Raises :class:`VariantFailure` naming the shape (:class:`FailureAt`)."""
        from .._steps import step

        timeout = max(1.0, self.timeout - 5, 60.0)  # the interpreter's, per run
        ragged = self.ragged_shape(config) or self.verify_shape(config)
        text = "x".join(map(str, ragged))
        with step(f"verifying the winner on the interpreter at a ragged shape {text} (check mode: races, missing "
                  "barriers; threadgroups in reverse order)"), failing_at(where, ragged):
            res = self.verify_at(config, ragged, backend=INTERPRETER_BACKEND, mode="check", timeout=timeout,
                                 schedule="reversed", within=max(self.timeout, 60.0) * 2)
        with step(f"checking the winner's device-buffer bounds at {text} (sanitizer build)"), failing_at(where, ragged):
            self.verify_at(config, ragged, backend=INTERPRETER_BACKEND, mode="sanitize", timeout=timeout,
                           within=max(self.timeout, 60.0) * 2)
        return res

    # -- the winner ---------------------------------------------------------------------------------
    def unpublishable(self) -> str | None:
        """Why no winner of this search could be published, known before it starts (None: one can be)."""
        return None

    def winner(self, result: StudyResult) -> Winner:
        """The study's winner as the store is offered it: its config, evidence and figures (the final round's where
        it ran) and where it was proven. A winner that failed its final check, or was proven nowhere at its tuned
        shape, is refused (one line)."""
        best = result.best
        if best is None:
            raise KernsearchError("no correct winner to publish")
        final = result.final or FinalRound(best.number)
        check = final.checks.get(best.number)
        if check is not None and not check.ok:
            raise KernsearchError(f"the winner failed its final check ({check.reason}): refusing to publish it")
        self._same_kernel(best, check)
        proof = self._proof(best, check)
        if proof is None:
            why = self.unpublishable() or "no check of it passed there"
            raise KernsearchError(f"the winner was not verified at its tuned shape ({why}): refusing to publish it")
        figures = final.figures if final.winner == best.number else None
        if figures is None:  # no figures against the op: its final re-timing, else the trial's own time
            timed = final.finalists.get(best.number)
            figures = Figures(median_ms=timed.median_ms if timed else best.time_ms,
                              spread=timed.spread if timed and timed.spread is not None else best.spread)
        return Winner(best.number, dict(best.config), Evidence(self.evidence), figures, result.study_name, proof,
                      sha256=self.rendered_sha256(best.config) or "")

    def _same_kernel(self, best: Trial, check: FinalistCheck | None) -> None:
        """Refuse (one line) a winner whose config renders now to another kernel than the one its trial evaluated or
        its final check proved: a proof is of one exact kernel (the family changed under a resumed study)."""
        now = self.rendered_sha256(best.config)
        proven = [("its trial evaluated", best.sha256)]
        if check is not None and check.ok:
            proven.append(("its final check proved", check.sha256 or "(no record of the kernel)"))
        for what, sha in proven:
            if sha and sha != now:
                template = self.family.template_path(self.target)
                raise KernsearchError(
                    f"stale proof: the winner (trial {best.number}) renders now to another kernel than {what} "
                    f"({sha[:12]}, now {(now or 'unrenderable')[:12]}): {template} or its family changed since; "
                    "refusing to publish it (run the search again: a changed family is a new study)")

    def _proof(self, best: Trial, check: FinalistCheck | None) -> Proof | None:
        """Where the winner was proven at its tuned shape (the interpreter's final check, by default)."""
        if check is None or not check.ok or check.max_abs_err is None:
            return None
        shapes = ["x".join(map(str, check.shape)), *(check.also or ())]
        if self.problem.shape_text not in shapes:
            return None
        return Proof(Verifier.INTERPRETER, tuple(sorted(set(shapes))), check.max_abs_err,
                     threadgroups_checked=check.threadgroups_checked)

    def publish(self, result: StudyResult, store: ArtifactStore | None = None,
                margin: float | None = None) -> PublishOutcome:
        """Offer the study's winner to the artifact store (its regression gate decides); returns the store's
        PublishOutcome. Only a winner proven correct (on the device, or on the interpreter for a modeled result)
        is offered; its evidence kind goes with it (``Candidate.from_winner``: every publish takes that path)."""
        from .._rules import DEFAULT_MARGIN
        from ..artifacts._artifacts import ArtifactStore
        from ..artifacts._candidate import Candidate

        candidate = Candidate.from_winner(self.winner(result), self.space, target=self.target)
        return (store or ArtifactStore()).publish(candidate, margin=DEFAULT_MARGIN if margin is None else margin)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
            self._worker = None


class FailureAt(VariantFailure):
    """A winner's further check failed: the failure names the shape it failed at."""

    def __init__(self, failure: VariantFailure, where: str, shape: tuple[int, ...]) -> None:
        super().__init__(failure.reason, f"at {where} {'x'.join(map(str, shape))}: {failure.detail}")
        self.shape = shape


@contextmanager
def failing_at(where: str, shape: tuple[int, ...]) -> Iterator[None]:
    """A :class:`VariantFailure` inside, raised again as a :class:`FailureAt` ``where`` at ``shape``."""
    try:
        yield
    except FailureAt:
        raise
    except VariantFailure as exc:
        raise FailureAt(exc, where, tuple(shape)) from None


def roofline(chip: Chip, problem: Problem) -> tuple[float, str]:
    """The problem's roofline time on ``chip`` in seconds, and what bounds it: its FLOPs at the compute peak
    ("compute peak") or its bytes at the DRAM bandwidth ("DRAM bandwidth"), whichever takes longer."""
    peak_flops = chip.peak_tflops(problem.dtype) * 1e12
    bandwidth = chip.memory_bandwidth_gbs * 1e9
    compute = problem.flops() / peak_flops if peak_flops else 0.0
    memory = problem.bytes() / bandwidth if bandwidth else 0.0
    return (compute, "compute peak") if compute >= memory else (memory, "DRAM bandwidth")


def roofline_pct(chip: Chip, problem: Problem, time_ms: float) -> float | None:
    """How close ``time_ms`` is to the problem's roofline on ``chip``, in percent (a memory-bound kernel is judged
    by the DRAM bandwidth, not by a compute peak it could never reach)."""
    bound_s, _ = roofline(chip, problem)
    return 100.0 * bound_s / (time_ms * 1e-3) if time_ms > 0 and bound_s > 0 else None


def model_prior(space: Space, configs: list[Config]) -> list[float] | None:
    """Modeled times of ``configs`` on ``space``'s problem and chip (inf where the model cannot say), or
    None when the model has nothing for this family or chip. Never raises: a prior is optional."""
    predictions = model_predictions(space, configs)
    return None if predictions is None else [p.time_ms for p in predictions]


def model_predictions(space: Space, configs: list[Config]) -> list[Prediction] | None:
    """The model's predictions of ``configs`` (``_ranking.predict``), as a step of the display."""
    from .._steps import step
    from ._ranking import predict

    with step(f"ranking {len(configs):,} valid configs with the {space.chip.name} model"):
        return predict(space, configs)


__all__ = ["INTERPRETER_BACKEND", "PICKS", "TUNED_SAMPLE", "FailureAt", "KernelVariants", "failing_at",
           "model_predictions", "model_prior", "roofline", "roofline_pct"]
