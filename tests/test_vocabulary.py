"""Every word of the vocabulary (evidence kind, trial status, verifier, target, severity, consumer mode) is spelled
once, in ``kernsearch._vocabulary``: the product names it through the enum, never as a string literal.

The walk reads every string constant of ``search/`` and ``flows/`` (docstrings aside) and flags one equal to a word.
A constant in a role that is not a word of ours is not flagged: an attribute name (``getattr(mx, "cuda")``), a
record's field name (a dict key, a subscript, ``.get("ok")``). A few generic English words (``ok``, ``error``,
``failed``, ``interrupted``) also name other things; each such use is listed below with what it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kernsearch._vocabulary import ConsumerMode, Evidence, Memcheck, Severity, Target, TrialStatus, Verdict, Verifier

ROOT = Path(__file__).resolve().parents[1]
WORDS = {str(w) for enum in (Evidence, TrialStatus, Verifier, Target, Severity, ConsumerMode, Verdict, Memcheck)
         for w in enum}

#: (file, word): the same letters naming something else, said here so a new one is a decision, not a slip.
OTHER_MEANINGS = {
    ("search/artifacts/_repair.py", "ok"): "`artifacts verify`'s line for an intact version",
    ("search/cli.py", "interrupted"): "the one-line message of a Ctrl-C",
    ("search/evaluation/_worker.py", "error"): "a variant's failure reason when it raised an unexpected exception",
    ("search/interp/_compile.py", "error"): "a search in the C compiler's stderr",
    ("search/interp/_source.py", "device"): "Metal's device address space",
    ("search/studies/_storage.py", "ok"): "SQLite's answer to `PRAGMA quick_check`",
    ("search/studies/_result.py", "interrupted"): "StopReason.INTERRUPTED, why a search ended",
    ("flows/_steps.py", "error"): "a step's failure reason when its result names none",
    ("flows/_report.py", "failed"): "a nightly job's outcome (Outcome.FAILED) and the export's (ExportStatus.FAILED)",
}


def _not_words(tree: ast.AST) -> set[int]:
    """Constants in roles that are not words: docstrings, attribute names, field names."""
    out: set[int] = set()
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            out.add(id(body[0].value))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr", "setattr") \
                and len(n.args) > 1:
            out.add(id(n.args[1]))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("get", "pop") and n.args:
            out.add(id(n.args[0]))
        if isinstance(n, ast.Dict):
            out.update(id(k) for k in n.keys if k is not None)
        if isinstance(n, ast.Subscript):
            out.add(id(n.slice))
    return out


def spelled_words(source: str) -> list[tuple[int, str]]:
    """(line, word) of every vocabulary word written as a string literal in ``source``."""
    tree = ast.parse(source)
    skip = _not_words(tree)
    return sorted((n.lineno, n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in WORDS
                  and id(n) not in skip)


def test_the_walk_finds_a_spelled_word_and_skips_other_roles() -> None:
    found = spelled_words('''
def f(m, r):
    """measured"""
    if m.evidence == "measured" or r.get("modeled") or r["cuda"] or getattr(m, "metal", None):
        return {"ok": Evidence.MEASURED, "status": "not_winning"}
''')
    assert found == [(4, "measured"), (5, "not_winning")]


def test_no_word_of_the_vocabulary_is_spelled_outside_it() -> None:
    found, used = [], set()
    for folder in ("search", "flows"):
        for file in sorted((ROOT / folder).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            if rel == "search/_vocabulary.py":
                continue
            for line, word in spelled_words(file.read_text(encoding="utf-8")):
                if (rel, word) in OTHER_MEANINGS:
                    used.add((rel, word))
                else:
                    found.append(f"{rel}:{line}: {word!r}")
    assert not found, "vocabulary words spelled as literals (name them through kernsearch._vocabulary): " + \
        ", ".join(found)
    assert used == set(OTHER_MEANINGS), f"stale exceptions: {set(OTHER_MEANINGS) - used}"


def test_the_literal_types_say_the_enums_words() -> None:
    """Validated models (specs, manifests) need ``Literal`` types; each says exactly its enum's words."""
    from typing import get_args

    from kernsearch._vocabulary import CONSUMER_MODES, ConsumerModeName, TargetName

    assert get_args(ConsumerModeName) == tuple(str(m) for m in ConsumerMode)
    assert CONSUMER_MODES == get_args(ConsumerModeName)[:2]  # always timed; batch only where a family declares it
    assert get_args(TargetName) == tuple(str(t) for t in Target)
