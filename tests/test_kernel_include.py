"""CUDA kernel texts reach MLX as ``#include "<file>"`` (``_rules_include``): MLX's CUDA back-end rebuilds a custom
kernel's whole text on every call and hashes it on every eval, so the compact text is written once to
``<sha256>.cuh`` in a private per-user folder and the factory gets one line naming it, with the input shape names
MLX looks for kept in view. Nothing about the folder or the file is trusted: wherever either could be someone
else's, or the path cannot be spelled in an include line, the factory gets the text itself. The search's device
runs and the exported package's runtime build through the same function; the include form compiles to the same
PTX as the text inline."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from kernsearch import _rules_include
from kernsearch._rules import compact, factory_texts, kernel_text
from kernsearch._rules_include import CACHE_ENV, CacheFolder, cache_folder, included

#: A CUDA body naming shapes, strides and ndim of some inputs (and a name that merely ends like one).
BODY = ("// a comment that compact drops\n"
        "    int n = W_shape[0] + X_strides[1] * Bq_ndim;\n"
        "    float max_shape_seen = 0.0f;  // 'max' is no input, but MLX finds 'x_shape' in it\n"
        "    Y[0] = n + max_shape_seen;\n")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "home" / "kc"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


def _path_in(text: str) -> Path:
    found = re.fullmatch(r'#include "([^"]+)"\n(// [^\n]*\n)?', text)
    assert found, text
    return Path(found.group(1))


def _mlx_sees(source: str, name: str) -> tuple[bool, bool, bool]:
    """What MLX's cuda_kernel decides from the source it is handed (``source.find(n + "_shape")``...)."""
    return tuple(f"{name}{suffix}" in source for suffix in ("_shape", "_strides", "_ndim"))  # type: ignore[return-value]


# -- the texts ----------------------------------------------------------------------------------------------

def test_a_cuda_text_becomes_an_include_of_its_compact_text_with_the_shape_names_in_view(cache: Path) -> None:
    texts = factory_texts("cuda", "// why\n  struct A { int x; };\n", BODY)
    for text, original in ((texts.header, "// why\n  struct A { int x; };\n"), (texts.source, BODY)):
        path = _path_in(text)
        body = compact(original)
        assert path.parent == cache and path.name == hashlib.sha256(body.encode()).hexdigest() + ".cuh"
        assert path.read_text() == body and path.is_absolute()
    assert texts.header == f'#include "{_path_in(texts.header)}"\n'  # no shape name in it: no comment line
    assert texts.source.splitlines()[1] == "// Bq_ndim W_shape X_strides max_shape_seen"
    # MLX passes an input's shape, strides and ndim from what it finds in the source: the same for every name
    for name in ("W", "X", "Bq", "Y", "x", "max", "ax", "q", "shape", ""):
        assert _mlx_sees(texts.source, name) == _mlx_sees(compact(BODY), name), name


def test_the_same_text_is_one_file_and_metal_stays_inline_as_rendered(cache: Path) -> None:
    first, again = factory_texts("cuda", "", BODY), factory_texts("cuda", "", BODY)
    assert first == again and first.header == "\n" and len(list(cache.iterdir())) == 1  # an empty header: inline
    metal = factory_texts("metal", "// kept\n  int h;\n", BODY)
    assert metal.header == "// kept\n  int h;\n" and metal.source == BODY  # Metal: no compaction, no include
    assert factory_texts("a target no row names", "h", BODY).source == BODY  # the default row's (Metal's)


def test_the_folder_and_the_parents_it_needs_are_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a" / "b" / "c"))
    path = _path_in(included("int a;\n"))
    for folder in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert stat.S_IMODE(folder.lstat().st_mode) == 0o700, folder
    assert stat.S_IMODE(path.lstat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_the_folder_s_default_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder().path == str(tmp_path / "xdg" / "kernsearch" / "cuda-src")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_folder().path == str(tmp_path / "home" / ".cache" / "kernsearch" / "cuda-src")


# -- every fallback yields the text inline ------------------------------------------------------------------

def _inline(why: str) -> None:
    assert included("int a;\n") == "int a;\n"
    assert why in cache_folder().refused, cache_folder()


def _private(folder: Path) -> Path:
    folder.mkdir(parents=True, mode=0o700)
    return folder


def test_a_symlinked_folder_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "link").symlink_to(_private(tmp_path / "real"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "link"))
    _inline("is a symbolic link")
    assert not list((tmp_path / "real").iterdir())


