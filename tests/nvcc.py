"""nvcc for the tests that compile CUDA twins without a GPU, its answers kept by content: a translation unit
compiled before with the same flags by the same nvcc is not compiled again (the suite's compile cache,
``$KERNSEARCH_CACHE/nvcc``, kept across runs of a checkout as the interpreter's objects are). Only clean compiles
are kept: a failing one runs again and says why."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)


@dataclass(frozen=True)
class Compiled:
    returncode: int
    stderr: str  # ptxas's report (--resource-usage) or the errors
    cached: bool


@cache
def _version() -> str:
    assert NVCC is not None
    return subprocess.run([NVCC, "--version"], capture_output=True, text=True, timeout=60).stdout


def _cache_dir() -> Path:
    root = Path(os.environ.get("KERNSEARCH_CACHE") or REPO / ".kernsearch" / "test-cache") / "nvcc"
    root.mkdir(parents=True, exist_ok=True)
    return root


def nvcc(flags: list[str], unit: str, suffix: str = ".cu", timeout: int = 900) -> Compiled:
    """``nvcc FLAGS UNIT -o OUT`` on the source text ``unit`` (the output is not kept: the tests read the
    return code and the report)."""
    assert NVCC is not None
    key = hashlib.sha256("\0".join([_version(), *flags, unit]).encode()).hexdigest()[:32]
    kept = _cache_dir() / f"{key}.json"
    if kept.is_file():
        return Compiled(0, json.loads(kept.read_text())["stderr"], True)
    with tempfile.TemporaryDirectory(prefix="ks-nvcc-") as tmp:
        source = Path(tmp) / f"unit{suffix}"
        source.write_text(unit)
        done = subprocess.run([NVCC, *flags, str(source), "-o", str(Path(tmp) / "out")], capture_output=True,
                              text=True, timeout=timeout, cwd=tmp)
    if done.returncode == 0:
        partial = kept.with_name(f"{key}.{os.getpid()}.{threading.get_ident()}.tmp")
        partial.write_text(json.dumps({"stderr": done.stderr}))
        os.replace(partial, kept)
    return Compiled(done.returncode, done.stderr, False)
