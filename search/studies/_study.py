"""The search: one Optuna study per problem, a trial per kernel variant, failures recorded, never fatal.

Python API (what the CLI, the nightly flows and the GPU scripts call)::

    from kernsearch.studies._objective import KernelObjective
    from kernsearch.studies._study import run_study
    objective = KernelObjective(problem, chip, "cuda", seed=0)   # render, build, verify, time one config
    result = run_study(objective, trials=200, time_budget="10m", seed=0,
                       storage=None, study_name=None)          # -> StudyResult
    result.best.config, result.best.time_ms, result.evidence, result.top, result.failures

``run_study`` takes any :class:`Objective` (a replayed landscape's ``Replay(path).objective()`` is
another) and keyword options: ``sampler`` (``default`` | ``tpe`` | ``random`` | ``grid`` | ``auto`` | ``forest`` |
``hybrid``: auto and forest propose only valid configs, ``_strategy`` and ``_forest``; hybrid is TPE, then the
forest), ``patience`` (stop after that
many evaluated trials without a new best), ``finalists``, ``progress`` (a callback receiving
:class:`Progress`), ``stop`` (a callable; true ends the search). What a trial does (``verify``: ``all`` |
``finalists`` | ``none``, ``timeout`` seconds per variant) is the objective's.

The loop (:class:`_Search`): ask the sampler for a config → reject it before compiling if a constraint
forbids it (the constraint is recorded) → skip it if the study already evaluated it (its recorded value
is told again, nothing is measured twice; two processes on one study claim configs through the shared
storage) → otherwise evaluate it (render → build → verify → time in an isolated worker, racing the incumbent:
a config that cannot beat it stops early and is recorded ``not_winning``, a measured slower time that is
never a finalist) and record every figure as trial attributes; a :class:`VariantFailure` marks the trial
failed with its reason. One evaluation is in flight at a time; a pipelined objective's runs in a background
thread while the loop asks for the next proposals (compiled ahead in other processes). When the
sampler keeps proposing configs that are invalid or known, an unevaluated neighbour of a leader (or a
random unevaluated config) is asked for instead, so the budget is always spent on new configs; after ten
trials every third one is such a local step. Trial 0 is the family's default config, then configs of
published artifacts (warm start), then the best configs of the family's other studies in the same storage
(transfer, ``_transfer``). ``--trials N`` is the number of evaluated configs the *study* should
hold, so re-running a command resumes the study and two processes on one study share one budget.

The kernel-specific evaluation (:class:`KernelObjective`) lives in ``_objective``; where studies are
stored (``make_storage``, ``study_name_for``) in ``_storage``.
"""

from __future__ import annotations

import math
import random
import re
import signal
import threading
import time
import warnings
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

from .._errors import KernsearchError, VariantFailure
from .._vocabulary import EVALUATED, Evidence, TrialStatus
from ..family._space import Config, format_config
from ._final import FinalRound
from ._storage import Heartbeat, StudyKey, default_storage, make_storage, redact, retry_collisions

__all__ = ["EVALUATED", "Objective", "Progress", "Record", "Stop", "StopReason", "StudyResult", "TrialStatus",
           "TrialSummary", "first_ctrl_c_stops", "run_study"]

if TYPE_CHECKING:
    import optuna

    from ..evaluation._race import Race
    from ._inflight import InFlight


STATUS_OK, STATUS_FAILED, STATUS_INVALID, STATUS_KNOWN = (TrialStatus.OK, TrialStatus.FAILED, TrialStatus.INVALID,
                                                          TrialStatus.KNOWN)
STATUS_CANCELLED, STATUS_NOT_WINNING = TrialStatus.CANCELLED, TrialStatus.NOT_WINNING
SAMPLERS = ("default", "tpe", "random", "grid", "auto", "forest", "hybrid")
#: ``default``: ``auto`` when the objective has a prior (the chip's performance model ranks the family's
#: configs), else ``tpe``. Measured on the held-out H100 GEMM landscape (benchmarks/search_landscapes.txt):
#: with the prior, auto scores 0.999 at 1 % of the space where TPE scores 0.61; without one, auto is not
#: reliably better than TPE on the tuning landscapes.


# -- what a study optimises ---------------------------------------------------------------------------

@dataclass
class Record:
    """Everything measured (or predicted, or replayed) about one variant."""

    time_ms: float
    evidence: str  # an Evidence: measured | modeled (interpreted runs are correctness only and never a time)
    samples_ms: list[float] = field(default_factory=list)
    spread: float = 0.0
    compile_seconds: float = 0.0
    sha256: str = ""
    gflops: float | None = None
    peak_pct: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    verified: str | None = None  # a Verifier (device, interpreter, recorded) or None (not verified)
    #: Orders equal times (smaller first): the modeled on-core time under the bound (``_ranking``); None: none.
    tie_break: float | None = None
    not_winning: bool | None = None  # True: its timing stopped early, it could not beat the incumbent (racing)

    def to_json(self) -> dict[str, Any]:
        """The trial's record as the study stores it (its ``record`` attribute, one JSON): no empty fields, figures
        to 6 significant digits (far finer than the timing noise), so optuna-dashboard and `show --json` stay
        readable."""
        def short(v: Any) -> Any:
            if isinstance(v, float):
                return float(f"{v:.6g}")
            if isinstance(v, list):
                return [short(x) for x in v]
            return v

        return {k: short(v) for k, v in asdict(self).items() if v is not None and v != []}

    @classmethod
    def from_json(cls, data: object) -> Record:
        """A stored record read back from a storage it does not trust: a field of the wrong type (or a sample that
        is not a finite number) is dropped, never used; a record that is not one reads as an empty one."""
        a = data if isinstance(data, dict) else {}
        samples = a.get("samples_ms")
        if not isinstance(samples, list) or not all(_number(x) is not None and math.isfinite(x) for x in samples):
            samples = []
        values: dict[str, Any] = {}
        for f in fields(cls):  # each field by its declared type; a value of another type is dropped
            v = a.get(f.name)
            if f.type == "float" or f.type == "float | None":
                values[f.name] = _number(v)
            elif f.type == "str" or f.type == "str | None":
                values[f.name] = v if isinstance(v, str) else None
            elif f.type == "bool | None":
                values[f.name] = True if v is True else None
        values = {k: v for k, v in values.items() if v is not None}
        return cls(**{"time_ms": math.nan, "evidence": "", **values, "samples_ms": [float(x) for x in samples]})


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


