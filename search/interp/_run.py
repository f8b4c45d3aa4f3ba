"""Running a compiled kernel in a child process, so that a hang or a crash fails the variant only.

fast / check: the shared object is loaded and called (ctypes) in a child forked by this thread's launcher
(:mod:`._launcher`: forking a lean process, not a caller of hundreds of MB), which writes outputs and diagnostics
into the run's shared memory file; the caller waits up to ``timeout`` seconds and kills it after that.
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
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from .._errors import VariantFailure
from .._vocabulary import Severity
from ._launcher import DIAGS_AT, HEAD, MAX_DIAGS, REFUSED, REPLY, Launch, run_child

KIND_NAMES = {1: "divergence", 2: "inactive_lane", 3: "partial_simdgroup", 4: "threadgroup_limit", 5: "race",
              6: "uninitialized", 7: "threadgroup_bounds", 8: "partial_collective", 9: "simdgroup_synchronous"}
#: A poisoned guard zone after every output buffer (bytes, and the pattern it holds): a kernel that writes past an
#: output's end changes it, and the run reports a ``device_bounds`` error (a write there is otherwise unseen).
GUARD_BYTES = 4096
POISON = b"\xa5\x5a\xc3\x3c"
#: The launcher's source, run as a script (the standard library only: see :mod:`._launcher`).
LAUNCHER = Path(__file__).with_name("_launcher.py")
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
    """Run the kernel in a forked child (forked by this thread's launcher, :mod:`._launcher`; by this process where
    none starts); ``args[i]`` for i in ``outputs`` are written back in place.
    ``threadgroups`` (positions in the grid) runs only those threadgroups; ``schedule`` is (threadgroup
    order, thread order, seed) for the schedule fuzz (0 = in order, 1 = reversed, 2 = shuffled); ``detect`` (lockstep
    builds only) turns the threadgroup-memory detector on (check mode) or off (fast mode); ``sync_all`` makes every
    threadgroup access synchronise the lanes of a simdgroup; ``persistent`` holds every threadgroup resident at once
    (ks_pool; builds with the detector run them one after another)."""
    launch = Launch(str(lib_path), grid, tg, int(tg_limit), int(stack_kb),
                    tuple(threadgroups) if threadgroups else None, schedule, detect, sync_all, persistent)
    with _Region(args, outputs, launch) as region:
        status = _launch(lib_path, region, timeout)
        rc, nd, unsynced = struct.unpack_from("<iii", region.map, 0)
        diags = _decode((_Diag * MAX_DIAGS).from_buffer_copy(region.map, DIAGS_AT), nd)
        if os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            raise VariantFailure("crash", f"the kernel crashed ({sig})" + _diag_suffix(diags))
        code = os.WEXITSTATUS(status)
        if code == _ARENA_EXHAUSTED:
            raise VariantFailure("crash", "threadgroup memory far beyond any chip's limit")
        if code != 0:
            raise VariantFailure("crash", f"the interpreter could not launch the kernel (code {code}, rc {rc})")
        return RunOutcome(diags + region.outputs_back(args, output_names), bool(unsynced))


class _Region:
    """One run's launch in one shared file mapping, which the kernel's process maps too: the head (rc, number of
    diagnostics, unsynced, where the request is), the diagnostics, every argument (each output followed by a poisoned
    guard zone), the request (JSON)."""

    def __init__(self, args: list[np.ndarray], outputs: list[int], launch: Launch) -> None:
        self.outputs = outputs
        self.offsets: list[int] = []
        at = _aligned(DIAGS_AT + ctypes.sizeof(_Diag) * MAX_DIAGS)
        for i, a in enumerate(args):
            self.offsets.append(at)
            at = _aligned(at + a.nbytes + (GUARD_BYTES if i in outputs else 0))
        body = replace(launch, offsets=tuple(self.offsets)).encode()
        self.fd = _shared_file()
        try:
            os.ftruncate(self.fd, at + len(body))
            self.map = mmap.mmap(self.fd, at + len(body))
        except BaseException:
            os.close(self.fd)
            raise
        HEAD.pack_into(self.map, 0, 0, 0, 0, at, len(body))
        self.map[at:at + len(body)] = body
        for i, (a, off) in enumerate(zip(args, self.offsets)):
            self._view(a, off)[:] = a.reshape(-1)
            if i in outputs:
                self.map[off + a.nbytes:off + a.nbytes + GUARD_BYTES] = POISON * (GUARD_BYTES // len(POISON))

    def _view(self, a: np.ndarray, off: int) -> np.ndarray:
        return np.frombuffer(self.map, dtype=a.dtype, count=a.size, offset=off)

    def outputs_back(self, args: list[np.ndarray], names: list[str] | None) -> list[RawDiag]:
        """Each output copied back into ``args``; a ``device_bounds`` error for each whose guard zone changed."""
        zones = []
        for i in self.outputs:
            off, n = self.offsets[i], args[i].nbytes
            args[i].reshape(-1)[:] = self._view(args[i], off)
            zones.append(self.map[off + n:off + n + GUARD_BYTES])
        return _guard_diags(zones, names)

    def __enter__(self) -> _Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.map.close()
        os.close(self.fd)


def _aligned(n: int) -> int:
    return (n + 63) // 64 * 64


def _shared_file() -> int:
    """A descriptor of a new file no other run names (in memory where the system has them: Linux's memfd)."""
    if hasattr(os, "memfd_create"):
        return os.memfd_create("kernsearch-run", os.MFD_CLOEXEC)
    with tempfile.TemporaryFile(prefix="ks-run-") as f:
        return os.dup(f.fileno())


def _launch(lib_path: Path, region: _Region, timeout: float) -> int:
    """The kernel's process started on ``region`` and waited for (``timeout`` s, then killed): its wait status. This
    thread's launcher forks it (a fresh launcher if the last one ended); this process where none starts, or where a
    new launcher ended before its first kernel (then none is tried again in this thread)."""
    for _ in range(2):
        launcher = _launcher_here()
        if launcher is None:
            break
        try:
            return launcher.run(region.fd, timeout)
        except LauncherGone:
            launcher.close()
            if not launcher.runs:
                _LOCAL.refused = os.getpid()
    lib = _load(lib_path)
    pid = os.fork()
    if pid == 0:  # child: never returns into the caller's code
        run_child(lib, region.map)
    try:
        return _wait(pid, timeout)
    except BaseException:  # Ctrl-C or any error while waiting: a hung kernel must not run on
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise


class LauncherGone(Exception):
    """The launcher process ended (killed, or it could not start)."""


class Launcher:
    """This thread's launcher process (:mod:`._launcher`) and the socket to it; one run at a time."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(LAUNCHER), str(theirs.fileno()),
                                          str(os.getpid())], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self.sock, self.owner = mine, os.getpid()
        self.runs = 0  # kernels this launcher started
        self._end = weakref.finalize(self, _end_launcher, mine, self.proc)

    def run(self, fd: int, timeout: float) -> int:
        """The launcher forks the kernel's process on the region ``fd``; its wait status (killed after ``timeout``
        s: :class:`VariantFailure`). :class:`LauncherGone` if the launcher ended before the kernel started."""
        try:
            socket.send_fds(self.sock, [b"r"], [fd])
            started = self._next(timeout)
        except OSError as exc:
            raise LauncherGone(str(exc)) from None
        if started is None:  # loading the kernel's library hung (its initialisers run then): the launcher goes
            self.proc.kill()
            self.close()
            raise VariantFailure("timeout", f"loading the kernel took longer than {timeout:g} s (stopped)")
        what, pid = started
        self.runs += 1
        if what == REFUSED:
            raise VariantFailure("crash", "the interpreter could not load the kernel's library")
        try:
            reply = self._next(timeout)
            if reply is None:  # the kernel ran too long: killed; the launcher reaps it and says so
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                self._next(None)
        except BaseException as exc:  # Ctrl-C while waiting, or the launcher died: the kernel must not run on
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            self.close()
            if isinstance(exc, (OSError, LauncherGone)):
                raise VariantFailure("crash", "the kernel's launcher stopped while the kernel ran") from None
            raise
        if reply is None:
            raise VariantFailure("timeout", f"the kernel ran longer than {timeout:g} s (stopped)")
        return reply[1]

    def _next(self, timeout: float | None) -> tuple[int, int] | None:
        """The launcher's next message; None if none came within ``timeout`` s."""
        if timeout is not None and not select.select([self.sock], [], [], max(timeout, 0.0))[0]:
            return None
        data = b""
        while len(data) < REPLY.size:
            got = self.sock.recv(REPLY.size - len(data))
            if not got:
                raise LauncherGone("the launcher ended")
            data += got
        what, value = REPLY.unpack(data)
        return what, value

    def close(self) -> None:
        self._end()


