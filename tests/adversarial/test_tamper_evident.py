"""A forged version is refused by `artifacts verify`, by `export` and by the exported package's first call.

The attack (issue 27): change ``template.sha256`` in a manifest, and the re-check took its "rendered from an
older template" branch, which skipped the comparison of the rendered source. The kernel body, its header, its
config or another key's kernel could then be swapped in (the manifest's source hash recomputed), and
``verify``, ``show`` and ``export`` passed; with a forged ``chip.detected``, ``verifier = device`` and
``speedup = 10`` the exported package took the swapped kernel as a measured win, by default. Now the store's
index records at publish a content hash over the manifest's exact text and both kernel files, the re-check
renders against the family kept in the store, and the package checks every artifact it ships against the
recorded hash before first use.

Each tampering below is one test, run against all three: the store's verify (the CLI, exit 2 and ``BAD``),
``export`` (one line, exit 2, no wheel) and the package (the same tampering applied to an exported package's
copy and to its dispatch record, as an export of the forged store would have written it: refused, with a
warning, at the first call that considers it).
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from judged import consumer_modes

from kernsearch import ArtifactStore, Candidate, Space, get_chip, load_family, make_problem
from kernsearch.artifacts._manifest import Correctness, LaunchGeometry, Measurements
from kernsearch.exporting._export import export
from kernsearch.exporting.runtime import _runtime
from kernsearch.family._render import geometry, render, source_sha256

from .conftest import GEMM_DIR
from .test_cli_fuzz import run_cli

M2MAX = {"architecture": "applegpu_g14c", "device_name": "Apple M2 Max"}
A = "gemm/M2-Max/float32/64x64x64"  # measured, 2x the op: the target of most tamperings
B = "gemm/M2-Max/float32/128x128x128"  # measured, another config: "another key's kernel"
MODELED = "gemm/M2-Max/float16/64x64x64"
INTERPRETED = "gemm/M2-Max/bfloat16/64x64x64"
UA, UB = "ugemm/M2-Max/float32/64x64x64", "ugemm/M2-Max/float32/128x128x128"  # a user's family
FORGED_TEMPLATE = "ab" * 32  # "rendered from an older template"


def _candidate(fam: Any, shape: tuple[int, ...], dtype: str, evidence: str, config: dict | None = None,
               speedup: float = 2.0) -> Candidate:
    chip = get_chip("M2 Max")
    if evidence == "measured":
        chip = chip.model_copy(update={"detected": M2MAX})
    space = Space(make_problem(fam, shape, dtype, chip), chip)
    corr = Correctness(verifier="device" if evidence == "measured" else "interpreter", passed=True,
                       shapes_checked=["x".join(map(str, shape))], max_abs_error=1e-6, max_rel_error=1e-6,
                       checks_run=2)
    meas = None if evidence == "interpreted" else Measurements(
        median_ms=1.0, spread=0.02, samples_ms=[1.0] * 5, baseline_median_ms=speedup, baseline_spread=0.02,
        speedup_low=speedup * 0.98, speedup_high=speedup * 1.02,
        modes=consumer_modes(1.0, speedup, speedup * 0.98, speedup * 1.02))
    return Candidate.for_config(space, space.parse_config(config or {}), target="metal", correctness=corr,
                                evidence=evidence, measurements=meas, study="tamper")


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A store (built-in gemm and a user's family), and the package exported from it, both untouched."""
    base = tmp_path_factory.mktemp("tamper")
    user = base / "ugemm"
    shutil.copytree(GEMM_DIR, user)
    (user / "family.toml").write_text((user / "family.toml").read_text().replace('name = "gemm"', 'name = "ugemm"', 1))
    gemm, ugemm = load_family("gemm"), load_family(str(user))
    store = ArtifactStore(base / "store")
    for c in (_candidate(gemm, (64, 64, 64), "float32", "measured"),
              _candidate(gemm, (128, 128, 128), "float32", "measured", {"BM": 64}),
              _candidate(gemm, (64, 64, 64), "float16", "modeled"),
              _candidate(gemm, (64, 64, 64), "bfloat16", "interpreted"),
              _candidate(ugemm, (64, 64, 64), "float32", "measured"),
              _candidate(ugemm, (128, 128, 128), "float32", "measured", {"BM": 64})):
        assert store.publish(c).published
    result = export(["gemm", str(user)], base / "dist", store, package="ks_tamper", version="1.0")
    assert len(result.artifacts) == 6
    return {"store": store.root, "package": result.source_dir / "ks_tamper", "family": user}


