"""The process that forks the interpreter's kernel runs, and what a kernel's child process does.

A fork copies the page tables of the process that forks, and every page either process then writes is copied or
re-mapped: a small kernel's run forked by a caller holding 800 MB cost 52 ms of CPU, forked by this launcher (the
standard library only, ~10 MB) 6 ms (``benchmarks/interp_launch.txt``). :func:`run_forked
<kernsearch.interp._run.run_forked>` asks the launcher of its thread to fork each run; a run's whole launch (request,
arguments, diagnostics) lives in one shared file mapping, whose descriptor travels over a Unix socket. Where no
launcher can start, the caller forks itself (the same child).

This module imports the standard library only: it runs as ``python -I -S THIS_FILE SOCKET_FD PARENT_PID``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import mmap
import os
import signal
import socket
import struct
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

MAX_DIAGS = 64
#: A run's region (a shared file mapping, written by ``kernsearch.interp._run``): its head (rc, number of
#: diagnostics, unsynced; the request's offset and length), the diagnostics, the arguments, the request (JSON).
HEAD = struct.Struct("<iiiqq")
DIAGS_AT = 32
#: Messages from the launcher: (what, value): the child's pid, then its wait status; or a refusal.
REPLY = struct.Struct("<ii")
STARTED, ENDED, REFUSED = 1, 2, 3


def die_with_parent() -> None:
    """Linux: this process is killed when its parent dies (a worker killed for a timeout, a launcher whose owner
    died)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Launch:
    """One kernel run as the caller asks for it (``kernsearch.interp._run.run_forked``) and its child reads it."""

    lib: str
    grid: tuple[int, int, int]
    tg: tuple[int, int, int]
    tg_limit: int
    stack_kb: int
    threadgroups: tuple[tuple[int, int, int], ...] | None = None
    schedule: tuple[int, int, int] = (0, 0, 0)
    detect: bool | None = None
    sync_all: bool = False
    persistent: bool = False
    offsets: tuple[int, ...] = ()  # each argument's place in the region

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> Launch:
        raw = json.loads(data)
        groups = raw["threadgroups"]
        return replace(cls(**raw), grid=tuple(raw["grid"]), tg=tuple(raw["tg"]), schedule=tuple(raw["schedule"]),
                       offsets=tuple(raw["offsets"]), threadgroups=tuple(map(tuple, groups)) if groups else None)


def configure(lib: Any, launch: Launch) -> Any:
    """The interpreter set up before ``ks_run``: the detector and lane sync (lockstep builds only), the resident
    pool, the schedule, the sampled threadgroups; each only where asked. Returns the sampled threadgroups' buffer:
    the interpreter keeps a pointer to it, so the caller holds it until ``ks_run`` returns."""
    if launch.detect is not None:
        lib.ks_detect(ctypes.c_int(1 if launch.detect else 0))
        lib.ks_sync_all(ctypes.c_int(1 if launch.sync_all else 0))
    if launch.persistent:
        lib.ks_pool(ctypes.c_int(1))
    if launch.schedule != (0, 0, 0):
        order, threads, seed = launch.schedule
        lib.ks_order(ctypes.c_int(order), ctypes.c_int(threads), ctypes.c_uint64(seed))
    if launch.threadgroups:
        flat = [int(v) for t in launch.threadgroups for v in t]
        selection = (ctypes.c_uint32 * len(flat))(*flat)
        lib.ks_select(selection, ctypes.c_int(len(launch.threadgroups)))
        return selection
    return None


def read_launch(region: mmap.mmap) -> Launch:
    at, size = HEAD.unpack_from(region, 0)[3:]
    return Launch.decode(bytes(region[at:at + size]))


def run_child(lib: Any, region: mmap.mmap) -> None:
    """The kernel's process: the launch its region holds, run; rc, diagnostics and outputs written back into the
    region. Never returns (``os._exit``: the forked process never runs its parent's code)."""
    code = 4
    try:
        die_with_parent()
        import faulthandler

        faulthandler.disable()  # a crashing kernel is reported by the parent, not dumped here
        launch = read_launch(region)
        base = ctypes.addressof(ctypes.c_char.from_buffer(region))
        argv = (ctypes.c_void_p * len(launch.offsets))(*[base + off for off in launch.offsets])
        nd = ctypes.c_int(0)
        selection = configure(lib, launch)
        rc = lib.ks_run(argv, (ctypes.c_uint32 * 3)(*launch.grid), (ctypes.c_uint32 * 3)(*launch.tg),
                        ctypes.c_int64(launch.tg_limit), ctypes.c_int(launch.stack_kb),
                        ctypes.c_void_p(base + DIAGS_AT), ctypes.c_int(MAX_DIAGS), ctypes.byref(nd))
        del selection  # held until here: ks_run read the sampled threadgroups through ks_select's pointer
        unsynced = lib.ks_unsynced() if launch.detect is not None else 0
        struct.pack_into("<iii", region, 0, rc, nd.value, unsynced)
        code = 0 if rc == 0 else 3
    finally:
        os._exit(code)


def _serve(sock: socket.socket) -> None:
    """One run at a time: receive a region's descriptor, fork the kernel's process, reply with its pid, reap it,
    reply with its wait status. Ends when the owner closes its end (or dies)."""
    libs: dict[str, Any] = {}  # loaded here, before forking: a child never takes the dynamic loader's lock
    while True:
        try:
            _, fds, _, _ = socket.recv_fds(sock, 16, 1)
        except OSError:
            return
        if not fds:
            return
        with contextlib.closing(mmap.mmap(fds[0], os.fstat(fds[0]).st_size)) as region:
            os.close(fds[0])
            path = read_launch(region).lib
            try:
                lib = libs.get(path) or libs.setdefault(path, ctypes.CDLL(path))
            except OSError:
                sock.sendall(REPLY.pack(REFUSED, 0))
                continue
            pid = os.fork()
            if pid == 0:
                sock.close()
                run_child(lib, region)
            sock.sendall(REPLY.pack(STARTED, pid))
            _, status = os.waitpid(pid, 0)
            sock.sendall(REPLY.pack(ENDED, status))


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the owner's to handle; it kills a running kernel
    die_with_parent()
    if os.getppid() != int(argv[2]):  # the owner died before the line above
        return
    sock = socket.socket(fileno=int(argv[1]))
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        _serve(sock)


if __name__ == "__main__":
    main(sys.argv)
