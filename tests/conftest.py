"""Shared fixtures. Tests never touch the user's data directories: KERNSEARCH_HOME/CACHE/KERNEL_CACHE point at
tmp."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Where the suite keeps compiled bytecode when the environment asks for none beside the sources.
PYCACHE = REPO / ".kernsearch" / "pycache"


def pytest_configure(config: pytest.Config) -> None:
    keep_bytecode_outside_the_sources()
    fault_big_arrays_in_small_pages()
    one_blas_thread_a_process()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest test files first (tests/schedule.py): make test's workers take whole files in this order."""
    from schedule import file_seconds, longest_files_first

    longest_files_first(items, file_seconds())


def keep_bytecode_outside_the_sources() -> None:
    """Where ``PYTHONDONTWRITEBYTECODE`` is set (containers often set it; this project's development machine does),
    every Python process the suite starts compiled kernsearch's modules and the tests again from their sources:
    the xdist workers, hundreds of ``kernsearch`` commands and search workers, ~0.15 s of CPU each and several
    seconds a worker (issue 42). The suite writes their bytecode to :data:`PYCACHE` instead (``PYTHONPYCACHEPREFIX``,
    for this process and every process it starts), never beside the sources, which the variable keeps clean; a
    prefix the environment names is kept. Called before the workers start (pytest_configure)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    prefix = os.environ.setdefault("PYTHONPYCACHEPREFIX", str(PYCACHE))
    sys.dont_write_bytecode = False
    sys.pycache_prefix = prefix


def fault_big_arrays_in_small_pages() -> None:
    """NumPy asks Linux for transparent huge pages for every big array (``madvise``); where the kernel gives them only
    on that request (``enabled: [madvise]``, this project's VMs), each 2 MB page is found and zeroed on its first touch,
    and the suite's big arrays are nearly all fresh, short-lived and touched once (the winner's check at a tuned shape:
    its inputs, the kernel's buffers, the float64 reference). There they cost more than they save: `tune swiglu --trials
    4` at its default shape, 14.7-16.0 -> 10.2-12.8 s of CPU (sys 7.2-8.3 -> 3.5-5.2 s), the same results
    (benchmarks/test_suite_time.txt, eighth pass). So the suite sets ``NUMPY_MADVISE_HUGEPAGE=0`` (NumPy's own switch,
    read when it is imported) for the workers and every process they start, unless the environment names a value; the
    product is not changed (a user's machine decides for itself). Called before the workers start (pytest_configure)."""
    os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")


def one_blas_thread_a_process() -> None:
    """NumPy's OpenBLAS starts a thread per core in every process that multiplies a matrix (the float64 references)
    and its idle threads spin before they sleep; make test runs three workers and their commands on two cores, so
    those threads only take CPU from each other: `kernsearch verify gemm` at 4096x4096x4096, 10.6 -> 8.6 s of CPU
    and 9.5 -> 8.7 s of wall on an idle machine with one thread (benchmarks/test_suite_time.txt, tenth pass). So the
    suite sets ``OPENBLAS_NUM_THREADS=1`` for the workers and every process they start, unless the environment names
    a value; the product is not changed. Called before the workers start (pytest_configure)."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@cache
def _spec_view(name: str) -> tuple[tuple[str, ...], tuple[str, ...], frozenset[str]]:
    """(problem dims, the families it is built on, its knobs) of a built-in family, read off its family.toml and
    those it extends (the nearest spec that says a thing says it): cheap enough for collection time, where the
    full load of every family (its templates compiled) took seconds in each worker. tests/test_packaging.py
    checks it against load_family."""
    import tomllib

    from kernsearch.family._spec import builtin_families_dir

    spec = tomllib.loads((builtin_families_dir() / name / "family.toml").read_text(encoding="utf-8"))
    base = spec.get("extends")
    dims, bases, knobs = _spec_view(base) if base else ((), (), frozenset())
    return (tuple(spec.get("problem", {}).get("dims", dims)), (base, *bases) if base else (),
            knobs | set(spec.get("knobs", {})))


def builtin_families(*, dims: int | None = None, built_on: str | None = None, knob: str | None = None) -> list[str]:
    """The built-in families found in the package's family folders (never a list kept by hand: a new folder is
    tested by every test that iterates them), narrowed by what a test needs of them: ``dims`` problem dimensions
    (2: the row families, a row count and a row length), ``built_on`` a family (itself and every family that
    extends it, directly or not), a ``knob`` they all have. Tests keep their per-family expectations in tables
    keyed by name and check that the table covers what this finds, so a new family fails until it has its own."""
    from kernsearch.family._spec import builtin_family_names

    found = []
    for name in builtin_family_names():
        problem_dims, bases, knobs = _spec_view(name)
        if dims is not None and len(problem_dims) != dims:
            continue
        if built_on is not None and built_on != name and built_on not in bases:
            continue
        if knob is not None and knob not in knobs:
            continue
        found.append(name)
    return found


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.getbasetemp() / "kernsearch-home"
    monkeypatch.setenv("KERNSEARCH_HOME", str(home))
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    # CUDA kernel texts handed to MLX as an #include of a file (_rules_include) go to the session's tmp, not ~/.cache
    monkeypatch.setenv("KERNSEARCH_KERNEL_CACHE", str(tmp_path_factory.getbasetemp() / "kernel-cache"))
    if "KERNSEARCH_CACHE" not in os.environ:
        # Compiled interpreter objects are keyed by source, flags, shim and compiler version, so the cache
        # is safe to keep across runs (the fast lane reuses it); CI starts from a clean clone anyway.
        monkeypatch.setenv("KERNSEARCH_CACHE", str(REPO / ".kernsearch" / "test-cache"))


#: A family folder the session's wheel is built with that no file of the repository names (a copy of gemm):
#: the build must find and ship it as it finds the built-in ones (setup.py), with no edit anywhere.
UNLISTED_FAMILY = "zz_unlisted_family"


@pytest.fixture(scope="session")
def kernsearch_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kernsearch built as a wheel (pip, as a user builds it), once per session; pip's output is in
    ``build.log`` beside it. Built from a copy of the checkout: setuptools writes ``build/`` into the source
    tree it builds, and the suite must leave the repository as it found it (tests/adversarial/conftest.py).
    The copy has one family folder more, :data:`UNLISTED_FAMILY`, as a contributor adds one."""
    import shutil
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source") / "kernsearch"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis", ".kernsearch",
        "test-artifacts", ".gpuwheels"))
    added = source / "templates" / UNLISTED_FAMILY
    shutil.copytree(source / "templates" / "gemm", added)
    spec = added / "family.toml"
    spec.write_text(spec.read_text().replace('name = "gemm"', f'name = "{UNLISTED_FAMILY}"', 1))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                            "-w", str(out), str(source)], check=True, capture_output=True, text=True, timeout=300)
    (out / "build.log").write_text(built.stdout + built.stderr)
    (whl,) = out.glob("kernsearch-*.whl")
    return whl


@pytest.fixture(scope="session")
def gemm():
    from kernsearch import load_family

    return load_family("gemm")


@pytest.fixture(scope="session")
def hashes_in_fresh_process():
    """``f(chip, configs, target)``: sha256 of each config's 64³ float16 rendering, computed in a new process."""
    import subprocess
    import sys

    def run(chip: str, configs: list[str], target: str = "metal") -> list[str]:
        code = ("from kernsearch.hardware._chips import get_chip; from kernsearch.family._space import Space, make_problem;"
                "from kernsearch.family._spec import load_family; from kernsearch.family._render import render;"
                f"f=load_family('gemm'); c=get_chip({chip!r}); sp=Space(make_problem(f,'64,64,64','float16',c),c);"
                f"print(' '.join(render(f, sp.parse_config(t), 'float16', {target!r}).sha256 for t in {configs!r}))")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.split()

    return run


def kernsearch_in_process(*args: str, env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                          ) -> subprocess.CompletedProcess[str]:
    """``kernsearch ARGS`` through its entry point (``kernsearch.cli.main``) in this process: the exit code, standard
    output and standard error a ``python -m kernsearch ARGS`` process gives, without starting one (~0.8 s of CPU
    each; issue 42). For the many cases of one behaviour (bad input is one line and exit 2); each such test keeps a
    real process for one of its cases, which also proves what only a process shows (its exit status, a traceback
    on stderr). ``env`` is added to the environment and ``cwd`` entered for the call, both restored after. An
    exception the entry point lets through (a traceback, in a process) is raised here."""
    import contextlib
    import io

    from kernsearch.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved, here = dict(os.environ), os.getcwd()
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
                code = 0
            except SystemExit as exited:
                code = exited.code if isinstance(exited.code, int) else 0 if exited.code is None else 1
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(saved)
    return subprocess.CompletedProcess(["kernsearch", *args], code, out.getvalue(), err.getvalue())