# -- the tamperings: each edits one version folder (of a store, or of a package's copy) ----------------------

def _manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())


def _save(folder: Path, m: dict[str, Any], header: str | None = None, source: str | None = None) -> None:
    """Write the forged manifest (and kernel files), its source hash recomputed so the file check passes."""
    if header is not None:
        (folder / "header.metal").write_text(header)
    if source is not None:
        (folder / "source.metal").write_text(source)
    k = m["kernel"]
    m["source_sha256"] = source_sha256((folder / "header.metal").read_text(), (folder / "source.metal").read_text(),
                                       k["template"], k["input_names"], k["output_names"])
    (folder / "manifest.json").write_text(json.dumps(m, indent=2))


def _edit(change: Callable[[dict[str, Any]], None], template: bool = True) -> Callable[[Path, Path], None]:
    """A manifest edit (with the template hash changed, the trigger of the old bypass, unless ``template``)."""
    def apply(root: Path, folder: Path) -> None:
        m = _manifest(folder)
        change(m)
        if template:
            m["template"]["sha256"] = FORGED_TEMPLATE
        _save(folder, m)
    return apply


def _swap(which: str, edit: Callable[[str], str], template: bool = True) -> Callable[[Path, Path], None]:
    """The kernel's ``header`` or ``source`` file edited (the manifest's source hash follows)."""
    def apply(root: Path, folder: Path) -> None:
        m = _manifest(folder)
        if template:
            m["template"]["sha256"] = FORGED_TEMPLATE
        _save(folder, m, **{which: edit((folder / f"{which}.metal").read_text())})
    return apply


def _swap_source(template: bool = True) -> Callable[[Path, Path], None]:
    return _swap("source", lambda body: "/* swapped in */ if (thread_position_in_grid.x == 0) { return; }\n" + body,
                 template)


def _swap_header(template: bool = True) -> Callable[[Path, Path], None]:
    return _swap("header", lambda text: "#define BK 1\n" + text, template)


def _other_key(other: str, template: bool = True) -> Callable[[Path, Path], None]:
    """Another key's kernel and config in this version (its source hash and kernel name with them)."""
    def apply(root: Path, folder: Path) -> None:
        theirs = root / other / "v1"
        m, t = _manifest(folder), _manifest(theirs)
        m["config"], m["kernel"]["name"] = t["config"], t["kernel"]["name"]
        if template:
            m["template"]["sha256"] = FORGED_TEMPLATE
        _save(folder, m, header=(theirs / "header.metal").read_text(), source=(theirs / "source.metal").read_text())
    return apply


def _rerendered_config(root: Path, folder: Path) -> None:
    """A config that was never verified, with the kernel and launch it renders: consistent, template intact."""
    m = _manifest(folder)
    fam, chip = load_family("gemm"), get_chip("M2 Max")
    space = Space(make_problem(fam, tuple(m["problem"]["shape"]), m["problem"]["dtype"], chip), chip)
    cfg = space.parse_config("BM=16,BN=16")
    kernel = render(fam, cfg, m["problem"]["dtype"])
    geo = geometry(space, cfg)
    m["config"], m["kernel"]["name"] = dict(cfg), kernel.name
    m["geometry"] = LaunchGeometry.of(geo).model_dump(mode="json")
    _save(folder, m, header=kernel.header, source=kernel.source)


