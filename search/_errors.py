"""Errors that mean "the user gave us something we cannot use".

The CLI turns every :class:`KernsearchError` into one line on stderr and exit code 2; anything else
is a bug in kernsearch and keeps its traceback.
"""

from __future__ import annotations

from typing import Any


class KernsearchError(Exception):
    """Bad input: unknown family, invalid knob value, impossible shape, malformed spec or artifact."""

    exit_code = 2


class SpecError(KernsearchError):
    """A family spec (file or folder) is malformed; the message names the file and the field."""


class ConfigError(KernsearchError):
    """A config does not belong to the family's space (unknown knob, bad value, violated constraint)."""


class ChipError(KernsearchError):
    """An unknown chip was named explicitly."""


class BackendError(KernsearchError):
    """A back-end is unavailable here (no GPU, no MLX CUDA build...)."""


class VariantFailure(Exception):
    """One kernel variant failed (compile error, crash, hang, wrong result).

    Not a user error: a search records it against the trial and goes on. ``reason`` is a short
    machine-friendly category (``compile``, ``crash``, ``timeout``, ``wrong``, ``nan``, ``unwritten``...).
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def not_empty(ctx: Any, param: Any, value: Any) -> Any:
    """A Typer/Click option callback: a text option given as an empty (or blank) string is a mistake, not "use
    the default" (``--chip ""`` used to mean the detected chip, ``--storage ""`` the default storage)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    if any(isinstance(v, str) and not v.strip() for v in values):
        flag = (getattr(param, "opts", None) or [f"--{getattr(param, 'name', 'option')}"])[0]
        raise KernsearchError(f"{flag}: empty value (give one, or leave the option out for the default)")
    return value
