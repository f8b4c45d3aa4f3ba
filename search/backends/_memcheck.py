"""A CUDA winner's verification launches under NVIDIA's memcheck (``compute-sanitizer --tool memcheck``).

A GPU reports no read outside a buffer, and the guard zones (:mod:`._guard`) see only writes: a kernel that reads a
row past an input's end at a ragged shape passes every device check. Before a CUDA winner is published its
verification launches (the ragged shape's, the tuned shape's) run once more in a child process under memcheck,
which reports every access outside an allocation. Off the timing path: the final round only, for the winner.

The child (``python -m kernsearch.backends._memcheck_child JOB SHA256``) reads a small typed job (:class:`Job`)
that this process wrote into a private temporary folder; it runs no code from it: it renders the family's kernel
again and refuses unless its hash is the one proven here (``SHA256`` on its command line). It places each input at
the end of its own allocation (MLX rounds allocations up to 16 KiB pages: a read a row past an input's end would
otherwise land inside the rounding, where memcheck sees nothing). The tool is found on ``PATH`` or in
:data:`TOOL_DIRS`; it runs with no shell, an environment of listed variables, a time limit, and at most
:data:`OUTPUT_BYTES` of its output read. The verdict is typed (:class:`MemcheckResult`): ``clean``, ``reported``
(the winner is refused, the line names the kind), ``not available`` or ``unfinished`` (said, never a pass).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from .._vocabulary import Dtype, Memcheck, TargetName
from ._memcheck_report import Report, parse

TOOL = "compute-sanitizer"
#: Where the tool is looked for after ``PATH`` (the CUDA toolkit's default place).
TOOL_DIRS: tuple[Path, ...] = (Path("/usr/local/cuda/bin"),)
#: The tool's exit status when it found an error (``--error-exitcode``).
ERROR_EXIT = 86
#: Bytes of padding memcheck puts after every CUDA allocation: a read past one allocation's end lands there, not in
#: the next allocation.
PADDING = 65536
#: At most this much of the tool's output is read (its head: the errors come first; ``--print-limit`` caps them).
OUTPUT_BYTES = 256 * 1024
#: The child's result file, beside its job, at most this big.
RESULT_BYTES = 64 * 1024
#: The environment variables the child gets (nothing else of this process's environment).
ENV_NAMES = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES",
             "CUDA_HOME", "CUDA_PATH", "VIRTUAL_ENV", "MLX_PTX_CACHE_DIR", "NVIDIA_VISIBLE_DEVICES")
CHILD = "kernsearch.backends._memcheck_child"
_SHAPE = re.compile(r"^\d{1,10}(x\d{1,10}){0,7}$")

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Dim = Annotated[int, Field(ge=1, le=1 << 31)]
Knob = bool | int | Annotated[str, StringConstraints(max_length=200)]


class Job(BaseModel):
    """What the child runs: one family's config (its folder, dtype, chip), the shapes to launch it at (each a
    verification launch with its inputs from ``seed``), and the hash its rendered source must have."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    family: Annotated[str, StringConstraints(min_length=1, max_length=4096)]
    target: TargetName
    dtype: Dtype
    chip: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    config: dict[Annotated[str, StringConstraints(max_length=100)], Knob] = Field(max_length=200)
    shapes: list[Annotated[list[Dim], Field(min_length=1, max_length=8)]] = Field(min_length=1, max_length=4)
    seed: int
    sha256: Sha256


class ChildResult(BaseModel):
    """What the child wrote back: the shapes it launched, each input's allocation size by ``NAME at SHAPE`` (to
    name the buffer of a report), a guard zone it saw changed, or why it stopped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    launched: list[Annotated[str, StringConstraints(max_length=80)]] = Field(default_factory=list, max_length=8)
    allocations: dict[Annotated[str, StringConstraints(max_length=100)], int] = Field(default_factory=dict,
                                                                                      max_length=64)
    guard: Annotated[str, StringConstraints(max_length=600)] = ""
    error: Annotated[str, StringConstraints(max_length=600)] = ""


@dataclass(frozen=True)
class MemcheckResult:
    """memcheck's verdict on a winner: its state (:class:`Memcheck`), and the detail: the kind and first line of a
    report, or why there is no verdict; ``shapes``: where it ran."""

    state: Memcheck
    detail: str = ""
    shapes: tuple[str, ...] = field(default_factory=tuple)
    at: str = ""  # the shape of the launch a reported error came from ('' where unknown)

    @property
    def refuses(self) -> bool:
        return self.state == Memcheck.REPORTED

    def text(self) -> str:
        """``memcheck: clean`` / ``memcheck: out-of-bounds read (...)`` / ``memcheck: not available (...)``."""
        where = f" at {', '.join(self.shapes)}" if self.shapes and self.state == Memcheck.CLEAN else ""
        if self.state == Memcheck.REPORTED:
            return f"memcheck: {self.detail}"
        return f"memcheck: {self.state}{where}" + (f" ({self.detail})" if self.detail else "")

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state.value, "detail": self.detail, "shapes": list(self.shapes), "at": self.at}

    @classmethod
    def from_dict(cls, data: object) -> MemcheckResult | None:
        """None when ``data`` is not a verdict (a storage is not trusted: fields bounded)."""
        if not isinstance(data, dict) or data.get("state") not in {m.value for m in Memcheck}:
            return None
        shapes, detail, at = data.get("shapes"), data.get("detail"), data.get("at")
        return cls(Memcheck(data["state"]), detail[:600] if isinstance(detail, str) else "",
                   tuple(str(s)[:80] for s in shapes[:8]) if isinstance(shapes, list) else (),
                   at[:80] if isinstance(at, str) and _SHAPE.match(at) else "")


def find_tool() -> Path | None:
    """compute-sanitizer on ``PATH``, else in :data:`TOOL_DIRS` (None: not here)."""
    found = shutil.which(TOOL)
    if found:
        return Path(found)
    for folder in TOOL_DIRS:
        path = folder / TOOL
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def child_env() -> dict[str, str]:
    """The child's whole environment: the listed variables of this one, and none other; ``PYTHONPATH`` led by the
    folder this kernsearch was imported from, where it is a plain folder (the child imports the same)."""
    env = {k: os.environ[k] for k in ENV_NAMES if k in os.environ}
    package = Path(__file__).resolve().parents[1]
    if package.name == "kernsearch":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package.parent), env.get("PYTHONPATH", "")) if p)
    return env


def command(tool: Path, job: Path, sha256: str) -> list[str]:
    """The tool's command line: memcheck, an exit status of its own when it finds an error, padding after every
    allocation, no API-error or backtrace noise, no limit on the child's start (importing MLX takes seconds; the
    time limit is this module's), then the child on this Python."""
    return [str(tool), "--tool", "memcheck", "--error-exitcode", str(ERROR_EXIT), "--padding", str(PADDING),
            "--report-api-errors", "no", "--show-backtrace", "no", "--print-limit", "20", "--launch-timeout", "0",
            sys.executable, "-m", CHILD, str(job), sha256]


