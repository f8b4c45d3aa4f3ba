"""Issue 39: a store's history cannot be laundered through ``migrate`` or rolled back, and an exported
package never runs what its store invalidated.

The attacks (each was undetected at ba31dcb):
- **migrate launders**: with ``KERNSEARCH_STORE_KEY``, a writer without the key forges a measured 10x claim
  and rechains the index (or deletes ``index.jsonl``, so that the store looks "made before kernsearch recorded
  content hashes"); the key holder runs ``migrate``, which sealed the forgery. Now ``migrate`` refuses every
  version it cannot vouch for, changing nothing, unless ``--untrusted-to modeled|invalidated`` re-judges them:
  a migrated store never gains a measured claim;
- **rollback by truncation**: invalidate v1, then delete the last index line; or drop a newer version's lines,
  folder and journal line. With the key the signed head record (``index.head``) and this machine's record of
  the longest chain it saw (``$KERNSEARCH_HOME/heads``) refuse the shorter chain, naming both heads;
- **the package**: ``"invalidated": null`` written into ``dispatch.json``: an invalidated version's kernel
  files are not shipped, so the edited record fails its integrity check.
Without a key (docs/artifacts.md, "What the index protects against"): edits that do not rewrite the chain.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from kernsearch import ArtifactStore
from kernsearch.artifacts._manifest import ArtifactError
from kernsearch.exporting._export import export
from kernsearch.exporting.runtime import _runtime

from .conftest import KEY, candidate, forge_index, key
from .test_cli_fuzz import run_cli
from .test_tamper_evident import _edit, _measured

M2MAX = {"architecture": "applegpu_g14c", "device_name": "Apple M2 Max"}
SECRET = "farm secret"


@pytest.fixture
def keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A keyed store holding a modeled v1 (the farm's exporter holds the key; KERNSEARCH_HOME is per test)."""
    monkeypatch.setenv("KERNSEARCH_STORE_KEY", SECRET)
    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path / "home"))
    root = tmp_path / "store"
    assert ArtifactStore(root).publish(candidate(median=1.0)).published
    return root


def _forge_measured(root: Path) -> None:
    """The modeled v1 forged as measured, 10x the op, on a detected M2 Max, verified on the device: a manifest
    publishing could have written (the re-check against the kept family passes; only the chain can tell)."""
    _edit(lambda m: _measured(m, 10.0), template=False)(root, root / KEY / "v1")


def _evidence(root: Path) -> str:
    return str(json.loads((root / KEY / "v1" / "manifest.json").read_text())["evidence"])


def _migrate(root: Path, tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli(["artifacts", "migrate", "--store", str(root), *extra], tmp_path)


def _one_line(code: int, stderr: str, *needles: str) -> str:
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, (code, stderr[-2000:])
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- migrate never launders --------------------------------------------------------------------------------

def test_a_rechained_keyed_store_is_not_sealed_by_migrate(keyed: Path, tmp_path: Path) -> None:
    _forge_measured(keyed)
    forge_index(keyed)
    before = (keyed / "index.jsonl").read_bytes()
    with pytest.raises(ArtifactError, match="not sealed with KERNSEARCH_STORE_KEY"):
        ArtifactStore(keyed).load(key())
    code, _, stderr = _migrate(keyed, tmp_path)
    _one_line(code, stderr, "head record", "truncated or rolled back")
    code, _, stderr = _migrate(keyed, tmp_path, "--untrusted-to", "modeled")  # no option seals a diverged chain
    _one_line(code, stderr, "head record")
    assert (keyed / "index.jsonl").read_bytes() == before and _evidence(keyed) == "measured"
    code, stdout, _ = run_cli(["artifacts", "verify", "--store", str(keyed)], tmp_path)
    assert code == 2 and "BAD" in stdout


def test_a_rechained_keyed_store_without_its_head_record_needs_a_rejudge(keyed: Path, tmp_path: Path) -> None:
    """The head record deleted too: this machine saw the store keyed, so every version is untrusted."""
    _forge_measured(keyed)
    forge_index(keyed)
    (keyed / "index.head").unlink()
    before = (keyed / "index.jsonl").read_bytes()
    code, _, stderr = _migrate(keyed, tmp_path)
    _one_line(code, stderr, f"{KEY}/v1", "--untrusted-to", "nothing changed")
    assert (keyed / "index.jsonl").read_bytes() == before and _evidence(keyed) == "measured"
    code, stdout, stderr = _migrate(keyed, tmp_path, "--untrusted-to", "modeled")
    assert code == 0 and "re-judged modeled" in stdout, stdout + stderr
    assert _evidence(keyed) == "modeled" and ArtifactStore(keyed).load(key()).manifest.evidence == "modeled"


@pytest.mark.parametrize("fresh_machine", [False, True])
def test_a_deleted_index_with_forged_measured_evidence_is_not_laundered(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        fresh_machine: bool) -> None:
    """No key: the index deleted so the store looks older than it; migrate refuses the measured claim."""
    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path / "home"))
    root = tmp_path / "store"
    assert ArtifactStore(root).publish(candidate(median=1.0)).published
    _forge_measured(root)
    (root / "index.jsonl").unlink()
    if fresh_machine:
        monkeypatch.setenv("KERNSEARCH_STORE_KEY", SECRET)  # the key holder migrates: still no measured claim
    code, _, stderr = _migrate(root, tmp_path)
    _one_line(code, stderr, f"{KEY}/v1", "--untrusted-to")
    assert not (root / "index.jsonl").exists() and _evidence(root) == "measured"
    code, stdout, stderr = _migrate(root, tmp_path, "--untrusted-to", "invalidated")
    assert code == 0 and "re-judged invalidated" in stdout, stdout + stderr
    st = ArtifactStore(root)
    assert st.pointer(key()).invalidated and list(st.current_artifacts("gemm")) == []
    result = export(["gemm"], tmp_path / "dist", st, package="ks_mig", version="1.0")
    assert result.artifacts == []


