"""Spec expressions as the small JSON trees the exported runtime evaluates (``_runtime.evaluate``): parsed with
Jinja's parser (as the spec's own expressions are), never executed; a node the runtime cannot evaluate is refused."""

from __future__ import annotations

from typing import Any

from jinja2 import nodes

from .._errors import KernsearchError
from ._expr import _ENV, Expr

_BINOPS: dict[type[nodes.Node], str] = {nodes.Add: "+", nodes.Sub: "-", nodes.Mul: "*", nodes.Div: "/",
                                        nodes.FloorDiv: "//", nodes.Mod: "%", nodes.Pow: "**"}
_UNARY: dict[type[nodes.Node], str] = {nodes.Not: "not", nodes.Neg: "neg", nodes.Pos: "pos"}


class TreeError(KernsearchError):
    """An expression the exported runtime cannot evaluate (filters, tests, slices...)."""


# -- expressions as trees --------------------------------------------------------------------------------

def expr_tree(expr: Expr | str) -> list[Any]:
    """A spec expression as the JSON tree ``_runtime.evaluate`` reads (refuses what it cannot evaluate)."""
    text = expr.text if isinstance(expr, Expr) else expr
    body = _ENV.parse("{{ " + text + " }}").body
    if len(body) != 1 or not isinstance(body[0], nodes.Output) or len(body[0].nodes) != 1:
        raise TreeError(f"{text!r}: not a single expression")
    try:
        return _tree(body[0].nodes[0])
    except TreeError as exc:
        raise TreeError(f"{text!r}: {exc}") from None


def _tree(node: nodes.Node) -> list[Any]:
    if isinstance(node, nodes.Const):
        if not isinstance(node.value, (bool, int, float, str, type(None))):
            raise TreeError(f"constant {node.value!r} cannot be exported")
        return ["const", node.value]
    if isinstance(node, nodes.Name):
        return ["name", node.name]
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return ["list", [_tree(n) for n in node.items]]
    if isinstance(node, nodes.BinExpr) and type(node) in _BINOPS:
        return ["bin", _BINOPS[type(node)], _tree(node.left), _tree(node.right)]
    if isinstance(node, nodes.UnaryExpr) and type(node) in _UNARY:
        return [_UNARY[type(node)], _tree(node.node)]
    if isinstance(node, nodes.Concat):
        return ["concat", [_tree(n) for n in node.nodes]]
    if isinstance(node, nodes.And):
        return ["and", _tree(node.left), _tree(node.right)]
    if isinstance(node, nodes.Or):
        return ["or", _tree(node.left), _tree(node.right)]
    if isinstance(node, nodes.Compare):
        return ["cmp", _tree(node.expr), [[op.op, _tree(op.expr)] for op in node.ops]]
    if isinstance(node, nodes.CondExpr):
        return ["if", _tree(node.test), _tree(node.expr1), None if node.expr2 is None else _tree(node.expr2)]
    if isinstance(node, nodes.Call):
        if not isinstance(node.node, nodes.Name) or node.dyn_args is not None or node.dyn_kwargs is not None:
            raise TreeError("only calls of named functions with plain arguments can be exported")
        return ["call", node.node.name, [_tree(a) for a in node.args], {k.key: _tree(k.value) for k in node.kwargs}]
    if isinstance(node, nodes.Getattr):
        return ["attr", _tree(node.node), node.attr]
    if isinstance(node, nodes.Getitem) and not isinstance(node.arg, nodes.Slice):
        return ["item", _tree(node.node), _tree(node.arg)]
    raise TreeError(f"{type(node).__name__} expressions (filters, tests, slices...) cannot be exported")
