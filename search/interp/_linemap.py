"""Which template line produced each rendered line (for diagnostics that name the template file:line).

The template is rendered a second time with an invisible marker at the end of every plain template
line (lines with no ``{% %}`` / ``{# #}`` tag and no ``-}}`` / ``{{-``, so whitespace control is
unchanged); a rendered line carries the markers of the template lines it came from. If the marked
rendering, markers removed, differs from the real one, no mapping is returned rather than a wrong one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from .._vocabulary import Target

_MARK = "\x02{}\x03"
_MARK_RE = re.compile("\x02(\\d+)\x03")


@dataclass(frozen=True)
class TemplateLines:
    """Template file and, per 1-based rendered line, its template line, for header and source."""

    file: str
    header: dict[int, int] = field(default_factory=dict)
    source: dict[int, int] = field(default_factory=dict)


def _mark(text: str) -> str:
    out = []
    in_comment = False
    for i, line in enumerate(text.split("\n"), start=1):
        plain = not in_comment and not any(t in line for t in ("{%", "%}", "{#", "#}", "-}}", "{{-"))
        if "{#" in line and "#}" not in line[line.index("{#"):]:
            in_comment = True
        elif in_comment and "#}" in line:
            in_comment = False
        out.append(line + _MARK.format(i) if plain and line.strip() else line)
    return "\n".join(out)


def _lines(marked: str) -> tuple[str, dict[int, int]]:
    mapping: dict[int, int] = {}
    clean = []
    for n, line in enumerate(marked.split("\n"), start=1):
        marks = _MARK_RE.findall(line)
        if marks:
            mapping[n] = int(marks[0])
        clean.append(_MARK_RE.sub("", line))
    return "\n".join(clean), mapping


def template_lines(family: Any, config: dict[str, Any], dtype: str,
                   target: str = Target.METAL) -> TemplateLines | None:
    """The line mapping of ``render(family, config, dtype, target)``, or None when it cannot be made."""
    from .._safeio import read_text
    from ..family._render import render, render_blocks, render_context
    from ..family._spec import template_env

    try:
        kernel = render(family, config, dtype, target)
        filename = family.templates[target]
        path = family.path / filename
        tmpl = template_env(family.path).from_string(_mark(read_text(path)))
        header, source = render_blocks(tmpl, render_context(family, config, dtype))
    except Exception:  # noqa: BLE001 - a missing mapping only makes diagnostics less precise
        return None
    clean_header, clean_source = _MARK_RE.sub("", header), _MARK_RE.sub("", source)
    if clean_header.strip("\n") + "\n" != kernel.header or clean_source.rstrip() + "\n" != kernel.source:
        return None
    lead = len(clean_header) - len(clean_header.lstrip("\n"))  # leading newlines the real render strips
    header_map = {n - lead: t for n, t in _lines(header)[1].items() if n > lead}
    source_map = _lines(source)[1]
    return TemplateLines(filename, header_map, source_map)
