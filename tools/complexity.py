"""The complexity gate of `make lint`: every function of the product (``search/``, ``flows/``) at most 15 by
radon's measure, which counts each extra operand of ``and``/``or`` and each comprehension's loops and filters
(ruff's mccabe check, which the lint also runs, counts neither). Closures and methods are measured on their own.

The functions above the limit when the gate came in are listed with their score in ``complexity_debt.txt``: the
list only shrinks (a listed function may not grow, and one brought within the limit must leave the list); any
other function above the limit fails the gate.

    python tools/complexity.py     # one line per finding; exit 1 if any
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from radon.visitors import Class, ComplexityVisitor, Function

LIMIT = 15
REPO = Path(__file__).resolve().parents[1]
ROOTS = ("search", "flows")
DEBT = Path(__file__).with_name("complexity_debt.txt")


def _blocks(blocks: Iterable[Function | Class], owner: str = "") -> Iterator[tuple[str, int, int]]:
    """(qualified name, line, complexity) of every function, method and closure below ``blocks``."""
    for block in blocks:
        name = f"{owner}{block.name}"
        if isinstance(block, Class):
            yield from _blocks([*block.methods, *block.inner_classes], f"{name}.")
        else:
            yield name, block.lineno, block.complexity
            yield from _blocks(block.closures, f"{name}.")


def over_limit(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """The functions of ``source`` more complex than ``limit``: (qualified name, line, complexity)."""
    top = ComplexityVisitor.from_code(source)
    return [b for b in _blocks([*top.functions, *top.classes]) if b[2] > limit]


def findings(repo: Path = REPO, debt: dict[str, int] | None = None) -> list[str]:
    """What fails the gate: a function over the limit that is not listed, or listed with a lower score; a listed
    function now within the limit (or gone), which must leave the list."""
    debt = read_debt() if debt is None else debt
    out, seen = [], set()
    for file in sorted(f for root in ROOTS for f in (repo / root).rglob("*.py")):
        path = file.relative_to(repo).as_posix()
        for name, line, score in over_limit(file.read_text(encoding="utf-8")):
            key = f"{path}:{name}"
            seen.add(key)
            if score > debt.get(key, LIMIT):
                listed = f", listed at {debt[key]}" if key in debt else ""
                out.append(f"{path}:{line}: {name} has complexity {score} (> {LIMIT}, radon's measure{listed})")
    out += [f"{key}: within the limit now: remove it from {DEBT.name}" for key in sorted(set(debt) - seen)]
    return out


def read_debt() -> dict[str, int]:
    """``complexity_debt.txt``: ``path:qualified.name score`` a line."""
    lines = [line.split() for line in DEBT.read_text(encoding="utf-8").splitlines()]
    return {words[0]: int(words[1]) for words in lines if words and not words[0].startswith("#")}


if __name__ == "__main__":
    found = findings()
    print("\n".join(found) if found else f"complexity: every function of {', '.join(ROOTS)} is within the gate")
    sys.exit(1 if found else 0)