class Objective(ABC):
    """A space of configs and a way to evaluate one; a study minimises its time."""

    backend: str
    evidence: str

    @property
    @abstractmethod
    def knobs(self) -> dict[str, list[Any]]:
        """Knob name → values, as the sampler sees them."""

    @property
    @abstractmethod
    def study_key(self) -> StudyKey:
        """What identifies the study: family, chip, dtype, shape, backend (an objective of your own may give a
        mapping of these five)."""

    @abstractmethod
    def violation(self, config: Config) -> str | None:
        """Why ``config`` cannot be built (a constraint's name), or None when it is valid."""

    def family_sha256(self) -> str:
        """The content hash of what configs render from ("": nothing to tell apart). A study keeps the one it was
        made with: a resumed study whose family changed since is another study (:func:`study_for`)."""
        return ""

    def rendered_sha256(self, config: Config) -> str | None:
        """The hash of the exact kernel ``config`` renders to now (None: no rendered kernel). A proof stored with
        the study holds only for the kernel it ran: the final round is re-run where they differ."""
        return None

    @abstractmethod
    def valid_configs(self) -> list[Config]:
        """Every valid config (may be slow for large spaces: the loop asks only when it must)."""

    def size(self) -> int | None:
        """How many valid configs there are, when that is cheap to know (the search stops at it)."""
        return len(self.valid_configs())

    def random_config(self, rng: random.Random, tries: int = 200) -> Config | None:
        """A random valid config: rejection sampling over the knobs, else one from the enumeration."""
        for _ in range(tries):
            cfg = {k: rng.choice(v) for k, v in self.knobs.items()}
            if self.violation(cfg) is None:
                return cfg
        valid = self.valid_configs()
        return rng.choice(valid) if valid else None

    @abstractmethod
    def evaluate(self, config: Config) -> Record:
        """Measure one config; raise :class:`VariantFailure` when it fails."""

    @property
    def races(self) -> bool:
        """Whether :meth:`evaluate_against` stops a timing that can no longer win (the loop then works out
        the incumbent's bound for it)."""
        return False

    def evaluate_against(self, config: Config, race: Race | None) -> Record:
        """:meth:`evaluate`, racing the incumbent: a config that cannot beat it may stop early and come back
        with ``not_winning`` and its partial samples (see ``kernsearch.evaluation._race``)."""
        return self.evaluate(config)

    def default(self) -> Config | None:
        return None

    def first_configs(self) -> list[Config]:
        """Configs the user asked to be evaluated first (``tune --start``), before the default and warm start."""
        return []

    def prior(self, configs: list[Config]) -> list[float] | None:
        """Predicted times of ``configs`` (e.g. the chip's performance model), or None: the ``auto``
        strategy starts from the best-predicted configs and learns the prediction's error."""
        return None

    def lookahead(self) -> int:
        """How many proposals the loop may hand to :meth:`prefetch` before the oldest is evaluated
        (1: one at a time, the loop as it always was)."""
        return 1

    def prefetch(self, config: Config) -> None:
        """``config`` will be evaluated soon: start what can run ahead (e.g. compiling it elsewhere)."""

    def warm_start(self) -> list[Config]:
        return []

    def unrankable(self) -> str | None:
        """Why evaluating more configs cannot rank this space (a performance model that predicts most of them
        alike), or None. The search then evaluates its first configs (default, warm start) and stops."""
        return None

    def baseline_ms(self) -> float | None:
        """The baseline op's time on this problem, when it can be measured here (for the progress display)."""
        return None

    def finalize(self, top: list[TrialSummary]) -> FinalRound:
        """Final checks of the leaders (re-measure, verify): the winner, and what to record on the study."""
        return FinalRound(top[0].number if top else None)

    def close(self) -> None:
        """Release workers."""


# -- results ------------------------------------------------------------------------------------------

@dataclass
class TrialSummary:
    number: int
    config: Config
    time_ms: float
    evidence: str
    spread: float = 0.0
    gflops: float | None = None
    peak_pct: float | None = None
    max_abs_err: float | None = None
    verified: str | None = None
    sha256: str = ""

    @classmethod
    def from_trial(cls, t: optuna.trial.FrozenTrial) -> TrialSummary:
        r = Record.from_json(t.user_attrs.get("record"))
        value = t.value if t.value is not None else math.inf
        return cls(t.number, dict(t.user_attrs["config"]), float(value), r.evidence, r.spread, r.gflops, r.peak_pct,
                   r.max_abs_err, r.verified, r.sha256)


class StopReason(Enum):
    """Why a search ended."""

    BUDGET = "budget"  # the study holds the --trials evaluated configs it was asked for
    TIME_BUDGET = "time budget"
    PATIENCE = "patience"  # no new best in the last --patience evaluated configs
    EXHAUSTED = "exhausted"  # every valid config of the space evaluated
    UNRANKABLE = "cannot rank"  # the objective's times cannot rank the space (a flat performance model)
    STOPPED = "stopped"  # a first Ctrl-C or a stop request: the trial in flight finished first
    INTERRUPTED = "interrupted"  # a second Ctrl-C: the trial in flight was abandoned

    @property
    def by_request(self) -> bool:
        """Cut short by a person (Ctrl-C) or a stop request rather than ended by the search's own limits:
        nothing is published and the CLI exits 130."""
        return self in (StopReason.STOPPED, StopReason.INTERRUPTED)


