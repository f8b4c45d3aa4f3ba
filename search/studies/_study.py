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
``hybrid`` | ``thompson``: auto, forest and thompson propose only valid configs, ``_strategy`` and ``_forest``; hybrid
is TPE, then the forest; thompson is the forest with Thompson sampling), ``patience`` (stop after that
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

The loop lives here; its parts are modules of their own: what a study optimises (:class:`Objective`,
``_objective_base``), one trial's record and its stored form (``_trial``), the study's trials as the loop reads
and writes them (``_trials``), how configs are proposed (``_samplers``), where a study lives and what it holds
(``_place``), and what a search ends with (``_result``). The kernel-specific evaluation (``KernelObjective``) lives
in ``_objective``; where studies are stored (``make_storage``, ``study_name_for``) in ``_storage``.
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .._errors import KernsearchError
from .._vocabulary import EVALUATED, TrialStatus
from ..family._space import Config, format_config
from ._final import FinalRound
from ._objective_base import Objective
from ._place import StudyPlace, check_study, earlier_final, finished, metric_name, open_study, study_for
from ._result import Progress, Stop, StopReason, StudyResult
from ._samplers import PRIOR_SAMPLERS, SAMPLERS, distributions, fill, make_sampler, neighbour, ordinal, stale_for
from ._storage import Heartbeat, StudyKey, default_storage, make_storage, redact
from ._trial import Record, StoredTrialError, Trial, read_trial, trial_attrs
from ._trials import claimed_elsewhere, race, record, top, write_trial
from ._trials import evaluated_configs as _known
from ._trials import progress as _progress
from ._trials import top as _top

__all__ = ["EVALUATED", "SAMPLERS", "Objective", "Progress", "Record", "Stop", "StopReason", "StoredTrialError",
           "StudyPlace", "StudyResult", "Trial", "TrialStatus", "TrialSummary", "_known", "_progress", "_top",
           "check_study", "distributions", "first_ctrl_c_stops", "make_sampler", "metric_name", "open_study",
           "ordinal", "parse_duration", "read_trial", "run_study", "study_for", "trial_attrs"]

if TYPE_CHECKING:
    import optuna

    from ._inflight import InFlight

#: A study's leader as the tables show it: the trial record itself (its views: time, spread, errors...).
TrialSummary = Trial
STATUS_OK, STATUS_FAILED, STATUS_INVALID, STATUS_KNOWN = (TrialStatus.OK, TrialStatus.FAILED, TrialStatus.INVALID,
                                                          TrialStatus.KNOWN)
STATUS_CANCELLED, STATUS_NOT_WINNING = TrialStatus.CANCELLED, TrialStatus.NOT_WINNING


def parse_duration(text: str | float | None) -> float | None:
    """``"10m"``, ``"90s"``, ``"1h30m"`` or seconds → seconds."""
    if text is None or isinstance(text, (int, float)):
        return None if text is None else float(text)
    parts = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or parts is None or not any(parts.groups()):
        raise KernsearchError(f"bad duration {text!r}: use e.g. 90s, 10m, 1h30m")
    h, m, s = (float(g) if g else 0.0 for g in parts.groups())
    return h * 3600 + m * 60 + s


#: Every LOCAL_EVERY-th new trial (after ten) is a one-knob neighbour of a leader instead of a TPE
#: proposal: tuned on the four landscapes of benchmarks/search_landscapes.py (0 turns it off).
LOCAL_EVERY = 3


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


def _switch() -> int:
    """The trial from which ``hybrid`` asks the forest (``_forest.HYBRID_SWITCH``)."""
    from ._forest import HYBRID_SWITCH

    return HYBRID_SWITCH


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
        if sampler in PRIOR_SAMPLERS and not finished(objective, storage, study_name, trials, patience):
            valid = objective.valid_configs()
            self.prior = objective.prior(valid) if valid else None
        self.sampler = sampler = ("auto" if self.prior is not None else "tpe") if sampler == "default" else sampler
        self.study = study = open_study(objective, storage, study_name, sampler, seed)
        self.dists = distributions(objective.knobs)
        self.rng = random.Random(seed)
        self.size = objective.size()
        self.beat = Heartbeat(study)  # this process's running trial stays alive; dead processes' trials are failed
        retry = self.beat.fail_stale()
        # Another process working on this study (running trials now, or gaps in trial numbers later) means
        # claims must be checked against the shared storage; alone, the local view is complete. One read: a trial
        # told between two reads would be neither known nor running, and its config asked for again.
        at_start = study.get_trials(deepcopy=False)
        self.known = _known(study, at_start)  # key -> Trial: every config the study has evaluated (ok or failed)
        self.shared = any(t.state == TrialState.RUNNING for t in at_start)
        self.next_number = len(at_start)  # a first trial numbered otherwise: another process asked one meanwhile
        self.last_number: int | None = None
        # Fixed configs are asked for through this process's sampler, not Optuna's shared queue of enqueued trials
        # (two processes popping one queued trial from SQLite at once is a race).
        self.first = self._first_configs(retry)
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

    def _first_configs(self, retry: list[Config]) -> list[Config]:
        """The configs asked for before the sampler's, each once and none the study knows: a dead process's trials
        retried, the user's ``--start`` configs, the default, published artifacts' configs, then the best configs of
        this family's other studies (:meth:`_transferred`)."""
        objective, first = self.objective, []
        for c in retry + objective.first_configs() + [objective.default()] + objective.warm_start():
            if c is not None and format_config(c) not in self.known and c not in first:
                first.append(c)
        return first + self._transferred({format_config(c) for c in first} | set(self.known))

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
                stop = self._step()
                if stop is not None:
                    return stop
        except KeyboardInterrupt:
            self._close_open(TrialStatus.INTERRUPTED)  # in flight: not a result; record why, and keep the rest
            return Stop(StopReason.INTERRUPTED)
        except BaseException:  # a bug of kernsearch itself: close the trial in flight, keep the traceback
            self._close_open(TrialStatus.ERROR)
            raise
        finally:
            for pending, _, _ in self.ahead:  # proposed, never timed: not a result, and its config stays free
                pending.set_user_attr("status", STATUS_CANCELLED)
                study.tell(pending, state=TrialState.PRUNED)
                self.beat.finish(pending)
            self.beat.stop()

    def _step(self) -> Stop | None:
        """One turn of the loop: record a finished evaluation, start the oldest proposal, propose, or wait for the
        evaluation in flight; the :class:`Stop` where the search ends, else None."""
        if self.shared:
            self._refresh_shared()
        if self.inflight is not None and self.inflight.done:
            self._record_oldest()
        stop = self._limit_reached()
        if stop is not None:
            if self.inflight is not None:  # the evaluation in flight finishes and counts
                self._record_oldest()
            return stop
        if self.inflight is None and self.ahead:
            self._start_oldest()
            return None
        full = self._full()
        if full is None and len(self.ahead) < self.depth:
            self._propose()
            return None
        if self.inflight is not None:
            self._record_oldest()
            return None
        assert full is not None  # depth >= 1: only a full study ends with nothing queued
        if not self.new and full.reason is StopReason.BUDGET:
            return Stop(StopReason.BUDGET, before_run=True, evaluated=len(self.known))
        return full

    def _refresh_shared(self) -> None:
        """A shared study's trials read anew: the shared budget counts every process's trials, and a process that
        died mid-trial has its trial failed here and its config asked for again."""
        self.known.update(_known(self.study))
        self.first[:0] = [c for c in self.beat.fail_stale()
                          if format_config(c) not in self.known and c not in self.first]

    def _close_open(self, status: TrialStatus) -> None:
        """The trials asked and not told when the loop ends abruptly, failed with ``status``."""
        from optuna.trial import TrialState

        for trial in self._open_trials():
            trial.set_user_attr("status", status)
            self.study.tell(trial, state=TrialState.FAIL)

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
        if self.patience is not None and stale_for(self.known) >= self.patience:
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
        bound = race(self.known) if self.objective.races else None
        objective = self.objective
        self.inflight = InFlight(lambda: objective.evaluate_against(config, bound), threaded=self.depth > 1)

    def _record_oldest(self) -> None:
        """Wait for the evaluation in flight and record it on its trial (see :func:`_record`)."""
        assert self.inflight is not None
        self.inflight.wait()
        inflight, self.inflight = self.inflight, None
        self.trial, config, key = self.ahead.popleft()
        last = record(self.study, self.trial, config, key, inflight, self.known, self.failures)
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
        if self.sampler in ("auto", "forest", "thompson") or (self.sampler == "hybrid" and queued >= _switch()):
            if self.strategy is None:
                self.strategy = self._valid_set_strategy()
            fixed: Config | None = self.strategy.propose(self.known, busy) or fill(
                self.known, self.objective, self.rng, busy)
            return fixed
        if self.skips >= 5:  # the sampler keeps proposing invalid or known configs: spend on a new one
            self.skips = 0
            return fill(self.known, self.objective, self.rng, busy)
        if self.sampler == "tpe" and LOCAL_EVERY and queued >= 10 and queued % LOCAL_EVERY == LOCAL_EVERY - 1:
            return neighbour(self.known, self.objective, self.rng, busy)  # one knob from a leader
        return None

    def _valid_set_strategy(self) -> Any:
        """The strategy that proposes from the enumerated valid set: ``auto``'s GP (with the prior), ``forest`` or
        ``thompson``."""
        if self.sampler in ("forest", "hybrid", "thompson"):
            from ._forest import ForestSearch

            return ForestSearch(self.objective.knobs, self.objective.valid_configs(), seed=self.seed,
                                budget=self.trials, start=0 if self.sampler == "hybrid" else None,
                                acquisition="thompson" if self.sampler == "thompson" else "ei")
        from ._strategy import ValidSetSearch

        prior = self.prior
        return ValidSetSearch(self.objective.knobs, self.objective.valid_configs(), seed=self.seed, budget=self.trials,
                              prior=lambda configs: prior)

    def _propose(self) -> None:
        """Ask for a trial; record it at once when it is invalid or known, else queue it for evaluation."""
        study, objective = self.study, self.objective
        fixed = self._fixed()
        self.trial = trial = _ask(study, self.dists, fixed)
        self.beat.start(trial)  # from ask to tell: a trial without a pulse is a dead process's
        if not self.shared:  # another process started on this study: its trials interleave with ours
            self.shared = self._interleaved(trial)
        self.last_number = trial.number
        params = trial.params  # a copy per access (Optuna): read once
        config = {k: params[k] for k in objective.knobs}
        key = format_config(config)
        trial.set_user_attr("config", config)
        why = objective.violation(config)
        if why is not None:  # rejected before compiling; the constraint is recorded
            self._record_skipped(Trial(trial.number, config, TrialStatus.INVALID, reason=why), trial, None)
            self.invalid += 1
            return
        seen = self._seen(key, trial, config)
        if seen is not None:  # never measure a config twice: tell the sampler what is known
            known = Trial(trial.number, config, TrialStatus.KNOWN, reason=STATUS_KNOWN, same_as=seen.number)
            self._record_skipped(known, trial, seen.value)
            return
        self.skips = 0
        objective.prefetch(config)  # e.g. compile it in another process while earlier ones are timed
        self.ahead.append((trial, config, key))
        self.trial = None

    def _seen(self, key: str, trial: optuna.Trial, config: Config) -> Trial | None:
        """The trial that already evaluated (or is evaluating) the config ``key``: this study's, another process's
        claim on it where the study is shared, or a proposal of this process still queued; None if none."""
        study = self.study
        if self.shared and key not in self.known:
            self.known.update(_known(study))  # another process may have finished it meanwhile
        seen = self.known.get(key) or (claimed_elsewhere(study, trial, self.objective, key) if self.shared else None)
        if seen is None and any(k == key for _, _, k in self.ahead):
            seen = Trial(next(t.number for t, _, k in self.ahead if k == key), config, TrialStatus.RUNNING,
                         reason="in flight")
        return seen

    def _interleaved(self, trial: optuna.Trial) -> bool:
        """Whether another process works on this study: ``trial``'s number is not the one this process expected,
        or a trial this process did not ask is running."""
        from optuna.trial import TrialState

        expected = self.next_number if self.last_number is None else self.last_number + 1
        return trial.number != expected or any(
            t.number != trial.number and all(t.number != a.number for a, _, _ in self.ahead)
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

    def _record_skipped(self, skipped: Trial, trial: optuna.Trial, value: float | None) -> None:
        """A proposal not evaluated: its status and why; the sampler is told the known value (or pruned)."""
        from optuna.trial import TrialState

        write_trial(trial, skipped)
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
        leaders = top(study, finalists)
        final: FinalRound | None = None
        if leaders and stop.reason is not StopReason.INTERRUPTED:
            final = earlier_final(study, leaders, objective) if not self.new else None
            if final is None:
                try:
                    final = objective.finalize(leaders)
                except KeyboardInterrupt:
                    final = FinalRound(None, note="final round interrupted")
                study.set_user_attr("final", final.to_dict())
        winner = final.winner if final is not None else leaders[0].number if leaders else None
        best = next((t for t in top(study, None) if t.number == winner), None) if winner is not None else None
        overhead = (elapsed - self.eval_seconds) / self.new if self.new else 0.0
        return StudyResult(study.study_name, redact(self.storage or default_storage()), objective.backend,
                           objective.evidence, StudyKey.of(objective.study_key), best, leaders, len(self.known),
                           self.failures, self.invalid, elapsed, stop, final, overhead)


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
