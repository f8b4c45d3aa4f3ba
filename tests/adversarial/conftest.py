"""Helpers for the adversarial suite: hostile family folders and the CLI run as a user runs it."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GEMM_DIR = REPO / "templates" / "gemm"
#: A tree no test may change: attacks aim their writes here, and the repository is watched too.
CANARY = Path(tempfile.gettempdir()) / f"ks-canary-{os.getpid()}"
#: Not watched: VCS and tool caches, and ``.kernsearch`` (the test suite's own compiled-kernel cache folder).
_SKIP = {".git", "__pycache__", ".venv", ".hypothesis", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".kernsearch"}
#: Named output folders inside the checkout: the screenshots folder (``.ci/run`` names it in the clone; unnamed, as in
#: a plain ``make test``, tests/test_report.py writes its default, test-artifacts/, ignored by git).
_OUTPUTS = {Path(os.environ.get("KERNSEARCH_TEST_ARTIFACTS") or REPO / "test-artifacts").resolve()}


def _snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (links as their target text) with a digest of its content and mode."""
    state: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP and not d.endswith(".egg-info")
                       and Path(dirpath, d).resolve() not in _OUTPUTS]
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                state[rel] = "link:" + os.readlink(path)
            elif path.is_file():
                state[rel] = hashlib.sha256(path.read_bytes()).hexdigest() + f":{path.stat().st_mode:o}"
        state[str(Path(dirpath).relative_to(root)) + "/"] = "dir"
    return state


@pytest.fixture(scope="session", autouse=True)
def canary_tree() -> Iterator[Path]:
    """Nothing outside the named output folders (pytest's tmp paths) changes during the suite."""
    CANARY.mkdir(parents=True, exist_ok=True)
    (CANARY / "keep.txt").write_text("canary\n")
    (CANARY / "journal.jsonl").write_text("")
    before = {"canary": _snapshot(CANARY), "repo": _snapshot(REPO)}
    yield CANARY
    after = {"canary": _snapshot(CANARY), "repo": _snapshot(REPO)}
    changed = {where: sorted(set(before[where].items()) ^ set(after[where].items())) for where in before}
    shutil.rmtree(CANARY, ignore_errors=True)
    assert not changed["canary"] and not changed["repo"], f"files changed outside output folders: {changed}"


#: For a tune that only sets up what a test is about (a study, a store, a search that must publish nothing): the
#: random sampler skips the ``auto`` start, which ranks every valid config with the model (~9 s of CPU for GEMM at
#: 64^3, in every such process), and proposes configs the test does not depend on.
RANDOM = ("--sampler", "random")


def ks(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict[str, str] | None = None
       ) -> subprocess.CompletedProcess[str]:
    """``python -m kernsearch ARGS`` in a fresh process (what a user or a nightly job runs)."""
    return subprocess.run([sys.executable, "-m", "kernsearch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env={**os.environ, **(env or {})})


def ks_here(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """What :func:`ks` gives, through the same entry point in this process (no interpreter's start: ~0.8 s of CPU;
    issue 42). For the many cases of one behaviour; each such test keeps a case in a real process (:func:`ks`), and
    any case that could hang (a FIFO, a bomb a bound must stop) stays in one, where its timeout ends it."""
    from conftest import kernsearch_in_process

    return kernsearch_in_process(*args, cwd=cwd, env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, exactly one line on stderr, no traceback; the line contains every needle."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture
def hostile_family(tmp_path: Path) -> Callable[..., Path]:
    """``make(toml=lambda text: text, metal=lambda text: text, name="fam")``: a copy of gemm, edited."""

    def make(toml: Callable[[str], str] = lambda t: t, metal: Callable[[str], str] = lambda t: t,
             name: str = "fam") -> Path:
        folder = tmp_path / name
        shutil.copytree(GEMM_DIR, folder)
        spec = folder / "family.toml"
        spec.write_text(toml(spec.read_text()))
        tmpl = folder / "gemm.metal.j2"
        tmpl.write_text(metal(tmpl.read_text()))
        return folder

    return make


def set_key(text: str, key: str, value: str) -> str:
    """Replace the top-level ``key = ...`` line of a family.toml."""
    out, done = [], False
    for line in text.splitlines():
        hit = not done and line.startswith(f"{key} =")
        out.append(f"{key} = {value}" if hit else line)
        done = done or hit
    return "\n".join(out) + "\n"


def _test_artifacts():  # noqa: ANN202 - the store helpers of tests/test_artifacts.py (one definition)
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ks_test_artifacts", REPO / "tests" / "test_artifacts.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


_ARTS = _test_artifacts()
KEY, candidate, key = _ARTS.KEY, _ARTS.candidate, _ARTS.key


def forge_index(root: Path) -> None:
    """What an attacker who can write the store but has no store key does after editing a version: record the
    edited files' content hashes in the index and chain every line again (plain SHA-256). Only the re-check
    (and, for a keyed store, the key) stands between such a store and a reader."""
    import json

    from kernsearch.artifacts import _index
    from kernsearch.exporting.runtime._runtime import content_sha256

    path = root / _index.INDEX
    head, lines = _index.GENESIS, []
    for seq, raw in enumerate(path.read_text().splitlines()):
        entry = json.loads(raw)
        folder = root / entry["key"] / entry["version"]
        if entry["op"] == "version" and (folder / "manifest.json").is_file():
            manifest = json.loads((folder / "manifest.json").read_text())
            entry["content"] = content_sha256((folder / "manifest.json").read_text(),
                                              (folder / manifest["kernel"]["header_file"]).read_text(),
                                              (folder / manifest["kernel"]["source_file"]).read_text())
        body = {**{k: v for k, v in entry.items() if k != "hash"}, "seq": seq, "prev": head, "mac": "sha256",
                "key_id": None}
        body["hash"] = head = _index._seal(body, None)
        lines.append(json.dumps(body, sort_keys=True) + "\n")
    path.write_text("".join(lines))