@dataclass(frozen=True)
class Stop:
    """A :class:`StopReason` with what its message needs; :attr:`text` is what the CLI prints."""

    reason: StopReason
    patience: int | None = None  # PATIENCE: the patience that ran out
    before_run: bool = False  # BUDGET, PATIENCE: already so when this run started (it evaluated nothing)
    evaluated: int = 0  # BUDGET before_run: configs the study already held
    note: str = ""  # UNRANKABLE: why (the objective's message)

    @property
    def text(self) -> str:
        if self.reason is StopReason.UNRANKABLE:
            return self.note or "the performance model cannot rank this space"
        if self.reason is StopReason.BUDGET:
            if not self.before_run:
                return "trial budget reached"
            # a resumed study that already had its budget: say how to go on
            return (f"trial budget reached: the study already has {self.evaluated} configs evaluated and --trials "
                    f"counts the whole study (e.g. --trials {self.evaluated + 50} evaluates 50 more)")
        if self.reason is StopReason.PATIENCE:
            return f"no improvement in {self.patience} trials" + (
                " (before this run started: to search on, raise --patience, or 0 for no early stop)"
                if self.before_run else "")
        return _STOP_TEXT[self.reason]


_STOP_TEXT = {StopReason.TIME_BUDGET: "time budget reached", StopReason.EXHAUSTED: "every valid config evaluated",
              StopReason.STOPPED: "stopped (Ctrl-C or a stop request); finished trials are kept",
              StopReason.INTERRUPTED: "interrupted (Ctrl-C); finished trials are kept"}


@dataclass
class StudyResult:
    study_name: str
    storage: str
    backend: str
    evidence: str
    key: StudyKey
    best: TrialSummary | None  # the final round's winner (the leader when no final round ran)
    top: list[TrialSummary]
    evaluated: int  # distinct configs evaluated in the study (ok + failed)
    failures: Counter[str]
    invalid: int  # proposals rejected before compiling
    elapsed_s: float
    stop: Stop
    final: FinalRound | None = None  # None: no final round ran (nothing correct, or interrupted)
    overhead_s_per_trial: float = 0.0  # time per new trial not spent evaluating (sampler, storage, loop)

    @property
    def stop_reason(self) -> str:
        """Why the search ended, as the CLI prints it."""
        return self.stop.text

    def to_dict(self) -> dict[str, Any]:
        """As ``tune --json`` prints it: ``stop_reason`` the text, ``final`` its stored form."""
        d = {"stop_reason" if k == "stop" else k: v for k, v in asdict(self).items()}
        d["key"] = self.key.as_dict()
        d.update(stop_reason=self.stop.text, final=self.final.to_dict() if self.final is not None else {},
                 failures=dict(self.failures))
        return d


@dataclass
class Progress:
    """What the progress display shows after each trial."""

    done: int
    total: int | None
    elapsed_s: float
    remaining_s: float | None
    best: TrialSummary | None
    failures: Counter[str]
    invalid: int
    last: str
    baseline_ms: float | None = None

    @property
    def speedup(self) -> float | None:
        """Baseline time / best time so far (measured back-ends only; the final round re-measures)."""
        return self.baseline_ms / self.best.time_ms if self.baseline_ms and self.best else None


# -- options ------------------------------------------------------------------------------------------

def parse_duration(text: str | float | None) -> float | None:
    """``"10m"``, ``"90s"``, ``"1h30m"`` or seconds → seconds."""
    if text is None or isinstance(text, (int, float)):
        return None if text is None else float(text)
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or parts is None or not any(parts.groups()):
        raise KernsearchError(f"bad duration {text!r}: use e.g. 90s, 10m, 1h30m")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    return h * 3600 + m * 60 + s


def ordinal(values: list[Any]) -> bool:
    """Numeric knobs with more than two values: a local step moves them to an adjacent value."""
    return len(values) > 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def distributions(knobs: dict[str, list[Any]]) -> dict[str, Any]:
    """Every knob is categorical for the sampler. (Numeric knobs searched by position were tried: no
    better on the four benchmark landscapes, worse on two.)"""
    from optuna.distributions import CategoricalDistribution

    return {k: CategoricalDistribution(v) for k, v in knobs.items()}


#: Every LOCAL_EVERY-th new trial (after ten) is a one-knob neighbour of a leader instead of a TPE
#: proposal: tuned on the four landscapes of benchmarks/search_landscapes.py (0 turns it off).
LOCAL_EVERY = 3


#: Constant liar (TPE treats configs being evaluated elsewhere as bad) stays off: with N = 2..8 workers on
#: one study it did not improve best-found vs budget (benchmarks/farm_scale.txt: within the seed spread,
#: slightly lower medians at N = 2 and 8). Alone it changes nothing either way.
CONSTANT_LIAR = False


def _switch() -> int:
    """The trial from which ``hybrid`` asks the forest (``_forest.HYBRID_SWITCH``)."""
    from ._forest import HYBRID_SWITCH

    return HYBRID_SWITCH


def make_sampler(name: str, seed: int | None, knobs: dict[str, list[Any]]) -> optuna.samplers.BaseSampler:
    import optuna

    if name in ("tpe", "default", "hybrid"):  # hybrid: TPE, then the forest (``_fixed``)
        # constant liar: configs proposed but not timed yet (pipelined, or other processes') repel proposals
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10,
                                              constant_liar=CONSTANT_LIAR)
    if name in ("random", "auto", "forest"):  # auto, forest: every config comes from the strategy, Optuna only stores
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        class Grid(optuna.samplers.GridSampler):
            def after_trial(self, *args: Any, **kwargs: Any) -> None:
                """Optuna's grid stops the study when its grid is done, which only works inside
                ``optimize``; the loop here stops by itself (every valid config evaluated)."""

        return Grid(knobs, seed=seed)
    raise KernsearchError(f"unknown sampler {name!r} (known: {', '.join(SAMPLERS)})")


# -- the loop -----------------------------------------------------------------------------------------

