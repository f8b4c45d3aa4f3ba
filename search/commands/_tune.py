"""``tune``: the search, from its options to the printed (or JSON) result and the publish."""

from __future__ import annotations

import sys
from enum import Enum
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from .._console import err, out
from .._errors import KernsearchError, not_empty
from .._rules import DEFAULT_MARGIN
from ._app import (
    FAMILY_HELP,
    ChipOpt,
    DtypeOpt,
    ShapeOpt,
    StorageOpt,
    StoreOpt,
    _evidence_label,
    _warn_line,
    _warnings_as_lines,
    _wide,
    app,
)
from ._tables import _final_lines, _top_table

if TYPE_CHECKING:
    from collections.abc import Callable

    from .._progress import Display
    from ..artifacts._artifacts import PublishOutcome
    from ..hardware._chips import Chip
    from ..studies._study import Objective, StudyResult
    from ..studies._study import Progress as ProgressInfo


class VerifyChoice(str, Enum):
    """``tune --verify``: which trials of a modeled search the interpreter checks."""

    all = "all"
    finalists = "finalists"
    none = "none"


class SamplerChoice(str, Enum):
    """``tune --sampler`` (the study's ``SAMPLERS``; tests/test_study_cli.py checks the two agree)."""

    default = "default"
    tpe = "tpe"
    random = "random"
    grid = "grid"
    auto = "auto"
    forest = "forest"
    hybrid = "hybrid"
    thompson = "thompson"


def _pick_backend(backend: str, chip_name: str | None, verify: str = "finalists") -> tuple[str, Chip, str | None]:
    """``--backend auto``: metal on Apple GPUs, cuda on NVIDIA, else the model for --chip (or an M-series).

    A measurement belongs to the GPU it ran on, never to a named one (see ``backends.select_backend``).
    Returns (back-end name, Chip, a one-line note or None)."""
    from ..backends import select_backend

    with _warnings_as_lines():  # an unknown detected chip warns on one line
        chosen = select_backend(backend, chip_name, verify=verify)
    if chosen.refusal:
        raise KernsearchError(chosen.refusal)
    return chosen.backend, chosen.chip, chosen.note


