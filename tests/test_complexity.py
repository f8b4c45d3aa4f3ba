"""The complexity gate of `make lint` (tools/complexity.py): radon's measure, which counts the operands of
``and``/``or`` and comprehensions that ruff's mccabe check does not; its list of old debts only shrinks."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import complexity  # noqa: E402

#: mccabe scores ``tangled`` 1 (it counts neither); radon: 1 + 8 extra `or` operands + a
#: comprehension's loop and filter x 4 = 17.
PLANTED = """
def tangled(a, b, c, d, e, f, g, h, i):
    ok = a or b or c or d or e or f or g or h or i
    return ok, [x for x in a if x], [x for x in b if x], [x for x in c if x], [x for x in d if x]


class Holder:
    def method(self, a):
        def inner(b):
            return a and b and a and b and a and b and a and b and a and b and a and b and a and b and a and b
        return inner
"""


def test_boolean_operands_and_comprehensions_count_methods_and_closures_on_their_own() -> None:
    assert complexity.over_limit(PLANTED) == [("tangled", 2, 17), ("Holder.method.inner", 9, 16)]
    assert complexity.over_limit(PLANTED, limit=20) == []


def test_the_debt_list_only_shrinks(tmp_path: Path) -> None:
    (tmp_path / "search").mkdir()
    (tmp_path / "flows").mkdir()
    (tmp_path / "search" / "m.py").write_text(PLANTED)
    assert complexity.findings(tmp_path, {}) == [
        "search/m.py:2: tangled has complexity 17 (> 15, radon's measure)",
        "search/m.py:9: Holder.method.inner has complexity 16 (> 15, radon's measure)"]
    debt = {"search/m.py:tangled": 17, "search/m.py:Holder.method.inner": 15, "search/gone.py:old": 20}
    assert complexity.findings(tmp_path, debt) == [
        "search/m.py:9: Holder.method.inner has complexity 16 (> 15, radon's measure, listed at 15)",
        f"search/gone.py:old: within the limit now: remove it from {complexity.DEBT.name}"]


def test_the_product_is_within_the_gate() -> None:
    assert complexity.findings() == []
