"""Where the CLI writes: only the file it was asked for, never through a link, never over a special file.

Every file kernsearch writes goes through ``_safeio.write_atomic``: a temporary file with an unpredictable
name, made with ``O_EXCL | O_NOFOLLOW`` in the target's folder, renamed over the target only if that is
absent or a regular file. The device case uses a ``mknod`` copy of /dev/null inside the test's own folder
(never the machine's /dev): the suite stays within its temp folders.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kernsearch._safeio import UnsafeFile, write_atomic

from .conftest import CANARY
from .test_cli_fuzz import run_cli

STUDY = "writes-study"


@pytest.fixture
def study(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A small stored study (made with Optuna directly: the report is what is tested, not the search)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    s = optuna.create_study(study_name=STUDY, storage=url)
    s.set_user_attr("family", "gemm")
    s.set_user_attr("evidence", "modeled")
    for i in range(3):
        t = s.ask({"BM": optuna.distributions.CategoricalDistribution([16, 32])})
        t.set_user_attr("config", {"BM": t.params["BM"]})
        t.set_user_attr("status", "ok")
        s.tell(t, 1.0 + i)
    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path / "home"))
    return url


def _tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` with its kind and content (links as their target text)."""
    state = {}
    for path in sorted(folder.rglob("*")):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            state[str(path)] = "link:" + os.readlink(path)
        elif stat.S_ISREG(st.st_mode):
            state[str(path)] = path.read_bytes().hex()[:64] + f":{st.st_size}"
        else:
            state[str(path)] = f"mode:{stat.S_IFMT(st.st_mode):o}"
    return state


def _report(study: str, out: Path, cwd: Path) -> tuple[int, str]:
    code, _, stderr = run_cli(["report", STUDY, "--storage", study, "--out", str(out)], cwd)
    return code, stderr


def _refused(code: int, stderr: str, *needles: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, (code, stderr)
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.slow
def test_report_never_writes_through_a_link_planted_at_its_temporary_name(study: str, tmp_path: Path) -> None:
    """The old report wrote ``.<name>.tmp`` beside --out, following links: the link's target was overwritten."""
    victim = CANARY / "victim.txt"
    victim.write_text("keep me\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / ".r.html.tmp").symlink_to(victim)
    before = _tree(out_dir)
    code, stderr = _report(study, out_dir / "r.html", tmp_path)
    assert code == 0, stderr
    assert victim.read_text() == "keep me\n"
    after = _tree(out_dir)
    assert set(after) - set(before) == {str(out_dir / "r.html")}  # nothing else appeared or was left over
    assert all(after[k] == v for k, v in before.items())
    assert (out_dir / "r.html").read_text().startswith("<!DOCTYPE html>")
    victim.unlink()


@pytest.mark.parametrize("kind", ["link", "link to a folder", "fifo", "device", "folder"])
def test_report_out_at_a_special_file_is_refused(study: str, tmp_path: Path, kind: str) -> None:
    victim = CANARY / f"victim-{kind.replace(' ', '-')}.txt"
    victim.write_text("keep me\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "r.html"
    if kind == "link":
        out.symlink_to(victim)
    elif kind == "link to a folder":
        out.symlink_to(CANARY)
    elif kind == "fifo":
        os.mkfifo(out)
    elif kind == "device":
        try:  # a private copy of /dev/null (char 1,3) inside the test's folder; the machine's /dev is never used
            os.mknod(out, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs root (CAP_MKNOD)")
    else:
        out.mkdir()
    before = _tree(out_dir)
    code, stderr = _report(study, out, tmp_path)
    _refused(code, stderr, "folder" if kind == "folder" else "refused")
    assert _tree(out_dir) == before  # the special file is still there, unchanged; no temporary file is left
    assert victim.read_text() == "keep me\n"
    victim.unlink()


def test_write_atomic_refuses_special_targets_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    write_atomic(target, "one")
    write_atomic(target, b"two")  # a regular file is replaced
    assert target.read_text() == "two" and sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(target)
    (tmp_path / "dir").mkdir()
    for name, what in (("fifo", "a FIFO"), ("link", "symbolic link"), ("dir", "a directory")):
        with pytest.raises(UnsafeFile, match=what):
            write_atomic(tmp_path / name, "x")
    assert target.read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "fifo", "link", "t.txt"]
    with pytest.raises(UnsafeFile, match="cannot open the folder"):
        write_atomic(tmp_path / "t.txt" / "under-a-file", "x")
