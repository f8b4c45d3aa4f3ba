"""Family composition: the shared template library (``_lib/NAME``: templates/_lib) a family template may import,
and ``extends``, a spec made of another family's plus its own changes. The sandbox reads the family folder and
the library only (real paths checked, no links); a malformed, unknown or cyclic ``extends`` is a one-line error
(exit 2); a store's snapshot keeps the library files and base specs a version was rendered from."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from jinja2 import TemplateNotFound

from kernsearch import load_family, render
from kernsearch._errors import SpecError
from kernsearch.family._extends import merge
from kernsearch.family._template import FolderLoader, TemplateSandbox, library_dir

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = ('{% import "_lib/qmatvec.metal.j2" as core with context %}\n'
            "{% block header %}{{ core.header() }}{% endblock %}\n{% block source %}{{ core.source() }}{% endblock %}\n")


def _user_family(tmp_path: Path, spec: str, template: str = TEMPLATE, name: str = "myq") -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    (folder / "family.toml").write_text(spec)
    (folder / "k.metal.j2").write_text(template)
    return folder


EXTENDING = 'extends = "qmatvec"\nname = "myq"\n[templates]\nmetal = "k.metal.j2"\n'


# -- merge rules ---------------------------------------------------------------------------------------------

def test_tables_merge_by_key_named_arrays_by_name_and_other_values_are_replaced() -> None:
    base = {"name": "b", "problem": {"dims": ["M", "N"], "flops": "1"}, "derived": {"A": "1", "B": "A"},
            "inputs": [{"name": "X", "shape": "[M]"}, {"name": "W", "shape": "[N]", "distribution": {"kind": "packed",
                                                                                                     "bits": 4}}],
            "constraints": [{"name": "c1", "expr": "1"}], "consumer_modes": ["graph"],
            "templates": {"metal": "b.metal.j2", "cuda": "b.cu.j2"}}
    over = {"name": "o", "problem": {"flops": "2"}, "derived": {"A": "2", "C": "B"},
            "inputs": [{"name": "W", "distribution": {"bits": 8}}, {"name": "g", "shape": "[K]"}],
            "constraints": [{"name": "c2", "expr": "0"}], "consumer_modes": ["eager"], "templates": {"metal": "o.j2"}}
    out = merge(base, over)
    assert out["name"] == "o" and out["problem"] == {"dims": ["M", "N"], "flops": "2"}
    assert list(out["derived"].items()) == [("A", "2"), ("B", "A"), ("C", "B")]  # an override keeps its place
    assert out["inputs"] == [{"name": "X", "shape": "[M]"},
                             {"name": "W", "shape": "[N]", "distribution": {"kind": "packed", "bits": 8}},
                             {"name": "g", "shape": "[K]"}]
    assert [c["name"] for c in out["constraints"]] == ["c1", "c2"] and out["consumer_modes"] == ["eager"]
    assert out["templates"] == {"metal": "o.j2"}  # the extending folder's own files, replaced whole
    assert base["problem"]["flops"] == "1" and base["inputs"][1]["distribution"]["bits"] == 4  # inputs untouched


def test_a_user_family_extends_a_builtin_and_renders_the_shared_core(tmp_path: Path) -> None:
    """A folder of two short files is qmatvec: the same space, the same kernel (the library's core)."""
    q = load_family("qmatvec")
    fam = load_family(str(_user_family(tmp_path, EXTENDING)))
    assert fam.name == "myq" and fam.knobs == q.knobs and fam.default == q.default and fam.bases == [q.path / "family.toml"]
    mine, theirs = render(fam, dict(fam.default), "float16", "metal"), render(q, dict(q.default), "float16", "metal")
    assert mine.source == theirs.source and mine.header.replace("myq", "qmatvec") == theirs.header


# -- malformed extends: one line, exit 2 ---------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "says"), [
    ('extends = "nosuchfamily"\nname = "myq"\n', "extends: unknown family 'nosuchfamily'"),
    ('extends = 3\nname = "myq"\n', "extends: '3' is not a family name"),
    ('extends = "../qmatvec"\nname = "myq"\n', "is not a family name"),
    ('extends = "qmatvec"\n', "must give its own name"),
])
def test_a_bad_extends_is_a_one_line_error(tmp_path: Path, spec: str, says: str) -> None:
    folder = _user_family(tmp_path, spec)
    with pytest.raises(SpecError, match=says.replace("(", r"\(")) as caught:
        load_family(str(folder))
    assert "\n" not in str(caught.value)


