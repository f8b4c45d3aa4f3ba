"""Running a compiled kernel in a child process, so that a hang or a crash fails the variant only.

fast / check: the shared object is loaded and called (ctypes) in a forked child that writes outputs and
diagnostics into shared memory; the parent waits up to ``timeout`` seconds and kills it after that.
sanitize: an AddressSanitizer executable reads the launch from a file; its report becomes a diagnostic.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .._errors import VariantFailure
from .._vocabulary import Severity

MAX_DIAGS = 64
KIND_NAMES = {1: "divergence", 2: "inactive_lane", 3: "partial_simdgroup", 4: "threadgroup_limit", 5: "race",
              6: "uninitialized", 7: "threadgroup_bounds", 8: "partial_collective", 9: "simdgroup_synchronous"}
#: A poisoned guard zone after every output buffer (bytes, and the pattern it holds): a kernel that writes past an
#: output's end changes it, and the run reports a ``device_bounds`` error (a write there is otherwise unseen).
GUARD_BYTES = 4096
POISON = b"\xa5\x5a\xc3\x3c"
#: Exit code of a child whose threadgroup arena ran out (far past any chip's limit).
_ARENA_EXHAUSTED = 86


class _Diag(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("severity", ctypes.c_int32), ("line", ctypes.c_int32),
                ("count", ctypes.c_int32), ("msg", ctypes.c_char * 232)]


@dataclass
class RawDiag:
    kind: str
    severity: str
    line: int | None
    count: int
    message: str


@dataclass
class RunOutcome:
    diags: list[RawDiag]
    #: check mode: lanes of one simdgroup passed values through threadgroup memory on lines that did not
    #: synchronise (the kernel is run again with every access synchronising)
    unsynced: bool = False


def _decode(diags: ctypes.Array[_Diag], n: int) -> list[RawDiag]:
    return [RawDiag(KIND_NAMES.get(d.kind, "unknown"), Severity.WARNING if d.severity else Severity.ERROR,
                    d.line if d.line > 0 else None, d.count, d.msg.decode(errors="replace"))
            for d in diags[:n]]


@lru_cache(maxsize=512)
def _load(lib_path: Path) -> ctypes.CDLL:
    """Load in the parent, before forking: the child then never takes the dynamic loader's lock
    (which another thread of the parent may have held at fork time)."""
    return ctypes.CDLL(str(lib_path))


def run_forked(lib_path: Path, args: list[np.ndarray], outputs: list[int], grid: tuple[int, int, int],
               tg: tuple[int, int, int], tg_limit: int, stack_kb: int, timeout: float,
               threadgroups: list[tuple[int, int, int]] | None = None,
               schedule: tuple[int, int, int] = (0, 0, 0), detect: bool | None = None,
               sync_all: bool = False, output_names: list[str] | None = None,
               persistent: bool = False) -> RunOutcome:
    """Run the kernel in a forked child; ``args[i]`` for i in ``outputs`` are written back in place.
    ``threadgroups`` (positions in the grid) runs only those threadgroups; ``schedule`` is (threadgroup
    order, thread order, seed) for the schedule fuzz (0 = in order, 1 = reversed, 2 = shuffled); ``detect`` (lockstep
    builds only) turns the threadgroup-memory detector on (check mode) or off (fast mode); ``sync_all`` makes every
    threadgroup access synchronise the lanes of a simdgroup; ``persistent`` holds every threadgroup resident at once
    (ks_pool; builds with the detector run them one after another)."""
    shared = [mmap.mmap(-1, args[i].nbytes + GUARD_BYTES) for i in outputs]
    views = [np.frombuffer(m, dtype=args[i].dtype, count=args[i].size) for m, i in zip(shared, outputs)]
    for v, i, m in zip(views, outputs, shared):
        v[:] = args[i].reshape(-1)
        m[args[i].nbytes:] = POISON * (GUARD_BYTES // len(POISON))
    call_args = list(args)
    for v, i in zip(views, outputs):
        call_args[i] = v
    diag_mem = mmap.mmap(-1, ctypes.sizeof(_Diag) * MAX_DIAGS + 16)
    lib = _load(lib_path)
    pid = os.fork()
    if pid == 0:  # child: never returns into the caller's code
        code = 4
        try:
            _die_with_parent()
            import faulthandler

            faulthandler.disable()  # a crashing kernel is reported by the parent, not dumped here
            argv = (ctypes.c_void_p * len(call_args))(*[a.ctypes.data for a in call_args])
            slots = (_Diag * MAX_DIAGS).from_buffer(diag_mem, 16)
            nd = ctypes.c_int(0)
            selection = _configure_run(lib, threadgroups, schedule, detect, sync_all, persistent)
            rc = lib.ks_run(argv, (ctypes.c_uint32 * 3)(*grid), (ctypes.c_uint32 * 3)(*tg), ctypes.c_int64(tg_limit),
                            ctypes.c_int(stack_kb), slots, ctypes.c_int(MAX_DIAGS), ctypes.byref(nd))
            del selection  # held until here: ks_run read the sampled threadgroups through ks_select's pointer
            unsynced = lib.ks_unsynced() if detect is not None else 0
            diag_mem[0:12] = struct.pack("iii", rc, nd.value, unsynced)
            code = 0 if rc == 0 else 3
        finally:
            os._exit(code)
    try:
        status = _wait(pid, timeout)
    except BaseException:  # Ctrl-C or any error while waiting: a hung kernel must not run on
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise
    rc, nd, unsynced = struct.unpack("iii", diag_mem[0:12])
    diags = _decode((_Diag * MAX_DIAGS).from_buffer_copy(diag_mem, 16), nd)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status)).name
        raise VariantFailure("crash", f"the kernel crashed ({sig})" + _diag_suffix(diags))
    code = os.WEXITSTATUS(status)
    if code == _ARENA_EXHAUSTED:
        raise VariantFailure("crash", "threadgroup memory far beyond any chip's limit")
    if code != 0:
        raise VariantFailure("crash", f"the interpreter could not launch the kernel (code {code}, rc {rc})")
    for v, i in zip(views, outputs):
        args[i].reshape(-1)[:] = v
    return RunOutcome(diags + _guard_diags(shared, [args[i].nbytes for i in outputs], output_names), bool(unsynced))


def _configure_run(lib: ctypes.CDLL, threadgroups: list[tuple[int, int, int]] | None,
                   schedule: tuple[int, int, int], detect: bool | None, sync_all: bool,
                   persistent: bool) -> ctypes.Array[ctypes.c_uint32] | None:
    """The child's interpreter set up before ``ks_run`` (see :func:`run_forked`): the detector and lane sync
    (lockstep builds only), the resident pool, the schedule, the sampled threadgroups; each only where asked.
    Returns the sampled threadgroups' buffer: the interpreter keeps a pointer to it, so the caller must hold it
    until ``ks_run`` returns."""
    if detect is not None:
        lib.ks_detect(ctypes.c_int(1 if detect else 0))
        lib.ks_sync_all(ctypes.c_int(1 if sync_all else 0))
    if persistent:
        lib.ks_pool(ctypes.c_int(1))
    if schedule != (0, 0, 0):
        lib.ks_order(ctypes.c_int(schedule[0]), ctypes.c_int(schedule[1]), ctypes.c_uint64(schedule[2]))
    if threadgroups:
        flat = [int(v) for t in threadgroups for v in t]
        selection = (ctypes.c_uint32 * len(flat))(*flat)
        lib.ks_select(selection, ctypes.c_int(len(threadgroups)))
        return selection
    return None


def _guard_diags(shared: list[mmap.mmap], sizes: list[int], names: list[str] | None) -> list[RawDiag]:
    """A ``device_bounds`` error for each output whose poisoned guard zone (just past its end) the kernel changed."""
    found: list[RawDiag] = []
    for k, (m, n) in enumerate(zip(shared, sizes)):
        zone = m[n:n + GUARD_BYTES]
        if zone != POISON * (GUARD_BYTES // len(POISON)):
            first = next(j for j, (a, b) in enumerate(zip(zone, POISON * (GUARD_BYTES // len(POISON)))) if a != b)
            name = names[k] if names and k < len(names) else f"#{k}"
            found.append(RawDiag("device_bounds", Severity.ERROR, None, 1,
                                 f"a write past the end of output {name} (byte {first} of the poisoned guard zone "
                                 "after it changed): a write outside the output buffer"))
    return found


def _diag_suffix(diags: list[RawDiag]) -> str:
    return f"; {diags[0].message}" if diags else ""


def _die_with_parent() -> None:
    """Linux: the kernel's process is killed when its parent dies (a worker killed for a timeout)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