def test_a_keyed_store_whose_index_was_deleted_is_refused(keyed: Path, tmp_path: Path) -> None:
    (keyed / "index.jsonl").unlink()
    for args in (["artifacts", "verify", "--store", str(keyed)], ["artifacts", "migrate", "--store", str(keyed)],
                 ["artifacts", "migrate", "--store", str(keyed), "--untrusted-to", "modeled"]):
        code, stdout, stderr = run_cli(args, tmp_path)
        assert code == 2 and "missing from a keyed store" in stdout + stderr, stdout + stderr


def test_an_honest_unkeyed_store_is_still_sealed_and_a_measured_one_needs_a_decision(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path / "home"))
    root = tmp_path / "store"
    assert ArtifactStore(root).publish(candidate(median=1.0)).published
    assert ArtifactStore(root).publish(candidate(median=0.5, evidence="measured", detected=M2MAX,
                                                 config={"BM": 64}, speedup=3.0)).published
    monkeypatch.setenv("KERNSEARCH_STORE_KEY", SECRET)
    code, _, stderr = _migrate(root, tmp_path)
    _one_line(code, stderr, f"{KEY}/v2")
    code, stdout, stderr = _migrate(root, tmp_path, "--untrusted-to", "modeled")
    assert code == 0 and "sealed with the store key" in stdout, stdout + stderr
    st = ArtifactStore(root)
    assert st.load(key(), "v1").manifest.evidence == "modeled" and st.load(key(), "v2").manifest.evidence == "modeled"
    assert ArtifactStore(root).migrate() == []  # sealed: nothing left to vouch for


def test_migrate_refuses_an_unknown_rejudgement(keyed: Path, tmp_path: Path) -> None:
    code, _, stderr = _migrate(keyed, tmp_path, "--untrusted-to", "measured")
    _one_line(code, stderr, "modeled or invalidated")


# -- rollback and truncation ---------------------------------------------------------------------------------

def _drop_last_lines(path: Path, count: int) -> None:
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-count]))


def test_an_invalidation_dropped_from_the_index_is_refused(keyed: Path, tmp_path: Path) -> None:
    ArtifactStore(keyed).invalidate(key(), "wrong on a ragged shape")
    _drop_last_lines(keyed / "index.jsonl", 1)
    (keyed / KEY / "CURRENT").write_text(json.dumps({"version": "v1", "invalidated": None}))
    with pytest.raises(ArtifactError, match="signed head record"):
        ArtifactStore(keyed).pointer(key())
    code, stdout, _ = run_cli(["artifacts", "verify", "--store", str(keyed)], tmp_path)
    assert code == 2 and "BAD index.jsonl" in stdout and "truncated or rolled back" in stdout, stdout
    code, _, stderr = run_cli(["export", "gemm", "--store", str(keyed), "--out", str(tmp_path / "dist")], tmp_path)
    _one_line(code, stderr, "truncated or rolled back")
    code, _, stderr = _migrate(keyed, tmp_path, "--untrusted-to", "modeled")
    _one_line(code, stderr, "truncated or rolled back")


def test_an_older_head_record_put_back_with_the_older_index_is_refused_here(keyed: Path, tmp_path: Path) -> None:
    """The attacker saved index.jsonl and index.head before the invalidation and puts both back: the signed
    record agrees, but this machine saw the longer chain."""
    saved = {name: (keyed / name).read_bytes() for name in ("index.jsonl", "index.head")}
    ArtifactStore(keyed).invalidate(key(), "wrong on a ragged shape")
    for name, data in saved.items():
        (keyed / name).write_bytes(data)
    with pytest.raises(ArtifactError, match="this machine last saw") as caught:
        ArtifactStore(keyed).pointer(key())
    assert "3 entries" in str(caught.value) and "2 entries" in str(caught.value)  # both heads named


