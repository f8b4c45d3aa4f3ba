"""Packaging: the wheel carries the templates and the chip registry and works outside the repo."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import UNLISTED_FAMILY, builtin_families

REPO = Path(__file__).resolve().parents[1]


def test_building_prints_no_setuptools_warnings(kernsearch_wheel: Path) -> None:
    """pyproject.toml is clean: a user installing kernsearch sees no wall of setuptools warnings."""
    log = (kernsearch_wheel.parent / "build.log").read_text()
    warnings = [line.strip() for line in log.splitlines() if "Warning:" in line]
    assert not warnings, "\n".join(warnings) + "\n(a folder setup.py does not find as a package?)"


def test_wheel_contains_templates_and_data(kernsearch_wheel: Path) -> None:
    names = set(zipfile.ZipFile(kernsearch_wheel).namelist())
    for required in ["kernsearch/__init__.py", "kernsearch/cli.py", "kernsearch/hardware/chips.toml",
                     "kernsearch/backends/_base.py", "kernsearch/templates/gemm/family.toml",
                     "kernsearch/templates/gemm/gemm.metal.j2", "kernsearch/templates/gemm/gemm.cu.j2",
                     "kernsearch/flows/__init__.py", "kernsearch/exporting/runtime/_runtime.py"]:
        assert required in names, required
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "kernsearch = kernsearch.cli:main" in zipfile.ZipFile(kernsearch_wheel).read(entry_points).decode()


def test_wheel_ships_every_family_folder_found_listed_or_not(kernsearch_wheel: Path) -> None:
    """Family folders are discovered at build time (setup.py): every file of every built-in family, and of a
    folder added that nothing lists, is in the wheel (with no setuptools warning: the test above)."""
    names = set(zipfile.ZipFile(kernsearch_wheel).namelist())
    families = builtin_families()
    assert len(families) >= 12
    for family in [*families, UNLISTED_FAMILY]:
        folder = REPO / "templates" / (family if family != UNLISTED_FAMILY else "gemm")
        files = sorted(p.name for p in folder.iterdir() if p.is_file())
        assert "family.toml" in files
        for name in files:
            assert f"kernsearch/templates/{family}/{name}" in names, (family, name)
    assert "kernsearch/templates/_lib/qmatvec.metal.j2" in names  # the shared template library too


@pytest.mark.slow
def test_the_families_found_for_tests_are_what_the_loader_says() -> None:
    """conftest.builtin_families reads the spec files (collection time); the loader agrees with every narrowing."""
    from kernsearch.family._spec import builtin_family_names, load_family

    specs = [load_family(name) for name in builtin_family_names()]
    assert builtin_families() == [f.name for f in specs]
    assert builtin_families(dims=2) == [f.name for f in specs if len(f.problem.dims) == 2]
    for base in ("qmatvec", "swiglu_qmatvec", "gemm"):
        assert builtin_families(built_on=base) == [
            f.name for f in specs if f.name == base or base in {b.parent.name for b in f.bases}]
    for knob in ("HOLD", "PATH", "MB"):
        assert builtin_families(knob=knob) == [f.name for f in specs if knob in f.knobs]


@pytest.mark.slow
def test_installed_wheel_works_outside_the_repo(kernsearch_wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(target), str(kernsearch_wheel)], check=True, capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = ("import kernsearch, kernsearch.flows; from kernsearch.family._spec import load_family;"
            "f = load_family('gemm'); print(kernsearch.__file__); print(f.path)")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True)
    module_file, family_path = res.stdout.split()
    assert module_file.startswith(str(target)) and family_path.startswith(str(target))
    script = target / "bin" / "kernsearch"
    res = subprocess.run([sys.executable, str(script), "families"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "gemm" in res.stdout, res.stderr
    assert UNLISTED_FAMILY in res.stdout  # the unlisted folder is a family of the installed package


def test_editable_install_is_what_tests_run_against() -> None:
    import kernsearch

    # `make test` installs with `pip install -e .`: the package must resolve to this checkout's search/
    assert Path(kernsearch.__file__).resolve().parent == REPO / "search"
