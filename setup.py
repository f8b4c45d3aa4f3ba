"""The package list, discovered at build time: every folder under the three source roots of pyproject.toml's
``package-dir`` is a package (folders of data only, such as a kernel family's, as namespace packages), so a new
family folder under ``templates/`` ships without an edit here or in pyproject.toml. Everything else about the
build is declared in pyproject.toml."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
#: Import name -> source folder, as pyproject.toml's [tool.setuptools] package-dir maps them.
ROOTS = {"kernsearch": "search", "kernsearch.templates": "templates", "kernsearch.flows": "flows"}


def _shipped(folder: Path) -> bool:
    """A folder that holds files of its own or below (not a cache, not hidden)."""
    if folder.name == "__pycache__" or folder.name.startswith(".") or folder.name.endswith(".egg-info"):
        return False
    return any(p.is_file() and "__pycache__" not in p.parts for p in folder.rglob("*"))


def discovered_packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        root = HERE / folder
        for sub in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
            parts = sub.relative_to(root).parts
            if all(_shipped(root.joinpath(*parts[: i + 1])) for i in range(len(parts))):
                found.append(".".join([name, *parts]))
    return sorted(found)


setup(packages=discovered_packages())
