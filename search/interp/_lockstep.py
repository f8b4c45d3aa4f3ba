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
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import lru_cache

from ._syntax import _EXPRESSION_WORDS, _TG_ARRAY, _TG_ARRAY_MD, _TG_POINTER, _TG_ROW_POINTER, _TG_SCALAR

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


_BRACKET = re.compile(r"[()\[\]{}]")
_OPENS = {")": "(", "]": "[", "}": "{"}
_STATEMENT_STOP = re.compile(r"[;()\[\]{}]")
_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b")


class _Code:
    """Masked kernel text with its bracket pairs and line starts: every scan below is linear in the text (kernel
    sources may be megabytes; a quadratic pass would stall a search before the compiler's timeout applies)."""

    def __init__(self, text: str) -> None:
        self.text = mask(text)
        self.pairs: dict[int, int] = {}  # offset of ( [ { -> offset of its closing bracket
        stack: list[tuple[str, int]] = []
        for m in _BRACKET.finditer(self.text):
            c = m[0]
            if c in "([{":
                stack.append((c, m.start()))
                continue
            while stack and stack[-1][0] != _OPENS[c]:  # unbalanced text: drop what cannot close here
                stack.pop()
            if stack:
                self.pairs[stack.pop()[1]] = m.start()
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]

    def line(self, offset: int) -> int:
        """1-based line of ``offset``."""
        return bisect_right(self.line_starts, offset)

    def skip_space(self, pos: int) -> int:
        text = self.text
        while pos < len(text) and text[pos].isspace():
            pos += 1
        return pos

    def statement_end(self, pos: int) -> int | None:
        """Index of the ``;`` ending the statement that starts at ``pos`` (bracketed groups skipped)."""
        while (m := _STATEMENT_STOP.search(self.text, pos)) is not None:
            c = m[0]
            if c == ";":
                return m.start()
            if c in ")]}":
                return None
            close = self.pairs.get(m.start())
            if close is None:
                return None
            pos = close + 1
        return None


@dataclass(frozen=True)
class _Found:
    keyword: int
    kind: str
    header: tuple[int, int] | None  # the parenthesised header (for / while), offsets inside the parentheses
    body: tuple[int, int]  # body start, offset past its end
    braced: bool


def _body(code: _Code, pos: int) -> tuple[tuple[int, int], bool] | None:
    start = code.skip_space(pos)
    if code.text.startswith("{", start):
        close = code.pairs.get(start)
        return None if close is None else ((start, close + 1), True)
    end = code.statement_end(start)
    return None if end is None else ((start, end + 1), False)


_DO_WHILE = re.compile(r"\s*while\b")


def _find(code: _Code) -> list[_Found]:
    found: list[_Found] = []
    do_whiles: set[int] = set()
    text = code.text
    for m in _LOOP.finditer(text):
        kind, pos = m[1], m.start()
        if pos in do_whiles:
            continue
        if kind == "do":
            body = _body(code, m.end())
            w = _DO_WHILE.match(text, body[0][1]) if body is not None else None
            if body is None or w is None:
                continue
            do_whiles.add(w.end() - 5)
            paren = code.skip_space(w.end())
            close = code.pairs.get(paren) if text.startswith("(", paren) else None
            if close is None:
                continue
            found.append(_Found(pos, kind, None, (body[0][0], code.skip_space(close + 1) + 1), body[1]))
            continue
        paren = code.skip_space(m.end())
        close = code.pairs.get(paren) if text.startswith("(", paren) else None
        body = _body(code, close + 1) if close is not None else None
        if close is None or body is None:
            continue
        found.append(_Found(pos, kind, (paren + 1, close), body[0], body[1]))
    return found


def _loops(code: _Code, found: list[_Found]) -> list[Loop]:
    loops: list[Loop] = []
    open_loops: list[int] = []  # loops whose body the scan is inside, innermost last
    for i, f in enumerate(found):
        while open_loops and found[open_loops[-1]].body[1] <= f.keyword:
            open_loops.pop()
        parent = open_loops[-1] if open_loops and found[open_loops[-1]].body[1] >= f.body[1] else -1
        loops.append(Loop(code.line(f.keyword), code.line(f.body[1] - 1), parent, f.keyword, f.body[1]))
        open_loops.append(i)
    return loops


def find_loops(text: str) -> list[Loop]:
    """The loops of ``text`` (for, while, do), in the order of their keywords."""
    code = _Code(text)
    return _loops(code, _find(code))


def _top_level_semicolons(code: _Code, start: int, end: int) -> list[int]:
    out = []
    pos = start
    while (m := _STATEMENT_STOP.search(code.text, pos, end)) is not None:
        if m[0] == ";":
            out.append(m.start())
            pos = m.end()
        elif m[0] in "([{" and m.start() in code.pairs:
            pos = code.pairs[m.start()] + 1
        else:
            pos = m.end()
    return out


