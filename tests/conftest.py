"""Shared fixtures. Tests never touch the user's data directories: KERNSEARCH_HOME/CACHE point at tmp."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path_factory.getbasetemp() / "kernsearch-home"
    monkeypatch.setenv("KERNSEARCH_HOME", str(home))
    monkeypatch.setenv("DO_NOT_TRACK", "1")
    if "KERNSEARCH_CACHE" not in os.environ:  # compiled-object cache may be shared across tests
        monkeypatch.setenv("KERNSEARCH_CACHE", str(tmp_path_factory.getbasetemp() / "kernsearch-cache"))


@pytest.fixture(scope="session")
def gemm():
    from kernsearch._spec import load_family

    return load_family("gemm")