def _end_launcher(sock: socket.socket, proc: subprocess.Popen[bytes]) -> None:
    """Close the socket (the launcher ends when it reads the end) and reap the launcher."""
    sock.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_LOCAL = threading.local()


def _launcher_here() -> Launcher | None:
    """This thread's launcher, started on first use (again after one ended); None where none can start in this
    process (then the caller forks itself)."""
    launcher: Launcher | None = getattr(_LOCAL, "launcher", None)
    if launcher is not None and launcher.owner == os.getpid():
        if launcher.proc.poll() is None:
            return launcher
        launcher.close()
    if getattr(_LOCAL, "refused", None) == os.getpid() or not sys.executable:
        return None
    try:
        launcher = _LOCAL.launcher = Launcher()
    except OSError:
        _LOCAL.launcher, _LOCAL.refused = None, os.getpid()
        return None
    return launcher


def _guard_diags(zones: list[bytes], names: list[str] | None) -> list[RawDiag]:
    """A ``device_bounds`` error for each output whose poisoned guard zone (just past its end) the kernel changed."""
    found: list[RawDiag] = []
    poison = POISON * (GUARD_BYTES // len(POISON))
    for k, zone in enumerate(zones):
        if zone != poison:
            first = next(j for j, (a, b) in enumerate(zip(zone, poison)) if a != b)
            name = names[k] if names and k < len(names) else f"#{k}"
            found.append(RawDiag("device_bounds", Severity.ERROR, None, 1,
                                 f"a write past the end of output {name} (byte {first} of the poisoned guard zone "
                                 "after it changed): a write outside the output buffer"))
    return found


def _diag_suffix(diags: list[RawDiag]) -> str:
    return f"; {diags[0].message}" if diags else ""




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