def memcheck(job: Job, timeout: float) -> MemcheckResult:
    """Run ``job``'s launches under memcheck in a child (at most ``timeout`` seconds): its verdict."""
    shapes = tuple("x".join(map(str, s)) for s in job.shapes)
    tool = find_tool()
    if tool is None:
        where = ", ".join(str(d) for d in TOOL_DIRS)
        return MemcheckResult(Memcheck.NOT_AVAILABLE, f"{TOOL} not found on PATH or in {where}", shapes)
    with tempfile.TemporaryDirectory(prefix="kernsearch-memcheck-") as tmp:  # mode 0700: this user's only
        folder = Path(tmp)
        path = folder / "job.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(job.model_dump_json())
        rc, output = _run(command(tool, path, job.sha256), folder, timeout)
        if rc is None:
            return MemcheckResult(Memcheck.UNFINISHED, f"timed out after {timeout:.0f} s", shapes)
        return verdict(rc, parse(output), read_result(folder / "result.json"), shapes)


def _run(cmd: list[str], folder: Path, timeout: float) -> tuple[int | None, str]:
    """(exit status, the head of its output); None on a timeout, its whole process group killed."""
    out = folder / "output.txt"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                env=child_env(), cwd=folder, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
            _kill(proc)
    with open(out, "rb") as f:
        return rc, f.read(OUTPUT_BYTES).decode("utf-8", errors="replace")


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill the tool and the child it started (their own process group), and reap the tool."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def read_result(path: Path) -> ChildResult | None:
    """The child's result, None when it wrote none (or one that is not a result)."""
    try:
        with open(path, "rb") as f:
            data = f.read(RESULT_BYTES + 1)
        return None if len(data) > RESULT_BYTES else ChildResult.model_validate_json(data)
    except (OSError, ValueError):
        return None


def _reported(report: Report, result: ChildResult | None, shapes: tuple[str, ...]) -> MemcheckResult:
    """The first error the tool reported: its kind and line, the buffer named where its allocation's size is one
    of the child's at that shape."""
    first = report.findings[0]
    allocations = result.allocations if result else {}
    names = [n.partition(" at ")[0] for n, size in allocations.items()
             if size == first.allocation_bytes and n.partition(" at ")[2] in (first.shape, "")]
    more = f"; {len(report.findings) - 1} more" if len(report.findings) > 1 else ""
    at = first.shape if _SHAPE.match(first.shape) else ""
    text = first.text(" or ".join(names) if first.beyond else "")
    return MemcheckResult(Memcheck.REPORTED, f"{text}{more}"[:600], shapes, at)


def _unfinished_why(rc: int, report: Report, result: ChildResult | None, count: int) -> str | None:
    """Why the child gave no verdict (it did not launch every shape, or it or the tool failed), None if it did."""
    if result is not None and not result.error and len(result.launched) >= count:
        return None
    if result is not None and result.error:
        return result.error
    launched = len(result.launched) if result else 0
    last = f"; {report.last_line}" if report.last_line else ""
    return report.tool_error or f"the child launched {launched} of {count} shapes (exit status {rc}{last})"


def verdict(rc: int, report: Report, result: ChildResult | None, shapes: tuple[str, ...]) -> MemcheckResult:
    """The run's verdict: an error the tool reported refuses (its kind and first line, the buffer named where its
    allocation's size is the child's); a child that did not launch every shape, or a tool that failed, gives no
    verdict; an error count with nothing parsed still refuses (never a silent pass)."""
    if report.findings:
        return _reported(report, result, shapes)
    if result is not None and result.guard:
        return MemcheckResult(Memcheck.REPORTED, f"out-of-bounds write ({result.guard})"[:600], shapes)
    why = _unfinished_why(rc, report, result, len(shapes))
    if why is not None:
        return MemcheckResult(Memcheck.UNFINISHED, why[:600], shapes)
    if rc == ERROR_EXIT or (report.errors or 0) > 0:
        return MemcheckResult(Memcheck.REPORTED, f"error (memcheck counted {report.errors or 'some'} error(s), "
                                                 f"exit status {rc}; none could be read)", shapes)
    if rc != 0 or report.tool_error or report.errors is None:  # clean is said only by the tool's own summary
        why = report.tool_error or (f"exit status {rc}" if rc else "no ERROR SUMMARY line from the tool")
        return MemcheckResult(Memcheck.UNFINISHED, why, shapes)
    return MemcheckResult(Memcheck.CLEAN, "", shapes)