@app.command()
def tune(family: str = typer.Argument(..., help=FAMILY_HELP), shape: str | None = ShapeOpt,
         dtype: str | None = DtypeOpt, chip_name: str | None = ChipOpt,
         trials: int | None = typer.Option(None, "--trials", help="configs the study should have evaluated "
                                              "(default: 150, or no limit with --time-budget)"),
         time_budget: str | None = typer.Option(None, "--time-budget", help="e.g. 90s, 10m, 1h"),
         patience: int | None = typer.Option(60, "--patience", help="stop after this many trials without "
                                                "a new best (0: never)"),
         backend: str = typer.Option("auto", "--backend", help="auto, metal, cuda, model or replay"),
         landscape: str | None = typer.Option(None, "--landscape", help="replay: a KernelTuner cache file"),
         sampler: SamplerChoice = typer.Option(
             SamplerChoice.default, "--sampler", help="default (auto when the chip's performance model ranks the "
             "family, else tpe), auto (valid configs only: the model's ranking, then a GP), forest (valid configs "
             "only: a tree surrogate; docs/search.md), thompson (forest, Thompson sampling), hybrid (tpe, then "
             "forest), tpe, random or grid"),
         storage: str | None = StorageOpt,
         study: str | None = typer.Option(None, "--study", help="study name (default: family/chip/dtype/"
                                             "shape/backend)", callback=not_empty),
         seed: int = typer.Option(0, "--seed", help="sampler and input seed"),
         start: list[str] = typer.Option([], "--start", help="a config to evaluate first, e.g. PATH=h2,RT=2 (knobs "
                                         "not given keep the family default; repeatable)"),
         finalists: int = typer.Option(3, "--finalists", help="leaders re-measured (or verified) at the end"),
         verify_choice: VerifyChoice = typer.Option(
             VerifyChoice.finalists, "--verify", help="model back-end: verify all trials, the finalists or none on "
             "the CPU interpreter"),
         timeout: float = typer.Option(120.0, "--timeout", help="seconds per variant before it counts as hung"),
         publish: bool = typer.Option(False, "--publish", help="offer the winner to the artifact store "
                                      "(its regression gate decides)"),
         store: str | None = StoreOpt,
         margin: float = typer.Option(DEFAULT_MARGIN, "--margin", min=0.0, max=10.0,
                                      help="a measured winner beats the MLX op only if its speedup's lower bound "
                                      "exceeds 1 + margin"),
         as_json: bool = typer.Option(False, "--json", help="print a machine-readable result on stdout"),
         report: bool = typer.Option(False, "--report", help="write the study's HTML report at the end and "
                                     "print its path (see `kernsearch report`)")) -> None:
    """Search for the fastest correct variant of a family on a problem and chip."""
    from ..studies._kernel import KernelVariants
    from ..studies._storage import StudyKey

    trials = _tune_options(trials, time_budget, finalists, patience, timeout, seed)
    objective, note = _tune_objective(family, shape, dtype, chip_name, backend, landscape, seed, timeout,
                                      verify_choice.value)
    _refuse_before_searching(objective, storage, study, publish, store)
    if start:
        _start_with(objective, start)
    if note:
        err.print(note, soft_wrap=True)
    if publish:
        _against_current(objective, store)
    key = StudyKey.of(objective.study_key)
    study, where = _study_place(objective, storage, study)
    err.print(f"tuning [bold]{key.family}[/] {key.shape} {key.dtype} on {key.chip} "
              f"({key.backend} back-end, {objective.evidence}){escape(where)}", soft_wrap=True)
    from .._progress import Display
    from .._steps import step
    from ..studies._study import first_ctrl_c_stops

    with Display(err, quiet=as_json) as display, first_ctrl_c_stops() as ctrl_c:
        _say_if_the_model_cannot_rank(objective, sampler.value)  # ranking the space: seconds, a step of the display
        result = _run_with_progress(display, objective, trials, time_budget, patience or None, sampler.value, seed,
                                    storage, study, finalists, ctrl_c.is_set)
        outcome = None
        if publish and isinstance(objective, KernelVariants) and result.best is not None \
                and not result.stop.reason.by_request:
            from ..artifacts._artifacts import ArtifactStore

            with step("publishing the winner through the regression gate"):
                outcome = objective.publish(result, ArtifactStore(store), margin=margin)
    _print_tune(result, objective, margin, outcome, as_json)
    if report:
        from ..studies._report import write_report

        with Display(err), step("writing the study's HTML report"):
            path = write_report(result.study_name, storage)
        err.print(f"report: {path}", soft_wrap=True, markup=False)
    if result.stop.reason.by_request:
        raise typer.Exit(130)
    if result.best is None or result.final is not None and result.final.winner is None:
        raise typer.Exit(1)  # the search ran, but no variant was correct: like a failed `verify`


def _tune_options(trials: int | None, time_budget: str | None, finalists: int, patience: int | None, timeout: float,
                  seed: int) -> int | None:
    """Every numeric option of `tune` checked (a bad one is one line, before anything starts); the trial budget
    (150 when neither it nor a time budget is given)."""
    from .. import _options
    from ..studies._study import parse_duration

    parse_duration(time_budget)
    if trials is None and time_budget is None:
        trials = 150
    _options.check(_options.Count, trials, "--trials")
    _options.check(_options.Count, finalists, "--finalists")
    _options.check(_options.Patience, patience, "--patience")
    _options.check(_options.Timeout, timeout, "--timeout")
    _options.check(_options.Seed, seed, "--seed")
    return trials


def _tune_objective(family: str, shape: str | None, dtype: str | None, chip_name: str | None, backend: str,
                    landscape: str | None, seed: int, timeout: float, verify: str) -> tuple[Objective, str | None]:
    """What `tune` searches (a family's variants on the chosen back-end and chip, or a replayed landscape) and the
    note it says first."""
    from ..backends import replays
    from ..studies._storage import StudyKey

    if replays(backend) or landscape:
        from ..studies._replay import Replay

        if not landscape:
            raise KernsearchError("--backend replay needs --landscape PATH (a KernelTuner cache file)")
        replay = Replay(landscape, seed=seed).objective(family)
        chip = StudyKey.of(replay.study_key).chip
        return replay, f"replaying {landscape}: recorded times measured on {chip}, not here"
    from ..family._space import make_problem
    from ..family._spec import load_family
    from ..studies._objective import KernelObjective

    name, c, note = _pick_backend(backend, chip_name, verify)
    problem = make_problem(load_family(family), shape, dtype, c)
    return KernelObjective(problem, c, name, seed=seed, timeout=timeout, verify=verify), note


