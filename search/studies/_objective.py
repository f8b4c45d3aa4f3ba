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
from ._final import FinalistCheck, FinalistTime, FinalRound, ModeFigures
from ._study import Objective, Record, TrialSummary

#: Configs of its own a search evaluates where the performance model cannot rank the space: the best-predicted
#: ones, as many as the final round verifies by default.
PICKS = 3
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
    from ._ranking import Ranking
    from ._study import StudyResult


class KernelObjective(Objective):
    """A family's kernel variants on one problem and chip, evaluated by a back-end.

    Measured back-ends (metal, cuda) run every variant in an isolated worker: build, verify against the
    reference the first time it is seen, then time it. The model back-end predicts times in-process
    (labeled modeled) and verifies on the CPU interpreter: every trial (``verify="all"``) or only the
    finalists (the default), on a small problem of the same family: ``verify_shape`` if given, else the smallest
    shape where that config is valid (:func:`kernsearch.family._shapes.smallest_shape`).
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
        if self.target not in self.family.templates:  # a twin is optional: the family runs where it has one
            runs = " or ".join(sorted(self.family.templates))
            why = (f"the model predicts the {self.target} kernel that {chip.name} would run" if cls.predicts
                   else f"the {backend} back-end runs {self.target} kernels")
            raise BackendError(f"family {self.family.name} has no {self.target} template ({why}); it has {runs} "
                               f"only: add templates.{self.target} to its family.toml, or tune it for a chip that "
                               f"runs {runs}")
        # The interpreter runs Metal only: a modeled CUDA kernel cannot be verified here (nor published).
        self.verify = verify if interpretable(self.target) or not cls.predicts else "none"
        self._verify_shape = tuple(verify_shape) if verify_shape else None
        self._small: dict[str, tuple[int, ...]] = {}  # config key -> its verification shape
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
        self._ranking: tuple[Ranking, list[Config]] | None = None
        self._ranked = False  # _ranking computed
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
        from ..artifacts._candidate import chip_slug

        try:
            from ..artifacts._artifacts import ArtifactStore

            artifacts = list((store or ArtifactStore()).current_artifacts(self.family.name))
        except Exception:  # noqa: BLE001 - no store, unreadable store: no published configs (the picks still come)
            artifacts = []
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
        out = out[:limit]
        ranked = self.model_ranking() if self.unrankable() else None
        for pick in ranked[1] if ranked is not None else []:  # nothing else will be searched: the model's picks
            if pick not in out:
                out.append(pick)
        return out

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
        """The chip's performance model's predicted times (no measurement): the ``auto`` strategy's start; None
        where the model cannot rank the space (a flat prior would only make the start arbitrary)."""
        ranked = self.model_ranking()
        if ranked is not None and ranked[0].flat:
            return None
        return model_prior(self.space, configs)

    def model_ranking(self) -> tuple[Ranking, list[Config]] | None:
        """Whether the chip's performance model can rank this space, and its picks (the best-predicted valid
        configs, ties broken by headroom, then by closeness to the default: ``_ranking``), over every valid config
        (a sample of a space too big to enumerate); None where the model has nothing to say. Computed once."""
        if not self._ranked:
            from ._ranking import predict, ranking

            self._ranked = True
            sampled = self._valid is None and self.space.total > 20000
            configs = self._sample(1000) if sampled else self.valid_configs()
            predictions = predict(self.space, configs) if configs else None
            if predictions is not None:
                default = self.family.default
                order = sorted(range(len(configs)), key=lambda i: (
                    *predictions[i].key, sum(configs[i].get(k) != v for k, v in default.items())))
                self._ranking = (ranking(predictions, sampled=sampled, roofline=not self.family.model),
                                 [configs[i] for i in order[:PICKS]])
        return self._ranking

    def _sample(self, n: int) -> list[Config]:
        """Up to ``n`` distinct random valid configs (a fixed seed: the verdict is the same every run)."""
        import random

        from .._steps import step
        from ..family._space import format_config

        rng, out, seen = random.Random(0), [], set()
        with step(f"sampling {n:,} valid configs of the {self.space.total:,} of {self.family.name} for the model",
                  total=n) as progress:
            for _ in range(4 * n):
                cfg = self.random_config(rng, tries=50)
                if cfg is not None and format_config(cfg) not in seen:
                    seen.add(format_config(cfg))
                    out.append(cfg)
                    progress.advance(len(out))
                if len(out) >= n:
                    break
        return out

    def model_note(self) -> str | None:
        """What `tune` says before searching when the model cannot rank this space (None when it can)."""
        ranked = self.model_ranking()
        if ranked is None or not ranked[0].flat:
            return None
        if self.unrankable():
            return (f"{ranked[0].text()}; the search evaluates the default config and the model's {PICKS} picks "
                    "(the least on-core work under the bound) and stops")
        if self.impl.predicts:
            return f"{ranked[0].text()}; the search goes on only to verify configs (--verify all)"
        return f"{ranked[0].text()}; the search measures without its guidance"

    def unrankable(self) -> str | None:
        """On the model back-end, a space the model cannot rank has nothing to search (``Objective``): its picks
        are the finalists a whole search would end with. Not when every trial is verified (``verify="all"``):
        then each one more is a correctness check, and the search goes on to find correct variants."""
        ranked = self.model_ranking() if self.impl.predicts and self.verify != "all" else None
        return ranked[0].text() if ranked is not None and ranked[0].flat else None

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

    def interpret(self, config: Config) -> dict[str, Any]:
        """Verify ``config`` on the CPU interpreter (small problem); raises VariantFailure."""
        from ..evaluation._measure import verify_variant

        task = self._task(config, "cpu", self.verify_shape(config),
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
        from .._steps import step

        shape = tuple(self.problem.shape)
        out: dict[str, Any] = {"shapes": []}
        if shape != self.verify_shape(config):
            task = self._task(config, "cpu", shape, options={"mode": "fast", "timeout": max(1.0, self.timeout - 5),
                                                             "sample_threadgroups": TUNED_SAMPLE})
            with step(f"verifying the winner on the interpreter at the tuned shape {self.problem.shape_text} "
                      f"({TUNED_SAMPLE} threadgroups)"):
                res = self.worker().call(verify_variant_at, task, timeout=max(self.timeout, 60.0) * 4)
            out["shapes"].append("x".join(map(str, shape)))
            out["threadgroups_checked"] = res.get("threadgroups_checked")
            out["max_abs_err"] = res["max_abs_err"]
        ragged = self.ragged_shape(config)
        if ragged is not None:
            task = self._task(config, "cpu", ragged, options={"mode": "fast", "timeout": max(1.0, self.timeout - 5)})
            with step(f"verifying the winner on the interpreter at a ragged shape {'x'.join(map(str, ragged))}"):
                res = self.worker().call(verify_variant_at, task)
            out["shapes"].append("x".join(map(str, ragged)))
            out["max_abs_err"] = max(out.get("max_abs_err", 0.0), res["max_abs_err"])
        return out

    def ragged_shape(self, config: Config, near: tuple[int, ...] | None = None) -> tuple[int, ...] | None:
        """A shape a little smaller than ``near`` (default: the config's verification shape) whose sizes are not
        multiples of the tiles, on which ``config`` is still valid (the family's declared ``problem.ragged_shape``
        first)."""
        from ..family._shapes import ragged_shape

        return ragged_shape(self.family, self.problem.dtype, self.chip, config,
                            tuple(near or self.verify_shape(config)))

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
                terms = self.impl.breakdown(self.space, config)
            except KernsearchError as exc:
                raise VariantFailure("model", str(exc)) from None
            ms = float(terms["time_ms"])
            rec = Record(ms, self.evidence, [ms], sha256=kernel.sha256,
                         tie_break=float(terms.get("core_ms", ms)))  # equal times: more headroom first
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
        rec.peak_pct = roofline_pct(self.chip, self.problem, rec.time_ms)
        return rec

    # -- the end ------------------------------------------------------------------------------------
    def finalize(self, top: list[TrialSummary]) -> FinalRound:
        self._close_pool()  # compiles still running ahead would load the CPU and GPU during the final round
        if self.impl.predicts:
            return self._verify_finalists(top)
        return self._remeasure_finalists(top)

    def _verify_finalists(self, top: list[TrialSummary]) -> FinalRound:
        """Modeled leaders are only predictions: the winner is the best-predicted one the interpreter passes."""
        from .._steps import step

        checks: dict[int, FinalistCheck] = {}
        winner = None
        for t in top:
            if self.verify == "none":
                break
            shape = self.verify_shape(t.config)
            try:
                with step(f"verifying trial {t.number} on the interpreter at {'x'.join(map(str, shape))}"):
                    c = self.interpret(t.config)
                checks[t.number] = FinalistCheck(True, c["max_abs_err"], tuple(c["shape"]))
                if winner is None:  # the one to publish: also at the tuned shape and a ragged one
                    extra = self.verify_for_publishing(t.config)
                    checks[t.number] = FinalistCheck(True, max(c["max_abs_err"], extra.get("max_abs_err", 0.0)),
                                                     tuple(c["shape"]), tuple(extra["shapes"]),
                                                     extra.get("threadgroups_checked"))
                    winner = t.number
            except VariantFailure as exc:
                checks[t.number] = FinalistCheck(False, shape=shape if t.number not in checks else (),
                                                 reason=exc.reason, detail=exc.detail[:300])
        note = "times are predictions of the performance model (modeled), not measurements"
        if self.verify == "none":
            winner = top[0].number
            note += "; the winner is NOT verified" + ("" if interpretable(self.target) else
                                                      " (the CPU interpreter runs Metal only, this is a CUDA kernel)")
        shown = next((t.config for t in top if t.number == winner), top[0].config if top else None)
        return FinalRound(winner, verified_on="interpreter",
                          verify_shape=self.verify_shape(shown) if shown is not None else None, checks=checks,
                          note=note)

    def _remeasure_finalists(self, top: list[TrialSummary]) -> FinalRound:
        """Fresh worker; finalists and the baseline MLX op interleaved; a lead must exceed the noise."""
        from .._steps import step
        from ..evaluation._measure import final_round

        worker = self.worker()
        worker.restart()
        task = self._task(top[0].config, self.backend, finalists=[t.config for t in top])
        try:
            with step(f"re-timing {len(top)} finalist(s) against the baseline op"):
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

        from .._steps import step

        samples: list[list[float]] = out["finalists"]
        keep = list(range(len(top)))
        checks: dict[int, FinalistCheck] = {}
        for i in sorted(keep, key=lambda i: float(np.median(samples[i]))):
            t = top[i]
            ragged = self.ragged_shape(t.config, near=tuple(self.problem.shape))
            if ragged is None:  # no smaller shape off the tiles where this config is valid: nothing more to run
                break
            try:
                with step(f"verifying trial {t.number} on the device at a ragged shape {'x'.join(map(str, ragged))}"):
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
        final = _judge([top[i] for i in keep], {**out, "finalists": [samples[i] for i in keep]},
                       tuple(self.family.consumer_modes))
        return replace(final, verified_on="device", verify_shape=shape, checks=checks)

    def baseline_ms(self) -> float | None:
        """The family's baseline MLX op timed in the worker (measured back-ends only); None if it fails."""
        if self.impl.predicts:
            return None
        from .._steps import step
        from ..evaluation._measure import time_baseline

        try:
            with step(f"timing the baseline op ({self.family.baseline_name})"):
                return float(self.worker().call(time_baseline, self._task(dict(self.family.default), self.backend)))
        except (VariantFailure, KernsearchError):
            return None

    def unpublishable(self) -> str | None:
        """Why no winner of this search could be published, known before it starts (None: one can be)."""
        if self.verify != "none" or not self.impl.predicts:
            return None
        if not interpretable(self.target):
            language = {"cuda": "CUDA", "metal": "Metal"}.get(self.target, self.target)
            return (f"a modeled {language} kernel for {self.chip.name} cannot be verified here (the CPU interpreter "
                    f"runs Metal only), so nothing could be published; tune on the {self.chip.name} itself to publish")
        return "--verify none verifies nothing, so nothing could be published"

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
            why = self.unpublishable() or "no check of it passed there"
            raise KernsearchError(f"the winner was not verified at its tuned shape ({why}): refusing to publish it")
        timed = final.finalists.get(best.number)
        measurements = Measurements(median_ms=timed.median_ms if timed else best.time_ms,
                                    spread=timed.spread if timed and timed.spread is not None else best.spread,
                                    baseline_median_ms=final.baseline_median_ms,
                                    baseline_spread=final.baseline_spread, speedup_low=final.speedup_low,
                                    speedup_high=final.speedup_high,
                                    modes={m: f.to_dict() for m, f in final.modes.items()} or None,
                                    weight_sets=final.weight_sets)
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
    from .._steps import step
    from ._ranking import predict

    with step(f"ranking {len(configs):,} valid configs with the {space.chip.name} model"):
        predictions = predict(space, configs)
    return None if predictions is None else [p.time_ms for p in predictions]


def _judge(top: list[TrialSummary], out: dict[str, Any], judged: tuple[str, ...] = ("graph", "eager")) -> FinalRound:
    """Pick the winner of the re-measured finalists (graph mode, as consumers mostly call) and its speedup over
    the baseline in every consumer mode; ``speedup_low`` is the smallest lower bound over the modes the family
    is judged in (every mode is recorded)."""
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
    modes: dict[str, ModeFigures] = {}
    for mode, by in (out.get("modes") or {}).items():
        if by.get("baseline"):
            ms = speedup(by["finalists"][first], by["baseline"])
            modes[mode] = ModeFigures(float(np.median(by["finalists"][first])), float(np.median(by["baseline"])),
                                      ms.median, ms.low, ms.high)
    low = min([s.low] + [f.low for m, f in modes.items() if m in judged])
    return FinalRound(top[first].number, finalists=times, lead_exceeds_noise=decisive,
                      baseline_median_ms=float(np.median(base)), baseline_spread=spread(base), speedup=s.median,
                      speedup_low=low, speedup_high=s.high, beats_baseline=lead_exceeds_noise(samples[first], base),
                      baseline_error=error, modes=modes, weight_sets=out.get("weight_sets"))