def test_a_symlink_above_the_folder_is_followed_and_the_real_path_included(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's ``~/.cache`` may be a link to another disk: the include names the real path, checked."""
    (tmp_path / "cache").symlink_to(_private(tmp_path / "disk"))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache" / "ks"))
    assert _path_in(included("int a;\n")).parent == tmp_path / "disk" / "ks"


def test_a_component_we_create_that_turns_out_a_symlink_is_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    elsewhere = _private(tmp_path / "elsewhere")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "a" / "b"))
    made = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda path, mode=0o777: (os.symlink(elsewhere, path)
                                                               if str(path).endswith("/a") else made(path, mode)))
    # raced: refused (a link found there before we make it is a parent like any other: followed, its target checked)
    assert cache_folder() == CacheFolder(None, f"{tmp_path / 'a'} is a symbolic link")
    assert not list(elsewhere.iterdir())


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o720, 0o702])
def test_a_folder_others_may_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int) -> None:
    folder = _private(tmp_path / "kc")
    folder.chmod(mode)
    monkeypatch.setenv(CACHE_ENV, str(folder))
    _inline("writable by its group or others")


def test_a_folder_made_private_after_a_refusal_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _private(tmp_path / "kc")
    monkeypatch.setenv(CACHE_ENV, str(folder))
    assert _path_in(included("int a;\n")).parent == folder
    folder.chmod(0o777)  # changed after it was checked: checked again
    _inline("writable by its group or others")
    folder.chmod(0o700)
    assert _path_in(included("int a;\n")).parent == folder


def test_a_folder_above_that_others_may_write_is_refused_unless_sticky(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    shared = _private(tmp_path / "shared")
    shared.chmod(0o777)
    monkeypatch.setenv(CACHE_ENV, str(shared / "kc"))
    _inline("(above the folder) is writable by its group or others")
    shared.chmod(0o1777)  # as /tmp: no one can rename another's entry away
    assert _path_in(included("int a;\n")).parent == shared / "kc"


def _root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.mark.skipif(not _root(), reason="giving a folder to another user takes root")
def test_a_folder_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _private(tmp_path / "kc")
    os.chown(folder, 65534, 65534)
    monkeypatch.setenv(CACHE_ENV, str(folder))
    _inline("is not owned by uid 0")
    os.chown(folder, 0, 0)
    above = _private(tmp_path / "above")
    os.chown(above, 65534, 65534)
    monkeypatch.setenv(CACHE_ENV, str(above / "kc"))
    _inline("(above the folder) is owned by uid 65534")


def _as_nobody(folder: Path) -> str:
    """What ``included`` hands over, and why, in a process of uid 65534 (root may write any folder): the module
    alone, loaded from its file (standard library only, as an exported package loads it)."""
    probe = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('inc', sys.argv[1]); "
             "m = importlib.util.module_from_spec(spec); sys.modules['inc'] = m; spec.loader.exec_module(m); "
             "print(repr(m.included('int a;\\n')), m.cache_folder().refused)")
    module = folder.parent / "inc.py"  # where uid 65534 can read it (the interpreter: the system's, any Python)
    shutil.copyfile(_rules_include.__file__, module)
    module.chmod(0o644)
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"
    done = subprocess.run([python, "-c", probe, str(module)], capture_output=True, text=True,
                          timeout=60, user=65534, group=65534, cwd="/", env={CACHE_ENV: str(folder)})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_folder_we_cannot_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not _root():
        folder = tmp_path / "kc"
        folder.mkdir(mode=0o500)
        monkeypatch.setenv(CACHE_ENV, str(folder))
        _inline("is not writable")
        return
    # root may write any folder: uid 65534 tries, in a folder of its own it may not write, that it can reach
    reachable = Path(tempfile.mkdtemp(prefix="ks-include-", dir="/tmp"))
    try:
        reachable.chmod(0o755)
        folder = reachable / "kc"
        folder.mkdir(mode=0o500)
        os.chown(folder, 65534, 65534)
        monkeypatch.setenv(CACHE_ENV, str(folder))
        assert _as_nobody(folder) == f"'int a;\\n' {folder} is not writable\n"
        assert not list(folder.iterdir())
    finally:
        shutil.rmtree(reachable)


@pytest.mark.parametrize("name", ['q"uote', "back\\slash", "new\nline", "tab\there", "caf\u00e9", "tri??/graph",
                                  "W_shape"])
def test_a_path_that_cannot_be_spelled_in_an_include_line_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     name: str) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / name))
    _inline("cannot be spelled in an include line")


def test_a_path_with_a_nul_byte_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_rules_include, "_wanted", lambda: "/tmp/a\0b")
    _inline("embedded null byte")