def _study_place(objective: Objective, storage: str | None, study: str | None) -> tuple[str | None, str]:
    """The study this run works in (another one where the named study's family changed since: said in a line) and
    what the first line says of it: a resumed study, where it lives, and that ``--trials`` counts all its trials."""
    if storage == ":memory:":
        return study, ""
    from ..studies._storage import default_storage, redact
    from ..studies._study import study_for

    place = study_for(objective, storage, study)
    if place.changed:
        _warn_line(place.changed)
    url = redact(storage or default_storage())
    if place.trials:
        return place.name, (f"; resuming study {place.name!r} ({place.trials} trials, counted by --trials) in "
                            f"{url}")
    return place.name, f"; new study {place.name!r} in {url}"


def _start_with(objective: Objective, start: list[str]) -> None:
    """``--start``: the configs the search proposes first."""
    from ..studies._kernel import KernelVariants

    if not isinstance(objective, KernelVariants):
        raise KernsearchError("--start names configs of a family's variants; a replayed landscape has none")
    try:
        objective.start_with(start)
    except KernsearchError as exc:
        raise KernsearchError(f"--start: {exc}") from None


def _against_current(objective: Objective, store: str | None) -> None:
    """A publishing search times its leader against the key's current version too (the gate then compares the two in
    paired rounds of one run), and says so."""
    from ..artifacts._artifacts import ArtifactStore
    from ..studies._kernel import KernelVariants

    current = objective.against_current(ArtifactStore(store)) if isinstance(objective, KernelVariants) else None
    if current is not None:
        err.print(f"the final round times its leader against the current version {current.version} too: the gate "
                  "compares the two in paired rounds of this run", soft_wrap=True)


def _refuse_before_searching(objective: Objective, storage: str | None, study: str | None, publish: bool,
                             store: str | None = None) -> None:
    """What would fail after the search, refused before it (one line, before the banner): a corrupted storage, a
    study made for another problem, a publish that could not happen."""
    from ..studies._kernel import KernelVariants

    if publish and not isinstance(objective, KernelVariants):
        raise KernsearchError("--publish needs a kernel family: replayed landscapes have no kernel to publish")
    if storage != ":memory:":
        from ..studies._storage import check_storage
        from ..studies._study import check_study

        check_storage(storage)
        check_study(objective, storage, study)
    if publish and isinstance(objective, KernelVariants):
        from ..artifacts._artifacts import ArtifactStore

        why = objective.unpublishable()
        if why:  # nothing this search finds could be published: say so now, not after the search
            raise KernsearchError(f"--publish: {why}")
        ArtifactStore(store).check_writable()  # so is a store no publish could write (not after the search)


def _print_tune(result: StudyResult, objective: Objective, margin: float, outcome: PublishOutcome | None,
                as_json: bool) -> None:
    """The search's result: tables and the verdict, or (``--json``) the machine-readable form."""
    import json

    from ..studies._storage import StudyKey
    from ..studies._tune import verdict

    family = getattr(objective, "family", None)
    judged = verdict(result, StudyKey.of(objective.study_key), family.baseline_name if family else "the MLX op",
                     margin, tuple(family.consumer_modes) if family else None)
    if as_json:
        data = result.to_dict()
        data["winner"] = result.best.summary() if result.best is not None else None
        data["beats_baseline"] = judged.beats
        data["verdict"] = judged.text
        if outcome is not None:
            data["publish"] = {"published": outcome.published, "version": outcome.version,
                               "reason": outcome.reason, "key": outcome.key,
                               "bounds": _bounds_text(result) if outcome.published else None}
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return
    _print_result(result)
    out.print(judged.text, soft_wrap=True, markup=False)
    if outcome is not None:
        state = f"published as {outcome.version}" if outcome.published else "not published"
        bounds = f"; bounds: {_bounds_text(result)}" if outcome.published else ""
        out.print(f"artifact {outcome.key}: {state} ({outcome.reason}){bounds}", soft_wrap=True)


