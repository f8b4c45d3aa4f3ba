"""Lockstep simdgroups: what the translator adds so the lanes of a simdgroup access threadgroup memory together.

On Apple GPUs the 32 threads of a simdgroup execute each instruction together, so a reduction tree across
lanes with no barrier, a shared slot reset right after every lane read it, or a scan's up-sweep followed by a
write give the right answer there (MSL leaves them undefined). The interpreter's lockstep builds (check mode,
and fast mode for kernels that may rely on it) make the threadgroup accesses on the lines :func:`sync_lines`
finds synchronisation points between the lanes of a simdgroup (``ks::step`` in the shim). To compare where two
lanes stand across loops, each loop of the kernel gets an iteration counter (``ks::tick(ID)`` in its condition)
and a line span.

:func:`needs_lockstep` decides, from the text, whether a kernel may pass threadgroup memory between lanes of a
simdgroup without a barrier; only those run in lockstep in fast mode (the others keep the cheaper one-thread-
after-another schedule, whose results are the same for them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from ._syntax import _TG_ARRAY, _TG_ARRAY_MD, _TG_POINTER, _TG_ROW_POINTER, _TG_SCALAR

#: Loops beyond this many have no iteration counter (ks_shim.h: KS_MAX_LOOPS).
MAX_LOOPS = 64

_MASKED = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|//[^\n]*|/\*.*?\*/|^[ \t]*#(?:[^\n]*\\\n)*[^\n]*',
                     re.S | re.M)
_LOOP = re.compile(r"\b(for|while|do)\b")
_BARRIER = re.compile(r"\b(?:threadgroup_barrier|simdgroup_barrier)\s*\(")
#: Calls every lane of a simdgroup completes together (the shim's collectives).
_COLLECTIVE = re.compile(r"\b(?:simd_(?!active_threads_mask)\w+|quad_\w+|simdgroup_multiply(?:_accumulate)?)\s*\(")
_ASSIGN = re.compile(r"\s*(?:(?:<<|>>|[-+*/%&|^])?=(?!=)|\+\+|--)")
_MEMBERS = re.compile(r"(?:\s*\.\s*\w+|\s*\[)")
#: A type before a name (`float* p`, `const uint& n`): the name is declared there, not used.
_DECLARED_AFTER = re.compile(r"\b(\w+)\s*[*&]?$")
_EXPRESSION_WORDS = frozenset({"return", "else", "do", "case", "sizeof", "throw", "co_return"})
#: `device const float* p` / `(const float* p`: a pointer declared (a parameter or a local), not `y * p`.
_POINTER_DECLARATION = re.compile(r"(?:^|[(,;{}]|\b(?:const|device|constant|thread|threadgroup))\s*(?:const\s+)?"
                                  r"(?:device\s+|constant\s+|thread\s+)?(?:const\s+)?[A-Za-z_][\w:]*(?:<[^<>;]*>)?\s*\*$")


@dataclass(frozen=True)
class Loop:
    """One loop of the kernel text: the lines it spans and the loop it is nested in."""

    start: int  # line of its keyword (1-based)
    end: int  # line where its body ends
    parent: int  # index of the enclosing loop, -1 when none
    keyword: int  # offset of the keyword
    body_end: int  # offset just past the body


def mask(text: str) -> str:
    """``text`` with strings, character literals, comments and preprocessor lines blanked (same length, same lines)."""
    return _MASKED.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)


def _match(code: str, pos: int, open_: str, close: str) -> int | None:
    """Index of the bracket closing the one at ``code[pos]``."""
    depth = 0
    for k in range(pos, len(code)):
        if code[k] == open_:
            depth += 1
        elif code[k] == close:
            depth -= 1
            if depth == 0:
                return k
    return None


def _statement_end(code: str, pos: int) -> int | None:
    """Index of the ``;`` ending the statement that starts at ``pos`` (brackets balanced)."""
    depth = 0
    for k in range(pos, len(code)):
        c = code[k]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif c == ";" and depth == 0:
            return k
    return None


def _skip_space(code: str, pos: int) -> int:
    while pos < len(code) and code[pos].isspace():
        pos += 1
    return pos


@dataclass(frozen=True)
class _Found:
    keyword: int
    kind: str
    header: tuple[int, int] | None  # the parenthesised header (for / while), offsets inside the parentheses
    body: tuple[int, int]  # body start, offset past its end
    braced: bool


def _body(code: str, pos: int) -> tuple[tuple[int, int], bool] | None:
    start = _skip_space(code, pos)
    if code.startswith("{", start):
        close = _match(code, start, "{", "}")
        return None if close is None else ((start, close + 1), True)
    end = _statement_end(code, start)
    return None if end is None else ((start, end + 1), False)


def _find(code: str) -> list[_Found]:
    found: list[_Found] = []
    do_whiles: set[int] = set()
    for m in _LOOP.finditer(code):
        kind, pos = m[1], m.start()
        if pos in do_whiles:
            continue
        if kind == "do":
            body = _body(code, m.end())
            if body is None:
                continue
            w = re.compile(r"\s*while\b").match(code, body[0][1])
            if w is None:
                continue
            do_whiles.add(w.end() - 5)
            paren = _skip_space(code, w.end())
            close = _match(code, paren, "(", ")") if code.startswith("(", paren) else None
            if close is None:
                continue
            semi = _skip_space(code, close + 1)
            found.append(_Found(pos, kind, None, (body[0][0], semi + 1), body[1]))
            continue
        paren = _skip_space(code, m.end())
        if not code.startswith("(", paren):
            continue
        close = _match(code, paren, "(", ")")
        if close is None:
            continue
        body = _body(code, close + 1)
        if body is None:
            continue
        found.append(_Found(pos, kind, (paren + 1, close), body[0], body[1]))
    return found


def find_loops(text: str) -> list[Loop]:
    """The loops of ``text`` (for, while, do), in the order of their keywords."""
    code = mask(text)
    found = _find(code)
    loops: list[Loop] = []
    for i, f in enumerate(found):
        parent = -1
        for j in range(i - 1, -1, -1):
            if found[j].body[1] >= f.body[1] and found[j].keyword < f.keyword:
                parent = j
                break
        loops.append(Loop(code.count("\n", 0, f.keyword) + 1, code.count("\n", 0, f.body[1] - 1) + 1, parent,
                          f.keyword, f.body[1]))
    return loops


def _top_level_semicolons(code: str, start: int, end: int) -> list[int]:
    depth, out = 0, []
    for k in range(start, end):
        c = code[k]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == ";" and depth == 0:
            out.append(k)
    return out


def instrument(text: str) -> tuple[str, list[Loop]]:
    """``text`` with an iteration counter in each loop (``ks::tick(ID)``; no line moves) and its loops."""
    code = mask(text)
    found = _find(code)
    inserts: list[tuple[int, int, str]] = []  # (start, end, replacement)
    for i, f in enumerate(found[:MAX_LOOPS]):
        tick = f"ks::tick({i})"
        if f.kind == "while" and f.header is not None:
            a, b = f.header
            inserts.append((a, b, f"{tick} && ({text[a:b]})"))
            continue
        semis = _top_level_semicolons(code, *f.header) if f.header is not None else []
        if f.kind == "for" and len(semis) == 2:
            a, b = semis[0] + 1, semis[1]
            cond = text[a:b]
            inserts.append((a, b, f" {tick} && ({cond})" if cond.strip() else f" {tick}"))
        elif f.braced:  # do { } while, range-for: the counter steps at the top of the body
            a = f.body[0] + 1
            inserts.append((a, a, f" {tick};"))
    out, pos = [], 0
    for a, b, rep in sorted(inserts):
        out.append(text[pos:a])
        out.append(rep)
        pos = b
    out.append(text[pos:])
    return "".join(out), find_loops(text)[:MAX_LOOPS]


def loop_tables(loops: list[Loop], lines: int, sync: set[int]) -> str:
    """The C++ definitions the shim reads: each loop's span and parent (ks_loop_info), each line's innermost loop
    (ks_line_loop) and whether its threadgroup accesses synchronise the lanes of a simdgroup (ks_sync_line)."""
    per_line = [-1] * (lines + 2)
    depth = [0] * len(loops)
    for i, lp in enumerate(loops):
        depth[i] = depth[lp.parent] + 1 if 0 <= lp.parent < i else 0
    for i in sorted(range(len(loops)), key=lambda k: depth[k]):
        for line in range(loops[i].start, min(loops[i].end, lines + 1) + 1):
            per_line[line] = i
    marks = ", ".join("1" if k in sync else "0" for k in range(len(per_line)))
    info = ", ".join(f"{{{lp.start}, {lp.end}, {lp.parent if 0 <= lp.parent < len(loops) else -1}}}" for lp in loops)
    return (f"extern const ks::LoopInfo ks_loop_info[] = {{{info}{', ' if info else ''}{{0, 0, -1}}}};\n"
            f"extern const int ks_loop_count = {len(loops)};\n"
            f"extern const int16_t ks_line_loop[] = {{{', '.join(map(str, per_line))}}};\n"
            f"extern const int ks_line_count = {len(per_line)};\n"
            f"extern const uint8_t ks_sync_line[] = {{{marks}}};\n")


# -- the fast-mode decision ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Use:
    offset: int
    name: str
    reads: bool
    writes: bool


def _classify(code: str, start: int, end: int) -> tuple[bool, bool]:
    """(may read, may write) for the use of a threadgroup name at ``code[start:end]``."""
    before = code[max(0, start - 200):start].rstrip()
    if before.endswith(("++", "--")) or (before.endswith("&") and not before.endswith("&&")):
        return True, True
    if before.endswith("*") and not re.search(r"[\w)\]]\s*\*$", before):  # *p
        return True, True
    pos = end
    if not code.startswith("[", _skip_space(code, pos)):
        call = re.search(r"\b(\w+)\s*\([^;()]*$", code[max(0, start - 200):start])
        if call is not None and call[1] == "simdgroup_load":
            return True, False
        return True, True  # passed on bare (a call, pointer arithmetic): it may be read and written through
    while (m := _MEMBERS.match(code, pos)) is not None:
        if m[0].strip() == "[":
            close = _match(code, _skip_space(code, pos), "[", "]")
            if close is None:
                break
            pos = close + 1
        else:
            pos = m.end()
    assigned = _ASSIGN.match(code, pos)
    if assigned is None:
        return True, False
    return assigned[0].strip() != "=", True


def _declarations(code: str) -> tuple[set[str], list[tuple[int, int]], set[int]]:
    """Threadgroup arrays, scalars and pointers declared in ``code``, the spans of pointer initialisers
    (``threadgroup T* p = buf + k;`` makes an alias there, not an access) and the offsets of the declared names."""
    names: set[str] = set()
    inits: list[tuple[int, int]] = []
    declared: set[int] = set()
    for pat, group in ((_TG_ARRAY, 2), (_TG_ARRAY_MD, 2), (_TG_SCALAR, 2), (_TG_ROW_POINTER, 2), (_TG_POINTER, 2)):
        for m in pat.finditer(code):
            names.add(m[group])
            declared.add(m.start(group))
            eq = _skip_space(code, m.end())
            if pat is _TG_POINTER and code.startswith("=", eq):
                end = _statement_end(code, eq)
                inits.append((eq, end if end is not None else eq))
    return names, inits, declared


def _uses(code: str) -> list[_Use]:
    names, inits, declared = _declarations(code)
    if not names:
        return []
    find = re.compile(rf"\b(?:{'|'.join(map(re.escape, sorted(names)))})\b")
    uses = []
    for m in find.finditer(code):
        if m.start() in declared or any(a <= m.start() < b for a, b in inits):
            continue
        before = code[max(0, m.start() - 64):m.start()].rstrip()
        if before.endswith((".", "->")):  # a member of something else
            continue
        word = _DECLARED_AFTER.search(before)
        indexed = code.startswith("[", _skip_space(code, m.end()))
        if word is not None and word[1] not in _EXPRESSION_WORDS and not indexed and not word[0].endswith("*"):
            continue  # `float p` / `float& p`: another variable of that name
        if word is not None and word[0].endswith("*") and _POINTER_DECLARATION.search(before):  # `const float* p`
            continue
        uses.append(_Use(m.start(), m[0], *_classify(code, m.start(), m.end())))
    return uses


def _conflicts(uses: list[_Use]) -> list[_Use]:
    """The uses of each array used twice in ``uses``, once reading it and once writing it: lanes may pass a value
    through it. (Two plain writes are not counted: which lane's write lands differs between schedules only where
    lanes overlap.)"""
    by_name: dict[str, list[_Use]] = {}
    for u in uses:
        by_name.setdefault(u.name, []).append(u)
    return [u for us in by_name.values() if len(us) >= 2 and any(u.reads for u in us) and any(u.writes for u in us)
            for u in us]


def sync_lines(text: str) -> set[int]:
    """Lines (1-based) of ``text`` whose threadgroup accesses must run in lockstep: those of a threadgroup array,
    scalar or pointer that some stretch of the kernel between two barriers (or simd collectives, which the lanes of
    a simdgroup complete together) uses twice, once writing it. Each name counts alone: values passed between lanes
    through two different pointers into one array are not found here (check mode finds them as it runs)."""
    code = mask(text)
    uses = _uses(code)
    if not uses:
        return set()
    splits = sorted([m.start() for m in _BARRIER.finditer(code)] + [m.start() for m in _COLLECTIVE.finditer(code)])
    bounds = [-1, *splits, len(code) + 1]
    found: list[_Use] = []
    for a, b in zip(bounds, bounds[1:]):
        found += _conflicts([u for u in uses if a < u.offset < b])
    for f in _find(code):  # a loop with barriers in its body: its last stretch runs on into its first
        inside = [s for s in splits if f.body[0] <= s < f.body[1]]
        if inside:
            found += _conflicts([u for u in uses
                                 if f.body[0] <= u.offset < inside[0] or inside[-1] < u.offset < f.body[1]])
    return {code.count("\n", 0, u.offset) + 1 for u in found}


@lru_cache(maxsize=256)
def needs_lockstep(header: str, source: str) -> bool:
    """Whether this kernel runs with its simdgroups in lockstep in fast mode (:func:`sync_lines` finds lines).
    Cached: a verification runs one kernel several times."""
    return bool(sync_lines(header + "\n" + source))