def _wait(pid: int, timeout: float) -> int:
    """Wait for the child up to ``timeout`` seconds; kill it and fail the variant after that."""
    deadline = time.monotonic() + timeout
    fd = None
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise VariantFailure("timeout", f"the kernel ran longer than {timeout:g} s (stopped)")
            if fd is not None:
                select.select([fd], [], [], left)
            else:
                time.sleep(min(0.002, left))
    finally:
        if fd is not None:
            os.close(fd)


_ASAN_KIND = re.compile(r"ERROR: AddressSanitizer: ([\w-]+)")
_ASAN_ACCESS = re.compile(r"(READ|WRITE) of size (\d+)")
_KERNEL_FRAME = re.compile(r"kernel\.metal:(\d+)")


def run_sanitized(exe: Path, args: list[np.ndarray], outputs: list[int], grid: tuple[int, int, int],
                  tg: tuple[int, int, int], tg_limit: int, stack_kb: int, timeout: float) -> RunOutcome:
    """Run the AddressSanitizer build; device-buffer overflows become ``device_bounds`` diagnostics."""
    with tempfile.TemporaryDirectory(prefix="ks-asan-") as tmp:
        launch, result = Path(tmp) / "launch.bin", Path(tmp) / "result.bin"
        out_set = set(outputs)
        with open(launch, "wb") as f:
            f.write(struct.pack("<i3I3Iqi", len(args), *grid, *tg, tg_limit, stack_kb))
            for i, a in enumerate(args):
                data = np.ascontiguousarray(a).tobytes()
                f.write(struct.pack("<iq", 1 if i in out_set else 0, len(data)))
                f.write(data)
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0:halt_on_error=0:detect_stack_use_after_return=0:"
                                            "print_legend=0:symbolize=1:exitcode=23")
        try:
            proc = subprocess.run([str(exe), str(launch), str(result)], capture_output=True, text=True,
                                  timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise VariantFailure("timeout", f"the kernel ran longer than {timeout:g} s (stopped)") from None
        diags = _asan_diags(proc.stderr)
        if proc.returncode < 0:
            sig = signal.Signals(-proc.returncode).name
            raise VariantFailure("crash", f"the kernel crashed ({sig})" + _diag_suffix(diags))
        if not result.exists():
            raise VariantFailure("crash", "the sanitizer build stopped before writing results"
                                 + _diag_suffix(diags))
        blob = result.read_bytes()
        pos = 0
        for i in outputs:
            n = args[i].nbytes
            args[i].reshape(-1)[:] = np.frombuffer(blob, dtype=args[i].dtype, count=args[i].size, offset=pos)
            pos += n
        (nd,) = struct.unpack_from("i", blob, pos)
        arr = (_Diag * max(nd, 1)).from_buffer_copy(blob[pos + 4:pos + 4 + ctypes.sizeof(_Diag) * nd].ljust(
            ctypes.sizeof(_Diag) * max(nd, 1), b"\0"))
        return RunOutcome(_decode(arr, nd) + diags)


def _asan_diags(stderr: str) -> list[RawDiag]:
    found: dict[tuple[str, int | None], RawDiag] = {}
    for report in stderr.split("=================================================================")[1:]:
        kind = _ASAN_KIND.search(report)
        if not kind:
            continue
        access = _ASAN_ACCESS.search(report)
        frame = _KERNEL_FRAME.search(report)
        line = int(frame.group(1)) if frame else None
        what = f"{access.group(1).lower()} of {access.group(2)} bytes" if access else "access"
        key = (kind.group(1), line)
        if key in found:
            found[key].count += 1
            continue
        found[key] = RawDiag("device_bounds", Severity.ERROR, line, 1,
                             f"{kind.group(1)}: {what} outside a device buffer (AddressSanitizer)")
    return list(found.values())
