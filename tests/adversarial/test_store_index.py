"""The store's index and family snapshots: what an attacker who can write the store's files still cannot do.

- edit, remove or reorder an index line (the chain breaks), plant a version no publish recorded, or edit
  ``CURRENT`` to bring an invalidated version back (the index decides which version is current);
- with ``KERNSEARCH_STORE_KEY`` set, record a forged version at all (the chain's hashes are HMACs);
- without the key, even after recording a forged version in the index, swap a kernel in: the re-check renders
  the version's config with the family kept in the store at publish, and that comparison is never skipped;
- change a kept family (its files hash to its name).
Older stores (no index) are refused until ``kernsearch artifacts migrate`` indexes them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kernsearch import ArtifactStore
from kernsearch.artifacts._manifest import ArtifactError
from kernsearch.exporting._export import export

from .conftest import KEY, candidate, forge_index, key
from .test_cli_fuzz import run_cli
from .test_tamper_evident import TAMPERINGS


@pytest.fixture
def store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    assert ArtifactStore(root).publish(candidate(median=1.0)).published  # modeled
    return root


def _tamper(root: Path, name: str) -> None:
    where, tamper = TAMPERINGS[name]
    tamper(root, root / where / "v1")


@pytest.mark.parametrize("name", ["source swapped, template hash changed", "header swapped, template hash changed",
                                  "config changed, template hash changed", "template hash alone",
                                  "geometry changed", "problem figures changed"])
def test_the_rendered_source_comparison_is_never_skipped(store: Path, name: str) -> None:
    """Even with the forged version recorded in the index (no key), the re-check renders the config with the
    family kept at publish and refuses what it does not render."""
    _tamper(store, name)
    forge_index(store)
    with pytest.raises(ArtifactError, match="not one publishing could write"):
        ArtifactStore(store).load(key())


def test_a_kept_family_that_changed_is_refused(store: Path) -> None:
    folder = next((store / ".families").iterdir())
    (folder / "gemm.metal.j2").write_text((folder / "gemm.metal.j2").read_text() + "{# edited #}\n")
    with pytest.raises(ArtifactError, match="do not hash to its name"):
        ArtifactStore(store).load(key())
    (folder / "extra.j2").write_text("x")
    (folder / "gemm.metal.j2").unlink()
    (folder / "gemm.metal.j2").symlink_to(folder / "extra.j2")
    with pytest.raises(ArtifactError, match="something other than its files"):
        ArtifactStore(store).load(key())


@pytest.mark.parametrize("edit", ["drop a line", "swap two lines", "edit a hash", "edit a content hash",
                                  "append a garbage line"])
def test_an_edited_index_refuses_every_version(store: Path, tmp_path: Path, edit: str) -> None:
    st = ArtifactStore(store)
    st.invalidate(key(), "found wrong on a ragged shape")
    path = store / "index.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    if edit == "drop a line":
        lines = lines[1:]
    elif edit == "swap two lines":
        lines[1], lines[2] = lines[2], lines[1]
    elif edit == "edit a hash":
        lines[0] = lines[0].replace('"hash": "', '"hash": "0')
    elif edit == "edit a content hash":
        entry = json.loads(lines[0])
        entry["content"] = "0" * 64
        lines[0] = json.dumps(entry, sort_keys=True) + "\n"
    else:
        lines.append('{"op": "current"}\n')
    path.write_text("".join(lines))
    with pytest.raises(ArtifactError, match="index"):
        ArtifactStore(store).load(key(), "v1")
    code, stdout, stderr = run_cli(["artifacts", "verify", "--store", str(store)], tmp_path)
    assert code == 2 and "BAD index.jsonl" in stdout, stdout


def test_a_planted_version_is_refused(store: Path, tmp_path: Path) -> None:
    shutil.copytree(store / KEY / "v1", store / KEY / "v2")
    manifest = json.loads((store / KEY / "v2" / "manifest.json").read_text())
    manifest["version"] = "v2"
    (store / KEY / "v2" / "manifest.json").write_text(json.dumps(manifest))
    (store / KEY / "CURRENT").write_text(json.dumps({"version": "v2", "invalidated": None}))
    st = ArtifactStore(store)
    with pytest.raises(ArtifactError, match="not in the store index"):
        st.load(key(), "v2")
    assert st.pointer(key()).version == "v1" and st.load(key()).version == "v1"  # the index decides
    results = {r.where: r for r in st.verify()}
    assert not results[f"{KEY}/v2"].ok and not results[f"{KEY}/CURRENT"].ok


def test_current_edited_to_bring_back_an_invalidated_version(store: Path, tmp_path: Path) -> None:
    st = ArtifactStore(store)
    st.invalidate(key(), "found wrong on a ragged shape")
    (store / KEY / "CURRENT").write_text(json.dumps({"version": "v1", "invalidated": None}))
    st = ArtifactStore(store)
    assert st.pointer(key()).invalidated == "found wrong on a ragged shape"
    result = export(["gemm"], tmp_path / "dist", st, package="ks_uninv", version="1.0")
    assert result.artifacts == []  # shipped as an invalidated record, never dispatched
    code, stdout, _ = run_cli(["artifacts", "verify", "--store", str(store)], tmp_path)
    assert code == 2 and f"BAD {KEY}/CURRENT" in stdout and "the index decides" in stdout
    code, stdout, stderr = run_cli(["artifacts", "verify", "--repair", "--store", str(store)], tmp_path)
    assert code == 0, stdout + stderr
    assert json.loads((store / KEY / "CURRENT").read_text())["invalidated"] == "found wrong on a ragged shape"


def test_with_a_store_key_a_forged_version_cannot_be_recorded(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNSEARCH_STORE_KEY", "farm secret")
    root = tmp_path / "store"
    assert ArtifactStore(root).publish(candidate(median=1.0)).published
    assert ArtifactStore(root).load(key()).version == "v1"
    assert all(json.loads(line)["mac"] == "hmac-sha256" for line in (root / "index.jsonl").read_text().splitlines())
    monkeypatch.setenv("KERNSEARCH_STORE_KEY", "another secret")
    with pytest.raises(ArtifactError, match="another KERNSEARCH_STORE_KEY"):
        ArtifactStore(root).load(key())
    monkeypatch.setenv("KERNSEARCH_STORE_KEY", "farm secret")
    _tamper(root, "speedup inflated to 10x")  # the modeled v1 forged as measured, 10x the op
    forge_index(root)  # a worker without the key records the forgery
    with pytest.raises(ArtifactError, match="not sealed with KERNSEARCH_STORE_KEY"):
        ArtifactStore(root).load(key())
    code, stdout, stderr = run_cli(["export", "gemm", "--store", str(root), "--out", str(tmp_path / "dist")], tmp_path)
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "KERNSEARCH_STORE_KEY" in stderr, stderr
    monkeypatch.setenv("KERNSEARCH_STORE_KEY", "")
    with pytest.raises(ArtifactError, match="set but empty"):
        ArtifactStore(root).load(key())


def test_a_keyed_store_without_the_key_is_refused_and_cannot_be_published_to(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNSEARCH_STORE_KEY", "farm secret")
    root = tmp_path / "store"
    assert ArtifactStore(root).publish(candidate(median=1.0)).published
    monkeypatch.delenv("KERNSEARCH_STORE_KEY")
    with pytest.raises(ArtifactError, match="keyed: set KERNSEARCH_STORE_KEY"):
        ArtifactStore(root).load(key())
    with pytest.raises(ArtifactError, match="keyed"):
        ArtifactStore(root).check_writable()
    with pytest.raises(ArtifactError, match="keyed"):
        ArtifactStore(root).publish(candidate(median=0.2, config={"BM": 64}))
    assert ArtifactStore(root).versions(key()) == ["v1"]


def test_migrate_seals_an_unkeyed_store_with_the_key(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNSEARCH_STORE_KEY", "farm secret")
    with pytest.raises(ArtifactError, match="not sealed"):
        ArtifactStore(store).load(key())
    done = ArtifactStore(store).migrate()
    assert done == ["index.jsonl: 2 line(s) sealed with the store key"]
    assert ArtifactStore(store).load(key()).version == "v1"


def _legacy(store: Path) -> None:
    """The store as an older kernsearch left it: no index, no kept families."""
    (store / "index.jsonl").unlink()
    shutil.rmtree(store / ".families")


def test_a_store_made_before_the_index_is_refused_until_migrated(store: Path, tmp_path: Path) -> None:
    _legacy(store)
    code, _, stderr = run_cli(["artifacts", "show", KEY, "--store", str(store)], tmp_path)
    assert code == 2 and "artifacts migrate" in stderr and len(stderr.strip().splitlines()) == 1
    with pytest.raises(ArtifactError, match="artifacts migrate"):
        ArtifactStore(store).publish(candidate(median=0.2, config={"BM": 64}))
    code, stdout, stderr = run_cli(["artifacts", "migrate", "--store", str(store)], tmp_path)
    assert code == 0 and f"{KEY}/v1: indexed" in stdout and f"{KEY}: current v1 recorded" in stdout, stdout + stderr
    code, stdout, _ = run_cli(["artifacts", "verify", "--store", str(store)], tmp_path)
    assert code == 0 and "1 version(s) verified" in stdout, stdout
    assert ArtifactStore(store).publish(candidate(median=0.2, config={"BM": 64})).version == "v2"


def test_migrate_indexes_a_version_only_against_the_family_it_was_rendered_from(store: Path, tmp_path: Path,
                                                                                hostile_family) -> None:
    """A version whose template is not the built-in one is indexed only with --family naming the family
    that renders it; a family that does not render it exactly is refused."""
    older = hostile_family(metal=lambda t: t + "{# the template as it was #}\n", name="older")
    manifest_path = store / KEY / "v1" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    import hashlib

    manifest["template"]["sha256"] = hashlib.sha256((older / "gemm.metal.j2").read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest, indent=2))
    _legacy(store)
    code, stdout, _ = run_cli(["artifacts", "migrate", "--store", str(store)], tmp_path)
    assert f"{KEY}/v1: not indexed: rendered from a gemm.metal.j2" in stdout and "--family" in stdout, stdout
    code, stdout, _ = run_cli(["artifacts", "verify", "--store", str(store)], tmp_path)
    assert code == 2
    code, stdout, stderr = run_cli(["artifacts", "migrate", "--store", str(store), "--family", str(older)], tmp_path)
    assert f"{KEY}/v1: indexed" in stdout, stdout + stderr
    assert ArtifactStore(store).load(key()).version == "v1"
