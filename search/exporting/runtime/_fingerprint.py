"""A function's code, hashed by its syntax tree: how ``patch(model)`` knows that mlx-lm's forward, cache and RoPE
are the code it reproduces. Copied verbatim into every exported package; standard library only."""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from typing import Any, Dict


def fingerprint(fn: Any) -> str:
    """A function's syntax tree, hashed: equal for the same code whatever its layout and comments, and whatever the
    Python version parsing it (once per function: a model's blocks share their class)."""
    key = getattr(fn, "__code__", fn)
    if key not in _FINGERPRINTS:
        try:
            source = textwrap.dedent(inspect.getsource(fn))
            tree = repr(_tree_shape(ast.parse(source)))
        except (OSError, TypeError, SyntaxError):
            return "unavailable"
        _FINGERPRINTS[key] = hashlib.sha256(tree.encode()).hexdigest()[:16]
    return _FINGERPRINTS[key]


#: Fields a newer Python's parser adds to the same code (3.12: ``type_params`` of every function), or that carry
#: no meaning of the code: left out, so that one mlx-lm's forward has one fingerprint on every Python.
_VOLATILE_FIELDS = frozenset({"type_params", "type_comment", "kind"})


def _tree_shape(node: Any) -> Any:
    """A syntax tree as nested tuples of node names and the values of their lasting fields."""
    if isinstance(node, ast.AST):
        return (type(node).__name__,
                tuple((f, _tree_shape(getattr(node, f, None))) for f in node._fields if f not in _VOLATILE_FIELDS))
    if isinstance(node, list):
        return tuple(_tree_shape(n) for n in node)
    return repr(node)


_FINGERPRINTS: Dict[Any, str] = {}


__all__ = ["fingerprint"]
