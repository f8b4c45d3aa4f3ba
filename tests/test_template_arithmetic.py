"""The templates' arithmetic (``kernsearch.family._expr.binary``, which the Jinja sandbox calls for every operator):
two ints take a short path; it must give what evaluating the expression tree gives, value or error."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kernsearch.family._expr import _CONTEXT_ONLY, BINARY, BOUNDS, MAX_INT_BITS, binary, evaluate

INTS = st.one_of(st.integers(-300, 300), st.integers(-(2 ** (MAX_INT_BITS + 4)), 2 ** (MAX_INT_BITS + 4)),
                 st.sampled_from([0, 1, -1, 2 ** MAX_INT_BITS - 1, 2 ** MAX_INT_BITS, -(2 ** MAX_INT_BITS)]))


def outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "value", fn()
    except Exception as exc:  # noqa: BLE001 - the error's kind and words are what is compared
        return type(exc).__name__, str(exc)


@settings(max_examples=400, deadline=None)
@given(op=st.sampled_from(sorted(BINARY)), left=INTS, right=INTS)
def test_integer_arithmetic_is_what_the_expression_tree_gives(op: str, left: int, right: int) -> None:
    tree = ["bin", op, ["const", left], ["const", right]]
    assert outcome(lambda: binary(op, left, right)) == outcome(lambda: evaluate(tree, {}, _CONTEXT_ONLY, BOUNDS))


def test_a_product_too_large_is_refused_on_the_short_path() -> None:
    big = 2 ** (MAX_INT_BITS - 1)
    assert outcome(lambda: binary("*", big, 4))[0] == "ExpressionError"
    assert outcome(lambda: binary("+", big, big))[0] == "ExpressionError"
    assert binary("//", 7, 2) == 3 and binary("%", -7, 3) == 2 and binary("/", 1, 4) == 0.25