def run_study(objective: Objective, *, trials: int | None = 100, time_budget: str | float | None = None,
              patience: int | None = None, sampler: str = "default", seed: int | None = None,
              storage: str | None = None, study_name: str | None = None, finalists: int = 3,
              progress: Callable[[Progress], None] | None = None,
              stop: Callable[[], bool] | None = None) -> StudyResult:
    """Search for the fastest correct variant; see the module docstring. Finished trials are always kept.

    ``objective`` evaluates configs: a kernel family's is ``KernelObjective(problem, chip, backend, ...)``
    (``kernsearch.studies._objective``), a replayed landscape's ``Replay(path).objective()``. ``stop`` ends the
    search after the trial in flight; a ``KeyboardInterrupt`` ends it at once (the trial in flight recorded as
    interrupted). Signals are the caller's: ``kernsearch tune`` stops on a first Ctrl-C and interrupts on a
    second through :func:`first_ctrl_c_stops`.
    """
    if not isinstance(objective, Objective):  # e.g. a Family: `kernsearch.tune` searches a family
        raise TypeError(f"run_study takes an Objective (e.g. KernelObjective(problem, chip, backend)), "
                        f"not {type(objective).__name__}; kernsearch.tune(family, ...) searches a family")
    try:
        search = _Search(objective, trials=trials, time_budget=parse_duration(time_budget), patience=patience,
                         sampler=sampler, seed=seed, storage=storage, study_name=study_name, progress=progress,
                         stop=stop)
        return search.finish(search.run(), finalists)
    finally:
        objective.close()


