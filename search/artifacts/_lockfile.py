"""An exclusive advisory lock on a file in a folder others may have written (an artifact store's key).

Why not the ``filelock`` package: a store may be hostile, and a lock must never write through what it finds.
filelock truncates the lock file once it holds it in 3.32.7 and 4.0.0 (tried), so a ``.lock`` hard-linked to
another file empties that file; 4.3.1 leaves it alone but locks a FIFO. Whether it writes is an implementation
detail that changed between minor releases, not a documented promise. This lock opens the file
without following a link, refuses anything but a regular file (:func:`kernsearch._safeio.open_regular`) and
never writes to it. ``flock`` has no timeout of its own (and ``SIGALRM`` works on the main thread only), so a
wait is non-blocking attempts a few milliseconds apart until the deadline, as filelock does too.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from .. import _safeio
from .._errors import KernsearchError

_FLAGS = (os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
          | getattr(os, "O_CLOEXEC", 0))
#: Seconds between attempts while another process holds the lock.
POLL_INTERVAL = 0.02


class LockTimeout(KernsearchError):
    """Another process held the lock for the whole wait."""


@contextlib.contextmanager
def exclusive(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing), waiting at most ``timeout`` seconds.

    The OS drops the lock when the holder exits or dies, so a killed process never leaves the key locked.
    Raises :class:`kernsearch._safeio.UnsafeFile` for a link or non-regular file, :class:`LockTimeout` if busy.
    """
    import fcntl

    fd = _safeio.open_regular(path, _FLAGS)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"another process holds {path} (waited {timeout:g} s)") from None
                time.sleep(POLL_INTERVAL)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
