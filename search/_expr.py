"""Sandboxed evaluation of the expressions written in family spec files.

Spec files are data written by users; their expressions (constraints, launch geometry, shapes,
references) are compiled with Jinja's immutable sandbox, never with Python's ``eval``. Only the names
given in the evaluation context exist; attribute access to private members is refused by the sandbox.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable

from jinja2 import StrictUndefined, TemplateSyntaxError, Undefined, meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


#: Functions every spec expression may call.
BUILTINS: dict[str, Callable[..., Any]] = {
    "ceil_div": ceil_div,
    "round_up": round_up,
    "is_pow2": is_pow2,
    "min": min,
    "max": max,
    "abs": abs,
    "int": int,
    "float": float,
    "len": len,
    "sqrt": math.sqrt,
    "log2": math.log2,
}

_ENV = ImmutableSandboxedEnvironment(undefined=StrictUndefined)


class ExprError(ValueError):
    """An expression failed to parse or to evaluate; the message says why."""


class Expr:
    """A compiled spec expression that knows which names it reads."""

    __slots__ = ("text", "names", "_fn")

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text.strip():
            raise ExprError("empty expression")
        self.text = text
        self.names, self._fn = _compile(text)

    def __call__(self, context: dict[str, Any]) -> Any:
        try:
            return self._fn(context)
        except ExprError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of user text is reported, not raised raw
            raise ExprError(f"{self.text!r}: {type(exc).__name__}: {exc}") from None

    def __repr__(self) -> str:
        return f"Expr({self.text!r})"


@lru_cache(maxsize=4096)
def _compile(text: str) -> tuple[frozenset[str], Callable[[dict[str, Any]], Any]]:
    try:
        ast = _ENV.parse("{{ " + text + " }}")
        compiled = _ENV.compile_expression(text, undefined_to_none=False)
    except TemplateSyntaxError as exc:
        raise ExprError(f"{text!r}: syntax error: {exc.message}") from None
    # Names the expression reads, minus names bound inside it (comprehension-like filters, lambdas).
    names = frozenset(meta.find_undeclared_variables(ast))
    if any(isinstance(n, (nodes.Filter, nodes.Test)) and n.name not in _ENV.filters | _ENV.tests
           for n in ast.find_all((nodes.Filter, nodes.Test))):
        raise ExprError(f"{text!r}: unknown filter or test")

    def run(context: dict[str, Any]) -> Any:
        value = compiled(**context)
        # A strict Undefined only raises when used; an expression that *returns* one (an unknown name,
        # or an attribute the sandbox hides) is an error too.
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, Undefined):
                raise ExprError(f"{text!r}: undefined value ({item._undefined_hint or 'unknown name'})")
        return value

    return names, run
