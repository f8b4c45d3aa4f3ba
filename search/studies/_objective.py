"""Kernel variants as a study objective: render → build → verify → time (through isolated workers),
interpreter verification of modeled finalists, re-measurement of measured finalists against the
baseline op, warm start from published artifacts, and publishing the winner."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._errors import BackendError, KernsearchError, VariantFailure
from ..family._space import Config
from ..hardware._targets import chip_target, interpretable
from ._final import FinalistCheck, FinalistTime, FinalRound
from ._study import Objective, Record, TrialSummary

#: Threadgroups of the tuned shape a winner runs on the interpreter before publishing (corners, edges,
#: random interior ones): a big problem cannot run whole on the CPU, a sample of its tiles can.
TUNED_SAMPLE = 12


def verify_variant_at(task: Any) -> dict[str, Any]:
    """Worker entry point (picklable): :func:`kernsearch.evaluation._measure.verify_variant`."""
    from ..evaluation._measure import verify_variant

    return verify_variant(task)

if TYPE_CHECKING:
    from ..evaluation._measure import TimingPlan
    from ..family._space import Problem, Space
    from ..hardware._chips import Chip
    from ._study import StudyResult


class KernelObjective(Objective):
    """A family's kernel variants on one problem and chip, evaluated by a back-end.

    Measured back-ends (metal, cuda) run every variant in an isolated worker: build, verify against the
    reference the first time it is seen, then time it. The model back-end predicts times in-process
    (labeled modeled) and verifies on the CPU interpreter: every trial (``verify="all"``) or only the
    finalists (the default), on a small problem of the same family (``verify_shape``).
    """

    def __init__(self, problem: Problem, chip: Chip, backend: str, *, seed: int = 0, timeout: float = 120.0,
                 verify: str = "finalists", verify_shape: tuple[int, ...] | None = None,
                 verify_mode: str = "fast", backend_options: dict[str, Any] | None = None,
                 compile_workers: int | None = None, racing: bool = True,
                 search_plan: TimingPlan | None = None) -> None:
        from ..backends import backend_class
        from ..family._space import Space

        self.problem, self.chip, self.backend, self.seed = problem, chip, backend, seed
        self.space: Space = Space(problem, chip)
        self.family = problem.family
        self.backend_options = dict(backend_options or {})
        cls = backend_class(backend)
        if cls.rotates_inputs:  # inputs are rotated when the working set fits the last-level cache
            self.backend_options.setdefault("cache_bytes", chip.system_cache_mb * 1e6)
        cls.check_tunable()
        self.impl = cls(chip=chip) if cls.predicts else cls(**self.backend_options)  # type: ignore[call-arg]
        self.impl.check_available()
        self.evidence = self.impl.evidence.value
        # The model predicts the kernel the chip would run: Metal on Apple GPUs, CUDA on NVIDIA ones.
        self.target = self.impl.target or chip_target(chip.vendor)
        if self.target not in self.family.templates:
            raise BackendError(f"family {self.family.name} has no {self.target} template "
                               f"(back-end {backend} needs one)")
        # The interpreter runs Metal only: a modeled CUDA kernel cannot be verified here (nor published).
        self.verify = verify if interpretable(self.target) or not cls.predicts else "none"
        self.verify_shape = verify_shape or tuple(min(d, 96) for d in problem.shape)
        if cls.predicts and self.verify != "none":  # say it now, not after the whole search
            from ..interp._compile import compiler

            try:
                compiler()
            except BackendError as exc:
                raise BackendError(f"{exc}: the interpreter that verifies modeled winners compiles them "
                                   "(apt-get install g++, or Xcode's command line tools); --verify none "
                                   "searches without it (then nothing is verified)") from None
        self.verify_mode = verify_mode
        self.timeout = timeout
        self._valid: list[Config] | None = None
        self._worker: Any = None
        # Pipelined measured search: compile workers render and compile the next proposals while the
        # timing worker measures (default: one per core but the timer's and the search loop's).
        if compile_workers is None:
            import os

            compile_workers = max(1, (os.cpu_count() or 3) - 2) if cls.compiles_ahead else 0
        self.compile_workers = compile_workers if not cls.predicts else 0
        # A trial's timing budget: racing (a config stops once it cannot beat the incumbent) and the search
        # plan (fewer, shorter samples); the final round re-times the finalists under the full plan.
        # ``racing=False, search_plan=TimingPlan()``: every config timed to the full plan, as before racing.
        from ..evaluation._measure import SEARCH_PLAN

        self.racing = racing and not cls.predicts
        self.search_plan = SEARCH_PLAN if search_plan is None else search_plan
        self._pool: Any = None
        self._prepared: dict[str, Any] = {}  # config key -> future of prepare_variant
        self.compile_wait_s = 0.0  # how long the timing process waited for compile workers (see _wait_prepared)

    # -- the space --------------------------------------------------------------------------------
    @property
    def knobs(self) -> dict[str, list[Any]]:
        return self.space.knobs

    @property
    def study_key(self) -> dict[str, str]:
        return {"family": self.family.name, "chip": self.chip.name, "dtype": self.problem.dtype,
                "shape": self.problem.shape_text, "backend": self.backend}

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

    def default(self) -> Config | None:
        cfg = dict(self.family.default)
        return cfg if self.space.is_valid(cfg) else None

    def warm_start(self, store: Any = None, limit: int = 5) -> list[Config]:
        """Configs of current published artifacts of this family, closest first: same chip and shape,
        same chip, same shape, then the rest (same dtype before others). A broken store never stops a
        search: it just gives no warm start."""
        try:
            from ..artifacts._artifacts import ArtifactStore
            from ..artifacts._candidate import chip_slug

            artifacts = list((store or ArtifactStore()).current_artifacts(self.family.name))
        except Exception:  # noqa: BLE001 - no store, unreadable store: no warm start
            return []
        me = chip_slug(self.chip.name)

        def distance(a: Any) -> tuple[int, int, int]:
            return (a.key.chip != me, tuple(a.key.shape) != tuple(self.problem.shape),
                    a.key.dtype != self.problem.dtype)

        out: list[Config] = []
        for a in sorted(artifacts, key=distance):
            cfg = dict(a.manifest.config)
            in_domain = set(cfg) == set(self.knobs) and all(  # the family's domains may have changed since
                type(cfg[k]) is type(values[0]) and cfg[k] in values for k, values in self.knobs.items())
            if in_domain and self.space.is_valid(cfg) and cfg not in out:
                out.append(cfg)
        return out[:limit]

    # -- one trial ----------------------------------------------------------------------------------
    def _task(self, config: Config, backend: str, shape: tuple[int, ...] | None = None, **extra: Any) -> Any:
        from ..evaluation._measure import VariantTask

        return VariantTask(family=str(self.family.path), shape=tuple(shape or self.problem.shape),
                           dtype=self.problem.dtype, chip=self.chip.name, backend=backend, config=config,
                           seed=self.seed, backend_options=self.backend_options if backend == self.backend else {},
                           **extra)

    def worker(self) -> Any:
        if self._worker is None:
            from ..evaluation._worker import Worker

            self._worker = Worker(timeout=self.timeout)
        return self._worker

    def prior(self, configs: list[Config]) -> list[float] | None:
        """The chip's performance model's predicted times (no measurement): the ``auto`` strategy's start."""
        return model_prior(self.space, configs)

    def lookahead(self) -> int:
        """The config being timed, one per compile worker, and one waiting for the first free worker."""
        return self.compile_workers + 2 if self.compile_workers else 1

    def prefetch(self, config: Config) -> None:
        if not self.compile_workers:
            return
        from ..evaluation._measure import prepare_variant
        from ..evaluation._worker import WorkerPool
        from ..family._space import format_config

        if self._pool is None:
            self._pool = WorkerPool(self.compile_workers, timeout=self.timeout)
        self._prepared[format_config(config)] = self._pool.submit(prepare_variant, self._task(config, self.backend))

    def _wait_prepared(self, config: Config) -> None:
        """The compile worker's verdict on ``config``: its compile error (or crash, hang) fails the variant
        without the timing process; otherwise the timing process finds it compiled (CUDA: on disk)."""
        from ..family._space import format_config

        future = self._prepared.pop(format_config(config), None)
        if future is not None:
            start = time.monotonic()
            try:
                future.result()  # raises the variant's VariantFailure
            finally:
                self.compile_wait_s += time.monotonic() - start  # the GPU idle, waiting for a compiler

    def interpret(self, config: Config) -> dict[str, Any]:
        """Verify ``config`` on the CPU interpreter (small problem); raises VariantFailure."""
        from ..evaluation._measure import verify_variant

        task = self._task(config, "cpu", self.verify_shape,
                          options={"mode": self.verify_mode, "timeout": max(1.0, self.timeout - 5)})
        result: dict[str, Any] = self.worker().call(verify_variant, task)
        return result

    def verify_for_publishing(self, config: Config) -> dict[str, Any]:
        """What a winner must also pass on the interpreter before it may be published: the tuned shape
        itself (a sample of its threadgroups when the grid is big: corners, edges, random interior, against
        the reference) and a ragged shape (whole grid). Raises VariantFailure."""
        try:
            return self._verify_for_publishing(config)
        except KernsearchError as exc:  # e.g. a tuned shape too big to hold for the reference
            raise VariantFailure("unverifiable", str(exc)) from None

    def _verify_for_publishing(self, config: Config) -> dict[str, Any]:
        shape = tuple(self.problem.shape)
        out: dict[str, Any] = {"shapes": []}
        if shape != tuple(self.verify_shape):
            task = self._task(config, "cpu", shape, options={"mode": "fast", "timeout": max(1.0, self.timeout - 5),
                                                             "sample_threadgroups": TUNED_SAMPLE})
            res = self.worker().call(verify_variant_at, task, timeout=max(self.timeout, 60.0) * 4)
            out["shapes"].append("x".join(map(str, shape)))
            out["threadgroups_checked"] = res.get("threadgroups_checked")
            out["max_abs_err"] = res["max_abs_err"]
        ragged = self.ragged_shape(config)
        if ragged is not None:
            task = self._task(config, "cpu", ragged, options={"mode": "fast", "timeout": max(1.0, self.timeout - 5)})
            res = self.worker().call(verify_variant_at, task)
            out["shapes"].append("x".join(map(str, ragged)))
            out["max_abs_err"] = max(out.get("max_abs_err", 0.0), res["max_abs_err"])
        return out

    def ragged_shape(self, config: Config, near: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
        """A shape a little smaller than ``near`` (default: the small verification shape) whose sizes are not
        multiples of the tiles, on which ``config`` is still valid."""
        from ..family._space import Space, make_problem

        small = tuple(near or self.verify_shape)
        for cut in (4, 8, 12, 20, 1, 2, 3):
            shape = tuple(max(1, d - cut) if d > cut else d for d in small)
            if shape == small:
                continue
            try:
                space = Space(make_problem(self.family, shape, self.problem.dtype, self.chip), self.chip)
            except KernsearchError:
                continue
            if space.is_valid(config):
                return shape
        return None

    @property
    def races(self) -> bool:
        return self.racing

    def evaluate(self, config: Config) -> Record:
        return self.evaluate_against(config, None)

    def evaluate_against(self, config: Config, race: Any) -> Record:
        from ..family._render import render

        try:
            kernel = render(self.family, config, self.problem.dtype, self.target)
        except KernsearchError as exc:  # the template cannot render this config: this variant fails
            raise VariantFailure("render", str(exc)) from None
        flops = self.problem.flops()
        if self.impl.predicts:
            check = self.interpret(config) if self.verify == "all" else None
            try:
                ms = float(self.impl.predict_ms(self.space, config))
            except KernsearchError as exc:
                raise VariantFailure("model", str(exc)) from None
            rec = Record(ms, self.evidence, [ms], sha256=kernel.sha256)
            if check is not None:
                rec.verified = "interpreter"
                rec.max_abs_err, rec.max_rel_err = check["max_abs_err"], check["max_rel_err"]
        else:
            from ..evaluation._measure import measure_variant

            self._wait_prepared(config)
            task = self._task(config, self.backend, plan=self.search_plan, race=race if self.racing else None)
            out = self.worker().call(measure_variant, task)
            samples = out["samples_ms"]
            rec = Record(out["median_ms"], self.evidence, samples, out["spread"], out["compile_seconds"],
                         kernel.sha256, max_abs_err=out["max_abs_err"], max_rel_err=out["max_rel_err"],
                         verified="device", not_winning=True if out.get("not_winning") else None)
        rec.gflops = flops / (rec.time_ms * 1e-3) / 1e9 if rec.time_ms > 0 else None
        peak = self.chip.peak_tflops(self.problem.dtype) * 1e3
        rec.peak_pct = 100.0 * rec.gflops / peak if rec.gflops and peak else None
        return rec

    # -- the end ------------------------------------------------------------------------------------
    def finalize(self, top: list[TrialSummary]) -> FinalRound:
        self._close_pool()  # compiles still running ahead would load the CPU and GPU during the final round
        if self.impl.predicts:
            return self._verify_finalists(top)
        return self._remeasure_finalists(top)

    def _verify_finalists(self, top: list[TrialSummary]) -> FinalRound:
        """Modeled leaders are only predictions: the winner is the best-predicted one the interpreter passes."""
        checks: dict[int, FinalistCheck] = {}
        winner = None
        for t in top:
            if self.verify == "none":
                break
            try:
                c = self.interpret(t.config)
                checks[t.number] = FinalistCheck(True, c["max_abs_err"], tuple(c["shape"]))
                if winner is None:  # the one to publish: also at the tuned shape and a ragged one
                    extra = self.verify_for_publishing(t.config)
                    checks[t.number] = FinalistCheck(True, max(c["max_abs_err"], extra.get("max_abs_err", 0.0)),
                                                     tuple(c["shape"]), tuple(extra["shapes"]),
                                                     extra.get("threadgroups_checked"))
                    winner = t.number
            except VariantFailure as exc:
                checks[t.number] = FinalistCheck(False, reason=exc.reason, detail=exc.detail[:300])
        note = "times are predictions of the performance model (modeled), not measurements"
        if self.verify == "none":
            winner = top[0].number
            note += "; the winner is NOT verified" + ("" if interpretable(self.target) else
                                                      " (the CPU interpreter runs Metal only, this is a CUDA kernel)")
        return FinalRound(winner, verified_on="interpreter", verify_shape=tuple(self.verify_shape), checks=checks,
                          note=note)

    def _remeasure_finalists(self, top: list[TrialSummary]) -> FinalRound:
        """Fresh worker; finalists and the baseline MLX op interleaved; a lead must exceed the noise."""
        from ..evaluation._measure import final_round

        worker = self.worker()
        worker.restart()
        task = self._task(top[0].config, self.backend, finalists=[t.config for t in top])
        try:
            out = worker.call(final_round, task, timeout=self.timeout * (len(top) + 1))
        except VariantFailure as exc:
            return FinalRound(top[0].number, note=f"final round failed ({exc.reason}): {exc.detail[:300]}")
        return self._prove_on_a_ragged_shape(top, out)

    def _prove_on_a_ragged_shape(self, top: list[TrialSummary], out: dict[str, Any]) -> FinalRound:
        """The fastest re-timed finalist that is also correct on the device at a ragged shape wins.

        Each variant was verified on the device at the tuned shape only, and a published kernel also runs at
        shapes near it (the exported package's nearest-shape rule): one wrong at sizes just below the tuned
        ones, not multiples of its tiles, is refused here, as the interpreter refuses a modeled one, and the
        next fastest is tried. (Near the tuned shape, not the interpreter's small one: the device runs it in
        moments, and a config tuned for a big shape is often not valid at a small one.)
        """
        import numpy as np

        samples: list[list[float]] = out["finalists"]
        keep = list(range(len(top)))
        checks: dict[int, FinalistCheck] = {}
        for i in sorted(keep, key=lambda i: float(np.median(samples[i]))):
            t = top[i]
            ragged = self.ragged_shape(t.config, near=tuple(self.problem.shape))
            if ragged is None:  # no smaller shape off the tiles where this config is valid: nothing more to run
                break
            try:
                res = self.worker().call(verify_variant_at, self._task(t.config, self.backend, ragged))
            except VariantFailure as exc:
                checks[t.number] = FinalistCheck(False, reason=exc.reason, detail=exc.detail[:300])
                keep.remove(i)
                continue
            checks[t.number] = FinalistCheck(True, max(t.max_abs_err or 0.0, float(res["max_abs_err"])),
                                             tuple(self.problem.shape), ("x".join(map(str, ragged)),))
            break
        shape = tuple(self.problem.shape)
        if not keep:
            return FinalRound(None, verified_on="device", verify_shape=shape, checks=checks,
                              note="no finalist is correct on the device at a ragged shape")
        final = _judge([top[i] for i in keep], {**out, "finalists": [samples[i] for i in keep]})
        return replace(final, verified_on="device", verify_shape=shape, checks=checks)

    def baseline_ms(self) -> float | None:
        """The family's baseline MLX op timed in the worker (measured back-ends only); None if it fails."""
        if self.impl.predicts:
            return None
        from ..evaluation._measure import time_baseline

        try:
            return float(self.worker().call(time_baseline, self._task(dict(self.family.default), self.backend)))
        except (VariantFailure, KernsearchError):
            return None

    def publish(self, result: StudyResult, store: Any = None, margin: float | None = None) -> Any:
        """Offer the study's winner to the artifact store (its regression gate decides); returns the
        store's PublishOutcome. Only a winner proven correct (on the device, or on the interpreter for a
        modeled result) is offered; its evidence kind goes with it."""
        from ..artifacts._artifacts import ArtifactStore
        from ..artifacts._candidate import Candidate
        from ..artifacts._manifest import Correctness, Measurements

        best = result.best
        if best is None:
            raise KernsearchError("no correct winner to publish")
        final = result.final or FinalRound(best.number)
        check = final.checks.get(best.number)
        if check is not None and not check.ok:
            raise KernsearchError(f"the winner failed its final check ({check.reason}): refusing to publish it")
        if best.verified == "device" and best.max_abs_err is not None:
            further = list(check.also or ()) if check else []  # the ragged shape of the final round
            err = max([best.max_abs_err] + ([check.max_abs_err] if check and check.max_abs_err is not None else []))
            correctness = Correctness(verifier="device", passed=True,
                                      shapes_checked=[self.problem.shape_text, *further], max_abs_error=err,
                                      checks_run=1 + len(further))
        elif check and check.ok and check.max_abs_err is not None and self.problem.shape_text in (
                list(check.also or ()) + ["x".join(map(str, check.shape))]):
            shapes = ["x".join(map(str, check.shape))] + list(check.also or ())
            correctness = Correctness(verifier="interpreter", passed=True, shapes_checked=sorted(set(shapes)),
                                      max_abs_error=check.max_abs_err, checks_run=len(shapes))
        else:
            raise KernsearchError("the winner was not verified at its tuned shape (--verify none?): refusing to "
                                  "publish it")
        timed = final.finalists.get(best.number)
        measurements = Measurements(median_ms=timed.median_ms if timed else best.time_ms,
                                    spread=timed.spread if timed and timed.spread is not None else best.spread,
                                    baseline_median_ms=final.baseline_median_ms,
                                    baseline_spread=final.baseline_spread, speedup_low=final.speedup_low,
                                    speedup_high=final.speedup_high)
        candidate = Candidate.for_config(self.space, best.config, target=self.target, correctness=correctness,
                                         evidence=result.evidence, measurements=measurements,
                                         study=result.study_name)
        from ..exporting.runtime._runtime import DEFAULT_MARGIN

        return (store or ArtifactStore()).publish(candidate, margin=DEFAULT_MARGIN if margin is None else margin)

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
            self._prepared.clear()

    def close(self) -> None:
        self._close_pool()
        if self._worker is not None:
            self._worker.close()
            self._worker = None


def model_prior(space: Space, configs: list[Config]) -> list[float] | None:
    """Modeled times of ``configs`` on ``space``'s problem and chip (inf where the model cannot say), or
    None when the model has nothing for this family or chip. Never raises: a prior is optional."""
    try:
        from ..backends import get_backend

        model = get_backend("model", chip=space.chip)
        out = []
        for c in configs:
            try:
                out.append(float(model.predict_ms(space, c)))
            except KernsearchError:
                out.append(float("inf"))
        return out if any(v != float("inf") for v in out) else None
    except Exception:  # noqa: BLE001 - no model for this family or chip: no prior
        return None


def _judge(top: list[TrialSummary], out: dict[str, Any]) -> FinalRound:
    """Pick the winner of the re-measured finalists and its speedup over the baseline."""
    import numpy as np

    from ..evaluation._measure import lead_exceeds_noise, speedup, spread

    samples: list[list[float]] = out["finalists"]
    base: list[float] | None = out.get("baseline")
    medians = [float(np.median(x)) for x in samples]
    order = sorted(range(len(top)), key=lambda i: medians[i])
    first = order[0]
    decisive = len(order) < 2 or lead_exceeds_noise(samples[first], samples[order[1]])
    times = {top[i].number: FinalistTime(medians[i], spread(samples[i])) for i in range(len(top))}
    error = str(out["baseline_error"]) if out.get("baseline_error") else None
    if not base:
        return FinalRound(top[first].number, finalists=times, lead_exceeds_noise=decisive, baseline_error=error)
    s = speedup(samples[first], base)
    return FinalRound(top[first].number, finalists=times, lead_exceeds_noise=decisive,
                      baseline_median_ms=float(np.median(base)), baseline_spread=spread(base), speedup=s.median,
                      speedup_low=s.low, speedup_high=s.high, beats_baseline=lead_exceeds_noise(samples[first], base),
                      baseline_error=error)
