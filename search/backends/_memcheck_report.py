"""NVIDIA memcheck's report (``compute-sanitizer --tool memcheck``) read as typed findings.

The tool prints its lines prefixed ``=========`` among the application's own output: an error starts at a line
of the prefix and one space (``Invalid __global__ read of size 2 bytes``), its details follow indented (``at
custom_kernel_gemv_...+0x2d0``, ``by thread (64,0,0) in block (1023,0,0)``, ``Address 0x... is out of bounds``,
``and is 249 bytes after the nearest allocation at 0x... of size 33,521,664 bytes``), and ``ERROR SUMMARY: N
errors`` ends the run. Only what is read here is trusted: a count of errors with nothing parsed is still an error
(never a silent pass). The child marks each launch (:data:`MARK`) so an error is told with the shape it ran at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The child's line before each launch: ``kernsearch-memcheck: launching at 3x4095x4092``.
MARK = "kernsearch-memcheck: launching at "
_PREFIX = "========="
_ACCESS = re.compile(r"^Invalid (__global__|__shared__|__local__|__generic__)?\s*(read|write|atomic)\w*"
                     r"(?: of size ([\d,]+)(?: bytes?)?)?", re.IGNORECASE)
_HARDWARE = re.compile(r"^(?:Warp |Lane )?(Illegal Address|Out-of-range [\w ]*Address|Misaligned [\w ]*Address|"
                       r"Illegal Instruction|Invalid PC|Hardware Stack Overflow|Misaligned PC)", re.IGNORECASE)
_WHERE = re.compile(r"^at (?:0x[0-9a-f]+ in )?(.+?)(?:\+0x[0-9a-f]+)?$", re.IGNORECASE)
_ADDRESS = re.compile(r"^Address (0x[0-9a-f]+) is (out of bounds|misaligned)", re.IGNORECASE)
_NEAREST = re.compile(r"^and is ([\d,]+) bytes (after|before) the nearest allocation at (0x[0-9a-f]+) of size "
                      r"([\d,]+) bytes", re.IGNORECASE)
_SUMMARY = re.compile(r"^ERROR SUMMARY: ([\d,]+) errors?", re.IGNORECASE)
#: Top-level lines that are the tool talking about itself, not an error of a kernel.
_TOOL = re.compile(r"^(Error: |Target application returned an error|COMPUTE-SANITIZER|LEAK SUMMARY|Program hit )",
                   re.IGNORECASE)
#: The kind of an error whose first line is none of the above (its line says what it is).
_OTHER = "memory error"
_SPACES = {"__global__": "", "__shared__": " of shared memory", "__local__": " of local memory",
           "__generic__": ""}


@dataclass(frozen=True)
class Finding:
    """One error of the report: ``kind`` (``out-of-bounds read``, ``misaligned write``, ``illegal address``...),
    the report's first line of it, the kernel it names, where past an allocation it landed, and the launch's shape
    (the child's last :data:`MARK` before it)."""

    kind: str
    line: str
    function: str = ""
    thread: str = ""
    beyond: str = ""  # "249 bytes after the nearest allocation of size 33521664 bytes"
    allocation_bytes: int | None = None
    shape: str = ""

    def text(self, buffer: str = "") -> str:
        """``out-of-bounds read of W (1016 bytes after the nearest allocation of size ... bytes; Invalid __global__
        read of size 8 bytes, thread (96,0,0) in block (1023,0,0), in custom_kernel_gemv_...) at 3x4095x4092``:
        the kind and the buffer first (a FAIL line is cut at 300 characters)."""
        function = re.sub(r"\(.*\)$", "", self.function).rsplit("::", 1)[-1][:100]
        parts = [p for p in (self.beyond, self.line, self.thread, f"in {function}" if function else "") if p]
        return f"{self.kind}{f' of {buffer}' if buffer else ''} ({', '.join(parts)})" + \
            (f" at {self.shape}" if self.shape else "")


@dataclass(frozen=True)
class Report:
    """What a memcheck run said: its findings (in order), the error count of its summary (None: no summary line:
    the run did not end), and the tool's own complaint (``Error: ...``), if any."""

    findings: tuple[Finding, ...] = ()
    errors: int | None = None
    tool_error: str = ""
    last_line: str = ""  # the application's last line of output (a crash's last words)


def parse(text: str, limit: int = 64) -> Report:
    """The findings of a report (at most ``limit``), its summary count and the tool's own error line."""
    findings: list[Finding] = []
    shape, errors, tool_error, last = "", None, "", ""
    current: dict[str, object] | None = None
    for raw in text.splitlines():
        if raw.startswith(MARK):
            shape = raw[len(MARK):].strip()[:80]
            continue
        if not raw.startswith(_PREFIX):
            last = raw.strip()[:300] or last
            continue
        body = raw[len(_PREFIX):]
        line = body.strip()
        if not line:
            continue
        if not body.startswith("  "):  # a top-level line: a new error, the summary, or the tool itself
            if current is not None:
                findings.append(_finding(current))
                current = None
            if (m := _SUMMARY.match(line)) is not None:
                errors = int(m.group(1).replace(",", ""))
            elif line.lower().startswith("error: ") and not tool_error:
                tool_error = line[:300]
            elif not _TOOL.match(line) and len(findings) < limit:
                current = {"line": line[:200], "shape": shape, **_head(line)}
            continue
        if current is not None:
            current.update(_detail(line))
    if current is not None:
        findings.append(_finding(current))
    return Report(tuple(findings[:limit]), errors, tool_error, last)


def _head(line: str) -> dict[str, object]:
    """What an error's first line says of its kind."""
    if (m := _ACCESS.match(line)) is not None:
        space, access = (m.group(1) or "").lower(), m.group(2).lower()
        return {"access": access, "space": _SPACES.get(space, "")}
    if (m := _HARDWARE.match(line)) is not None:
        return {"kind": m.group(1).lower()}
    return {"kind": _OTHER}


def _detail(line: str) -> dict[str, object]:
    """What one indented line of an error adds (nothing for backtraces)."""
    if (m := _ADDRESS.match(line)) is not None:
        return {"address": m.group(2).lower()}
    if (m := _NEAREST.match(line)) is not None:
        size = int(m.group(4).replace(",", ""))
        return {"beyond": f"{m.group(1).replace(',', '')} bytes {m.group(2)} the nearest allocation of size "
                          f"{size} bytes", "allocation_bytes": size}
    if line.lower().startswith("by thread"):
        return {"thread": line[3:][:80]}
    if line.lower().startswith("at ") and (m := _WHERE.match(line)) is not None:
        return {"function": m.group(1).strip()}
    return {}


def _finding(data: dict[str, object]) -> Finding:
    kind = str(data.get("kind", ""))
    if "access" in data:
        state = "misaligned" if data.get("address") == "misaligned" else "out-of-bounds"
        kind = f"{state} {data['access']}{data.get('space', '')}"
    size = data.get("allocation_bytes")
    return Finding(kind or _OTHER, str(data["line"]), str(data.get("function", "")), str(data.get("thread", "")),
                   str(data.get("beyond", "")), size if isinstance(size, int) else None, str(data.get("shape", "")))