def _measured(m: dict[str, Any], speedup: float = 10.0) -> None:
    """Forged measured evidence: a detected M2 Max, verified on the device, 10x the op."""
    m["evidence"] = "measured"
    m["chip"]["detected"] = dict(M2MAX)
    m["correctness"]["verifier"] = "device"
    m["measurements"] = {"median_ms": 1.0, "spread": 0.02, "samples_ms": [1.0] * 5, "baseline_median_ms": speedup,
                         "baseline_spread": 0.02, "speedup": speedup, "speedup_low": speedup * 0.9,
                         "speedup_high": speedup * 1.1}


#: name -> (the key whose v1 is tampered, the tampering). 22 tamperings (issue 27's "Must hold").
TAMPERINGS: dict[str, tuple[str, Callable[[Path, Path], None]]] = {
    # the bypass: a kernel swapped in, with a changed template hash
    "source swapped, template hash changed": (A, _swap_source()),
    "header swapped, template hash changed": (A, _swap_header()),
    "config changed, template hash changed": (A, _edit(lambda m: m["config"].update(BM=64))),
    "another key's kernel, template hash changed": (A, _other_key(B)),
    # the same swaps in a user's family whose template really changed since publish
    "source swapped, family template changed": (UA, _swap_source(False)),
    "header swapped, family template changed": (UA, _swap_header(False)),
    "config changed, family template changed": (UA, _edit(lambda m: m["config"].update(BM=64), False)),
    "another key's kernel, family template changed": (UA, _other_key(UB, False)),
    # a never-verified config with the kernel and launch it renders (consistent; the template is intact)
    "unverified config, re-rendered": (A, _rerendered_config),
    # forged measured evidence
    "modeled forged as measured 10x": (MODELED, _edit(_measured)),
    "interpreted forged as measured 10x": (INTERPRETED, _edit(_measured)),
    "speedup inflated to 10x": (A, _edit(lambda m: _measured(m, 10.0))),
    "median made faster": (A, _edit(lambda m: m["measurements"].update(median_ms=0.5, samples_ms=[0.5] * 5))),
    "toolchain changed": (A, _edit(lambda m: m["toolchain"].update(mlx_version="9.9.0"))),
    "device changed": (A, _edit(lambda m: m["chip"]["detected"].update(device_name="Apple M2 Max (other)"))),
    # correctness
    "shapes_checked inflated, error 0": (A, _edit(lambda m: m["correctness"].update(
        shapes_checked=["64x64x64", "4096x4096x4096", "8192x8192x8192"], max_abs_error=0.0, max_rel_error=0.0))),
    "errors zeroed": (A, _edit(lambda m: m["correctness"].update(max_abs_error=0.0, max_rel_error=0.0))),
    "checks_run inflated": (A, _edit(lambda m: m["correctness"].update(checks_run=100000))),
    # other fields a decision rests on
    "geometry changed": (A, _edit(lambda m: m["geometry"].update(threadgroup=[64, 1, 1]))),
    "problem figures changed": (A, _edit(lambda m: m["problem"].update(flops=m["problem"]["flops"] * 2))),
    "template hash alone": (A, _edit(lambda m: None)),
    "gate record rewritten": (A, _edit(lambda m: m["gate"].update(reason="first version for this key (measured)",
                                                                 replaced=None))),
}
assert len(TAMPERINGS) == 22


