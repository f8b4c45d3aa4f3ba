"""Spec expressions as the small JSON trees the exported runtime evaluates: the tree a parsed :class:`Expr` is
evaluated as here (``_rules.evaluate``, the same evaluator both sides run), never executed by Jinja or Python."""

from __future__ import annotations

import copy
from typing import Any

from .._errors import KernsearchError
from ._expr import Expr, ExprError


class TreeError(KernsearchError):
    """An expression that is not one of the language (filters, tests, ``*args``...): nothing can evaluate it."""


def expr_tree(expr: Expr | str) -> list[Any]:
    """A spec expression as the JSON tree ``_rules.evaluate`` reads (refuses what is not in the language): a copy,
    the parsed tree being shared by every ``Expr`` of the same text."""
    if isinstance(expr, Expr):
        return copy.deepcopy(expr.tree)
    try:
        return copy.deepcopy(Expr(expr).tree)
    except ExprError as exc:
        raise TreeError(str(exc)) from None
