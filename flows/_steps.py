"""The steps of a nightly job, as plain functions, and a way to run one in a killable subprocess.

Prefect's task timeout cannot interrupt a call that blocks in native code (a kernel spinning on the CPU
interpreter, a GPU driver that never returns), so every step that runs kernels — ``tune`` and
``verify`` — runs as ``python -m kernsearch.flows._steps STEP IN OUT`` in its own process group, with its
own timeout; on timeout (or any error in the caller) the whole group is killed, grand-children included.
The payloads are JSON: a step process shares nothing with the flow but the files it names.

``publish`` and ``export`` only move files under locks with their own time limits; they run in the flow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kernsearch import KernsearchError


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
        try:
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                exc = StepTimeout("timeout", f"{step} step ran past {timeout:g} s; its processes were killed")
                exc.pgid = proc.pid
                raise exc from None
        finally:
            _kill_group(proc)
            log.seek(0)
            output = log.read()
            log.close()
        if dst.is_file():
            result = json.loads(dst.read_text(encoding="utf-8"))
            if result.get("ok"):
                return result["value"]
            if result.get("user"):
                raise KernsearchError(result["detail"])
            raise StepError(result.get("reason", "error"), result.get("detail", ""))
        tail = " | ".join(output.strip().splitlines()[-3:])
        raise StepCrashed("crash", f"{step} step exited with {_describe(code)} and no result"
                                   + (f": {tail}" if tail else ""))


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

def tune(p: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) the unit's study; return its verified winner, or fail with the reason."""
    from kernsearch import FinalRound, get_chip, load_family, make_problem, run_study
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
    result = run_study(objective, trials=trials, time_budget=o["time_budget"], patience=o["patience"],
                       sampler=o["sampler"], seed=o["seed"], storage=p["storage"], finalists=o["finalists"])
    failures = dict(result.failures)
    best, final = result.best, result.final or FinalRound(None)
    refused = "; ".join(f"trial {n}: {c.reason} {(c.detail or '')[:120]}".strip()
                        for n, c in final.checks.items() if not c.ok)
    if best is None:
        if refused:
            raise StepError("no-winner", f"no finalist passed its final check ({refused})")
        raise StepError("no-winner", f"no variant ran correctly in {result.evaluated} evaluated "
                                     f"(failures: {_counts(failures)})")
    checks: list[dict[str, Any]] = []
    if result.evidence == "modeled":
        verdict = final.checks.get(best.number)
        if final.winner != best.number or not verdict or not verdict.ok:
            raise StepError("no-winner", "no finalist passed the interpreter" + (f" ({refused})" if refused else ""))
        checks.append({"shape": list(verdict.shape), "verifier": "interpreter",
                       "max_abs_err": verdict.max_abs_err, "max_rel_err": None})
    elif best.verified == "device":
        checks.append({"shape": list(problem.shape), "verifier": "device", "max_abs_err": best.max_abs_err or 0.0,
                       "max_rel_err": None})
        verdict = final.checks.get(best.number)  # the final round's run at a ragged shape, on the device
        for shape in (verdict.also or ()) if verdict is not None and verdict.ok else ():
            checks.append({"shape": [int(d) for d in shape.split("x")], "verifier": "device",
                           "max_abs_err": verdict.max_abs_err, "max_rel_err": None})
    else:
        raise StepError("unverified", f"the winner (trial {best.number}) was never verified")
    median, spread_ = best.time_ms, best.spread
    finalist = final.finalists.get(best.number)
    if finalist:  # measured: the interleaved final round is the better figure
        median, spread_ = finalist.median_ms, finalist.spread if finalist.spread is not None else best.spread
    return {"study": result.study_name, "evidence": result.evidence, "evaluated": result.evaluated,
            "failures": failures, "stop_reason": result.stop_reason, "config": best.config,
            "trial": best.number, "median_ms": median, "spread": spread_,
            "baseline_median_ms": final.baseline_median_ms, "checks": checks,
            "baseline_spread": final.baseline_spread, "speedup": final.speedup, "speedup_low": final.speedup_low,
            "speedup_high": final.speedup_high, "modes": {m: f.to_dict() for m, f in final.modes.items()} or None,
            "weight_sets": final.weight_sets,
            "best": _jsonable(asdict(best))}


def verify(p: dict[str, Any]) -> dict[str, Any]:
    """Verify the winner on the unit's extra shapes (a shape its config is not valid for is skipped); none given:
    a ragged shape near the smallest one where the winner's config is valid."""
    from kernsearch import Space, get_chip, load_family, make_problem
    from kernsearch._errors import VariantFailure
    from kernsearch.backends import backend_class
    from kernsearch.evaluation._measure import VariantTask, verify_variant

    fam = load_family(p["family"])
    chip = get_chip(p["chip"])
    backend = p["verifier_backend"]
    interprets = backend_class(backend).interprets
    checks, skipped = [], []
    shapes = p["shapes"]
    if not shapes and p.get("tuned_shape"):
        from kernsearch.family._shapes import ragged_shape, smallest_shape

        tuned = tuple(p["tuned_shape"])
        small = smallest_shape(fam, p["dtype"], chip, p["config"], tuned)
        shapes = [ragged_shape(fam, p["dtype"], chip, p["config"], small) or small]
    for shape in shapes:
        problem = make_problem(fam, tuple(shape), p["dtype"], chip)
        bad = Space(problem, chip).violations(p["config"])
        if bad:
            skipped.append({"shape": list(problem.shape), "why": "; ".join(map(str, bad))})
            continue
        options = {"mode": "fast", "timeout": p["timeout"]} if interprets else {}
        task = VariantTask(family=str(fam.path), shape=problem.shape, dtype=p["dtype"], chip=chip.name,
                           backend=backend, config=p["config"], seed=p["seed"] + 7, options=options)
        try:
            out = verify_variant(task)
        except VariantFailure as exc:
            raise StepError(exc.reason, f"winner wrong at shape {problem.shape_text}: {exc.detail[:300]}") from None
        checks.append({"shape": list(problem.shape), "verifier": "interpreter" if interprets else "device",
                       "max_abs_err": out["max_abs_err"], "max_rel_err": out["max_rel_err"]})
    return {"checks": checks, "skipped": skipped}


def _evaluated(family: str, chip: str, problem: Any, backend: str, storage: str | None) -> int:
    """Configs the unit's study has evaluated so far (0 when it does not exist yet)."""
    import optuna

    from kernsearch.family._space import format_config
    from kernsearch.studies._storage import make_storage, study_name_for
    from kernsearch.studies._study import EVALUATED

    name = study_name_for({"family": family, "chip": chip, "dtype": problem.dtype, "shape": problem.shape_text,
                           "backend": backend})
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


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def main(argv: list[str]) -> int:
    """``python -m kernsearch.flows._steps STEP IN.json OUT.json``: the subprocess side of :func:`run_step`."""
    step, src, dst = argv
    payload = json.loads(Path(src).read_text(encoding="utf-8"))
    started = time.monotonic()
    try:
        reply: dict[str, Any] = {"ok": True, "value": STEPS[step](payload)}
    except StepError as exc:
        reply = {"ok": False, "reason": exc.reason, "detail": exc.detail}
    except KernsearchError as exc:
        reply = {"ok": False, "user": True, "reason": "user", "detail": str(exc)}
    reply["seconds"] = time.monotonic() - started
    from kernsearch._safeio import write_atomic

    write_atomic(dst, json.dumps(reply, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
