"""Kernel text handed over as ``#include "<file>"`` (a shared rule, ``_rules``): MLX's CUDA back-end rebuilds a
custom kernel's whole source on every call of the kernel object and hashes it on every eval, so a call's host time
grows with the text (H200: build + eval 2.2 + 6.8 us a call at 4 KB, 6.0 + 20.8 at 64 KB; the same text as one
``#include`` line: 2.0-4.1 + 5.1-8.3 flat, ``benchmarks/gpu_host_cost.py``). NVRTC reads the file when it compiles.

The file is content-addressed (``<sha256 of the text>.cuh``) in a private per-user folder that nothing here
trusts: :func:`included` falls back to the text itself (never an exception, never another kernel) wherever the
folder or the file could be someone else's, or the path cannot be spelled in an include line.

Standard library only, Python >= 3.9 (shipped verbatim in every exported package, beside ``_rules.py``).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

#: The environment variable naming the folder (else ``$XDG_CACHE_HOME/kernsearch/cuda-src``, else
#: ``~/.cache/kernsearch/cuda-src``).
CACHE_ENV = "KERNSEARCH_KERNEL_CACHE"
CACHE_SUBFOLDER = ("kernsearch", "cuda-src")
#: MLX passes an input's shape, strides and ndim to a kernel only where the source it is handed contains
#: ``<name>_shape`` (``_strides``, ``_ndim``): every run of identifier characters holding one is kept in view.
_SHAPE_NAMES = re.compile(r"[A-Za-z0-9_$]*_(?:shape|strides|ndim)[A-Za-z0-9_$]*")
#: What a folder's path may hold to be spelled in ``#include "..."`` and read back by NVRTC as written: printable
#: ASCII without a quote, a backslash or a trigraph's ``??``, and nothing MLX would read as a shape name.
_UNSAFE_PATH = re.compile(r'[^ -~]|["\\]|\?\?|_(?:shape|strides|ndim)')
_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_OPEN_READ = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)

#: What says a folder or file is still the one checked: device, inode, mode, owner (a file's: size, mtime too).
Identity = Tuple[int, ...]


@dataclass(frozen=True)
class CacheFolder:
    """Where include files go (``path``: absolute, real, checked), or why texts stay inline (``refused``)."""

    path: Optional[str]
    refused: str = ""


class _Refused(Exception):
    """A reason to keep the text inline."""


#: Folders checked in this process: wanted path -> (the folder's identity when checked, its real path).
_FOLDERS: Dict[str, Tuple[Identity, str]] = {}
#: Files verified in this process: path -> their identity when verified (a changed file is verified again).
_FILES: Dict[str, Identity] = {}


def _identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_mode, st.st_uid)


def _file_identity(st: os.stat_result) -> Identity:
    return _identity(st) + (st.st_size, st.st_mtime_ns)


def _wanted() -> Optional[str]:
    """The folder the environment names (absolute), None where no home folder can be found."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return os.path.abspath(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, *CACHE_SUBFOLDER) if os.path.isabs(base) else None


def _own(path: str, uid: int) -> os.stat_result:
    """``path`` is a folder of ``uid`` (not a link to one) that no one else may write."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _Refused(f"{path} is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise _Refused(f"{path} is not a folder")
    if st.st_uid != uid:
        raise _Refused(f"{path} is not owned by uid {uid}")
    if st.st_mode & _GROUP_OTHER_WRITE:
        raise _Refused(f"{path} is writable by its group or others")
    return st


def _make(wanted: str, uid: int) -> None:
    """Create the folder's missing components (mode 0700), each checked as ours once made."""
    missing: List[str] = []
    path = wanted
    while not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # made meanwhile: checked below, as every component we would have made
        _own(path, uid)


def _check_ancestors(real: str, uid: int) -> None:
    """No one but ``uid`` and root can rename a component of ``real`` away (sticky folders such as /tmp aside)."""
    path = os.path.dirname(real)
    while True:
        st = os.lstat(path)
        if st.st_uid not in (0, uid):
            raise _Refused(f"{path} (above the folder) is owned by uid {st.st_uid}")
        if st.st_mode & _GROUP_OTHER_WRITE and not st.st_mode & stat.S_ISVTX:
            raise _Refused(f"{path} (above the folder) is writable by its group or others")
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _prepare(wanted: str) -> Tuple[Identity, str]:
    """Create and check the folder: (its identity, its real path), or :class:`_Refused`."""
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:
        raise _Refused("no POSIX owners on this system")
    uid = geteuid()
    _make(wanted, uid)
    st = _own(wanted, uid)
    if not os.access(wanted, os.W_OK | os.X_OK):
        raise _Refused(f"{wanted} is not writable")
    real = os.path.realpath(wanted)
    if _identity(os.lstat(real)) != _identity(st):
        raise _Refused(f"{wanted} moved while it was checked")
    _check_ancestors(real, uid)
    if _UNSAFE_PATH.search(real):
        raise _Refused(f"{real!r} cannot be spelled in an include line")
    return _identity(st), real


def cache_folder() -> CacheFolder:
    """The include files' folder, created and checked (once per process while it stays the same folder)."""
    wanted = _wanted()
    if wanted is None:
        return CacheFolder(None, "no home folder to keep a cache in")
    try:
        try:
            now: Optional[Identity] = _identity(os.lstat(wanted))
        except FileNotFoundError:
            now = None
        known = _FOLDERS.get(wanted)
        if known is not None and known[0] == now:
            return CacheFolder(known[1])
        _FOLDERS[wanted] = checked = _prepare(wanted)
        return CacheFolder(checked[1])
    except _Refused as exc:
        return CacheFolder(None, str(exc))
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        return CacheFolder(None, f"{wanted!r}: {exc}")


def _holds(path: str, data: bytes) -> Optional[Identity]:
    """The identity of the regular file at ``path`` if its bytes are ``data`` (a bounded read), else None."""
    try:
        fd = os.open(path, _OPEN_READ)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return None
        chunks, left = [], len(data) + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return _file_identity(st) if b"".join(chunks) == data else None
    finally:
        os.close(fd)


def _write(folder: str, path: str, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``: a new file beside it (``O_EXCL | O_NOFOLLOW``), renamed over."""
    temp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temp, _OPEN_NEW, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise


def _file(folder: str, data: bytes) -> Optional[str]:
    """The path of the file ``<sha256>.cuh`` in ``folder`` holding ``data``, written or verified now (a file
    verified before in this process and unchanged since is not read again); None where it cannot be."""
    path = os.path.join(folder, hashlib.sha256(data).hexdigest() + ".cuh")
    try:
        try:
            if _FILES.get(path) == _file_identity(os.lstat(path)):
                return path
        except FileNotFoundError:
            pass
        held = _holds(path, data)
        if held is None:
            _write(folder, path, data)
            held = _holds(path, data)
        if held is None:
            return None
        _FILES[path] = held
        return path
    except OSError:
        return None


def included(text: str) -> str:
    """``text`` as one ``#include`` line of the file holding it (and a comment naming every shape, strides and
    ndim name it uses), or ``text`` itself where it cannot be (no folder, an empty or non-ASCII text)."""
    if not text.strip() or not text.isascii():
        return text
    folder = cache_folder().path
    path = _file(folder, text.encode("ascii")) if folder is not None else None
    if path is None:
        return text
    names = sorted(set(_SHAPE_NAMES.findall(text)))
    return f'#include "{path}"\n' + (f"// {' '.join(names)}\n" if names else "")