def test_a_non_ascii_or_blank_text_stays_inline(cache: Path) -> None:
    assert included("float pi = 3.14f; // \u03c0\n") == "float pi = 3.14f; // \u03c0\n"
    assert included("\n") == "\n" and included("") == ""
    assert not cache.exists()


# -- the file: verified, rewritten or refused ---------------------------------------------------------------

def test_a_file_replaced_by_a_symlink_is_rewritten_and_its_target_left_alone(cache: Path, tmp_path: Path) -> None:
    path = _path_in(included("int a;\n"))
    decoy = tmp_path / "decoy"
    decoy.write_text("int b;\n")
    path.unlink()
    path.symlink_to(decoy)
    assert _path_in(included("int a;\n")) == path
    assert not path.is_symlink() and path.read_text() == "int a;\n" and decoy.read_text() == "int b;\n"


@pytest.mark.parametrize("other", ["int b;\n", "int a;\n// longer\n", ""])
def test_a_file_with_other_bytes_is_rewritten(cache: Path, other: str) -> None:
    path = _path_in(included("int a;\n"))
    path.write_text(other)
    assert _path_in(included("int a;\n")) == path and path.read_text() == "int a;\n"
    assert [p.name for p in cache.iterdir()] == [path.name]


def test_a_file_found_with_other_bytes_before_any_build_is_rewritten(cache: Path) -> None:
    cache.mkdir(parents=True, mode=0o700)
    path = cache / (hashlib.sha256(b"int c;\n").hexdigest() + ".cuh")
    path.write_text("int d;\n")  # the same size: the bytes are read
    assert _path_in(included("int c;\n")) == path and path.read_text() == "int c;\n"


def test_a_folder_or_fifo_in_the_file_s_place(cache: Path) -> None:
    cache.mkdir(parents=True, mode=0o700)
    name = hashlib.sha256(b"int a;\n").hexdigest() + ".cuh"
    (cache / name).mkdir()
    assert included("int a;\n") == "int a;\n"  # cannot be replaced: inline
    assert [p.name for p in cache.iterdir()] == [name]  # no temporary file left behind
    (cache / name).rmdir()
    os.mkfifo(cache / name)
    assert _path_in(included("int a;\n")) == cache / name  # a FIFO does not block the check; it is replaced
    assert (cache / name).read_text() == "int a;\n"


