"""What is published and shipped: manifests re-validated on load, no generated code from data, per-file
tamper verdicts in the exported dispatcher."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernsearch import ArtifactStore, export
from kernsearch.artifacts._manifest import ArtifactError
from kernsearch.exporting._export import INIT_MODULE

from .conftest import CANARY, KEY, assert_one_line_error, candidate, forge_index, key, ks, set_key


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    assert ArtifactStore(root).publish(candidate(median=1.0)).published
    return root


def _edit(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = root / KEY / "v1" / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


MANIFEST_ATTACKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "modeled->measured": lambda d: d.update(evidence="measured"),
    "measured, detected elsewhere": lambda d: (d.update(evidence="measured"), d["chip"].update(
        detected={"architecture": "sm_90", "device_name": "NVIDIA H100"}), d["correctness"].update(verifier="device")),
    "median 1e-9": lambda d: d["measurements"].update(median_ms=1e-9, samples_ms=[1e-9]),
    "speedup 1e6": lambda d: d["measurements"].update(speedup=1e6),
    "BM=7": lambda d: d["config"].update(BM=7),
    "unknown knob": lambda d: d["config"].update(ZZ=1),
    "BM as a string": lambda d: d["config"].update(BM="64"),
    "constraint violated": lambda d: d["config"].update(STAGE="none", VEC=4),
    "grid -1": lambda d: d["geometry"].update(grid=[-1, 1, 1]),
    "grid changed": lambda d: d["geometry"].update(grid=[1, 1, 1]),
    "shared memory 10**400": lambda d: d["geometry"].update(shared_memory=10**400),
    "kernel name ../../x": lambda d: d["kernel"].update(name="../../x"),
    "chip name code": lambda d: d["chip"].update(name='M2 Max"""; import os; os.system("id")  # '),
    "unknown chip": lambda d: d["chip"].update(name="M9 Hyper"),
    "family name": lambda d: d.update(family="../../x"),
    "flops": lambda d: d["problem"].update(flops=1.0),
    "input names": lambda d: d["kernel"].update(input_names=["A", "__class__"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("attack", sorted(MANIFEST_ATTACKS))
def test_a_manifest_is_revalidated_against_its_family(store: Path, attack: str) -> None:
    _edit(store, MANIFEST_ATTACKS[attack])
    with pytest.raises(ArtifactError, match="changed since publish|source hash mismatch"):  # the index's content hash
        ArtifactStore(store).load(key())
    forge_index(store)  # an attacker without the store key records the edit: the re-check still refuses it
    with pytest.raises(ArtifactError):
        ArtifactStore(store).load(key())
    assert not {r.where: r for r in ArtifactStore(store).verify()}[f"{KEY}/v1"].ok


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["modeled->measured", "BM=7", "kernel name ../../x"])
def test_every_command_refuses_a_revalidation_failure(store: Path, tmp_path: Path, attack: str) -> None:
    _edit(store, MANIFEST_ATTACKS[attack])
    verify = ks("artifacts", "verify", "--store", str(store))
    assert verify.returncode == 2 and "BAD" in verify.stdout, verify.stdout + verify.stderr
    assert_one_line_error(ks("artifacts", "show", KEY, "--store", str(store)))
    assert_one_line_error(ks("export", "gemm", "--out", str(tmp_path / "dist"), "--store", str(store)))
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").glob("*.whl"))


def test_infinity_in_a_manifest_is_refused(store: Path) -> None:
    path = store / KEY / "v1" / "manifest.json"
    path.write_text(path.read_text().replace('"median_ms": 1.0', '"median_ms": Infinity'))
    with pytest.raises(ArtifactError, match="Infinity"):
        ArtifactStore(store).load(key())


HOSTILE = '"""\nimport os; os.system("touch {m}")\n"""\' + __import__("os").system("touch {m}") + \'{{{{}}}}\\\\'


def _import(source_dir: Path, name: str):  # noqa: ANN202
    pkg = source_dir / name
    spec = importlib.util.spec_from_file_location(name, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        sys.modules.pop(name, None)
    return module


def test_exported_package_holds_no_code_from_data(hostile_family, tmp_path: Path) -> None:
    marker = CANARY / "pwned-export"
    desc = json.dumps(HOSTILE.format(m=marker))
    folder = hostile_family(name="evil", toml=lambda t: set_key(set_key(t, "name", '"evil"'), "description", desc)
                            .replace('why = "the simdgroup grid must split the threadgroup tile evenly"',
                                     f"why = {desc}"))
    result = export([str(folder)], tmp_path / "dist", ArtifactStore(tmp_path / "empty"), package="ks_hostile",
                    version="1.0.0")
    init = (result.source_dir / "ks_hostile" / "__init__.py").read_text()
    assert init == INIT_MODULE  # constant text: nothing from the spec, manifests or artifacts
    for py in (result.source_dir / "ks_hostile").glob("*.py"):
        assert "touch" not in py.read_text()
    module = _import(result.source_dir, "ks_hostile")
    assert not marker.exists()
    assert module.evil.__doc__ == json.loads(desc)  # the description is data, shown as written
    assert "evil" in module.__all__


def test_tamper_verdict_belongs_to_a_file_not_to_a_hash(tmp_path: Path) -> None:
    from kernsearch.exporting.runtime import _runtime

    store = ArtifactStore(tmp_path / "store")
    assert store.publish(candidate(median=1.0)).published
    result = export(["gemm"], tmp_path / "dist", store, package="ks_tamper", version="1.0.0")
    pkg = result.source_dir / "ks_tamper"
    table = json.loads((pkg / "dispatch.json").read_text())
    art = table["families"]["gemm"]["artifacts"][0]
    # A second, identical copy of the same kernel (same hash) at another path; then tamper with the first.
    copy_rel = art["source"].replace("/v1/", "/v1copy/")
    (pkg / copy_rel).parent.mkdir(parents=True)
    shutil.copy(pkg / art["header"], pkg / art["header"].replace("/v1/", "/v1copy/"))
    shutil.copy(pkg / art["source"], pkg / copy_rel)
    intact = {**art, "header": art["header"].replace("/v1/", "/v1copy/"), "source": copy_rel}
    (pkg / art["source"]).write_text((pkg / art["source"]).read_text() + "\n// tampered\n")
    dispatcher = _runtime.Dispatcher(pkg)
    with pytest.warns(RuntimeWarning):
        assert dispatcher._source(art) is None
    assert dispatcher._source(intact) is not None  # the intact copy is not refused by the tampered one
    assert "refused" in dispatcher._refusal(art) and dispatcher._refusal(intact) == ""
    fresh = _runtime.Dispatcher(pkg)
    assert fresh._source(intact) is not None
    with pytest.warns(RuntimeWarning):
        assert fresh._source(art) is None  # and an intact copy read first never vouches for a tampered one


def test_kernel_files_outside_the_package_are_refused(tmp_path: Path) -> None:
    from kernsearch.exporting.runtime import _runtime

    store = ArtifactStore(tmp_path / "store")
    assert store.publish(candidate(median=1.0)).published
    result = export(["gemm"], tmp_path / "dist", store, package="ks_escape", version="1.0.0")
    pkg = result.source_dir / "ks_escape"
    art = json.loads((pkg / "dispatch.json").read_text())["families"]["gemm"]["artifacts"][0]
    escaped = {**art, "source": "../../../../etc/passwd"}
    with pytest.warns(RuntimeWarning):
        assert _runtime.Dispatcher(pkg)._source(escaped) is None
