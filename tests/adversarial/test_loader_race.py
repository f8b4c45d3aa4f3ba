"""Issue 39, case 1: a folder swapped for a link while templates load never leads a read outside the family.

The attack: a family template includes ``sub/passwd`` while another process keeps swapping ``sub`` between a
real folder and a link to a folder outside (``/etc``). The loader resolved the path twice (a real-path check,
then a walk of the resolved folders, which could hold ``..`` steps that ``O_NOFOLLOW`` does not stop): in 15
of 600 in-process renders it read the outside file. It now opens each component relative to the previous
folder's descriptor with ``O_NOFOLLOW`` (``_safeio.open_inside``), so there is no second resolution to race.

The race is run a bounded number of times (a swapper thread, reads in the test's thread); the test must never
see the outside text. Against the old loader it saw it in nearly every run of this loop (checked when written).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernsearch import _safeio
from kernsearch.family._template import FolderLoader

SECRET = "root:x:0:0:i39-outside-line"
READS = 3000


@pytest.fixture
def swapped(tmp_path: Path) -> Iterator[Callable[[], None]]:
    """A family folder whose ``sub`` a thread swaps between a real folder and a link to ``outside``."""
    fam, outside = tmp_path / "fam", tmp_path / "outside"
    fam.mkdir()
    outside.mkdir()
    (outside / "passwd").write_text(SECRET + "\n")
    (fam / "sub").mkdir()
    (fam / "sub" / "passwd").write_text("inside\n")
    (fam / "sub-link").symlink_to(outside, target_is_directory=True)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            os.rename(fam / "sub", fam / "sub-dir")
            os.rename(fam / "sub-link", fam / "sub")
            os.rename(fam / "sub", fam / "sub-link")
            os.rename(fam / "sub-dir", fam / "sub")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        yield lambda: None
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(old)


@pytest.mark.slow
def test_reads_never_leave_the_folder_while_a_folder_is_swapped_for_a_link(tmp_path: Path, swapped) -> None:
    fam = tmp_path / "fam"
    inside = refused = 0
    for _ in range(READS):
        try:
            text = _safeio.read_inside(fam, ["sub", "passwd"]).decode()
        except _safeio.UnsafeFile:
            refused += 1
            continue
        assert SECRET not in text, "read the outside file through a swapped folder"
        inside += 1
    assert inside and refused  # both states were seen: the swap raced the reads


@pytest.mark.slow
def test_the_template_loader_never_serves_the_outside_file(tmp_path: Path, swapped) -> None:
    loader = FolderLoader(tmp_path / "fam")
    for _ in range(READS // 3):
        try:
            text, _, _ = loader.get_source(None, "sub/passwd")
        except Exception:  # TemplateNotFound: refused, or not there at that instant
            continue
        assert SECRET not in text


def test_a_linked_folder_inside_the_family_is_refused_too(tmp_path: Path) -> None:
    """No link is followed on the way, even one that stays inside (there is nothing to resolve twice)."""
    fam = tmp_path / "fam"
    (fam / "real").mkdir(parents=True)
    (fam / "real" / "a.j2").write_text("x")
    (fam / "alias").symlink_to(fam / "real", target_is_directory=True)
    assert _safeio.read_inside(fam, ["real", "a.j2"]) == b"x"
    with pytest.raises(_safeio.UnsafeFile, match="linked folder"):
        _safeio.read_inside(fam, ["alias", "a.j2"])
    with pytest.raises(_safeio.UnsafeFile, match="plain name"):
        _safeio.read_inside(fam, ["real", "..", "real", "a.j2"])
