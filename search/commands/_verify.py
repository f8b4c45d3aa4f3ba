"""``verify``: one variant against the float64 NumPy reference, on the interpreter or a GPU here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.markup import escape

from .._console import err, out
from .._errors import KernsearchError, VariantFailure
from .._rules import DEFAULT_TARGET
from .._vocabulary import Severity
from ._app import FAMILY_HELP, ChipOpt, DtypeOpt, ShapeOpt, app, resolve_chip

if TYPE_CHECKING:
    from ..backends._base import BaseBackend
    from ..family._space import Problem
    from ..family._spec import Family
    from ..hardware._chips import Chip


@app.command()
def verify(family: str = typer.Argument(..., help=FAMILY_HELP),
           config: str | None = typer.Option(None, "--config", help="KNOB=VALUE,... (others: the default)"),
           shape: str | None = ShapeOpt, dtype: str | None = DtypeOpt, chip_name: str | None = ChipOpt,
           backend: str = typer.Option("cpu", "--backend", help="cpu (the Metal interpreter), metal or cuda"),
           check: bool = typer.Option(False, "--check", help="cpu: also detect threadgroup races, reads of "
                                      "never-written and out-of-bounds threadgroup memory"),
           sanitize: bool = typer.Option(False, "--sanitize", help="cpu: detect device-buffer out-of-bounds "
                                         "accesses (AddressSanitizer)"),
           seed: int = typer.Option(0, "--seed", help="seed of the random inputs"),
           timeout: float = typer.Option(30.0, "--timeout", help="cpu: seconds before a hanging kernel is stopped"),
           full: bool = typer.Option(False, "--full", help="cpu: run every threadgroup of a big problem (default: "
                                     "8 threadgroups: the corners and edge middles, when there are more than 64)")
           ) -> None:
    """Run one variant against the float64 NumPy reference: pass/fail, error, diagnostics (exit 1 on fail)."""
    from .. import _options
    from .._progress import Display
    from .._steps import step
    from ..evaluation._verify import check_size, verify_kernel
    from ..family._render import geometry
    from ..family._render import render as render_variant
    from ..family._space import Space, format_config, make_problem
    from ..family._spec import load_family

    _options.check(_options.Seed, seed, "--seed")
    _options.check(_options.Timeout, timeout, "--timeout")
    if check and sanitize:
        raise KernsearchError("--check and --sanitize are separate runs: give one of them")
    be_class = _verifying_backend(backend, check or sanitize)
    # The chip it verifies for: the one named even on a GPU back-end (a check is not a timing: another chip's space
    # may be checked on the GPU here), else the GPU here where it runs the back-end's kernels, else the default.
    c = resolve_chip(chip_name, target=be_class.target, default=True)
    be = be_class()
    be.check_available()
    fam = load_family(family)
    problem = make_problem(fam, shape, dtype, c)
    sp = Space(problem, c)
    check_size(problem)
    cfg = sp.validate(sp.parse_config(config))
    kernel = render_variant(fam, cfg, problem.dtype, be.target or DEFAULT_TARGET)
    geo = geometry(sp, cfg)
    mode = "sanitize" if sanitize else ("check" if check else "fast")
    options, sampled = _interpreter_options(be, fam, cfg, problem, geo, mode, timeout, c, seed, full)
    how = f"{be.name} back-end ({be.evidence}" + (f", {mode} mode)" if be.interprets else ")") + sampled
    out.print(f"[bold]{fam.name}[/] {problem.shape_text} {problem.dtype} for {c.name} · "
              f"{format_config(cfg)} · {how}", soft_wrap=True)
    try:
        with Display(err), step(f"running {problem.shape_text} on the {be.name} back-end"):
            result, diagnostics = verify_kernel(be, kernel, geo, problem, seed, **options)
    except VariantFailure as exc:
        _verify_failed(exc, be.interprets, timeout, problem.shape_text)
    _print_verified(result, diagnostics, problem)


def _verifying_backend(backend: str, diagnoses: bool) -> type[BaseBackend]:
    """The class of the back-end `verify` runs on (``--check`` and ``--sanitize`` are the interpreter's)."""
    from ..backends import backend_class

    be_class = backend_class(backend)
    if diagnoses and not be_class.interprets:
        raise KernsearchError("--check and --sanitize need --backend cpu")
    return be_class


def _interpreter_options(be: BaseBackend, fam: Family, cfg: dict[str, Any], problem: Problem, geo: Any, mode: str,
                         timeout: float, chip: Chip, seed: int, full: bool) -> tuple[dict[str, Any], str]:
    """The interpreter's options for one run (a sample of a big grid's threadgroups unless ``full``), and how the
    banner says what is sampled."""
    if not be.interprets:
        return {}, ""
    from ..evaluation._verify import sample_threadgroups, threadgroup_counts
    from ..interp import template_lines

    options: dict[str, Any] = {"mode": mode, "timeout": timeout, "chip": chip,
                               "lines": template_lines(fam, cfg, problem.dtype, be.target or DEFAULT_TARGET)}
    counts = threadgroup_counts(geo)
    groups = counts[0] * counts[1] * counts[2]
    if groups <= 64 or full:
        return options, ""
    options["threadgroups"] = sample_threadgroups(geo, 8, seed)  # a 4096³ GEMM takes minutes: check a sample
    return options, f", {len(options['threadgroups'])} of {groups} threadgroups (corners, edge middles; --full: all)"


def _verify_failed(exc: VariantFailure, interprets: bool, timeout: float, shape: str) -> NoReturn:
    if exc.reason == "timeout" and interprets:  # slow interpretation is no verdict on the kernel
        out.print(f"[yellow]NO VERDICT (timeout)[/]: the interpreter did not finish in {timeout:g} s at "
                  f"{shape}; this says nothing about the kernel (a hang and a big problem look "
                  "alike here): try a smaller --shape or a longer --timeout", soft_wrap=True)
        raise typer.Exit(1) from None
    out.print(f"[red]FAIL ({exc.reason})[/]: {escape(exc.detail)}", soft_wrap=True)
    raise typer.Exit(1) from None


def _print_verified(result: Any, diagnostics: list[Any], problem: Problem) -> None:
    from ..evaluation._verify import tolerance

    rtol, atol = tolerance(problem)
    colour = "green" if result.ok else "red"
    out.print(f"[{colour}]{result.summary()}[/] (tolerance: rtol {rtol:g}, atol {atol:.3g})", soft_wrap=True)
    errors = [d for d in diagnostics if d.severity == Severity.ERROR]
    for d in diagnostics:
        out.print(f"  [{'red' if d.severity == Severity.ERROR else 'yellow'}]{escape(str(d))}[/]", soft_wrap=True)
    if not result.ok or errors:
        if result.ok:
            out.print(f"[red]FAIL[/]: {len(errors)} error diagnostic(s)")
        raise typer.Exit(1)

