"""The modeled objective: a family's variants ranked by the per-chip performance model (the model back-end).

Times are predictions (evidence: modeled), computed in this process. The CPU interpreter proves configs
correct: every trial (``verify="all"``) or only the finalists (the default), on a small problem of the same
family; the winner also at the tuned shape (a sample of its threadgroups) and a ragged one before it may be
published. The interpreter runs Metal only: a modeled CUDA kernel cannot be verified here, nor published.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._errors import BackendError, KernsearchError, VariantFailure
from .._records import Proof
from .._vocabulary import Evidence, Verifier
from ..family._space import Config
from ..hardware._targets import get_target, interpretable
from ._final import BoundsChecks, FinalistCheck, FinalRound
from ._kernel import PICKS, TUNED_SAMPLE, FailureAt, KernelVariants, failing_at
from ._trial import Record, Trial

if TYPE_CHECKING:
    from ..backends._base import BaseBackend
    from ..family._space import Problem
    from ..hardware._chips import Chip

#: ``verify``: what a modeled search proves on the interpreter.
VERIFY_ALL, VERIFY_FINALISTS, VERIFY_NONE = "all", "finalists", "none"


class ModeledObjective(KernelVariants):
    """Variants predicted by the chip's performance model and proven on the interpreter (module docstring)."""

    def __init__(self, problem: Problem, chip: Chip, backend: str, **options: Any) -> None:
        super().__init__(problem, chip, backend, **options)
        if not interpretable(self.target):  # a modeled CUDA kernel cannot be verified here (nor published)
            self.verify = VERIFY_NONE
        if self.verify != VERIFY_NONE:  # say it now, not after the whole search
            from ..interp._compile import compiler

            try:
                compiler()
            except BackendError as exc:
                raise BackendError(f"{exc}: the interpreter that verifies modeled winners compiles them "
                                   "(apt-get install g++, or Xcode's command line tools); --verify none "
                                   "searches without it (then nothing is verified)") from None

    def _make_backend(self) -> BaseBackend:
        return self.backend_class(chip=self.chip)  # type: ignore[call-arg]

    def _runs_what(self) -> str:
        return f"the model predicts the {self.target} kernel that {self.chip.name} would run"

    def _flat_note(self, verdict: str) -> str:
        if self.unrankable():
            return (f"{verdict}; the search evaluates the default config and the model's {PICKS} picks "
                    "(the least on-core work under the bound) and stops")
        return f"{verdict}; the search goes on only to verify configs (--verify all)"

    def unrankable(self) -> str | None:
        """A space the model cannot rank has nothing to search (``Objective``): its picks are the finalists a
        whole search would end with. Not when every trial is verified (``verify="all"``): then each one more is a
        correctness check, and the search goes on to find correct variants."""
        ranked = self.model_ranking() if self.verify != VERIFY_ALL else None
        return ranked[0].text() if ranked is not None and ranked[0].flat else None

    # -- one trial ----------------------------------------------------------------------------------
    def evaluate(self, config: Config) -> Record:
        kernel = self.render(config)
        proof = self.interpret(config) if self.verify == VERIFY_ALL else None
        try:
            predicted = self.impl.predict(self.space, config)
        except KernsearchError as exc:
            raise VariantFailure("model", str(exc)) from None
        ms = predicted.time_ms
        return self.with_figures(Record(ms, Evidence(self.evidence), (ms,), sha256=kernel.sha256, proof=proof,
                                        tie_break=predicted.tie_break))  # equal times: more headroom first

    def interpret(self, config: Config) -> Proof:
        """Verify ``config`` on the CPU interpreter (small problem); raises VariantFailure."""
        return self.verify_at(config, self.verify_shape(config), mode=self.verify_mode,
                              timeout=max(1.0, self.timeout - 5))

    # -- the end ------------------------------------------------------------------------------------
    def finalize(self, top: list[Trial]) -> FinalRound:
        """Modeled leaders are only predictions: the winner is the best-predicted one the interpreter passes."""
        from .._steps import step

        checks: dict[int, FinalistCheck] = {}
        winner = None
        for t in top:
            if self.verify == VERIFY_NONE:
                break
            shape = self.verify_shape(t.config)
            try:
                with step(f"verifying trial {t.number} on the interpreter at {'x'.join(map(str, shape))}"):
                    c = self.interpret(t.config)
                sha = self.rendered_sha256(t.config) or ""
                checks[t.number] = FinalistCheck(True, c.max_abs_err, shape, sha256=sha)
                if winner is None:  # the one to publish: also at the tuned shape and a ragged one
                    checks[t.number] = self._winner_check(t.config, c.max_abs_err, shape, sha)
                    winner = t.number
            except VariantFailure as exc:  # the shape that failed: the finalist's own, or one of the winner's
                failed = exc.shape if isinstance(exc, FailureAt) else shape
                why = self._diagnose(t.config, failed, exc)
                checks[t.number] = FinalistCheck(False, shape=failed, reason=why.reason, detail=why.detail[:400])
        note = "times are predictions of the performance model (modeled), not measurements"
        if self.verify == VERIFY_NONE:
            winner = top[0].number
            note += "; the winner is NOT verified" + ("" if interpretable(self.target) else
                                                      " (the CPU interpreter runs Metal only, this is a CUDA kernel)")
        shown = next((t.config for t in top if t.number == winner), top[0].config if top else None)
        return FinalRound(winner, verified_on=Verifier.INTERPRETER,
                          verify_shape=self.verify_shape(shown) if shown is not None else None, checks=checks,
                          note=note)

    def _winner_check(self, config: Config, err: float, shape: tuple[int, ...], sha: str) -> FinalistCheck:
        """The first finalist to pass is the one published: checked also at the tuned shape and a ragged one
        (raising :class:`VariantFailure` where it fails there), its error the worst of all its shapes."""
        extra = self.verify_for_publishing(config)
        err = max(err, extra.max_abs_err if extra is not None else 0.0)
        return FinalistCheck(True, err, shape, extra.shapes if extra is not None else (),
                             extra.threadgroups_checked if extra is not None else None,
                             sha256=sha, bounds=BoundsChecks(interpreter=self.target, target=self.target))

    def _diagnose(self, config: Config, shape: tuple[int, ...], failure: VariantFailure) -> VariantFailure:
        """A wrong, NaN or unwritten result found in fast mode, run again in check mode at the shape that failed: a
        race, a missing barrier or an uninitialized read is then named with its template line (first), the fast
        mode's finding after it. Otherwise ``failure`` as it was."""
        from .._steps import step

        sampled = shape == tuple(self.problem.shape) and shape != self.verify_shape(config)
        options: dict[str, Any] = {}
        if failure.reason == "device_bounds" and ".j2:" not in failure.detail and not sampled:
            mode = "sanitize"  # a guard zone changed: the sanitizer build names the line
        elif failure.reason in ("wrong", "nan", "unwritten") and self.verify_mode == "fast":
            mode = "check"
            if sampled:
                options["sample_threadgroups"] = TUNED_SAMPLE
        else:
            return failure
        try:
            with step(f"finding why in {mode} mode at {'x'.join(map(str, shape))}"):
                self.verify_at(config, shape, mode=mode, timeout=max(1.0, self.timeout - 5, 60.0 if mode ==
                               "sanitize" else 1.0), within=max(self.timeout, 60.0) * 4, **options)
        except VariantFailure as again:
            if again.reason not in ("wrong", "nan", "unwritten"):
                return VariantFailure(again.reason, f"{again.detail} ({mode} mode; first found: {failure.reason}: "
                                      f"{failure.detail})")
        return failure

    def verify_for_publishing(self, config: Config) -> Proof | None:
        """What a winner must also pass on the interpreter before it may be published: the tuned shape
        itself (a sample of its threadgroups when the grid is big: corners, edges, random interior, against
        the reference) and a ragged shape (whole grid); None where neither applies. Raises VariantFailure."""
        try:
            return self._verify_for_publishing(config)
        except KernsearchError as exc:  # e.g. a tuned shape too big to hold for the reference
            raise VariantFailure("unverifiable", str(exc)) from None

    def _verify_for_publishing(self, config: Config) -> Proof | None:
        """Out-of-bounds is checked here, before anything is published: every run has a poisoned guard zone after
        each output buffer that must stay untouched, threadgroups run in reverse order (a late write past a tile
        is then not overwritten by the next tile's right value), and the ragged shape also runs with device-bounds
        checking (the sanitizer build: a read or write outside any buffer names its template line), and check mode
        (races, missing barriers, uninitialized reads) runs there too."""
        from .._steps import step

        shape = tuple(self.problem.shape)
        proof: Proof | None = None
        timeout = max(1.0, self.timeout - 5)  # the interpreter's, per run
        if shape != self.verify_shape(config):
            with step(f"verifying the winner on the interpreter at the tuned shape {self.problem.shape_text} "
                      f"({TUNED_SAMPLE} threadgroups, in reverse order)"), failing_at("the tuned shape", shape):
                proof = self.verify_at(config, shape, within=max(self.timeout, 60.0) * 4, mode="fast",
                                       timeout=timeout, sample_threadgroups=TUNED_SAMPLE, schedule="reversed")
        res = self.interpreter_ragged(config)
        proof = proof.also(res) if proof is not None else res
        return proof

    def unpublishable(self) -> str | None:
        """Why no winner of this search could be published, known before it starts (None: one can be)."""
        if self.verify != VERIFY_NONE:
            return None
        if not interpretable(self.target):
            language = get_target(self.target).language
            return (f"a modeled {language} kernel for {self.chip.name} cannot be verified here (the CPU interpreter "
                    f"runs Metal only), so nothing could be published; tune on the {self.chip.name} itself to publish")
        return "--verify none verifies nothing, so nothing could be published"
