"""The measured objective: a family's variants timed on the GPU here (the metal and cuda back-ends).

Every variant runs in an isolated worker: built, verified against the reference on the device, then timed
(racing the incumbent: a config that can no longer win stops early). With compile workers, each config is compiled
by one worker and then verified and timed by the same worker (MLX keeps a compiled kernel in the process that
compiled it: ``docs/timing.md``), one timing at a time, while the other workers compile the next proposals. The
final round re-times the finalists against the MLX op as consumers call them, in a fresh worker, and proves the
fastest at a ragged shape on the device.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import KernsearchError, VariantFailure
from .._records import FinalTimings, Measurement, Proof
from .._rules import INTERPRETER_TARGET
from .._vocabulary import Evidence, Memcheck, Verifier
from ..backends._memcheck import MemcheckResult
from ..family._space import Config
from ._final import BoundsChecks, FinalistCheck, FinalRound, judge
from ._kernel import FailureAt, Incumbent, KernelVariants, failing_at
from ._trial import Record, Trial

if TYPE_CHECKING:
    from ..artifacts._artifacts import ArtifactStore
    from ..backends._base import BaseBackend
    from ..evaluation._measure import TimingPlan
    from ..evaluation._race import Race
    from ..family._space import Problem
    from ..hardware._chips import Chip


class MeasuredObjective(KernelVariants):
    """Variants timed on the GPU here (see the module docstring). ``compile_workers``: processes compiling ahead,
    each then timing what it compiled (default: the cores less two); ``racing=False, search_plan=TimingPlan()``: every
    config timed to the full plan, as before racing."""

    def __init__(self, problem: Problem, chip: Chip, backend: str, *, compile_workers: int | None = None,
                 racing: bool = True, search_plan: TimingPlan | None = None, **options: Any) -> None:
        super().__init__(problem, chip, backend, **options)
        if compile_workers is None:
            import os

            compile_workers = max(1, (os.cpu_count() or 3) - 2) if self.backend_class.compiles_ahead else 0
        self.compile_workers = compile_workers
        from ..evaluation._measure import SEARCH_PLAN

        self.racing = racing
        self.search_plan = SEARCH_PLAN if search_plan is None else search_plan
        self._pool: Any = None
        self._prepared: dict[str, Any] = {}  # config key -> the Lease of the worker that compiles it
        self.compile_wait_s = 0.0  # how long the timing process waited for compile workers (see _wait_prepared)
        self.incumbent: Incumbent | None = None  # the current version the final round times its leader against

    def against_current(self, store: ArtifactStore) -> Incumbent | None:
        """Have the final round time its leader against the key's current version in ``store`` too, in paired rounds
        (``Figures.versus``), so that the gate compares two kernels of one run rather than two runs' speedups over the
        op. Only a measured, valid current version is taken, and only when this template renders its config to the
        published source byte for byte: the published kernel is what is timed, and no text of the store runs here
        (a template changed since cannot time it; the gate then compares the runs' figures, as before)."""
        from ..artifacts._candidate import ArtifactKey, chip_slug

        self.incumbent = None
        try:
            key = ArtifactKey(self.family.name, chip_slug(self.chip.name), self.problem.dtype,
                              tuple(self.problem.shape))
            pointer = store.pointer(key)
            art = store.load(key, pointer.version) if pointer is not None and not pointer.invalidated else None
        except KernsearchError:  # no readable current version: nothing to time against
            return None
        if art is None or art.manifest.evidence != Evidence.MEASURED:
            return None
        config = dict(art.manifest.config)
        if self.in_domain(config) and self.space.is_valid(config) and \
                self.rendered_sha256(config) == art.manifest.source_sha256:
            self.incumbent = Incumbent(art.version, config)
        return self.incumbent

    def _make_backend(self) -> BaseBackend:
        if self.backend_class.rotates_inputs:  # inputs are rotated when the working set fits the last-level cache
            self.backend_options.setdefault("cache_bytes", self.chip.system_cache_mb * 1e6)
        return self.backend_class(**self.backend_options)

    # -- compiling ahead ----------------------------------------------------------------------------
    def lookahead(self) -> int:
        """One config per worker: the one being timed and the others compiling (a worker is held by its config
        until it is timed, so with this many proposals held a free worker always awaits the next)."""
        return self.compile_workers or 1

    def prefetch(self, config: Config) -> None:
        if not self.compile_workers:
            return
        from ..evaluation._worker import PinnedPool
        from ..family._space import format_config
        from ..variants._tasks import prepare_variant

        if self._pool is None:
            self._pool = PinnedPool(self.compile_workers, timeout=self.timeout)
        self._prepared[format_config(config)] = self._pool.submit(prepare_variant, self._task(config, self.backend))

    def _wait_prepared(self, config: Config) -> Any:
        """The lease of the worker that compiled ``config`` (None: not compiled ahead; the timing worker builds
        it). Its compile error (or crash, hang) fails the variant here, before anything is timed."""
        from ..family._space import format_config

        lease = self._prepared.pop(format_config(config), None)
        if lease is not None:
            start = time.monotonic()
            try:
                lease.result()  # raises the variant's VariantFailure
            finally:
                self.compile_wait_s += time.monotonic() - start  # the GPU idle, waiting for a compiler
        return lease

    # -- one trial ----------------------------------------------------------------------------------
    @property
    def races(self) -> bool:
        return self.racing

    def evaluate(self, config: Config) -> Record:
        return self.evaluate_against(config, None)

    def evaluate_against(self, config: Config, race: Race | None) -> Record:
        from ..variants._tasks import measure_variant

        lease = self._wait_prepared(config)  # a compile failure raises here, its worker already freed
        try:  # in the process that compiled it, its first launch a lookup; the worker freed whatever happens
            kernel = self.render(config)
            task = self._task(config, self.backend, plan=self.search_plan, race=race if self.racing else None)
            m: Measurement = (lease or self.worker()).call(measure_variant, task)
        finally:
            if lease is not None:
                lease.release()
        return self.with_figures(Record(m.median_ms, Evidence(self.evidence), m.samples_ms, m.spread, m.compile_seconds,
                                        kernel.sha256, proof=m.proof, not_winning=m.not_winning))

    def baseline_ms(self) -> float | None:
        """The family's baseline MLX op timed in the worker; None if it fails."""
        from .._steps import step
        from ..variants._tasks import time_baseline

        try:
            with step(f"timing the baseline op ({self.family.baseline_name})"):
                return float(self.worker().call(time_baseline, self._task(dict(self.family.default), self.backend)))
        except (VariantFailure, KernsearchError):
            return None

    # -- the end ------------------------------------------------------------------------------------
    def finalize(self, top: list[Trial]) -> FinalRound:
        """Fresh worker; finalists and the baseline MLX op interleaved; a lead must exceed the noise."""
        from .._steps import step
        from ..variants._tasks import final_round

        self._close_pool()  # compiles still running ahead would load the CPU and GPU during the final round
        worker = self.worker()
        worker.restart()
        task = self._task(top[0].config, self.backend, finalists=[t.config for t in top],
                          incumbent=self.incumbent.config if self.incumbent is not None else None)
        try:
            with step(f"re-timing {len(top)} finalist(s) against the baseline op"):
                timings: FinalTimings = worker.call(final_round, task, timeout=self.timeout * (len(top) + 1))
        except VariantFailure as exc:
            return FinalRound(top[0].number, note=f"final round failed ({exc.reason}): {exc.detail[:300]}")
        return self._prove_on_a_ragged_shape(top, timings)

    def _prove_on_a_ragged_shape(self, top: list[Trial], timings: FinalTimings) -> FinalRound:
        """The fastest re-timed finalist that is also correct on the device at a ragged shape wins.

        Each variant was verified on the device at the tuned shape only, and a published kernel also runs at
        shapes near it (the exported package's nearest-shape rule): one wrong at sizes just below the tuned
        ones, not multiples of its tiles, is refused here, as the interpreter refuses a modeled one, and the
        next fastest is tried. (Near the tuned shape, not the interpreter's small one: the device runs it in
        moments, and a config tuned for a big shape is often not valid at a small one.)
        """
        import numpy as np

        samples = timings.finalists
        keep = list(range(len(top)))
        checks: dict[int, FinalistCheck] = {}
        for i in sorted(keep, key=lambda i: float(np.median(samples[i]))):
            t = top[i]
            try:
                checks[t.number] = self._check_finalist(t)
            except VariantFailure as exc:
                failed = exc.shape if isinstance(exc, FailureAt) else ()
                checks[t.number] = FinalistCheck(False, shape=failed, reason=exc.reason, detail=exc.detail[:400])
                keep.remove(i)
                continue
            break
        shape = tuple(self.problem.shape)
        if not keep:
            return FinalRound(None, verified_on=Verifier.DEVICE, verify_shape=shape, checks=checks,
                              note="no finalist passed the checks before publishing (on the device at a ragged shape, "
                                   "guard zones; the interpreter's out-of-bounds checks; memcheck on the cuda "
                                   "back-end)")
        final = judge([top[i] for i in keep], timings.keep(keep), tuple(self.family.consumer_modes),
                      current=self.incumbent.version if self.incumbent is not None else None)
        return replace(final, verified_on=Verifier.DEVICE, verify_shape=shape, checks=checks)

    def _check_finalist(self, t: Trial) -> FinalistCheck:
        """A finalist's checks before publishing (raises :class:`VariantFailure` naming the shape): on the device at a
        ragged shape, the interpreter's of its Metal template, then (the cuda back-end) its own launches under
        memcheck."""
        from .._steps import step

        ragged = self.ragged_shape(t.config, near=tuple(self.problem.shape))
        bounds = self._bounds(t.config)  # the interpreter's reason not to run, asked once
        err = t.max_abs_err or 0.0
        if ragged is not None:
            with step(f"verifying trial {t.number} on the device at a ragged shape "
                      f"{'x'.join(map(str, ragged))} (a poisoned guard zone after every output)"), \
                    failing_at("a ragged shape on the device", ragged):
                err = max(err, self.verify_at(t.config, ragged, backend=self.backend).max_abs_err)
        if not bounds.why_not:  # the same checks as a modeled winner's, of the Metal template
            twin = "" if self.target == INTERPRETER_TARGET else f" (its {INTERPRETER_TARGET} twin)"
            self.interpreter_ragged(t.config, where=f"a ragged shape on the interpreter{twin}")
        if self.backend_class.memchecks:
            bounds = replace(bounds, memcheck=self._memcheck(t, ragged))
        also = ("x".join(map(str, ragged)),) if ragged is not None else ()
        return FinalistCheck(True, err, tuple(self.problem.shape), also,
                             sha256=self.rendered_sha256(t.config) or "", bounds=bounds)

    def _memcheck(self, t: Trial, ragged: tuple[int, ...] | None) -> MemcheckResult:
        """The finalist's verification launches (the ragged shape's, the tuned shape's) under memcheck in a child
        process (:mod:`kernsearch.backends._memcheck`): its verdict; a reported error raises, naming its shape."""
        from .._steps import step
        from ..backends._memcheck import Job, memcheck

        shapes = ([list(ragged)] if ragged is not None else []) + [list(self.problem.shape)]
        text = ", ".join("x".join(map(str, s)) for s in shapes)
        sha = self.rendered_sha256(t.config)
        if sha is None:
            return MemcheckResult(Memcheck.UNFINISHED, "the config renders no kernel now")
        config = {k: v.item() if hasattr(v, "item") else v for k, v in t.config.items()}  # NumPy scalars as Python's
        try:
            job = Job.model_validate({"family": str(Path(self.family.path).resolve()), "target": self.target,
                                      "dtype": self.problem.dtype, "chip": self.chip.name, "config": config,
                                      "shapes": shapes, "seed": self.seed, "sha256": sha})
        except ValueError as exc:  # not a job the child would take: said, never a pass
            return MemcheckResult(Memcheck.UNFINISHED, f"no job for the child: {str(exc).splitlines()[0][:200]}")
        with step(f"running trial {t.number} under memcheck at {text} (compute-sanitizer: reads and writes outside "
                  "any allocation)"):
            result = memcheck(job, timeout=max(3 * self.timeout, 300.0))
        if result.refuses:
            at = tuple(int(d) for d in result.at.split("x")) if result.at else tuple(shapes[0])
            raise FailureAt(VariantFailure("device_bounds", result.text()), "a launch under memcheck", at)
        return result

    def _bounds(self, config: Config) -> BoundsChecks:
        """The out-of-bounds checks a finalist gets here (:class:`BoundsChecks`): guard zones on the device, and the
        interpreter's checks of the family's Metal template (the kernel itself, or a CUDA kernel's twin) where there
        is one and the interpreter runs here; else ``why_not`` says why they cannot run."""
        from .._errors import BackendError

        metal = INTERPRETER_TARGET
        why = ""
        if metal not in self.family.templates:
            why = f"the family has no {metal} template for the interpreter to run"
        elif (twin := self._no_twin(config)):
            why = twin
        else:
            try:
                from ..interp._compile import compiler

                compiler()
            except BackendError as exc:
                why = f"no interpreter here: {str(exc)[:200]}"
        return BoundsChecks(True, None if why else metal, self.target, why)

    def _no_twin(self, config: Config) -> str:
        """Why a CUDA config has no Metal twin to check ('' where it has one): the family's constraints on an Apple
        chip refuse it (a tensor-core or half2 path is NVIDIA-only), so its Metal template renders no kernel."""
        if self.target == INTERPRETER_TARGET:
            return ""
        from ..family._space import Space, make_problem
        from ..hardware._chips import default_apple_chip

        apple = default_apple_chip()
        try:
            problem = make_problem(self.family, self.problem.shape, self.problem.dtype, apple)
            bad = Space(problem, apple).violations(config)
        except KernsearchError as exc:
            return f"this config has no {INTERPRETER_TARGET} twin to check ({str(exc)[:160]})"
        return f"this config has no {INTERPRETER_TARGET} twin to check ({bad[0]})" if bad else ""

    def _proof(self, best: Trial, check: FinalistCheck | None) -> Proof | None:
        """The worker's proof of the winner when it was timed (on the device at the tuned shape), and the final
        round's check of it at a ragged shape."""
        proof = best.proof
        if proof is None or proof.verifier != Verifier.DEVICE or self.problem.shape_text not in proof.shapes:
            return None
        if check is None or check.max_abs_err is None or not check.also:
            return proof
        return proof.also(Proof(Verifier.DEVICE, tuple(check.also), check.max_abs_err))

    def _close_pool(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
            self._prepared.clear()

    def close(self) -> None:
        self._close_pool()
        super().close()