def _store_copy(clean: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    store, family = tmp_path / "store", tmp_path / "ugemm"
    shutil.copytree(clean["store"], store, symlinks=True)
    shutil.copytree(clean["family"], family)
    tmpl = family / "gemm.metal.j2"  # the user's family changed since publish (its template hash with it)
    tmpl.write_text(tmpl.read_text() + "{# improved since #}\n")
    return store, family


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_verify_and_export_refuse_a_tampered_version(clean: dict[str, Path], tmp_path: Path, name: str) -> None:
    store, family = _store_copy(clean, tmp_path)
    where, tamper = TAMPERINGS[name]
    tamper(store, store / where / "v1")
    code, stdout, stderr = run_cli(["artifacts", "verify", "--store", str(store)], tmp_path)
    assert code == 2 and f"BAD {where}/v1" in stdout, (code, stdout[-3000:], stderr)
    fam = where.split("/")[0]
    code, stdout, stderr = run_cli(["export", fam if fam == "gemm" else str(family), "--store", str(store),
                                    "--out", str(tmp_path / "dist"), "--name", "ks_forged"], tmp_path)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and where in lines[0], (code, stdout[-2000:], stderr)
    assert not list(tmp_path.glob("dist/*.whl"))


def _record_fields(m: dict[str, Any]) -> dict[str, Any]:
    """The dispatch record an export of the forged manifest would write (what the dispatcher decides on)."""
    meas, tc = m.get("measurements") or {}, m["toolchain"]
    return {"chip": m["chip"]["name"], "vendor": m["chip"]["vendor"], "lineage": list(m["chip"]["lineage"]),
            "dtype": m["problem"]["dtype"], "shape": list(m["problem"]["shape"]), "config": dict(m["config"]),
            "target": m["kernel"]["target"], "evidence": m["evidence"], "median_ms": meas.get("median_ms"),
            "speedup": meas.get("speedup"), "speedup_low": meas.get("speedup_low"),
            "speedup_high": meas.get("speedup_high"),
            "timing_identity": _runtime.timing_identity(tc["mlx_version"], tc["os"], tc["macos_version"],
                                                        tc.get("cuda_driver"), tc.get("nvrtc_version")),
            "kernel": {"name": m["kernel"]["name"], "target": m["kernel"]["target"],
                       "input_names": m["kernel"]["input_names"], "output_names": m["kernel"]["output_names"],
                       "template": m["kernel"]["template"]}, "sha256": m["source_sha256"]}


@pytest.mark.parametrize("name", list(TAMPERINGS))
def test_the_package_refuses_a_tampered_artifact_at_its_first_call(clean: dict[str, Path], tmp_path: Path,
                                                                    name: str) -> None:
    pkg = tmp_path / "ks_tamper"
    shutil.copytree(clean["package"], pkg)
    where, tamper = TAMPERINGS[name]
    tamper(pkg / "artifacts", pkg / "artifacts" / where / "v1")
    table = json.loads((pkg / "dispatch.json").read_text())
    family = where.split("/")[0]
    record = next(a for a in table["families"][family]["artifacts"] if a["key"] == where)
    record.update(_record_fields(_manifest(pkg / "artifacts" / where / "v1")))
    (pkg / "dispatch.json").write_text(json.dumps(table))
    dispatcher = _runtime.Dispatcher(pkg)
    dispatcher.toolchain = dict(record["timing_identity"])  # a consumer whose toolchain is the forged one
    arrays = [SimpleNamespace(shape=tuple(s), dtype=record["dtype"]) for s in
              ((record["shape"][0], record["shape"][2]), (record["shape"][2], record["shape"][1]))]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        decision = dispatcher.explain(family, *arrays, chip="M2 Max")
    assert decision.artifact != f"{where}/v1", str(decision)
    assert f"{where}/v1 skipped: refused: " in str(decision), str(decision)
    assert any(issubclass(w.category, RuntimeWarning) and where in str(w.message) for w in caught)


def test_the_untouched_package_takes_the_artifacts(clean: dict[str, Path]) -> None:
    """The control: without a tampering the same calls take the same artifacts (the refusals above are not
    an accident of the set-up)."""
    dispatcher = _runtime.Dispatcher(clean["package"])
    table = dispatcher.table
    for family, where in (("gemm", A), ("ugemm", UA)):
        record = next(a for a in table["families"][family]["artifacts"] if a["key"] == where)
        dispatcher.toolchain = dict(record["timing_identity"])
        arrays = [SimpleNamespace(shape=(64, 64), dtype="float32")] * 2
        assert dispatcher.explain(family, *arrays, chip="M2 Max").artifact == f"{where}/v1"
