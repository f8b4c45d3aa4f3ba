"""Isolated worker processes: a kernel variant that crashes or hangs takes down its worker, never the search.

A :class:`Worker` owns one child process (started with ``spawn``: GPU runtimes are not fork-safe) that
runs picklable functions one at a time. ``call`` waits at most ``timeout`` seconds; a hang kills the
child and raises ``VariantFailure("timeout")``, a dead child (segfault, abort, ``os._exit``) raises
``VariantFailure("crash")`` with its exit status; either way the next call starts a fresh child.
Exceptions raised by the function come back as the same :class:`VariantFailure` (other exceptions as
``VariantFailure("error")`` with their traceback's last line), so the caller handles one error type.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .._errors import KernsearchError, VariantFailure


def _serve(conn: Connection) -> None:
    """The child's loop: run each (fn, args, kwargs) it receives and send back the outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        fn, args, kwargs = task
        try:
            reply: tuple[Any, ...] = ("done", fn(*args, **kwargs))
        except VariantFailure as exc:
            reply = ("fail", exc.reason, exc.detail)
        except KernsearchError as exc:
            reply = ("user", type(exc).__name__, str(exc))
        except BaseException as exc:  # noqa: BLE001 - anything else is this variant's failure
            last = traceback.format_exception_only(type(exc), exc)[-1].strip()
            reply = ("fail", "error", last)
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send(("fail", "error", f"cannot return the result: {exc}"))


class Worker:
    """One child process that runs functions with a timeout and is replaced after a crash or hang."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Connection | None = None
        self.starts = 0  # child processes started so far (more than one: crashes, hangs or restarts)

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child,), daemon=True, name="kernsearch-worker")
        self._proc.start()
        child.close()
        self._conn = parent

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in the child; VariantFailure on failure, crash or timeout."""
        if self._proc is None or not self._proc.is_alive():
            self._drop()
            self._start()
            self.starts += 1
        # Local references: a pool closing (another thread) may kill this child and drop them meanwhile.
        proc, conn = self._proc, self._conn
        assert conn is not None
        limit = self.timeout if timeout is None else timeout
        try:
            conn.send((fn, args, kwargs))
        except (BrokenPipeError, OSError):
            self._kill()
            raise VariantFailure("crash", "worker process died before the task started") from None
        deadline = time.monotonic() + limit
        while True:
            try:
                ready = conn.poll(min(0.5, max(0.0, deadline - time.monotonic())))
            except (EOFError, OSError, ValueError):
                ready = True
            if ready:
                try:
                    reply = conn.recv()
                except (EOFError, OSError, ValueError):
                    code = self._reap(proc)
                    raise VariantFailure("crash", f"worker process died ({_describe_exit(code)})") from None
                break
            if not proc.is_alive():
                code = self._reap(proc)
                raise VariantFailure("crash", f"worker process died ({_describe_exit(code)})")
            if time.monotonic() >= deadline:
                self._kill()
                raise VariantFailure("timeout", f"no result within {limit:g} s; worker killed")
        kind = reply[0]
        if kind == "done":
            return reply[1]
        if kind == "user":
            raise KernsearchError(reply[2])
        raise VariantFailure(reply[1], reply[2])

    def _reap(self, proc: Any) -> int | None:
        proc.join(timeout=5)
        code: int | None = proc.exitcode
        if self._proc is proc:
            self._drop()
        return code

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        self._drop()

    def _drop(self) -> None:
        conn, self._conn, self._proc = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except OSError:  # closed meanwhile by the thread that was waiting on it
                pass

    def restart(self) -> None:
        """Start afresh on the next call (e.g. a clean process for final re-measurements)."""
        self.close()

    def close(self) -> None:
        """Stop the child (politely, then by force)."""
        if self._proc is not None and self._proc.is_alive() and self._conn is not None:
            try:
                self._conn.send(None)
                self._proc.join(timeout=2)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Lease:
    """One worker of a :class:`PinnedPool` held for one config, from its compile to its timing: ``result`` waits
    for the first task (its failure frees the worker at once), ``call`` runs the next one in the same process,
    ``release`` frees it. A lease whose first task failed is already released."""

    def __init__(self, pool: PinnedPool, worker: Worker) -> None:
        self._pool, self.worker = pool, worker
        self._released = False
        self.future: Any = None

    def _first(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return self.worker.call(fn, *args, **kwargs)
        except BaseException:
            self.release()
            raise

    def result(self) -> Any:
        """The first task's value; its VariantFailure (compile error, crash, hang) raised here."""
        return self.future.result()

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        return self.worker.call(fn, *args, timeout=timeout, **kwargs)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._pool._free.put(self.worker)


class PinnedPool:
    """``size`` isolated workers, each serving one config at a time from its compile to its timing.

    A GPU runtime keeps a kernel it compiled in the process that compiled it: MLX's ``cuda_kernel`` never writes
    NVRTC's output to its disk cache, and ``metal_kernel`` keeps its library in memory (``docs/timing.md``). A
    compile worker whose kernel another process then times only moved the compile; here the worker that compiled
    a config also verifies and times it, its first launch a lookup. The caller times one config at a time (the
    GPU is never shared by two timings) while the other workers compile. ``submit`` waits for a free worker."""

    def __init__(self, size: int, timeout: float = 60.0) -> None:
        import queue
        from concurrent.futures import ThreadPoolExecutor

        self.size = size
        self._workers = [Worker(timeout=timeout) for _ in range(size)]
        self._free: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        for w in self._workers:
            self._free.put(w)
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="kernsearch-compile")

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Lease:
        """``fn(*args, **kwargs)`` on a free worker (waiting for one), held by the returned lease."""
        lease = Lease(self, self._free.get())
        lease.future = self._pool.submit(lease._first, fn, args, kwargs)
        return lease

    def close(self) -> None:
        """Drop queued tasks and stop the workers now (a compile in flight is not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for w in self._workers:
            w._kill()