def instrument(text: str) -> tuple[str, list[Loop]]:
    """``text`` with an iteration counter in each loop (``ks::tick(ID)``; no line moves) and its loops."""
    code = _Code(text)
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
    return "".join(out), _loops(code, found)[:MAX_LOOPS]


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


def _classify(code: _Code, start: int, end: int) -> tuple[bool, bool]:
    """(may read, may write) for the use of a threadgroup name at ``code.text[start:end]``."""
    text = code.text
    before = text[max(0, start - 200):start].rstrip()
    if before.endswith(("++", "--")) or (before.endswith("&") and not before.endswith("&&")):
        return True, True
    if before.endswith("*") and not re.search(r"[\w)\]]\s*\*$", before):  # *p
        return True, True
    pos = end
    if not text.startswith("[", code.skip_space(pos)):
        call = re.search(r"\b(\w+)\s*\([^;()]*$", text[max(0, start - 200):start])
        if call is not None and call[1] == "simdgroup_load":
            return True, False
        return True, True  # passed on bare (a call, pointer arithmetic): it may be read and written through
    while (m := _MEMBERS.match(text, pos)) is not None:
        if m[0].strip() == "[":
            close = code.pairs.get(code.skip_space(pos))
            if close is None:
                break
            pos = close + 1
        else:
            pos = m.end()
    assigned = _ASSIGN.match(text, pos)
    if assigned is None:
        return True, False
    return assigned[0].strip() != "=", True


def _declarations(code: _Code) -> tuple[set[str], list[tuple[int, int]], set[int]]:
    """Threadgroup arrays, scalars and pointers declared in ``code``, the spans of pointer initialisers, in order
    (``threadgroup T* p = buf + k;`` makes an alias there, not an access), and the offsets of the declared names."""
    names: set[str] = set()
    inits: list[tuple[int, int]] = []
    declared: set[int] = set()
    text = code.text
    for pat in (_TG_ARRAY, _TG_ARRAY_MD, _TG_SCALAR, _TG_ROW_POINTER, _TG_POINTER):
        for m in pat.finditer(text):
            names.add(m[2])
            declared.add(m.start(2))
            eq = code.skip_space(m.end())
            if pat is _TG_POINTER and text.startswith("=", eq):
                end = code.statement_end(eq)
                inits.append((eq, end if end is not None else eq))
    return names, sorted(inits), declared


def _in_initialiser(inits: list[tuple[int, int]], starts: list[int], pos: int) -> bool:
    k = bisect_right(starts, pos) - 1
    return k >= 0 and pos < inits[k][1]


def _uses(code: _Code) -> list[_Use]:
    """Every use of a threadgroup name, in order, with whether it may read and write."""
    names, inits, declared = _declarations(code)
    starts = [a for a, _ in inits]
    text = code.text
    uses = []
    for m in _IDENTIFIER.finditer(text):
        if m[0] not in names or m.start() in declared or _in_initialiser(inits, starts, m.start()):
            continue
        before = text[max(0, m.start() - 64):m.start()].rstrip()
        if before.endswith((".", "->")):  # a member of something else
            continue
        word = _DECLARED_AFTER.search(before)
        indexed = text.startswith("[", code.skip_space(m.end()))
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
    code = _Code(text)
    uses = _uses(code)
    if not uses:
        return set()
    offsets = [u.offset for u in uses]

    def between(a: int, b: int) -> list[_Use]:  # the uses at offsets a < offset < b
        return uses[bisect_right(offsets, a):bisect_left(offsets, b)]

    splits = sorted([m.start() for m in _BARRIER.finditer(code.text)] +
                    [m.start() for m in _COLLECTIVE.finditer(code.text)])
    bounds = [-1, *splits, len(code.text) + 1]
    found: list[_Use] = []
    for a, b in zip(bounds, bounds[1:]):
        found += _conflicts(between(a, b))
    for f in _find(code):  # a loop with barriers in its body: its last stretch runs on into its first
        first, last = bisect_left(splits, f.body[0]), bisect_left(splits, f.body[1]) - 1
        if first <= last:
            found += _conflicts(between(f.body[0] - 1, splits[first]) + between(splits[last], f.body[1]))
    return {code.line(u.offset) for u in found}


@lru_cache(maxsize=256)
def needs_lockstep(header: str, source: str) -> bool:
    """Whether this kernel runs with its simdgroups in lockstep in fast mode (:func:`sync_lines` finds lines).
    Cached: a verification runs one kernel several times."""
    return bool(sync_lines(header + "\n" + source))
