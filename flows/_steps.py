"""The steps of a nightly job, as plain functions, and a way to run one in a killable subprocess.

Prefect's task timeout cannot interrupt a call that blocks in native code (a kernel spinning on the CPU
interpreter, a GPU driver that never returns), so every step that runs kernels — ``tune`` and
``verify`` — runs as ``python -m kernsearch.flows._steps STEP IN OUT`` in its own process group, with its
own timeout; on timeout (or any error in the caller) the whole group is killed, grand-children included.
The payloads are JSON: a step process shares nothing with the flow but the files it names.

``publish`` and ``export`` only move files under locks with their own time limits; they run in the flow.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernsearch import KernsearchError
from kernsearch._records import Proof, Winner
from kernsearch._vocabulary import Evidence

#: Process groups of the steps running now (SIGTERM of the run kills them: :func:`kill_running`).
RUNNING: set[int] = set()


class StepError(Exception):
    """A step did not produce a result; ``reason`` is short (``timeout``, ``crash``, ``no-winner``...)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class StepTimeout(StepError):
    """The step ran past its timeout; its process group (``pgid``) was killed."""

    pgid: int | None = None


class StepCrashed(StepError):
    """The step process died without a result (signal, out of memory): worth one retry."""


# -- running a step in a subprocess -------------------------------------------------------------------