def test_a_newer_version_dropped_with_its_lines_folder_and_journal_is_refused(keyed: Path, tmp_path: Path) -> None:
    assert ArtifactStore(keyed).publish(candidate(median=0.5, config={"BM": 64})).version == "v2"
    _drop_last_lines(keyed / "index.jsonl", 2)
    _drop_last_lines(keyed / KEY / "journal.jsonl", 1)
    shutil.rmtree(keyed / KEY / "v2")
    (keyed / KEY / "CURRENT").write_text(json.dumps({"version": "v1", "invalidated": None}))
    code, stdout, _ = run_cli(["artifacts", "verify", "--store", str(keyed)], tmp_path)
    assert code == 2 and "truncated or rolled back" in stdout, stdout
    with pytest.raises(ArtifactError, match="truncated or rolled back"):
        ArtifactStore(keyed).publish(candidate(median=0.4, config={"BM": 32}))  # a publish never signs it


def test_a_deleted_head_record_is_refused_and_a_forged_one_too(keyed: Path, tmp_path: Path) -> None:
    head = keyed / "index.head"
    data = json.loads(head.read_text())
    head.write_text(json.dumps({**data, "entries": 1}))
    with pytest.raises(ArtifactError, match="seal does not match"):
        ArtifactStore(keyed).load(key())
    head.unlink()
    with pytest.raises(ArtifactError, match="missing"):
        ArtifactStore(keyed).load(key())


def test_without_a_key_a_dropped_invalidation_goes_unseen_as_documented(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented limit (docs/artifacts.md, "What protects what"): an unkeyed chain cannot tell its end was
    cut; edits inside it still break it. A farm that needs more sets KERNSEARCH_STORE_KEY."""
    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path / "home"))
    root = tmp_path / "store"
    st = ArtifactStore(root)
    assert st.publish(candidate(median=1.0)).published
    st.invalidate(key(), "found wrong")
    _drop_last_lines(root / "index.jsonl", 1)
    assert ArtifactStore(root).pointer(key()).invalidated is None  # accepted: the limit without a key
    lines = (root / "index.jsonl").read_text().splitlines(keepends=True)
    (root / "index.jsonl").write_text(lines[1] + lines[0])  # reordered: refused, key or not
    with pytest.raises(ArtifactError, match="out of the index's chain"):
        ArtifactStore(root).pointer(key())


def test_a_keyed_store_made_again_at_the_same_path_is_a_new_store(keyed: Path) -> None:
    """Deleting a whole store is no tampering to detect: publishing into its path again starts a new chain."""
    shutil.rmtree(keyed)
    assert ArtifactStore(keyed).publish(candidate(median=2.0)).version == "v1"
    assert ArtifactStore(keyed).load(key()).manifest.measurements.median_ms == 2.0


def test_an_honest_keyed_store_reads_and_grows(keyed: Path, tmp_path: Path) -> None:
    """The control: publishes, invalidations and readers of an untouched keyed store pass every check."""
    st = ArtifactStore(keyed)
    assert st.publish(candidate(median=0.5, config={"BM": 64})).version == "v2"
    st.invalidate(key(), "found wrong")
    assert ArtifactStore(keyed).pointer(key()).invalidated == "found wrong"
    code, stdout, stderr = run_cli(["artifacts", "verify", "--store", str(keyed)], tmp_path)
    assert code == 0 and "2 version(s) verified" in stdout, stdout + stderr


# -- the exported package --------------------------------------------------------------------------------

def test_the_package_never_runs_an_invalidated_artifact_whose_record_was_edited(tmp_path: Path) -> None:
    root = tmp_path / "store"
    st = ArtifactStore(root)
    assert st.publish(candidate(median=1.0, evidence="measured", detected=M2MAX, speedup=3.0)).published
    st.invalidate(key(), "found wrong on a ragged shape")
    result = export(["gemm"], tmp_path / "dist", st, package="ks_inv", version="1.0")
    pkg = result.source_dir / "ks_inv"
    table = json.loads((pkg / "dispatch.json").read_text())
    record = next(a for a in table["families"]["gemm"]["artifacts"] if a["key"] == KEY)
    assert record["invalidated"] == "found wrong on a ragged shape"
    record["invalidated"] = None
    (pkg / "dispatch.json").write_text(json.dumps(table))
    dispatcher = _runtime.Dispatcher(pkg)
    dispatcher.toolchain = dict(record["timing_identity"])
    arrays = [SimpleNamespace(shape=(64, 64), dtype="float32")] * 2
    with pytest.warns(RuntimeWarning, match=KEY):
        decision = dispatcher.explain("gemm", *arrays, chip="M2 Max")
    assert decision.artifact is None and f"{KEY}/v1 skipped: refused: " in str(decision), str(decision)