def _bounds_text(result: StudyResult) -> str:
    """Exactly which out-of-bounds checks the published winner passed (``BoundsChecks.text``)."""
    final, best = result.final, result.best
    check = final.checks.get(best.number) if final is not None and best is not None else None
    if check is None or check.bounds is None:
        return "no record of checks (a final round stored before they were recorded)"
    return check.bounds.text()


def _say_if_the_model_cannot_rank(objective: Objective, sampler: str) -> None:
    """A family the performance model predicts flat: one warning line before the search (``model_note``). The
    ``auto`` sampler's prior ranks every valid config: the note's verdict is then of all of them, predicted once."""
    from ..studies._kernel import KernelVariants
    from ..studies._samplers import PRIOR_SAMPLERS

    whole = sampler in PRIOR_SAMPLERS
    text = objective.model_note(whole=whole) if isinstance(objective, KernelVariants) else None
    if text:
        _warn_line(text)



def _run_with_progress(display: Display, objective: Objective, trials: int | None, time_budget: str | None,
                       patience: int | None, sampler: str, seed: int | None, storage: str | None, study: str | None,
                       finalists: int, stop: Callable[[], bool] | None = None) -> StudyResult:
    """The search as a step of ``display``: a bar on a terminal; through a pipe, a whole line for every new best
    and at least every few seconds (never cut at 80 columns). Trial numbers are the study's, as in the tables."""
    from .._progress import LINE_EVERY, seconds
    from .._steps import step
    from ..family._space import format_config
    from ..studies._study import run_study

    state: dict[str, float | None] = {"best": None}
    of = trials if trials is not None else "-"
    with step("searching (configs evaluated)", total=trials) as search:
        def show(p: ProgressInfo) -> None:
            search.estimate(p.remaining_s)
            search.advance(p.done)
            best = (f"best trial {p.best.number}: {p.best.time_ms:.4g} ms {format_config(p.best.config)}" if p.best
                    else "no correct variant yet")
            fails = ", ".join(f"{k} {v}" for k, v in p.failures.most_common()) or "none"
            versus = f" ({p.speedup:.2f}x the baseline)" if p.speedup else ""
            display.status(search, f"{best}{versus} · failed: {fails}")
            better = p.best is not None and (state["best"] is None or p.best.time_ms < state["best"])
            if p.best is not None:
                state["best"] = p.best.time_ms
            if display.live or not (better or display.quiet_for() >= LINE_EVERY or p.done == trials):
                return
            left = f", ~{seconds(p.remaining_s)} left" if p.remaining_s is not None else ""
            display.line(f"{p.done}/{of} configs evaluated ({seconds(p.elapsed_s)}{left}): {best}{versus} · "
                         f"failed: {fails}")

        return run_study(objective, trials=trials, time_budget=time_budget, patience=patience, sampler=sampler,
                         seed=seed, storage=storage, study_name=study, finalists=finalists, progress=show, stop=stop)


def _print_result(result: StudyResult) -> None:
    from ..family._space import format_config

    fails = ", ".join(f"{k} {v}" for k, v in result.failures.most_common()) or "none"
    out.print(f"study [bold]{result.study_name}[/] · {result.evaluated} configs evaluated · failed: {fails} · "
              f"{result.invalid} invalid proposals rejected before compiling · {result.elapsed_s:.1f} s · "
              f"{escape(result.stop_reason)}", soft_wrap=True)
    winner = result.final.winner if result.final is not None else result.best.number if result.best else None
    if result.top:
        _wide().print(_top_table(result.top, result.evidence, winner, result.final))
    for line in _final_lines(result.final, result.evidence):
        out.print(line, soft_wrap=True)
    if result.best is None or winner is None:
        out.print("[red]no correct variant found[/]")
        return
    out.print(f"winner: trial {result.best.number} [bold]{format_config(result.best.config)}[/] "
              f"{result.best.time_ms:.4g} ms ({_evidence_label(result.evidence, result.backend)})", soft_wrap=True)

