"""Bounded, link-refusing reads and appends of files others wrote (family folders, stores, job files), and
the one safe way kernsearch writes a file (:func:`write_atomic`).

Every file kernsearch reads from a family folder, an artifact store or a job file goes through here:

- the last path component is opened with ``O_NOFOLLOW`` (a symlink is refused, not followed) and
  ``O_NONBLOCK`` (a FIFO or device cannot block the open), and anything but a regular file is refused;
- at most ``limit`` bytes are read (a bigger file is an error, never a memory blow-up);
- text must be UTF-8, JSON must be shallow enough to parse without recursion trouble.

Every file kernsearch writes (a report, a package file, a store pointer) is replaced through
:func:`write_atomic`: a temporary file with an unpredictable name made with ``O_EXCL | O_NOFOLLOW`` in the
target's folder, renamed over the target only if that is absent or a regular file.

Every failure is an :class:`UnsafeFile` (a ``KernsearchError``) whose message is one line naming the file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from ._errors import KernsearchError

#: Default size caps (bytes): spec/job files, kernel sources and manifests, journals.
SPEC_LIMIT = 1 << 20
SOURCE_LIMIT = 4 << 20
JOURNAL_LIMIT = 64 << 20
#: Deepest JSON nesting accepted (manifests are 4 levels deep).
JSON_DEPTH = 32

_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class UnsafeFile(KernsearchError):
    """A file that must not or cannot be read: a link, a special file, too big, not UTF-8, malformed."""


def _describe(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def open_regular(path: str | Path, flags: int = _READ_FLAGS, mode: int = 0o644) -> int:
    """A file descriptor for ``path``, refusing links and anything but a regular file."""
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and os.path.islink(path)):
            raise UnsafeFile(f"{path}: is a symbolic link (refused)") from None
        if exc.errno == errno.EISDIR:
            raise UnsafeFile(f"{path}: is a directory, expected a file") from None
        if exc.errno == errno.ENOENT:
            raise UnsafeFile(f"{path}: no such file") from None
        if exc.errno == errno.ENXIO:
            raise UnsafeFile(f"{path}: is a special file (refused)") from None
        raise UnsafeFile(f"{path}: cannot open ({exc.strerror})") from None
    except ValueError:  # a NUL byte in the path: no file has that name
        raise UnsafeFile(f"{str(path)!r}: not a usable path (it holds a NUL byte)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path}: is {_describe(st.st_mode)}, expected a regular file")
        if flags & getattr(os, "O_NONBLOCK", 0):
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | Path, limit: int = SOURCE_LIMIT) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (links, special files, bigger files refused)."""
    return _read_fd(open_regular(path), path, limit)


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_inside(root: str | Path, parts: list[str]) -> int:
    """A descriptor of the regular file ``root/part/part/...``, opened ``openat``-style: each component is
    opened relative to the descriptor of the folder before it, with ``O_NOFOLLOW`` on every step, so nothing is
    resolved twice and no link (to a folder or a file, inside ``root`` or out of it) is ever followed; the
    names are plain (no ``..``, ``.``, separators or NUL), and the file is checked as regular by its
    descriptor. ``root`` itself is the folder the caller named."""
    where = os.path.join(str(root), *parts)
    if not parts or any(p in ("", ".", "..") or "/" in p or os.sep in p or "\x00" in p for p in parts):
        raise UnsafeFile(f"{where}: not a plain name inside {root}")
    try:
        dfd = os.open(root, _DIR_FLAGS & ~getattr(os, "O_NOFOLLOW", 0))
    except (OSError, ValueError) as exc:
        raise UnsafeFile(f"{root}: cannot open the folder ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        for step in parts[:-1]:
            try:
                nfd = os.open(step, _DIR_FLAGS, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeFile(f"{where}: {step} on the way is a linked folder (refused) or not a "
                                      "folder") from None
                raise UnsafeFile(f"{where}: cannot open a folder on the way ({exc.strerror})") from None
            os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(parts[-1], _READ_FLAGS, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafeFile(f"{where}: is a symbolic link (refused)") from None
            if exc.errno == errno.ENOENT:
                raise UnsafeFile(f"{where}: no such file") from None
            raise UnsafeFile(f"{where}: cannot open ({exc.strerror})") from None
    finally:
        os.close(dfd)
    return fd


def read_inside(root: str | Path, parts: list[str], limit: int = SOURCE_LIMIT) -> bytes:
    """The bytes of ``root/part/part/...`` read through :func:`open_inside` (no link on the way, no ``..``,
    a regular file of at most ``limit`` bytes): a folder swapped for a link at any moment is refused."""
    return _read_fd(open_inside(root, parts), os.path.join(str(root), *parts), limit)


def _read_fd(fd: int, path: str | Path, limit: int) -> bytes:
    """Read at most ``limit`` bytes of an open regular file (closed here)."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path}: is {_describe(st.st_mode)}, expected a regular file")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise UnsafeFile(f"{path}: larger than {limit} bytes (refused)")
    except OSError as exc:
        raise UnsafeFile(f"{path}: cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: str | Path, limit: int = SOURCE_LIMIT) -> str:
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnsafeFile(f"{path}: not UTF-8 text (byte {exc.start})") from None


def json_depth_ok(text: str, limit: int = JSON_DEPTH) -> bool:
    """Whether the brackets of a JSON text nest at most ``limit`` deep (strings skipped)."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def loads_json(text: str, where: str | Path, limit: int = JSON_DEPTH) -> Any:
    """Parse JSON with a depth limit; NaN/Infinity are refused (a store never holds them)."""
    if not json_depth_ok(text, limit):
        raise UnsafeFile(f"{where}: JSON nested deeper than {limit} levels (refused)")

    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a number JSON allows")

    try:
        return json.loads(text, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        raise UnsafeFile(f"{where}: not valid JSON: {' '.join(str(exc).split())[:200]}") from None


def read_json(path: str | Path, limit: int = SOURCE_LIMIT) -> Any:
    return loads_json(read_text(path, limit), path)


def read_toml(path: str | Path, limit: int = SPEC_LIMIT) -> dict[str, Any]:
    """A TOML file, bounded in size and nesting (a 5000-deep table is an error, not a RecursionError)."""
    import tomllib

    text = read_text(path, limit)
    if not json_depth_ok(text.replace("'", '"'), JSON_DEPTH):
        raise UnsafeFile(f"{path}: nested deeper than {JSON_DEPTH} levels (refused)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UnsafeFile(f"{path}: not valid TOML: {' '.join(str(exc).split())[:200]}") from None
    except RecursionError:
        raise UnsafeFile(f"{path}: nested too deeply (refused)") from None


def append_line(path: str | Path, line: str) -> None:
    """Append one line (fsync'd) to a regular file, never through a symbolic link."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | \
        getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = open_regular(path, flags)
    try:
        data = line.encode("utf-8")
        while data:
            written = os.write(fd, data)
            data = data[written:]
        os.fsync(fd)
    finally:
        os.close(fd)


def is_regular(path: str | Path) -> bool:
    """Whether ``path`` itself (not a link target) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_real_dir(path: str | Path) -> bool:
    """Whether ``path`` itself (not a link target) is a directory."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


# -- writing ---------------------------------------------------------------------------------------------

_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _refuse_special(path: str | Path, mode: int) -> None:
    """Only an absent or regular file may be replaced: a link, FIFO, device, socket or folder is refused."""
    if stat.S_ISLNK(mode):
        raise UnsafeFile(f"{path}: is a symbolic link (refused: only a new or regular file is replaced)")
    if not stat.S_ISREG(mode):
        raise UnsafeFile(f"{path}: is {_describe(mode)} (refused: only a new or regular file is replaced)")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def write_atomic(path: str | Path, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` safely: every file the CLI writes goes through here.

    The data goes to a temporary file with an unpredictable name, made with ``O_EXCL | O_NOFOLLOW`` in the
    target's own folder (opened once; every step is relative to it), flushed, then renamed over the target
    only if the target is absent or a regular file. A link, FIFO, device, socket or folder at ``path`` is
    refused (:class:`UnsafeFile`, one line) before anything is created, and nothing is ever written through
    a link: a link planted at the temporary name cannot exist (the name is new), one planted at the target
    is refused, never followed.
    """
    import secrets

    blob = data.encode("utf-8") if isinstance(data, str) else data
    target = Path(path)
    if "\x00" in str(path):
        raise UnsafeFile(f"{str(path)!r}: not a usable path (it holds a NUL byte)")
    name = target.name
    if not name or name in (".", ".."):
        raise UnsafeFile(f"{path}: not a file name")
    try:
        dfd = os.open(target.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UnsafeFile(f"{target.parent}: cannot open the folder ({exc.strerror})") from None
    tmp = f".{name[:100]}.{secrets.token_hex(8)}.tmp"
    try:
        _check_target(dfd, name, path)
        try:
            fd = os.open(tmp, _NEW_FLAGS, mode, dir_fd=dfd)
        except OSError as exc:
            raise UnsafeFile(f"{path}: cannot create a file beside it ({exc.strerror})") from None
        try:
            try:
                _write_all(fd, blob)
            finally:
                os.close(fd)
            _check_target(dfd, name, path)  # again, just before the rename
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(exc, OSError):
                raise UnsafeFile(f"{path}: cannot write ({exc.strerror or exc})") from None
            raise
        with contextlib.suppress(OSError):
            os.fsync(dfd)
    finally:
        os.close(dfd)


def check_replaceable(path: str | Path) -> None:
    """Refuse, before any work, a target :func:`write_atomic` would refuse (a link, FIFO, device, folder)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except ValueError:
        raise UnsafeFile(f"{str(path)!r}: not a usable path (it holds a NUL byte)") from None
    except OSError as exc:
        raise UnsafeFile(f"{path}: cannot check the target ({exc.strerror})") from None
    _refuse_special(path, st.st_mode)


def _check_target(dfd: int, name: str, path: str | Path) -> None:
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UnsafeFile(f"{path}: cannot check the target ({exc.strerror})") from None
    _refuse_special(path, st.st_mode)
