"""Spec composition: ``extends = "qmatvec"`` makes a family spec another family's plus its own changes.

A fused family (``rmsnorm_qmatvec``) is a matrix-vector family with a prologue; copying the base spec's knobs,
constraints and model terms would make two specs to keep in step. ``extends`` names a built-in family whose
``family.toml`` is read (bounded, no links) and merged under this one, before validation:

- tables merge key by key, recursively (``[knobs]``, ``[derived]``, ``[model]``, ``[tolerance.float16]``...),
  but for ``[templates]``, replaced whole (template names are the extending folder's own files: it names each
  template it has, usually a few lines importing the shared library's core);
- the arrays of named tables (``[[inputs]]``, ``[[outputs]]``, ``[[constraints]]``) merge by ``name``: an entry
  naming a base entry is merged key by key into it, in place; a new name is appended, in the order given;
- any other value (a string, a number, a plain list such as ``dims`` or ``default_shape``) is replaced;
- the extending spec wins every conflict; it must give its own ``name``. A base may extend another (at most
  :data:`MAX_DEPTH` levels); a cycle, an unknown family or a malformed ``extends`` is an error.

Order follows the derived table's rule: a derived value the extending spec overrides keeps its place (later
values may read it), new ones come after the base's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import SpecError

#: Tables replaced whole, not merged (file names inside the extending folder).
REPLACED = ("templates",)
#: The arrays of tables merged entry by entry, by their ``name``.
NAMED_ARRAYS = ("inputs", "outputs", "constraints")
#: How many specs a chain of ``extends`` may hold (the spec itself included).
MAX_DEPTH = 8


def merge(base: dict[str, Any], over: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``over`` merged onto ``base`` by the rules above (neither is modified)."""
    out = dict(base)
    for key, value in over.items():
        old = out.get(key)
        if isinstance(old, dict) and isinstance(value, dict) and (path or key not in REPLACED):
            out[key] = merge(old, value, f"{path}{key}.")
        elif not path and key in NAMED_ARRAYS and isinstance(old, list) and _named(old) and _named(value):
            out[key] = _merge_named(old, value)
        else:
            out[key] = value
    return out


def _named(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in value)


def _merge_named(base: list[dict[str, Any]], over: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = list(base)
    index = {entry["name"]: i for i, entry in enumerate(out)}
    for entry in over:
        if entry["name"] in index:
            out[index[entry["name"]]] = merge(out[index[entry["name"]]], entry, "entry.")
        else:
            index[entry["name"]] = len(out)
            out.append(entry)
    return out


def extended(data: dict[str, Any], source: Path | str, read_base: Callable[[str], tuple[dict[str, Any], Path]],
             is_name: Callable[[str], bool]) -> tuple[dict[str, Any], list[Path]]:
    """``data`` with its chain of bases merged in, and the base specs' files (nearest first).

    ``read_base(name)`` gives a base's spec table and file (or raises :class:`SpecError` for an unknown name);
    ``is_name`` tells a family name. Without ``extends`` the table is returned as it is."""
    if "extends" not in data:
        return data, []
    if "name" not in data:
        raise SpecError(f"{source}: a spec that extends another must give its own name")
    chain: list[tuple[dict[str, Any], Path | str]] = [(data, source)]
    names, files = [str(data["name"])[:48]], {str(Path(source).resolve())}
    while "extends" in chain[-1][0]:
        table, where = chain[-1]
        base = table["extends"]
        if not isinstance(base, str) or not is_name(base):
            raise SpecError(f"{where}: extends: {str(base)[:60]!r} is not a family name (give a built-in family's "
                            "name, e.g. extends = \"qmatvec\")")
        if len(chain) >= MAX_DEPTH:
            raise SpecError(f"{source}: extends: more than {MAX_DEPTH} specs in a chain")
        names.append(base)
        table, where = read_base(base)
        if str(Path(where).resolve()) in files:
            raise SpecError(f"{source}: extends: a cycle ({' -> '.join(names)})")
        files.add(str(Path(where).resolve()))
        chain.append((table, where))
    merged: dict[str, Any] = {}
    for table, _ in reversed(chain):
        merged = merge(merged, {k: v for k, v in table.items() if k != "extends"})
    return merged, [Path(where) for _, where in chain[1:]]