def run_step(step: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run ``STEPS[step](payload)`` in a fresh process group; kill the group on timeout or interruption."""
    if step not in STEPS:
        raise ValueError(f"unknown step {step!r}")
    with tempfile.TemporaryDirectory(prefix=f"kernsearch-{step}-") as tmp:
        src, dst = Path(tmp) / "in.json", Path(tmp) / "out.json"
        src.write_text(json.dumps(payload), encoding="utf-8")
        log = open(Path(tmp) / "log.txt", "w+", encoding="utf-8")  # noqa: SIM115 - closed below
        proc = subprocess.Popen([sys.executable, "-m", "kernsearch.flows._steps", step, str(src), str(dst)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        RUNNING.add(proc.pid)
        try:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                exc = StepTimeout("timeout", f"{step} step ran past {timeout:g} s; its processes were killed")
                exc.pgid = proc.pid
                raise exc from None
        finally:
            _kill_group(proc)
            RUNNING.discard(proc.pid)
            log.seek(0)
            output = log.read()
            log.close()
        if dst.is_file():
            result = json.loads(dst.read_text(encoding="utf-8"))
            if "value" in result:
                return dict(result["value"])
            if result.get("user"):
                raise KernsearchError(result["detail"])
            raise StepError(result.get("reason", "error"), result.get("detail", ""))
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise StepCrashed("crash", f"{step} step exited with {_describe(code)} and no result"
                                   + (f": {tail}" if tail else ""))


def kill_running() -> None:
    """SIGKILL every step's process group still running (the run is stopping)."""
    for pgid in list(RUNNING):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the step's process group (its workers too), then reap the step process."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL
        pass


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


# -- the steps ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tuned:
    """What the tune step hands the flow: the unit's study, how its search went, and its winner (proven where the
    search could prove it; ``Candidate.from_winner`` publishes it)."""

    study: str
    evidence: Evidence
    evaluated: int
    failures: dict[str, int]
    stop_reason: str
    winner: Winner

    def to_json(self) -> dict[str, Any]:
        return {"study": self.study, "evidence": self.evidence.value, "evaluated": self.evaluated,
                "failures": dict(self.failures), "stop_reason": self.stop_reason, "winner": self.winner.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tuned:
        return cls(str(data["study"]), Evidence(data["evidence"]), int(data["evaluated"]),
                   {str(k): int(v) for k, v in dict(data["failures"]).items()}, str(data["stop_reason"]),
                   Winner.from_json(data["winner"]))


@dataclass(frozen=True)
class Skipped:
    """An extra shape the winner was not verified at: its config is not valid there."""

    shape: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class Verified:
    """What the verify step hands the flow: the winner's proof at the unit's extra shapes (None: none ran) and the
    shapes skipped."""

    proof: Proof | None
    skipped: tuple[Skipped, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"proof": self.proof.to_json() if self.proof is not None else None,
                "skipped": [{"shape": list(s.shape), "why": s.why} for s in self.skipped]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verified:
        proof = Proof.from_json(data["proof"]) if data.get("proof") is not None else None
        return cls(proof, tuple(Skipped(tuple(int(d) for d in s["shape"]), str(s["why"])) for s in data["skipped"]))


def tune(p: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) the unit's study; return its winner (a :class:`Tuned`), or fail with the reason."""
    from kernsearch import ArtifactStore, get_chip, load_family, make_problem, run_study
    from kernsearch.studies._objective import KernelObjective

    fam = load_family(p["family"])
    chip = get_chip(p["chip"])
    problem = make_problem(fam, tuple(p["shape"]), p["dtype"], chip)
    o = p["options"]
    trials = o["trials"]
    if o.get("trials_per_night"):
        tonight = _evaluated(fam.name, chip.name, problem, p["backend"], p["storage"]) + o["trials_per_night"]
        trials = tonight if trials is None else min(trials, tonight)
    objective = KernelObjective(problem, chip, p["backend"], seed=o["seed"] or 0, timeout=o["timeout"],
                                verify=o.get("verify", "finalists"))
    objective.against_current(ArtifactStore(p.get("artifacts")))  # the store the winner is offered to
    result = run_study(objective, trials=trials, time_budget=o["time_budget"], patience=o["patience"],
                       sampler=o["sampler"], seed=o["seed"], storage=p["storage"], finalists=o["finalists"])
    failures = dict(result.failures)
    if result.best is None or (result.final is not None and result.final.winner is None):
        final = result.final
        refused = "; ".join(f"trial {n}: {c.reason} {(c.detail or '')[:120]}".strip()
                            for n, c in (final.checks.items() if final else ()) if not c.ok)
        if refused:
            raise StepError("no-winner", f"no finalist passed its final check ({refused})")
        raise StepError("no-winner", f"no variant ran correctly in {result.evaluated} evaluated "
                                     f"(failures: {_counts(failures)})")
    try:
        winner = objective.winner(result)
    except KernsearchError as exc:
        raise StepError("unverified", str(exc)) from None
    return Tuned(result.study_name, Evidence(result.evidence), result.evaluated, failures, result.stop_reason,
                 winner).to_json()


def verify(p: dict[str, Any]) -> dict[str, Any]:
    """Verify the winner on the unit's extra shapes (a shape its config is not valid for is skipped); none given:
    a ragged shape near the smallest one where the winner's config is valid. Returns a :class:`Verified`."""
    from kernsearch import Space, get_chip, load_family, make_problem
    from kernsearch._errors import VariantFailure
    from kernsearch.backends import backend_class
    from kernsearch.variants._tasks import VariantTask, verify_variant

    fam = load_family(p["family"])
    chip = get_chip(p["chip"])
    backend = p["verifier_backend"]
    interprets = backend_class(backend).interprets
    proof: Proof | None = None
    skipped = []
    for shape in _shapes(p, fam, chip):
        problem = make_problem(fam, tuple(shape), p["dtype"], chip)
        bad = Space(problem, chip).violations(p["config"])
        if bad:
            skipped.append(Skipped(tuple(problem.shape), "; ".join(map(str, bad))))
            continue
        options = {"mode": "fast", "timeout": p["timeout"]} if interprets else {}
        task = VariantTask(family=str(fam.path), shape=problem.shape, dtype=p["dtype"], chip=chip.name,
                           backend=backend, config=p["config"], seed=p["seed"] + 7, options=options)
        try:
            checked = verify_variant(task)
        except VariantFailure as exc:
            raise StepError(exc.reason, f"winner wrong at shape {problem.shape_text}: {exc.detail[:300]}") from None
        proof = proof.also(checked) if proof is not None else checked
    return Verified(proof, tuple(skipped)).to_json()


def _shapes(p: dict[str, Any], fam: Any, chip: Any) -> list[Any]:
    """The unit's extra shapes; none given: a ragged shape near the smallest one where the config is valid."""
    if p["shapes"] or not p.get("tuned_shape"):
        return list(p["shapes"])
    from kernsearch.family._shapes import ragged_shape, smallest_shape

    small = smallest_shape(fam, p["dtype"], chip, p["config"], tuple(p["tuned_shape"]))
    return [ragged_shape(fam, p["dtype"], chip, p["config"], small) or small]


def _evaluated(family: str, chip: str, problem: Any, backend: str, storage: str | None) -> int:
    """Configs the unit's study has evaluated so far (0 when it does not exist yet)."""
    import optuna

    from kernsearch._vocabulary import EVALUATED
    from kernsearch.family._space import format_config
    from kernsearch.studies._storage import StudyKey, make_storage

    name = StudyKey(family, chip, problem.dtype, problem.shape_text, backend).name
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=name, storage=make_storage(storage))
    except KeyError:  # no such study yet
        return 0
    return len({format_config(t.user_attrs["config"]) for t in study.get_trials(deepcopy=False)
                if t.user_attrs.get("status") in EVALUATED and "config" in t.user_attrs})


STEPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {"tune": tune, "verify": verify}


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"


def main(argv: list[str]) -> int:
    """``python -m kernsearch.flows._steps STEP IN.json OUT.json``: the subprocess side of :func:`run_step`."""
    step, src, dst = argv
    payload = json.loads(Path(src).read_text(encoding="utf-8"))
    started = time.monotonic()
    try:
        reply: dict[str, Any] = {"value": STEPS[step](payload)}
    except StepError as exc:
        reply = {"reason": exc.reason, "detail": exc.detail}
    except KernsearchError as exc:
        reply = {"user": True, "reason": "user", "detail": str(exc)}
    reply["seconds"] = time.monotonic() - started
    from kernsearch._safeio import write_atomic

    write_atomic(dst, json.dumps(reply, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
