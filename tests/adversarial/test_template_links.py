"""A family folder cannot make a template read outside it through a linked folder.

The loader checked only the last component of an included name: with ``ln -s /etc fam/sub``,
``{% include "sub/passwd" %}`` rendered ``root:x:0:0:...`` into the kernel (and so into a store and a wheel);
nested links (``a/b/c -> /etc``), ``{% import %}`` and ``{% extends %}`` did the same. The loader now opens
each component relative to the folder before it, never through a link (``_safeio.open_inside``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from .test_cli_fuzz import run_cli

SECRET = "root:x:0:0:i27-secret-line"
#: How each directive pulls an outside file into the kernel's source block (as a comment: the kernel still
#: compiles, so without the fix a search proves and publishes it, the outside text inside).
DIRECTIVES: dict[str, Callable[[str, str], str]] = {
    "include": lambda text, name: text.replace("{% block source %}", "{% block source %}// {% include \"" + name
                                               + "\" %}", 1),
    "import": lambda text, name: text.replace("{% block source %}", "{% block source %}{% from \"" + name
                                              + "\" import leak %}// {{ leak() }}\n", 1),
    "extends": lambda text, name: ("{% extends \"" + name + "\" %}{% block header %}{% endblock %}"
                                   "{% block source %}{{ leak() }}{% endblock %}"),
}
#: What the outside file holds for each directive (a plain file, a macro library, a base template).
OUTSIDE = {"include": SECRET + "\n",
           "import": "{% macro leak() %}" + SECRET + "{% endmacro %}",
           "extends": "{% macro leak() %}" + SECRET + "{% endmacro %}{% block header %}{% endblock %}"
                      "{% block source %}{% endblock %}"}
LINKS = {"one level": ["sub"], "nested": ["a", "b", "c"]}


def _family(hostile_family, tmp_path: Path, directive: str, depth: str) -> Path:
    """A gemm copy whose Metal template pulls ``<link>/outside.j2`` in, the link leading out of the folder."""
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "outside.j2").write_text(OUTSIDE[directive])
    parts = LINKS[depth]
    name = "/".join([*parts, "outside.j2"])
    folder = hostile_family(metal=lambda t: DIRECTIVES[directive](t, name), name=f"fam-{directive}-{len(parts)}")
    inner = folder.joinpath(*parts[:-1])
    inner.mkdir(parents=True, exist_ok=True)
    (inner / parts[-1]).symlink_to(outside, target_is_directory=True)
    return folder


def _no_leak(code: int, stdout: str, stderr: str) -> None:
    assert SECRET not in stdout and SECRET not in stderr, (stdout[-500:], stderr[-500:])
    assert "Traceback" not in stderr, stderr[-3000:]


@pytest.mark.parametrize("depth", sorted(LINKS))
@pytest.mark.parametrize("directive", sorted(DIRECTIVES))
def test_render_cannot_read_through_a_linked_folder(hostile_family, tmp_path: Path, directive: str,
                                                     depth: str) -> None:
    folder = _family(hostile_family, tmp_path, directive, depth)
    code, stdout, stderr = run_cli(["render", str(folder), "--chip", "M2 Max"], tmp_path)
    _no_leak(code, stdout, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "linked folder (refused)" in lines[0], (code, stderr)


def test_a_link_inside_the_family_to_its_own_folder_is_refused_too(hostile_family, tmp_path: Path) -> None:
    """No link is followed on the way (issue 39: a resolved path can be raced), even one that stays inside."""
    folder = hostile_family(metal=lambda t: DIRECTIVES["include"](t, "alias/part.j2"), name="fam-inside")
    (folder / "parts").mkdir()
    (folder / "parts" / "part.j2").write_text("// an included part\n")
    (folder / "alias").symlink_to(folder / "parts", target_is_directory=True)
    code, stdout, stderr = run_cli(["render", str(folder), "--chip", "M2 Max"], tmp_path)
    assert code == 2 and "// an included part" not in stdout and "linked folder (refused)" in stderr, stderr


@pytest.mark.slow
@pytest.mark.parametrize(("directive", "depth"), [("include", "one level"), ("extends", "nested")])
def test_verify_cannot_read_through_a_linked_folder(hostile_family, tmp_path: Path, directive: str,
                                                     depth: str) -> None:
    folder = _family(hostile_family, tmp_path, directive, depth)
    code, stdout, stderr = run_cli(["verify", str(folder), "--chip", "M2 Max", "--shape", "64,64,64",
                                    "--dtype", "float32"], tmp_path, bound=120)
    _no_leak(code, stdout, stderr)
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "linked folder" in stderr, (code, stderr)


@pytest.mark.slow
def test_tune_cannot_read_through_a_linked_folder(hostile_family, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _family(hostile_family, tmp_path, "import", "nested")
    store = tmp_path / "store"
    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERNSEARCH_ARTIFACTS", str(store))
    code, stdout, stderr = run_cli(["tune", str(folder), "--backend", "model", "--chip", "M2 Max", "--shape",
                                    "64,64,64", "--dtype", "float32", "--trials", "2", "--storage", ":memory:",
                                    "--publish"], tmp_path, bound=300)
    _no_leak(code, stdout, stderr)
    assert code != 0, stdout
    written = [p for p in store.rglob("*") if p.is_file()] if store.exists() else []
    assert not any(SECRET in p.read_text(errors="replace") for p in written)
    assert not any(re.fullmatch(r"v[0-9]+", p.name) for p in store.rglob("*")) if store.exists() else True
