"""The ``kernsearch`` command line: the commands (``kernsearch.commands``, one module a concept) and the sub-apps
assembled into one app, and its entry point.

Every user error (:class:`KernsearchError`) becomes one line on stderr and exit code 2. Heavy imports
(MLX, Optuna, Prefect) happen inside the commands that need them, so ``kernsearch --help`` stays fast.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.markup import escape

from ._console import err, out
from ._errors import KernsearchError
from .commands import _inspect, _store, _studies, _tune, _verify  # noqa: F401  (each registers its commands)
from .commands._app import app, problem_and_space, resolve_chip
from .commands._tune import SamplerChoice, VerifyChoice

#: The order `kernsearch --help` lists the commands in (a command not named here comes last); the sub-apps follow.
HELP_ORDER = ("families", "chip", "space", "render", "export", "explain", "verify", "tune", "studies", "show", "report",
              "dashboard", "predict")


def _help_place(command: Any) -> int:
    name = command.name or command.callback.__name__
    return HELP_ORDER.index(name) if name in HELP_ORDER else len(HELP_ORDER)


app.registered_commands.sort(key=_help_place)

# -- nightly flows (issue 6): the sub-app imports Prefect only inside its commands --------------------
from .flows._cli import app as _flows_app  # noqa: E402

app.add_typer(_flows_app, name="flows")

from .bench._cli import app as _bench_app  # noqa: E402

app.add_typer(_bench_app, name="bench")

__all__ = ["SamplerChoice", "VerifyChoice", "app", "main", "problem_and_space", "resolve_chip"]


def _error_line(message: str) -> None:
    """One line on stderr, whatever the message holds (newlines of user text are flattened; the password of a
    URL in it, e.g. a storage a driver names, is masked)."""
    from .studies._storage import mask_passwords

    err.print(f"[red]error:[/] {escape(mask_passwords(' '.join(str(message).split())))}", soft_wrap=True)


def _flag_value_hint(args: list[str] | None, message: str) -> str:
    """``--publish true``: the value is left over as an extra argument; say that flags take none."""
    words = list(sys.argv[1:] if args is None else args)
    if "unexpected extra argument" not in message:
        return ""
    for flag, value in zip(words, words[1:]):
        if flag.startswith("--") and "=" not in flag and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return f": {flag} is a flag and takes no value (give {flag} alone, or leave it out)"
    return ""


def main(args: list[str] | None = None) -> None:
    """Console-script entry point: usage and user errors → one line on stderr, exit 2."""
    import importlib

    try:  # typer >= 0.20 vendors its own click
        click: Any = importlib.import_module("typer._click")
    except ImportError:  # pragma: no cover
        click = importlib.import_module("click")

    from .studies._storage import OPENED

    try:
        with OPENED.scope():  # a study's storage is opened once a command
            rc = app(args=args, prog_name="kernsearch", standalone_mode=False)
    except getattr(click.exceptions, "NoArgsIsHelpError", ()) as exc:
        out.print(exc.ctx.get_help() if exc.ctx else "", soft_wrap=True, markup=False, highlight=False)
        sys.exit(0)
    except click.exceptions.UsageError as exc:
        command = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
        _error_line(f"{command}{exc.format_message()}{_flag_value_hint(args, exc.format_message())} (see --help)")
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        _error_line("interrupted")
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        _error_line(exc.format_message())
        sys.exit(exc.exit_code or 2)
    except KernsearchError as exc:
        _error_line(str(exc))
        sys.exit(exc.exit_code)
    except RecursionError:
        _error_line("input nested too deeply")
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - only storage failures are turned into a line; others stay bugs
        from .studies._storage import storage_errors

        if not isinstance(exc, storage_errors()):
            raise
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        _error_line(f"the study storage cannot be used ({type(exc).__name__}): {first}")
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