def test_a_verified_file_is_not_read_again_until_it_changes(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    included("int a;\n")
    reads: list[str] = []
    holds = _rules_include._holds
    monkeypatch.setattr(_rules_include, "_holds", lambda path, data: reads.append(path) or holds(path, data))
    path = _path_in(included("int a;\n"))
    assert reads == []
    path.write_text("int b;\n")
    included("int a;\n")
    assert reads == [str(path), str(path)] and path.read_text() == "int a;\n"  # found changed, rewritten, read back


# -- both places that build kernels hand the factory the same texts -----------------------------------------

def _record(target: str) -> dict[str, Any]:
    return {"name": "k", "input_names": ["W", "X", "Bq"], "output_names": ["Y"], "header": "// h\n  int h;\n",
            "source": BODY, "target": target, "sha256": "0" * 64}


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_the_runtime_builds_cuda_from_an_include_and_metal_inline(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 target: str) -> None:
    from kernsearch._rules_targets import kernel_factory
    from kernsearch.exporting.runtime import _runtime

    seen: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(_runtime, "kernel_factory",
                        lambda t: lambda **kw: seen.append((t, kw)) or f"kernel of {kernel_factory(t).__name__}")
    dispatcher = _runtime.Dispatcher.__new__(_runtime.Dispatcher)
    dispatcher._kernels, dispatcher.kernel_factory = {}, _runtime._mlx_kernel
    assert dispatcher._kernel(_record(target), 1024) == f"kernel of {target}_kernel"
    [(asked, args)] = seen
    assert asked == target and args["input_names"] == ["W", "X", "Bq"]
    if target == "cuda":
        assert args["shared_memory"] == 1024
        assert _path_in(args["source"]).read_text() == compact(BODY)
        assert _path_in(args["header"]).read_text() == "int h;\n"
    else:
        assert (args["source"], args["header"]) == (BODY, "// h\n  int h;\n")


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_the_search_s_backend_builds_from_the_same_texts(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                                         target: str) -> None:
    from kernsearch.backends._mlx_base import MLXBackend
    from kernsearch.family._render import Geometry, KernelSource
    from kernsearch.hardware import _targets

    seen: dict[str, Any] = {}
    monkeypatch.setattr(_targets, "kernel_factory", lambda _t: lambda **kw: seen.update(kw) or "kernel")
    source = KernelSource("k", target, ("W", "X", "Bq"), ("Y",), "// h\n  int h;\n", BODY)
    backend = object.__new__(MLXBackend)
    assert backend._make_kernel(source, Geometry((1, 1, 1), (1, 1, 1), ((1,),), ("float32",))) == "kernel"
    want = factory_texts(target, source.header, source.source)
    assert (seen["source"], seen["header"]) == (want.source, want.header)
    assert (seen["source"] == BODY) == (target == "metal")
    if target == "cuda":
        assert _path_in(seen["source"]).read_text() == kernel_text("cuda", BODY)


# -- the include form compiles to the same kernel -----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("family", ["qmatvec", "rmsnorm"])
def test_the_include_form_compiles_to_the_same_ptx_as_the_text_inline(cache: Path, tmp_path: Path,
                                                                    family: str) -> None:
    """Each translation unit as MLX's build_kernel joins it (the user header after MLX's prelude, the signature
    with the shape parameters MLX finds names for in the source it is handed, the body), compiled by nvcc for
    sm_90: the include form's PTX is the inline form's, byte for byte (but for the hash nvcc gives internal
    symbols, which is the main file's)."""
    from nvcc import NVCC
    from test_qmatvec_cuda import MLX_PRELUDE, mlx_kernel_text

    from kernsearch import Space, get_chip, load_family, make_problem, render

    if NVCC is None:
        pytest.skip("nvcc not installed")
    fam = load_family(family)
    chip = get_chip("H200")
    shape = "1,4096,4096,512,64" if family == "qmatvec" else "64,4096"
    space = Space(make_problem(fam, shape, "float16", chip), chip)
    kernel = render(fam, space.family.default, "float16", "cuda")
    inline = dataclasses.replace(kernel, header=kernel_text("cuda", kernel.header),
                                 source=kernel_text("cuda", kernel.source))
    texts = factory_texts("cuda", kernel.header, kernel.source)
    through = dataclasses.replace(kernel, header=texts.header, source=texts.source)
    assert re.search(r"\w+_shape", inline.source) and texts.source.startswith("#include")
    ptx = []
    for form, k in (("inline", inline), ("include", through)):
        header, body = mlx_kernel_text(fam, k, "float16", "custom_kernel_" + kernel.name)
        folder = tmp_path / form  # the same file name: nvcc names internal symbols after it
        folder.mkdir()
        (folder / "unit.cu").write_text(MLX_PRELUDE + header + "\n" + body)
        subprocess.run([NVCC, "-arch=sm_90", "-std=c++17", "--ptx", "unit.cu", "-o", "unit.ptx"],
                       check=True, capture_output=True, timeout=600, cwd=folder)
        # internal-linkage symbols (cuda::std's objects) carry a hash of the main file's text: named alike here
        ptx.append(re.sub(r"_INTERNAL_[0-9a-f]{8}_", "_INTERNAL_", (folder / "unit.ptx").read_text()))
    assert ".entry" in ptx[0] and ptx[0] == ptx[1]


def test_two_shared_memory_sizes_of_one_source_are_two_modules_for_mlx(cache: Path) -> None:
    """MLX keys a compiled module by name and source and opts it into > 48 KB only on first load: a kernel object
    of the same source with more shared memory must reach MLX as another text (seen failing on the H200)."""
    small, large = (factory_texts("cuda", "int h;\n", BODY, n) for n in (93024, 93568))
    assert small.source == large.source and small.header != large.header
    assert "93568" in large.header and factory_texts("cuda", "int h;\n", BODY, 0).header == included("int h;\n")
    assert factory_texts("metal", "int h;\n", BODY, 93568).header == "int h;\n"  # Metal fixes none at build


def test_the_runtime_names_the_kernel_s_shared_memory_in_what_mlx_hashes(cache: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from kernsearch.exporting.runtime import _runtime

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(_runtime, "kernel_factory", lambda t: lambda **kw: seen.append(kw) or len(seen))
    dispatcher = _runtime.Dispatcher.__new__(_runtime.Dispatcher)
    dispatcher._kernels, dispatcher.kernel_factory = {}, _runtime._mlx_kernel
    assert dispatcher._kernel(_record("cuda"), 60000) != dispatcher._kernel(_record("cuda"), 90000)
    assert seen[0]["header"] != seen[1]["header"] and "90000" in seen[1]["header"]