@contextmanager
def first_ctrl_c_stops() -> Iterator[threading.Event]:
    """While inside, the first Ctrl-C sets the event (pass ``stop=event.is_set`` to :func:`run_study`: the trial in
    flight finishes, then the search stops and keeps everything); a second one raises ``KeyboardInterrupt``
    (interrupting at once). The previous handler is restored on leaving; off the main thread, nothing is
    installed."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return

    def handler(signum: int, frame: Any) -> None:
        if event.is_set():
            raise KeyboardInterrupt
        event.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass(frozen=True)
class StudyPlace:
    """Which study a run works in: its name, the trials it holds already (0: a new one) and, where the named study
    was made from another version of the family, what this run says about it (the study it uses instead)."""

    name: str
    trials: int = 0
    changed: str | None = None


def study_for(objective: Objective, storage: str | None, study_name: str | None) -> StudyPlace:
    """The study ``objective`` resumes or starts: ``study_name`` (default: its key's name), unless that study was
    made from another version of the family (its content hash differs): its trials and proofs are of other
    kernels, so the run works in ``NAME@HASH`` instead (found again by the next run of the same family)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    key = StudyKey.of(objective.study_key)
    name = study_name or key.name
    sha = objective.family_sha256()
    study = _load(name, storage)
    if study is None:
        return StudyPlace(name)
    stored = study.user_attrs.get("family_sha256")
    made = study.user_attrs.get("knobs") is not None
    if not sha or not made or stored == sha:
        return StudyPlace(name, len(study.get_trials(deepcopy=False)))
    other = f"{name}@{sha[:12]}"
    again = _load(other, storage)
    was = f"family content {str(stored)[:12]}" if isinstance(stored, str) else "a family of unrecorded content"
    note = (f"study {name!r} was made from another version of family {key.family} ({was}, now {sha[:12]}): its "
            f"trials prove other kernels, so this run {'resumes' if again is not None else 'starts'} study "
            f"{other!r}")
    return StudyPlace(other, len(again.get_trials(deepcopy=False)) if again is not None else 0, note)


def _load(name: str, storage: str | None) -> optuna.Study | None:
    import optuna

    try:
        return optuna.load_study(study_name=name, storage=make_storage(storage))
    except KeyError:
        return None


def open_study(objective: Objective, storage: str | None, study_name: str | None, sampler: str,
               seed: int | None) -> optuna.Study:
    """Create or resume the study (before any worker starts: a new SQLite file must not race)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    key = StudyKey.of(objective.study_key)
    name = study_for(objective, storage, study_name).name
    made = make_sampler(sampler, seed, objective.knobs)
    study = retry_collisions(lambda: optuna.create_study(study_name=name, storage=make_storage(storage),
                                                         direction="minimize", sampler=made, load_if_exists=True))
    if study.user_attrs.get("knobs") is None:
        for k, v in key.as_dict().items():
            study.set_user_attr(k, v)
        if objective.family_sha256():
            study.set_user_attr("family_sha256", objective.family_sha256())
        study.set_user_attr("knobs", objective.knobs)
        study.set_user_attr("evidence", objective.evidence)
    else:
        _check_same_problem(study, objective, name)
    if study.metric_names is None:  # optuna-dashboard labels its axes with it ("Objective 0" without)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names([metric_name(objective.evidence)])
    return study


def metric_name(evidence: str) -> str:
    """What a study minimises, with its unit: a predicted time is said to be one."""
    return "predicted kernel time (ms)" if evidence == Evidence.MODELED else "kernel time (ms)"


def check_study(objective: Objective, storage: str | None, study_name: str | None) -> None:
    """What :func:`open_study` refuses, checked read-only before any work (the CLI: before its banner): an
    existing study of that name made for another space or problem."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    name = study_for(objective, storage, study_name).name
    try:
        study = optuna.load_study(study_name=name, storage=make_storage(storage))
    except KeyError:  # no such study yet: open_study creates it
        return
    if study.user_attrs.get("knobs") is not None:
        _check_same_problem(study, objective, name)


def _check_same_problem(study: optuna.Study, objective: Objective, name: str) -> None:
    differs = [f"{k} {study.user_attrs.get(k)!r} (asked: {v!r})"
               for k, v in StudyKey.of(objective.study_key).as_dict().items()
               if study.user_attrs.get(k) != v]
    if study.user_attrs.get("knobs") != objective.knobs:
        differs.append("its knobs")
    if differs:
        raise KernsearchError(f"study {name!r} was made for another space or problem: {', '.join(differs)}; "
                              "choose another --study name")


class _Search:
    """The loop's state and its steps: :meth:`_propose` asks the sampler for a new trial and records what is
    not evaluated (invalid, known); :meth:`_start_oldest` starts evaluating the oldest queued proposal and
    :meth:`_record_oldest` records it; :meth:`run` alternates them until a :class:`Stop`."""

    def __init__(self, objective: Objective, *, trials: int | None, time_budget: float | None,
                 patience: int | None, sampler: str, seed: int | None, storage: str | None, study_name: str | None,
                 progress: Callable[[Progress], None] | None, stop: Callable[[], bool] | None) -> None:
        from optuna.trial import TrialState

        self.started = time.monotonic()
        self.objective, self.trials, self.time_budget, self.patience = objective, trials, time_budget, patience
        self.seed, self.storage, self.progress, self.stop_requested = seed, storage, progress, stop
        study_name = study_for(objective, storage, study_name).name
        self.prior = None
        if sampler in ("default", "auto") and not _finished(objective, storage, study_name, trials, patience):
            valid = objective.valid_configs()
            self.prior = objective.prior(valid) if valid else None
        if sampler == "default":
            sampler = "auto" if self.prior is not None else "tpe"
        self.sampler = sampler
        self.study = study = open_study(objective, storage, study_name, sampler, seed)
        self.dists = distributions(objective.knobs)
        self.rng = random.Random(seed)
        self.size = objective.size()
        self.beat = Heartbeat(study)  # this process's running trial stays alive; dead processes' trials are failed
        retry = self.beat.fail_stale()
        self.known = _known(study)  # key -> Seen: every config the study has evaluated (ok or failed)
        # Another process working on this study (running trials now, or gaps in trial numbers later) means
        # claims must be checked against the shared storage; alone, the local view is complete.
        at_start = study.get_trials(deepcopy=False)
        self.shared = any(t.state == TrialState.RUNNING for t in at_start)
        self.next_number = len(at_start)  # a first trial numbered otherwise: another process asked one meanwhile
        self.last_number: int | None = None
        # The configs the user named first (--start), the default config (trial 0 of a new study), then configs of
        # published artifacts. Fixed
        # configs are asked for through this process's sampler, not Optuna's shared queue of enqueued trials
        # (two processes popping one queued trial from SQLite at once is a race).
        self.first: list[Config] = []
        for c in retry + objective.first_configs() + [objective.default()] + objective.warm_start():
            if c is not None and format_config(c) not in self.known and c not in self.first:
                self.first.append(c)
        self.first += self._transferred({format_config(c) for c in self.first} | set(self.known))
        self.failures: Counter[str] = Counter(s.reason for s in self.known.values() if s.value is None)
        self.baseline = objective.baseline_ms() if progress is not None else None
        self.invalid = self.skips = self.new = 0
        self.eval_seconds = 0.0
        self.loop_started = time.monotonic()
        self.trial: optuna.Trial | None = None  # asked and not told yet: closed if the loop ends abruptly
        # Pipelined evaluation: proposals are handed to the objective (compiled ahead in other processes)
        # up to ``depth`` held at once, the oldest being evaluated; what is still ahead when the search stops
        # is closed.
        self.depth = max(1, objective.lookahead())
        self.ahead: deque[tuple[optuna.Trial, Config, str]] = deque()
        self.inflight: InFlight[Record] | None = None  # the evaluation of ahead[0], once started
        self.strategy: Any = None
        self.unrankable = objective.unrankable()
        if self.unrankable or study.user_attrs.get("cannot_rank"):  # the report says it too (or no longer)
            study.set_user_attr("cannot_rank", self.unrankable or "")

    def _transferred(self, exclude: set[str]) -> list[Config]:
        """Transfer (``_transfer``): the best configs of this family's other studies in the same storage (another
        shape, chip or dtype), mapped into this space; nothing for a study in memory or a storage that fails."""
        key = StudyKey.of(self.objective.study_key)
        if (self.storage or default_storage()) == ":memory:" or not key.family:
            return []
        from ._transfer import completed_with, nearest_valid, ranked_studies, transfer_configs

        objective = self.objective
        try:
            ranked = ranked_studies(make_storage(self.storage), key, objective.evidence, STATUS_OK)
        except Exception:  # noqa: BLE001 - no transfer is never fatal
            return []
        if not ranked:
            return []
        complete = nearest_valid(objective.knobs, objective.valid_configs()) if self.size is not None else \
            completed_with(objective.knobs, objective.default(), objective.violation)
        return transfer_configs(ranked, complete, exclude=exclude)

    def run(self) -> Stop:
        """Propose and evaluate until a limit, a stop request or Ctrl-C; proposals not evaluated are closed.

        One evaluation is in flight at a time (the oldest proposal); for a pipelined objective it runs in a
        background thread while this loop asks for the next proposals, up to ``depth`` held at once."""
        from optuna.trial import TrialState

        study = self.study
        self.loop_started = time.monotonic()
        try:
            while True:
                if self.shared:
                    self.known.update(_known(study))  # the shared budget counts every process's trials
                    # A process that died mid-trial: its trial is failed here, and its config asked for again.
                    self.first[:0] = [c for c in self.beat.fail_stale()
                                      if format_config(c) not in self.known and c not in self.first]
                if self.inflight is not None and self.inflight.done:
                    self._record_oldest()
                stop = self._limit_reached()
                if stop is not None:
                    if self.inflight is not None:  # the evaluation in flight finishes and counts
                        self._record_oldest()
                    return stop
                if self.inflight is None and self.ahead:
                    self._start_oldest()
                    continue
                full = self._full()
                if full is None and len(self.ahead) < self.depth:
                    self._propose()
                    continue
                if self.inflight is not None:
                    self._record_oldest()
                    continue
                assert full is not None  # depth >= 1: only a full study ends with nothing queued
                if not self.new and full.reason is StopReason.BUDGET:
                    return Stop(StopReason.BUDGET, before_run=True, evaluated=len(self.known))
                return full
        except KeyboardInterrupt:
            for trial in self._open_trials():  # in flight: not a result; record why, and keep the rest
                trial.set_user_attr("status", TrialStatus.INTERRUPTED)
                study.tell(trial, state=TrialState.FAIL)
            return Stop(StopReason.INTERRUPTED)
        except BaseException:  # a bug of kernsearch itself: close the trial in flight, keep the traceback
            for trial in self._open_trials():
                trial.set_user_attr("status", TrialStatus.ERROR)
                study.tell(trial, state=TrialState.FAIL)
            raise
        finally:
            for pending, _, _ in self.ahead:  # proposed, never timed: not a result, and its config stays free
                pending.set_user_attr("status", STATUS_CANCELLED)
                study.tell(pending, state=TrialState.PRUNED)
                self.beat.finish(pending)
            self.beat.stop()

    def _open_trials(self) -> list[optuna.Trial]:
        """Trials asked and not told when the loop ends abruptly: the one being proposed or recorded, and the one
        whose evaluation is in flight (taken off the queue, so it is not closed as cancelled too)."""
        out = [self.trial] if self.trial is not None else []
        if self.inflight is not None and self.ahead:
            out.append(self.ahead.popleft()[0])
            self.inflight = None
        self.trial = None
        return out

    def _limit_reached(self) -> Stop | None:
        """The time budget, the patience or a stop request (checked before every step)."""
        if self.time_budget is not None and time.monotonic() - self.started >= self.time_budget:
            return Stop(StopReason.TIME_BUDGET)
        if self.patience is not None and _stale_for(self.known) >= self.patience:
            return Stop(StopReason.PATIENCE, patience=self.patience, before_run=not self.new and not self.ahead)
        if self.stop_requested is not None and self.stop_requested():
            return Stop(StopReason.STOPPED)
        if self.unrankable and not self.first and not self.ahead and self.known:
            return Stop(StopReason.UNRANKABLE, before_run=not self.new, note=self.unrankable)
        return None

    def _full(self) -> Stop | None:
        """The study holds (or has queued) every valid config, or its trial budget: propose no more."""
        held = len(self.known) + len(self.ahead)
        if self.size is not None and held >= self.size:
            return Stop(StopReason.EXHAUSTED)
        if self.trials is not None and held >= self.trials:
            return Stop(StopReason.BUDGET)
        return None

    def _start_oldest(self) -> None:
        """Start evaluating the oldest queued proposal, racing the incumbent as the study knows it now."""
        from ._inflight import InFlight

        _, config, _ = self.ahead[0]
        race = _race(self.known) if self.objective.races else None
        objective = self.objective
        self.inflight = InFlight(lambda: objective.evaluate_against(config, race), threaded=self.depth > 1)

    def _record_oldest(self) -> None:
        """Wait for the evaluation in flight and record it on its trial (see :func:`_record`)."""
        assert self.inflight is not None
        self.inflight.wait()
        inflight, self.inflight = self.inflight, None
        self.trial, config, key = self.ahead.popleft()
        last = _record(self.study, self.trial, config, key, inflight, self.known, self.failures)
        self.beat.finish(self.trial)
        self.eval_seconds += inflight.seconds
        self.trial = None
        self.new += 1
        if self.progress is not None:
            now = time.monotonic()
            self.progress(_progress(self.known, self.trials, self.time_budget, now - self.started,
                                    self.failures, self.invalid, last, self.new, self.baseline,
                                    pace=(now - self.loop_started) / self.new, patience=self.patience))

    def _fixed(self) -> Config | None:
        """The config to ask for instead of the sampler's proposal, if any (see the module docstring)."""
        busy = {k for _, _, k in self.ahead}
        if self.first:
            return self.first.pop(0)
        queued = self.new + len(self.ahead)
        if self.sampler in ("auto", "forest") or (self.sampler == "hybrid" and queued >= _switch()):
            if self.strategy is None:
                self.strategy = self._valid_set_strategy()
            fixed: Config | None = self.strategy.propose(self.known, busy) or _fill(
                self.known, self.objective, self.rng, busy)
            return fixed
        if self.skips >= 5:  # the sampler keeps proposing invalid or known configs: spend on a new one
            self.skips = 0
            return _fill(self.known, self.objective, self.rng, busy)
        if self.sampler == "tpe" and LOCAL_EVERY and queued >= 10 and queued % LOCAL_EVERY == LOCAL_EVERY - 1:
            return _neighbour(self.known, self.objective, self.rng, busy)  # one knob from a leader
        return None

    def _valid_set_strategy(self) -> Any:
        """The strategy that proposes from the enumerated valid set: ``auto``'s GP (with the prior) or ``forest``."""
        if self.sampler in ("forest", "hybrid"):
            from ._forest import ForestSearch

            return ForestSearch(self.objective.knobs, self.objective.valid_configs(), seed=self.seed,
                                budget=self.trials, start=0 if self.sampler == "hybrid" else None)
        from ._strategy import ValidSetSearch

        prior = self.prior
        return ValidSetSearch(self.objective.knobs, self.objective.valid_configs(), seed=self.seed, budget=self.trials,
                              prior=lambda configs: prior)

    def _propose(self) -> None:
        """Ask for a trial; record it at once when it is invalid or known, else queue it for evaluation."""
        from optuna.trial import TrialState

        study, objective = self.study, self.objective
        fixed = self._fixed()
        self.trial = trial = _ask(study, self.dists, fixed)
        self.beat.start(trial)  # from ask to tell: a trial without a pulse is a dead process's
        if not self.shared:  # another process started on this study: its trials interleave with ours
            expected = self.next_number if self.last_number is None else self.last_number + 1
            self.shared = trial.number != expected or any(
                t.number != trial.number and all(t.number != a.number for a, _, _ in self.ahead)
                for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        self.last_number = trial.number
        params = trial.params  # a copy per access (Optuna): read once
        config = {k: params[k] for k in objective.knobs}
        key = format_config(config)
        trial.set_user_attr("config", config)
        why = objective.violation(config)
        if why is not None:  # rejected before compiling; the constraint is recorded
            self._record_skipped(trial, STATUS_INVALID, {"reason": why}, None)
            self.invalid += 1
            return
        if self.shared and key not in self.known:
            self.known.update(_known(study))  # another process may have finished it meanwhile
        seen = self.known.get(key) or (_claimed_elsewhere(study, trial, objective, key) if self.shared else None)
        if seen is None and any(k == key for _, _, k in self.ahead):
            seen = Seen(None, next(t.number for t, _, k in self.ahead if k == key), config, "in flight")
        if seen is not None:  # never measure a config twice: tell the sampler what is known
            self._record_skipped(trial, STATUS_KNOWN, {"reason": STATUS_KNOWN, "same_as": seen.number}, seen.value)
            return
        self.skips = 0
        objective.prefetch(config)  # e.g. compile it in another process while earlier ones are timed
        self.ahead.append((trial, config, key))
        self.trial = None

    def _record_skipped(self, trial: optuna.Trial, status: str, failure: dict[str, Any],
                        value: float | None) -> None:
        """A proposal not evaluated: its status and why; the sampler is told the known value (or pruned)."""
        from optuna.trial import TrialState

        trial.set_user_attr("status", status)
        trial.set_user_attr("failure", failure)
        if value is None:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, value)
        self.beat.finish(trial)
        self.skips += 1
        self.trial = None

    def finish(self, stop: Stop, finalists: int) -> StudyResult:
        """The final round over the leaders (not after an interrupt), and the result."""
        elapsed = time.monotonic() - self.started
        study, objective = self.study, self.objective
        top = _top(study, finalists)
        final: FinalRound | None = None
        if top and stop.reason is not StopReason.INTERRUPTED:
            final = _earlier_final(study, top, objective) if not self.new else None
            if final is None:
                try:
                    final = objective.finalize(top)
                except KeyboardInterrupt:
                    final = FinalRound(None, note="final round interrupted")
                study.set_user_attr("final", final.to_dict())
        winner = final.winner if final is not None else top[0].number if top else None
        best = next((t for t in _top(study, None) if t.number == winner), None) if winner is not None else None
        overhead = (elapsed - self.eval_seconds) / self.new if self.new else 0.0
        return StudyResult(study.study_name, redact(self.storage or default_storage()), objective.backend,
                           objective.evidence, StudyKey.of(objective.study_key), best, top, len(self.known),
                           self.failures,
                           self.invalid, elapsed, stop, final, overhead)


def _finished(objective: Objective, storage: str | None, study_name: str | None, trials: int | None,
              patience: int | None) -> bool:
    """The stored study already holds its budget or ran out of patience: this run proposes nothing (so it
    needs no ranking of the space)."""
    import optuna

    if trials is None and not patience:
        return False
    try:
        study = optuna.load_study(study_name=study_name or StudyKey.of(objective.study_key).name,
                                  storage=make_storage(storage))
    except KeyError:
        return False
    known = _known(study)
    return (trials is not None and len(known) >= trials) or bool(patience and _stale_for(known) >= patience)


def _earlier_final(study: optuna.Study, top: list[TrialSummary], objective: Objective) -> FinalRound | None:
    """The final round stored by the run that evaluated these leaders, when this run evaluated nothing new and
    that round judged exactly them (and decided): running it again would redo the same work. Not when a check it
    stored was of another kernel than its config renders to now (a template changed since): then it is re-run."""
    stored = FinalRound.from_dict(study.user_attrs.get("final"))
    if stored is None or stored.winner is None:
        return None
    judged = set(stored.checks) | set(stored.finalists)
    if judged != {t.number for t in top}:
        return None
    configs = {t.number: t.config for t in top}
    for number, check in stored.checks.items():
        now = objective.rendered_sha256(configs[number]) if check.ok else None
        if now is not None and check.sha256 != now:
            return None
    note = "final round of the run that evaluated these trials (nothing new was evaluated since)"
    return replace(stored, note=f"{stored.note}; {note}" if stored.note else note)


def _record(study: optuna.Study, trial: optuna.Trial, config: Config, key: str, outcome: InFlight[Record],
            known: dict[str, Seen], failures: Counter[str]) -> str:
    """Record one evaluated proposal on its trial; a failure is a value, never an exception (anything else the
    evaluation raised is a bug, and raised here)."""
    from optuna.trial import TrialState

    try:
        record = outcome.result()
    except VariantFailure as exc:
        trial.set_user_attr("status", STATUS_FAILED)
        trial.set_user_attr("failure", {"reason": exc.reason, "detail": exc.detail[:500]})
        study.tell(trial, state=TrialState.FAIL)
        failures[exc.reason] += 1
        known[key] = Seen(None, trial.number, config, exc.reason)
        return f"trial {trial.number} failed ({exc.reason})"
    status = STATUS_NOT_WINNING if record.not_winning else STATUS_OK
    trial.set_user_attr("status", status)
    trial.set_user_attr("record", record.to_json())
    study.tell(trial, record.time_ms)  # not winning: its partial median, a measured (slower) time
    known[key] = Seen(record.time_ms, trial.number, config, status if record.not_winning else "",
                      tuple(record.samples_ms))
    return f"trial {trial.number}: {record.time_ms:.4g} ms" + (" (not winning: stopped early)"
                                                               if record.not_winning else "")


def _race(known: dict[str, Seen]) -> Race | None:
    """The race against the incumbent: the fastest config timed to the end (not one stopped early)."""
    from ..evaluation._race import Race

    timed = [s for s in known.values() if s.value is not None and s.reason != STATUS_NOT_WINNING and s.samples]
    if not timed:
        return None
    return Race.against(min(timed, key=lambda s: (s.value, s.number)).samples)



def _ask(study: optuna.Study, dists: dict[str, Any], fixed: Config | None) -> optuna.Trial:
    """A new trial: the sampler's proposal, or ``fixed`` (through a PartialFixedSampler of this process).

    The loop runs the heartbeat itself (:class:`Heartbeat`): Optuna's warning that heartbeats are meant for
    ``optimize`` does not apply."""
    import optuna

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Heartbeat of storage", UserWarning)
        if fixed is None:
            return study.ask(dists)
        sampler = study.sampler
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.sampler = optuna.samplers.PartialFixedSampler(fixed, sampler)
        try:
            return study.ask(dists)
        finally:
            study.sampler = sampler


@dataclass
class Seen:
    """A config the study has evaluated (``value`` None: it failed) or that another process holds."""

    value: float | None
    number: int
    config: Config
    reason: str = ""  # why it failed; STATUS_NOT_WINNING for a config stopped early (its value is measured)
    samples: tuple[float, ...] = ()  # its timing's samples (the incumbent's bound for racing)


def _known(study: optuna.Study) -> dict[str, Seen]:
    out: dict[str, Seen] = {}
    for t in study.get_trials(deepcopy=False):
        status = t.user_attrs.get("status")
        if status in (STATUS_OK, STATUS_NOT_WINNING) and t.value is not None:
            out.setdefault(format_config(t.user_attrs["config"]),
                           Seen(t.value, t.number, t.user_attrs["config"], "" if status == STATUS_OK else status,
                                _samples(t)))
        elif status == STATUS_FAILED:
            out.setdefault(format_config(t.user_attrs["config"]),
                           Seen(None, t.number, t.user_attrs["config"], _reason(t)))
    return out


def _samples(t: optuna.trial.FrozenTrial) -> tuple[float, ...]:
    """A stored trial's timing samples (empty when the record has none, or they are not numbers)."""
    return tuple(Record.from_json(t.user_attrs.get("record")).samples_ms)


def _reason(t: optuna.trial.FrozenTrial) -> str:
    return str(t.user_attrs.get("failure", {}).get("reason", "?"))


def _claimed_elsewhere(study: optuna.Study, trial: optuna.Trial, objective: Objective, key: str) -> Seen | None:
    """Another process holds this config: a running trial of it (its params are stored when it is asked for;
    a status written but not told yet still holds it), or a finished one (told since ``known`` was read).

    One read of the study answers both: two reads would miss a trial told between them."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False):
        if t.number == trial.number or set(t.params) != set(objective.knobs) or \
                format_config({k: t.params[k] for k in objective.knobs}) != key:
            continue
        status = t.user_attrs.get("status")
        if status in (STATUS_OK, STATUS_NOT_WINNING) and t.value is not None:
            return Seen(t.value, t.number, dict(t.params), "" if status == STATUS_OK else status, _samples(t))
        if status == STATUS_FAILED:
            return Seen(None, t.number, dict(t.params), _reason(t))
        if t.state == TrialState.RUNNING and status not in (STATUS_INVALID, STATUS_CANCELLED):
            return Seen(None, t.number, dict(t.params), "running elsewhere")
    return None


def _stale_for(known: dict[str, Seen]) -> int:
    """Evaluated configs since the last new best, in trial order."""
    best, since = math.inf, 0
    for s in sorted(known.values(), key=lambda s: s.number):
        if s.value is not None and s.value < best:
            best, since = s.value, 0
        else:
            since += 1
    return since


def _leaders(known: dict[str, Seen], n: int) -> list[Seen]:
    return sorted((s for s in known.values() if s.value is not None), key=lambda s: (s.value, s.number))[:n]


def _fill(known: dict[str, Seen], objective: Objective, rng: random.Random,
          busy: set[str] = frozenset()) -> Config | None:  # type: ignore[assignment]
    """An unevaluated config (not ``busy``): a one-knob neighbour of a leader if one is left, else a random one."""
    if rng.random() < 0.7:
        cfg = _neighbour(known, objective, rng, busy)
        if cfg is not None:
            return cfg
    for _ in range(50):
        cfg = objective.random_config(rng)
        if cfg is not None and format_config(cfg) not in known and format_config(cfg) not in busy:
            return cfg
    fresh = [c for c in objective.valid_configs() if format_config(c) not in known and format_config(c) not in busy]
    return rng.choice(fresh) if fresh else None


def _neighbour(known: dict[str, Seen], objective: Objective, rng: random.Random,
               busy: set[str] = frozenset()) -> Config | None:  # type: ignore[assignment]
    """An unevaluated valid config one knob away from one of the three leaders (numeric knobs: one step)."""
    leaders = _leaders(known, 3)
    if not leaders:
        return None
    base = rng.choice(leaders).config
    moves = []
    for k, values in objective.knobs.items():
        i = values.index(base[k])
        near = [values[j] for j in (i - 1, i + 1) if 0 <= j < len(values)] if ordinal(values) else values
        moves += [(k, v) for v in near if v != base[k]]
    rng.shuffle(moves)
    for k, v in moves:
        cfg = {**base, k: v}
        if format_config(cfg) not in known and format_config(cfg) not in busy and objective.violation(cfg) is None:
            return cfg
    return None


def _top(study: optuna.Study, n: int | None) -> list[TrialSummary]:
    """The study's best distinct configs, fastest first."""
    ok = [t for t in study.get_trials(deepcopy=False)
          if t.user_attrs.get("status") == STATUS_OK and t.value is not None]
    seen: set[str] = set()
    out = []
    for t in sorted(ok, key=lambda t: (t.value, _tie_break(t), t.number)):
        key = format_config(t.user_attrs["config"])
        if key not in seen:
            seen.add(key)
            out.append(TrialSummary.from_trial(t))
    return out if n is None else out[:n]


def _tie_break(t: optuna.trial.FrozenTrial) -> float:
    """What orders trials of equal time (``Record.tie_break``; 0 when none was recorded)."""
    return Record.from_json(t.user_attrs.get("record")).tie_break or 0.0


def _progress(known: dict[str, Seen], total: int | None, budget: float | None, elapsed: float,
              failures: Counter[str], invalid: int, last: str, new: int, baseline: float | None,
              pace: float | None = None, patience: int | None = None) -> Progress:
    """``pace``: seconds per new config in this run's loop (the set-up before it is not a trial's cost); the
    estimate counts the trials that can still run: to the budget, or to the patience if no new best comes."""
    remaining = None
    left = [total - len(known)] if total is not None else []
    if patience:
        left.append(patience - _stale_for(known))
    if left and new:
        remaining = (pace if pace is not None else elapsed / new) * max(0, min(left))
    if budget is not None:
        remaining = min(remaining if remaining is not None else budget, max(0.0, budget - elapsed))
    lead = _leaders(known, 1)
    best = TrialSummary(lead[0].number, lead[0].config, lead[0].value, "") if lead else None  # type: ignore[arg-type]
    return Progress(len(known), total, elapsed, remaining, best, failures, invalid, last, baseline)
