"""The command line's shared parts: the Typer app, the options several commands take, the chip a command works for,
warnings as one line each, and the formatting helpers of its tables."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from .._console import err, out
from .._errors import not_empty

if TYPE_CHECKING:
    from ..family._space import Problem, Space
    from ..family._spec import Family
    from ..hardware._chips import Chip


def _flags_take_no_value() -> None:
    """Typer's help prints a type beside every option, flags included (``--publish <bool>``), as if a flag took a
    value, which it does not (``--publish true`` is refused): a flag's row shows none."""
    from typer.core import TyperOption

    typed = getattr(TyperOption, "display_type_rich", None)
    if typed is None:  # a Typer without it (older than 0.16) prints no type for flags anyway
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_bool_flag else typed(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()


app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Find, prove and ship the fastest variant of a GPU kernel for the chip it runs on.")


FAMILY_HELP = "family name (see `kernsearch families`) or path to a family folder"


ShapeOpt = typer.Option(None, "--shape", help="problem shape, e.g. 4096,4096,4096 (default: the family's)")


DtypeOpt = typer.Option(None, "--dtype", help="float32, float16 or bfloat16 (default: the family's)",
                        callback=not_empty)


ChipOpt = typer.Option(None, "--chip", help="chip name, e.g. 'M2 Max' or H100 (default: detected)",
                       callback=not_empty)


StoreOpt = typer.Option(None, "--store", envvar="KERNSEARCH_ARTIFACTS",
                        help="artifact store folder (default: ./artifacts)", callback=not_empty)


StorageOpt = typer.Option(None, "--storage", help="Optuna storage URL (default: SQLite under $KERNSEARCH_HOME "
                          "or ~/.kernsearch; e.g. postgresql://... to share a study between machines)",
                          callback=not_empty)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            out.print(f"kernsearch {version('kernsearch')}", highlight=False)
        except PackageNotFoundError:
            out.print("kernsearch (not installed: run from a source tree)")
        raise typer.Exit()


@app.callback()
def _root(show_version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                            help="print the version and exit")) -> None:
    """Find, prove and ship the fastest variant of a GPU kernel for the chip it runs on."""


def _warn_line(message: warnings.WarningMessage | str) -> None:
    text = message.message if isinstance(message, warnings.WarningMessage) else message
    err.print(f"[yellow]warning:[/] {escape(str(text))}")


def resolve_chip(name: str | None, **rule: Any) -> Chip:
    """The chip a command works for (``hardware.resolve_chip``, the one chip rule, with its options ``rule``); an
    unknown detected chip warns on one line."""
    from ..hardware._chips import resolve_chip as _resolve

    with _warnings_as_lines():
        return _resolve(name, **rule)


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Warnings raised inside (an unknown detected chip) are printed as one line each, even on an error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                _warn_line(w)


def problem_and_space(family: str, shape: str | None, dtype: str | None,
                      chip_name: str | None) -> tuple[Family, Chip, Problem, Space]:
    from ..family._space import Space, make_problem
    from ..family._spec import load_family

    fam = load_family(family)
    chip = resolve_chip(chip_name, default=True)
    problem = make_problem(fam, shape, dtype, chip)
    return fam, chip, problem, Space(problem, chip)


def _wide() -> Console:
    """Tables of configs are wide: in a pipe or file, do not squeeze them to 80 columns."""
    return out if out.is_terminal else Console(highlight=False, width=max(out.width, 200))


def _evidence_label(evidence: str, backend: str | None) -> str:
    """A replayed landscape was measured on the GPU that recorded it, never here: say so."""
    from ..backends import evidence_label

    return evidence_label(evidence, backend)


def _fmt(value: Any, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)

