"""Compiling a kernel's C++ translation with g++ (or clang++), cached by source + flags + shim version.

Objects live under ``$KERNSEARCH_CACHE`` (or ``~/.cache/kernsearch/interp``); a cache entry is written
to a temporary name and renamed, so concurrent processes never see half-written objects.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .._errors import BackendError, VariantFailure

SHIM_DIR = Path(__file__).parent / "shim"

#: Never -ffast-math: it folds NaN checks away and breaks NaN poisoning. -O0: compiling dominates a
#: verification (kernels run on small problems); -O1 doubles the compile time for little run time.
BASE_FLAGS = ("-std=c++17", "-O0", "-fno-strict-aliasing", "-fno-exceptions", "-w", "-pipe")

#: A compile that takes longer than this is a failed variant, not a stalled search.
COMPILE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Compiled:
    path: Path
    seconds: float  # 0.0 when it came from the cache
    cached: bool


def cache_dir() -> Path:
    root = os.environ.get("KERNSEARCH_CACHE")
    base = Path(root) / "interp" if root else Path.home() / ".cache" / "kernsearch" / "interp"
    base.mkdir(parents=True, exist_ok=True)
    return base


@lru_cache(maxsize=1)
def compiler() -> str:
    for name in (os.environ.get("KERNSEARCH_CXX"), "g++", "clang++"):
        if name and shutil.which(name):
            return name
    raise BackendError("the cpu back-end needs a C++ compiler (g++ or clang++) on PATH")


@lru_cache(maxsize=1)
def link_flags() -> tuple[str, ...]:
    """GNU gold where the compiler links with it: a kernel's shared object links in ~60 % of the default linker's CPU
    time (g++ 12: ~0.03 s of a ~0.13 s build; the sanitizer's executable ~0.05 of ~0.27 s); the same code either way.
    None where gold is not installed or the compiler does not link with it (the default linker then)."""
    if not shutil.which("ld.gold"):
        return ()
    try:
        probe = subprocess.run([compiler(), "-fuse-ld=gold", "-Wl,--version"], capture_output=True, text=True,
                               timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return ("-fuse-ld=gold",) if probe.returncode == 0 and "GNU gold" in probe.stdout else ()


@lru_cache(maxsize=1)
def shim_version() -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in SHIM_DIR.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(SHIM_DIR)).encode() + f.read_bytes())
    try:
        h.update(subprocess.run([compiler(), "--version"], capture_output=True, text=True).stdout.encode())
    except OSError:
        pass
    return h.hexdigest()[:16]


def flags(mode: str, cpp: str = "", lockstep: bool = False) -> list[str]:
    """Compiler flags of a ``mode`` build; ``lockstep`` (or check mode): the checked translation, whose simdgroups
    run in lockstep (KS_CHECK)."""
    f = list(BASE_FLAGS) + [f"-I{SHIM_DIR}"]
    if "ks_mpp.h" in cpp or "MetalPerformancePrimitives" in cpp or "metal_tensor" in cpp:
        f[0] = "-std=c++20"  # matmul2d takes its descriptor as a class-type template argument
    if platform.machine() in ("x86_64", "AMD64"):
        f.append("-mf16c")
    if mode == "check" or lockstep:
        f.append("-DKS_CHECK=1")
    if os.environ.get("KERNSEARCH_INTERP_UCONTEXT"):  # the portable fiber switch, for comparison and tests
        f.append("-DKS_FORCE_UCONTEXT=1")
    if mode == "sanitize":
        f += ["-DKS_SANITIZE=1", "-DKS_DRIVER=1", "-fsanitize=address", "-fsanitize-recover=address",
              "-fno-omit-frame-pointer", "-g"]
    else:
        f += ["-fPIC", "-shared"]
    return f


def _runtime_object(cmd_flags: list[str]) -> Path | None:
    """The interpreter's runtime (``shim/ks_runtime.inc``: context switch, scheduler, launch, the lockstep and
    detector functions) compiled once per shim version and flags, optimised (``-O2``), and linked into every kernel
    built with those flags: each kernel's own compile stays ``-O0`` and skips the runtime. None when it cannot be
    built (the kernel then compiles the runtime in, ``-DKS_RUNTIME_IMPL=1``)."""
    if os.environ.get("KERNSEARCH_NO_RUNTIME_OBJECT"):
        return None
    rt_flags = ["-O2" if f == "-O0" else f for f in cmd_flags if f != "-shared"]
    key = hashlib.sha256("\0".join([*rt_flags, shim_version()]).encode()).hexdigest()[:24]
    target = cache_dir() / f"rt-{key}.o"
    if target.exists():
        return target
    try:
        with tempfile.TemporaryDirectory(prefix="ks-rt-", dir=cache_dir()) as tmp:
            out = Path(tmp) / "rt.o"
            proc = subprocess.run([compiler(), *rt_flags, "-DKS_RUNTIME_IMPL=1", "-x", "c++", "-c",
                                   str(SHIM_DIR / "ks_shim.h"), "-o", str(out)],
                                  capture_output=True, timeout=COMPILE_TIMEOUT_S)
            if proc.returncode != 0:
                return None
            os.replace(out, target)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return target


def _pch_dir(cmd_flags: list[str]) -> Path | None:
    """A GCC precompiled ``ks_shim.h`` for these flags (built once per shim version and flags, shared by every
    kernel compiled after): parsing the shim is most of a kernel's compile time. GCC checks a precompiled
    header before using it and falls back to the text, so a stale or foreign one is never wrong; clang++ and
    sanitize builds compile without it."""
    if "g++" not in Path(compiler()).name or "-DKS_SANITIZE=1" in cmd_flags or os.environ.get("KERNSEARCH_NO_PCH"):
        return None
    pch_flags = [f for f in cmd_flags if f != "-shared"]
    key = hashlib.sha256("\0".join([*pch_flags, shim_version()]).encode()).hexdigest()[:24]
    target = cache_dir() / f"pch-{key}"
    if (target / "ks_shim.h.gch").exists():
        return target
    try:
        with tempfile.TemporaryDirectory(prefix="ks-pch-", dir=cache_dir()) as tmp:
            out = Path(tmp) / "pch"
            out.mkdir()
            proc = subprocess.run([compiler(), *pch_flags, "-x", "c++-header",
                                   str(SHIM_DIR / "ks_shim.h"), "-o", str(out / "ks_shim.h.gch")],
                                  capture_output=True, timeout=COMPILE_TIMEOUT_S)
            if proc.returncode != 0:
                return None
            try:
                os.rename(out, target)
            except OSError:  # another process built it first
                pass
    except (OSError, subprocess.TimeoutExpired):
        return None
    return target if (target / "ks_shim.h.gch").exists() else None


_KERNEL_REF = re.compile(r"kernel\.metal:(\d+)")
_ANY_ERROR = re.compile(r":\d+(?::\d+)?:\s*(?:fatal )?error:\s*(.*)")
_ERROR_LINE = re.compile(r"kernel\.metal:(\d+):(?:\d+:)?\s*(?:fatal )?error:\s*(.*)")


def compile_unit(cpp: str, mode: str, lockstep: bool = False) -> Compiled:
    """Compile (or fetch from the cache) one translation unit; errors are a ``compile`` variant failure."""
    cmd_flags = flags(mode, cpp, lockstep)
    key = hashlib.sha256("\0".join([cpp, *cmd_flags, *link_flags(), shim_version()]).encode()).hexdigest()[:32]
    suffix = ".exe" if mode == "sanitize" else ".so"
    target = cache_dir() / f"{key}{suffix}"
    if target.exists():
        return Compiled(target, 0.0, True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ks-build-", dir=cache_dir()) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(cpp)
        out = Path(tmp) / f"out{suffix}"
        runtime = _runtime_object(cmd_flags)
        pch = _pch_dir(cmd_flags) if runtime is not None else None  # the precompiled shim holds no runtime
        build_flags = [f"-I{pch}", *cmd_flags] if pch else cmd_flags
        linked = [str(runtime)] if runtime is not None else []
        inline = ["-DKS_RUNTIME_IMPL=1"] if runtime is None else []
        try:
            proc = subprocess.run([compiler(), *build_flags, *inline, *link_flags(), str(src), *linked, "-o", str(out)],
                                  capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # subprocess.run kills the compiler before raising
            raise VariantFailure("compile", f"the compiler ran longer than {COMPILE_TIMEOUT_S} s") from None
        if proc.returncode != 0:
            raise VariantFailure("compile", first_error(proc.stderr))
        os.replace(out, target)
    return Compiled(target, time.perf_counter() - start, False)


#: g++'s wording for an undeclared name called in a template (every kernel is one), as Metal's compiler says it.
_UNDECLARED = re.compile(r"there are no arguments to [‘'](\w+)[’'] that depend on a template parameter.*")


def first_error(stderr: str) -> str:
    """The first compiler error (see :func:`_first_error`), in Metal's words where g++'s are obscure."""
    return _UNDECLARED.sub(lambda m: f"use of undeclared identifier '{m.group(1)}'", _first_error(stderr))


def _first_error(stderr: str) -> str:
    """The first compiler error, named by its line in the full kernel: an error inside the interpreter's shim
    (a template instantiated by the kernel) is named by the kernel line that required it."""
    kernel_line = None
    for line in stderr.splitlines():
        m = _ERROR_LINE.search(line)
        if m:
            return f"line {m.group(1)}: {m.group(2)}"
        ref = _KERNEL_REF.search(line)
        if ref:
            kernel_line = ref.group(1)
        err = _ANY_ERROR.search(line)
        if err and kernel_line is not None:
            return f"line {kernel_line}: {err.group(1)} (inside the interpreter's shim)"
    for line in stderr.splitlines():
        if "error" in line:
            return line.strip()[:300]
    return stderr.strip().splitlines()[-1][:300] if stderr.strip() else "compiler failed"