@pytest.mark.slow
def test_the_cli_says_a_bad_extends_in_one_line_and_exits_2(tmp_path: Path) -> None:
    folder = _user_family(tmp_path, 'extends = "nosuchfamily"\nname = "myq"\n')
    done = subprocess.run([sys.executable, "-m", "kernsearch", "space", str(folder)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KERNSEARCH_HOME": str(tmp_path)})
    assert done.returncode == 2 and "extends: unknown family 'nosuchfamily'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


def test_a_cycle_of_extends_is_refused(tmp_path: Path) -> None:
    """Bases come from the folder's own ``_extends`` when it has one (as a snapshot does): a -> b -> a."""
    folder = _user_family(tmp_path, 'extends = "a"\nname = "myq"\n')
    for me, other in (("a", "b"), ("b", "a")):
        (folder / "_extends" / me).mkdir(parents=True)
        (folder / "_extends" / me / "family.toml").write_text(f'extends = "{other}"\nname = "{me}"\n')
    with pytest.raises(SpecError, match=r"extends: a cycle \(myq -> a -> b -> a\)"):
        load_family(str(folder))


def test_a_linked_extends_folder_is_refused(tmp_path: Path) -> None:
    folder = _user_family(tmp_path, EXTENDING)
    (folder / "_extends").symlink_to(REPO / "templates")
    with pytest.raises(SpecError, match="not in a plain folder"):
        load_family(str(folder))


# -- the library in the sandbox -------------------------------------------------------------------------------

def test_the_library_is_readable_and_nothing_beside_it(tmp_path: Path) -> None:
    folder = _user_family(tmp_path, EXTENDING)
    loader = FolderLoader(folder)
    assert "macro source()" in loader.get_source(None, "_lib/qmatvec.metal.j2")[0]
    assert loader.library == library_dir() and (library_dir() / "qmatvec.cu.j2").is_file()
    for name in ("_lib/../qmatvec/family.toml", "_lib/../../README.md", "../myq/k.metal.j2", "_lib/.hidden",
                 "_lib//qmatvec.metal.j2", "/etc/passwd", "_lib"):
        with pytest.raises(TemplateNotFound):
            loader.get_source(None, name)


def test_links_in_the_library_are_refused(tmp_path: Path) -> None:
    """A file link and a linked folder inside the library lead nowhere, whatever they point at."""
    library = tmp_path / "lib"
    library.mkdir()
    (library / "core.j2").write_text("{% macro f() %}x{% endmacro %}")
    (library / "secret.j2").symlink_to(REPO / "README.md")
    (library / "sub").symlink_to(REPO / "templates" / "qmatvec")
    folder = _user_family(tmp_path, EXTENDING)
    loader = FolderLoader(folder, library)
    assert "macro f()" in loader.get_source(None, "_lib/core.j2")[0]
    with pytest.raises(TemplateNotFound, match="symbolic link"):
        loader.get_source(None, "_lib/secret.j2")
    with pytest.raises(TemplateNotFound, match="linked folder"):
        loader.get_source(None, "_lib/sub/family.toml")
    env = TemplateSandbox(folder, library)
    with pytest.raises(TemplateNotFound):
        env.from_string('{% include "_lib/secret.j2" %}').render()


def test_a_folders_own_lib_stands_for_the_library_and_a_linked_one_is_refused(tmp_path: Path) -> None:
    """A family folder with a ``_lib`` of its own (a store's snapshot) reads that one, never the built-in one;
    a ``_lib`` that is a link to elsewhere is refused like any linked folder."""
    folder = _user_family(tmp_path, EXTENDING)
    shutil.copytree(library_dir(), folder / "_lib")
    core = folder / "_lib" / "qmatvec.metal.j2"
    core.write_text(core.read_text().replace("constexpr int QB = {{ QBITS }};", "constexpr int QB = {{ QBITS }}; // own"))
    fam = load_family(str(folder))
    assert "// own" in render(fam, dict(fam.default), "float16", "metal").source
    other = _user_family(tmp_path / "b", EXTENDING)
    (other / "_lib").symlink_to(library_dir())
    with pytest.raises(TemplateNotFound, match="linked folder"):
        FolderLoader(other).get_source(None, "_lib/qmatvec.metal.j2")


def test_only_macros_of_an_imported_template_are_reachable(tmp_path: Path) -> None:
    """``core.NAME`` reaches the library's macros, not the module's other attributes (its exported names or
    internals)."""
    from jinja2.exceptions import SecurityError, UndefinedError

    library = tmp_path / "lib"
    library.mkdir()
    (library / "m.j2").write_text('{% set secret = "s" %}{% macro f() %}ok{% endmacro %}')
    env = TemplateSandbox(_user_family(tmp_path, EXTENDING), library)
    assert env.from_string('{% import "_lib/m.j2" as m %}{{ m.f() }}').render() == "ok"
    for attr in ("secret", "_body_stream", "__class__"):
        with pytest.raises((SecurityError, UndefinedError)):
            env.from_string('{% import "_lib/m.j2" as m %}{{ m.' + attr + " }}").render()


# -- snapshots keep what a version was rendered from ------------------------------------------------------


def test_a_sandbox_reads_and_compiles_an_imported_template_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Every render imports the library ``with context``: the sandbox keeps what it read (was: read and compiled
    again on every render, 0.14 s each, most of a tune's or a sweep's rendering time)."""
    library = tmp_path / "lib"
    library.mkdir()
    (library / "m.j2").write_text("{% macro f() %}{{ x }}{% endmacro %}")
    reads: list[str] = []
    served = FolderLoader.get_source
    monkeypatch.setattr(FolderLoader, "get_source", lambda self, env, name: (reads.append(name), served(self, env, name))[1])
    env = TemplateSandbox(_user_family(tmp_path, EXTENDING), library)
    tmpl = env.from_string('{% import "_lib/m.j2" as m with context %}{{ m.f() }}')
    assert [tmpl.render(x=x) for x in (1, 2, 3)] == ["1", "2", "3"]  # the importing context still reaches it
    assert reads == ["_lib/m.j2"] and list(env.loader.loaded) == ["_lib/m.j2"]  # type: ignore[union-attr]

@pytest.mark.slow
def test_a_published_fused_version_keeps_its_library_and_base_spec(tmp_path: Path) -> None:
    from kernsearch import ArtifactStore, Candidate, Space, get_chip, make_problem
    from kernsearch.artifacts._manifest import Correctness, Measurements
    from kernsearch.artifacts._snapshot import family_files

    fam = load_family("rmsnorm_qmatvec")
    files = family_files(fam, "metal", dict(fam.default), "float16")
    assert set(files) == {"family.toml", "rmsnorm_qmatvec.metal.j2", "rmsnorm_qmatvec.cu.j2",
                          "_lib/qmatvec.metal.j2", "_extends/qmatvec/family.toml"}
    assert files["_extends/qmatvec/family.toml"] == (REPO / "templates/qmatvec/family.toml").read_bytes()
    chip = get_chip("M2 Max")
    space = Space(make_problem(fam, "1,256,256,32,4", "float16", chip), chip)
    store = ArtifactStore(tmp_path / "store")
    corr = Correctness(verifier="interpreter", passed=True, shapes_checked=["1x256x256x32x4"], max_abs_error=0.0,
                       checks_run=1)
    outcome = store.publish(Candidate.for_config(space, dict(fam.default), target="metal", evidence="modeled",
                                                 correctness=corr, measurements=Measurements(median_ms=1.0, spread=0.0)))
    assert outcome.published, outcome.reason
    done = subprocess.run([sys.executable, "-m", "kernsearch", "artifacts", "verify", "--store",
                           str(tmp_path / "store")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERNSEARCH_HOME": str(tmp_path)})
    assert done.returncode == 0 and "1 version(s) verified" in done.stdout, done.stdout + done.stderr
