"""The artifact store: versions, the regression gate, refusal of bad artifacts, concurrency and crashes."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from judged import consumer_modes

from kernsearch import ArtifactStore, Candidate, Space, get_chip, load_family, make_problem
from kernsearch.artifacts._artifacts import ArtifactKey
from kernsearch.artifacts._gate import gate
from kernsearch.artifacts._manifest import (
    SCHEMA_VERSION,
    ArtifactError,
    Correctness,
    Manifest,
    Measurements,
    Toolchain,
    parse_manifest,
)

REPO = Path(__file__).resolve().parents[1]
M2MAX_INFO = {"architecture": "applegpu_g14c", "device_name": "Apple M2 Max"}
KEY = "gemm/M2-Max/float32/64x64x64"


def candidate(median: float = 1.0, spread: float = 0.0, evidence: str = "modeled", chip: str = "M2 Max",
              shape: tuple[int, ...] = (64, 64, 64), dtype: str = "float32", config: dict | None = None,
              passed: bool = True, detected: dict | None = None, toolchain: Toolchain | None = None,
              target: str = "metal", speedup: float = 2.0) -> Candidate:
    """A gemm candidate with the given evidence (the store's input; the figures are the test's choice)."""
    fam = load_family("gemm")
    c = get_chip(chip)
    if detected is not None:
        c = c.model_copy(update={"detected": detected})
    space = Space(make_problem(fam, shape, dtype, c), c)
    corr = Correctness(verifier="device" if evidence == "measured" else "interpreter", passed=passed,
                       shapes_checked=["x".join(map(str, shape))], max_abs_error=1e-6, checks_run=2)
    meas = None if evidence == "interpreted" else Measurements(
        median_ms=median, spread=spread, samples_ms=[median] * 5, baseline_median_ms=speedup * median,
        baseline_spread=spread, speedup_low=speedup * (1 - spread / 2) / (1 + spread / 2),
        speedup_high=speedup * (1 + spread / 2) / (1 - spread / 2),
        modes=consumer_modes(median, speedup, speedup * (1 - spread / 2) / (1 + spread / 2),
                             speedup * (1 + spread / 2) / (1 - spread / 2)))
    return Candidate.for_config(space, space.parse_config(config or {}), target=target, correctness=corr,
                                evidence=evidence, measurements=meas, study="test-study", toolchain=toolchain)


def toolchain(mlx: str = "0.32.4") -> Toolchain:
    return Toolchain(kernsearch_version="0.1.0", mlx_version=mlx, python_version="3.11.7", os="Darwin",
                     os_release="24.1.0", macos_version="15.1", macos_build="24B83")


def key(text: str = KEY) -> ArtifactKey:
    return ArtifactKey.parse(text)[0]


# -- versions and the gate ---------------------------------------------------------------------------------

def test_publish_creates_versions_and_the_gate_needs_a_gain_beyond_noise(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    first = store.publish(candidate(median=1.0, spread=0.02))
    assert (first.published, first.version, first.key) == (True, "v1", KEY)
    same = store.publish(candidate(median=0.99, spread=0.02))  # 1 % faster, 2 % noise
    assert not same.published and same.version is None and "not faster than v1 beyond the noise" in same.reason
    assert same.current == "v1"
    faster = store.publish(candidate(median=0.5, spread=0.02, config={"BM": 64}))
    assert (faster.published, faster.version) == (True, "v2") and "faster than v1" in faster.reason
    assert store.versions(key()) == ["v1", "v2"] and store.pointer(key()).version == "v2"
    art = store.load(key())
    assert art.version == "v2" and art.manifest.config["BM"] == 64 and art.manifest.gate.replaced == "v1"
    assert art.manifest.measurements.speedup == pytest.approx(2.0)
    # v1 is untouched by later publishes
    assert store.load(key(), "v1").manifest.measurements.median_ms == 1.0
    assert [e["outcome"] for e in store.journal(key())] == ["published", "rejected", "published"]
    # min_gain is required on top of the noise
    assert not store.publish(candidate(median=0.47, spread=0.02), min_gain=0.05).published


def _paired(c: Candidate, lo: float, hi: float, rounds: int = 30) -> Candidate:
    """``c`` with per-round ratios (op / kernel) spread evenly over [lo, hi] in both consumer modes."""
    ratios = [lo + (hi - lo) * i / (rounds - 1) for i in range(rounds)]
    m = c.measurements
    assert m is not None and m.modes
    modes = {k: v.model_copy(update={"ratios": tuple(ratios)}) for k, v in m.modes.items()}
    return dataclasses.replace(c, measurements=m.model_copy(update={"modes": modes}))


def test_a_version_whose_speedup_interval_lies_above_the_currents_replaces_it_whatever_the_spread(
        tmp_path: Path) -> None:
    """Each version's speedup over the op was measured against the op in its own run; where the new interval lies
    wholly above the current's, the new one is faster as consumers call it, even when the medians' p10-p90 spread
    (39 %: graph mode on the H200) is wider than the gain. Overlapping intervals fall back to the spread rule."""
    store = ArtifactStore(tmp_path)
    v1 = _paired(candidate(median=0.1642, spread=0.39, evidence="measured", detected=M2MAX_INFO), 1.0, 1.5)
    assert store.publish(v1).published
    overlapping = _paired(candidate(median=0.13, spread=0.39, evidence="measured", detected=M2MAX_INFO,
                                    config={"BM": 64}), 1.25, 1.75)
    kept = store.publish(overlapping)
    assert not kept.published and "not faster than v1 beyond the noise" in kept.reason
    above = _paired(candidate(median=0.1273, spread=0.39, evidence="measured", detected=M2MAX_INFO,
                              config={"BM": 64}), 1.6, 1.95)
    out = store.publish(above)
    assert out.published and out.version == "v2", out.reason
    assert "as consumers call it" in out.reason and "graph 1.6" in out.reason
    # without paired rounds (a version judged before them) the spread rule alone decides
    plain = candidate(median=0.1, spread=0.39, evidence="measured", detected=M2MAX_INFO, config={"BM": 32})
    assert not store.publish(plain).published


def test_version_holds_source_config_geometry_and_evidence(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    c = candidate(median=0.8, evidence="measured", detected=M2MAX_INFO, config={"LAYOUT_B": "t"})
    store.publish(c)
    art = store.load(key())
    m = art.manifest
    assert art.kernel.header == c.kernel.header and art.kernel.source == c.kernel.source
    assert m.source_sha256 == c.kernel.sha256 and len(m.template.sha256) == 64
    assert m.schema_version == SCHEMA_VERSION and m.evidence == "measured" and m.correctness.verifier == "device"
    assert m.chip.detected == M2MAX_INFO and m.chip.lineage == ("apple-g14", "apple-g14c")
    assert art.geometry == c.geometry and m.geometry.transposed_inputs == ["B"]
    assert m.problem.flops == 2 * 64 ** 3 and m.study == "test-study" and m.toolchain.mlx_version
    assert (art.path / "header.metal").read_text() == c.kernel.header


def _versus(c: Candidate, version: str, lo: float, hi: float, rounds: int = 30) -> Candidate:
    """``c`` timed against ``version`` in paired rounds: per-round ratios (current / new) spread evenly over [lo, hi]
    in both consumer modes."""
    from kernsearch._records import Versus

    ratios = tuple(lo + (hi - lo) * i / (rounds - 1) for i in range(rounds))
    m = c.measurements
    assert m is not None
    versus = Versus(version=version, modes={"graph": ratios, "eager": ratios})
    return dataclasses.replace(c, measurements=m.model_copy(update={"versus": versus}))


def test_paired_rounds_against_the_current_version_decide_alone_whatever_the_two_runs_say(tmp_path: Path) -> None:
    """A new result timed against the current version itself in its final round (two kernels back to back in one
    run) is judged on those rounds: faster when their interval lies above 1 + the margin, else kept out, whatever
    the two runs' speedups over the op say; rounds against another version say nothing of this one."""
    store = ArtifactStore(tmp_path)
    v1 = _paired(candidate(median=0.1642, spread=0.39, evidence="measured", detected=M2MAX_INFO), 1.0, 1.5)
    assert store.publish(v1).published

    def new(config: dict) -> Candidate:  # its speedup over the op overlaps v1's: the two runs decide nothing
        return _paired(candidate(median=0.13, spread=0.39, evidence="measured", detected=M2MAX_INFO, config=config),
                       1.25, 1.75)

    assert not store.publish(new({"BM": 64})).published  # as before: overlapping, within the noise
    stale = store.publish(_versus(new({"BM": 64}), "v7", 1.2, 1.3))  # rounds against a version that is not current
    assert not stale.published and "beyond the noise" in stale.reason
    slow = _paired(candidate(median=0.1, spread=0.39, evidence="measured", detected=M2MAX_INFO, config={"BM": 32}),
                   1.6, 1.95)  # its interval over the op lies above v1's, but against v1 itself it is no faster
    kept = store.publish(_versus(slow, "v1", 0.97, 1.05))
    assert not kept.published and "not faster than v1 by more than 3% in paired rounds" in kept.reason, kept.reason
    assert not store.publish(_versus(new({"BM": 64}), "v1", 1.02, 1.025)).published  # 2 %: within the margin
    assert not store.publish(_versus(new({"BM": 64}), "v1", 1.2, 1.3), min_gain=0.25).published
    out = store.publish(_versus(new({"BM": 64}), "v1", 1.2, 1.3))
    assert out.published and out.version == "v2" and "faster than v1 in paired rounds of one run" in out.reason
    assert "graph 99% interval 1.2" in out.reason, out.reason
    versus = store.load(key()).manifest.measurements.versus
    assert versus is not None and versus.version == "v1" and len(versus.modes["graph"]) == 30  # kept in the manifest


def test_paired_rounds_against_the_current_version_are_judged_in_the_familys_modes(tmp_path: Path) -> None:
    """A decode family is judged by the chain (graph) alone: its final round stops the rounds against the current
    version when graph decides, so an eager interval still spanning the margin must not keep the new version out."""
    from kernsearch._records import Versus
    from kernsearch.artifacts._candidate import draft_manifest
    from kernsearch.artifacts._gate import gate

    store = ArtifactStore(tmp_path)
    assert store.publish(candidate(median=1.0, spread=0.39, evidence="measured", detected=M2MAX_INFO)).published
    current = store.load(key()).manifest
    c = candidate(median=0.9, spread=0.39, evidence="measured", detected=M2MAX_INFO, config={"BM": 64})
    graph = tuple(1.2 + 0.1 * i / 29 for i in range(30))
    eager = tuple(0.97 + 0.08 * i / 29 for i in range(30))
    m = c.measurements
    assert m is not None
    c = dataclasses.replace(c, measurements=m.model_copy(update={
        "versus": Versus(version="v1", modes={"graph": graph, "eager": eager})}))
    draft = draft_manifest(c)
    judged_by_chain = gate(draft, current, None, 0.0, ("graph",))
    assert judged_by_chain[0] and "in paired rounds of one run" in judged_by_chain[1] and "eager" in judged_by_chain[1]
    assert not gate(draft, current, None, 0.0, ("graph", "eager"))[0]  # judged in both: eager has not decided


def test_modeled_never_replaces_measured_but_measured_replaces_modeled(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    assert store.publish(candidate(median=1.0, evidence="measured", detected=M2MAX_INFO)).published
    modeled = store.publish(candidate(median=0.1, evidence="modeled"))
    assert not modeled.published and "modeled results never replace measured" in modeled.reason
    interpreted = store.publish(candidate(evidence="interpreted"))
    assert not interpreted.published and store.pointer(key()).version == "v1"

    other = ArtifactStore(tmp_path / "other")
    other.publish(candidate(median=0.1, evidence="modeled"))
    slower_but_measured = other.publish(candidate(median=5.0, evidence="measured", detected=M2MAX_INFO))
    assert slower_but_measured.published and "replaces modeled v1" in slower_but_measured.reason


def test_toolchain_change_invalidates_a_measured_current(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.publish(candidate(median=1.0, evidence="measured", detected=M2MAX_INFO, toolchain=toolchain("0.30.0")))
    same_toolchain = store.publish(candidate(median=2.0, evidence="measured", detected=M2MAX_INFO,
                                             toolchain=toolchain("0.30.0")))
    assert not same_toolchain.published
    new_mlx = store.publish(candidate(median=2.0, evidence="measured", detected=M2MAX_INFO,
                                      toolchain=toolchain("0.32.4")))
    assert new_mlx.published and "toolchain changed (mlx 0.30 → 0.32)" in new_mlx.reason
    patch_only = store.publish(candidate(median=3.0, evidence="measured", detected=M2MAX_INFO,
                                         toolchain=toolchain("0.32.5")))
    assert not patch_only.published  # an MLX patch release does not void a measurement


def test_explicit_invalidation_and_unreadable_current_let_a_correct_candidate_in(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    store.publish(candidate(median=1.0))
    store.invalidate(key(), "wrong results reported on M2 Max")
    assert store.pointer(key()).invalidated == "wrong results reported on M2 Max"
    assert list(store.current_artifacts()) == []  # invalidated versions are not shipped
    out = store.publish(candidate(median=3.0))
    assert out.published and out.version == "v2" and "invalidated: wrong results" in out.reason
    (store.key_dir(key()) / "v2" / "source.metal").write_text("// tampered\n")
    out = store.publish(candidate(median=9.0))
    assert out.published and out.version == "v3" and "unreadable" in out.reason


def test_failed_verification_is_refused_and_recorded(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    out = store.publish(candidate(passed=False))
    assert not out.published and out.version is None and "failed verification" in out.reason
    assert store.versions(key()) == [] and store.pointer(key()) is None
    assert store.journal(key())[-1]["outcome"] == "rejected"


@pytest.mark.parametrize("make, message", [
    (lambda: candidate(evidence="measured"), "measured evidence needs a GPU detected"),
    (lambda: candidate(evidence="measured", chip="cpu", detected={"architecture": "x86_64"}), "a CPU"),
    (lambda: candidate(evidence="measured", detected={"architecture": "sm_90", "device_name": "NVIDIA H100"}),
     "does not match the device that timed it"),
    (lambda: candidate(config={"VEC": 4}, shape=(63, 64, 63)), "vector_alignment"),
])
def test_inconsistent_candidates_are_refused(tmp_path: Path, make, message: str) -> None:
    with pytest.raises(ArtifactError, match=message):
        ArtifactStore(tmp_path).publish(make())


def test_a_kernel_that_is_not_what_the_template_renders_is_refused(tmp_path: Path) -> None:
    import dataclasses

    c = candidate()
    edited = dataclasses.replace(c.kernel, source=c.kernel.source + "// edited by hand\n")
    with pytest.raises(ArtifactError, match="differs from what gemm.metal.j2 renders"):
        ArtifactStore(tmp_path).publish(dataclasses.replace(c, kernel=edited))


def test_gate_is_a_pure_decision() -> None:
    store_free = candidate(median=1.0)
    from kernsearch.artifacts._candidate import draft_manifest

    draft = draft_manifest(store_free)
    from kernsearch.artifacts._manifest import MODELED_POLICY

    assert gate(draft, None, None) == (True, f"first version for this key (modeled); {MODELED_POLICY}")


# -- refusing bad artifacts ------------------------------------------------------------------------------

@pytest.fixture
def published(tmp_path: Path) -> ArtifactStore:
    store = ArtifactStore(tmp_path / "store")
    store.publish(candidate(median=1.0))
    return store


def _manifest_file(store: ArtifactStore) -> Path:
    return store.key_dir(key()) / "v1" / "manifest.json"


@pytest.mark.parametrize("damage, message", [
    (lambda s: (s.key_dir(key()) / "v1" / "source.metal").write_text("kernel void evil() {}\n"),
     "source hash mismatch .* tampered or corrupted"),
    (lambda s: (s.key_dir(key()) / "v1" / "header.metal").unlink(), "missing kernel file header.metal"),
    (lambda s: _manifest_file(s).write_text("{ not json"), "malformed manifest: not JSON"),
    (lambda s: _manifest_file(s).write_text("[]"), "malformed manifest: expected a JSON object"),
    (lambda s: _manifest_file(s).write_text(json.dumps({
        k: v for k, v in json.loads(_manifest_file(s).read_text()).items() if k != "correctness"})),
     "malformed manifest: correctness: Field required"),
    (lambda s: _manifest_file(s).write_text(json.dumps({
        **json.loads(_manifest_file(s).read_text()), "evidence": "guessed"})), "malformed manifest: evidence"),
    (lambda s: _manifest_file(s).write_text(json.dumps({
        **json.loads(_manifest_file(s).read_text()), "schema_version": 3})),
     "unknown manifest schema version 3 \\(this kernsearch reads version 2 and migrates 1\\)"),
    (lambda s: _manifest_file(s).write_text(json.dumps({
        k: v for k, v in json.loads(_manifest_file(s).read_text()).items() if k != "schema_version"})),
     "no schema_version"),
    (lambda s: _manifest_file(s).write_text(json.dumps({
        **json.loads(_manifest_file(s).read_text()), "version": "v7"})), "manifest describes .*/v7, not this folder"),
    (lambda s: _manifest_file(s).write_text(json.dumps({
        **(m := json.loads(_manifest_file(s).read_text())),
        "kernel": {**m["kernel"], "source_file": "../../../../../etc/passwd"}})),
     "malformed manifest: kernel.source_file"),
])
def test_tampered_or_malformed_artifacts_are_refused_in_one_line(published: ArtifactStore, damage,
                                                                 message: str) -> None:
    damage(published)
    with pytest.raises(ArtifactError, match=message) as info:
        published.load(key())
    assert "\n" not in str(info.value)
    bad = [r for r in published.verify() if not r.ok]
    assert len(bad) == 1 and bad[0].where == f"{KEY}/v1"


@pytest.mark.slow
def test_cli_refuses_a_tampered_artifact_with_one_line_and_exit_2(published: ArtifactStore) -> None:
    (published.key_dir(key()) / "v1" / "source.metal").write_text("// tampered\n")
    env = {**os.environ, "KERNSEARCH_ARTIFACTS": str(published.root)}
    for args in (["artifacts", "verify"], ["artifacts", "show", KEY]):
        res = subprocess.run([sys.executable, "-m", "kernsearch", *args], capture_output=True, text=True, env=env,
                             timeout=120)
        assert res.returncode == 2, res
        assert "Traceback" not in res.stderr
        error_lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert len(error_lines) == 1 and error_lines[0].startswith("error:"), res.stderr
    assert "source hash mismatch" in res.stderr


def test_manifest_round_trips_and_rejects_unknown_fields(published: ArtifactStore) -> None:
    text = _manifest_file(published).read_text()
    m = parse_manifest(text, "here")
    assert isinstance(m, Manifest) and parse_manifest(m.to_json(), "again") == m
    with pytest.raises(ArtifactError, match="malformed manifest: surprise: Extra inputs"):
        parse_manifest(json.dumps({**json.loads(text), "surprise": 1}), "here")


def test_bad_keys_are_one_line_errors() -> None:
    assert ArtifactKey.parse("gemm/M2 Max/float16/8x8x8/v3") == (ArtifactKey("gemm", "M2-Max", "float16", (8, 8, 8)),
                                                                "v3")
    for bad in ("../M2-Max/float16/8x8x8", "gemm/M2-Max/../8x8x8", "gemm/M2-Max/float16/0x8x8"):
        with pytest.raises(ArtifactError, match="cannot name an artifact folder|bad artifact key|bad shape"):
            ArtifactKey.parse(bad)
    for bad in ("gemm", "gemm/M2-Max/float16/eightxeight", "a/b/c/d/e/f"):
        with pytest.raises(ArtifactError, match="bad artifact key"):
            ArtifactKey.parse(bad)


def test_docs_describe_every_manifest_field_and_the_schema_version() -> None:
    doc = (REPO / "docs" / "artifacts.md").read_text()
    assert f"schema version {SCHEMA_VERSION}" in doc.lower()
    missing = [name for name in Manifest.model_fields if f"`{name}`" not in doc]
    assert not missing, f"docs/artifacts.md does not describe {missing}"


# -- concurrency and faults --------------------------------------------------------------------------------

PUBLISHER = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    from test_artifacts import candidate
    from kernsearch import ArtifactStore
    store = ArtifactStore({root!r}, lock_timeout=60)
    medians = json.loads(sys.argv[1])
    cands = [candidate(median=m) for m in medians]
    open(f"{barrier}/{{sys.argv[2]}}", "w").close()
    while len(os.listdir({barrier!r})) < {n!r}:  # start together
        time.sleep(0.002)
    t0 = time.time()
    outs = [store.publish(c) for c in cands]
    window = [t0, time.time()]
    print(json.dumps({{"window": window,
                      "outs": [[m, o.published, o.version, o.reason] for m, o in zip(medians, outs)]}}))
""")


@pytest.mark.slow
def test_concurrent_publishers_get_distinct_versions_and_a_consistent_gate(tmp_path: Path) -> None:
    root, barrier = tmp_path / "store", tmp_path / "barrier"
    barrier.mkdir()
    script = PUBLISHER.format(tests=str(Path(__file__).parent), root=str(root), barrier=str(barrier), n=4)
    medians = [[5.0 - 0.25 * (p + 4 * i) for i in range(3)] for p in range(4)]  # 12 distinct medians
    procs = [subprocess.Popen([sys.executable, "-c", script, json.dumps(m), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i, m in enumerate(medians)]
    results, windows = [], []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        report = json.loads(stdout)
        results += report["outs"]
        windows.append(report["window"])
    # the publishers really ran at the same time (at least two publish windows overlap)
    assert any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(windows) for b in windows[i + 1:]), windows
    store = ArtifactStore(root)
    published = [r for r in results if r[1]]
    versions = [r[2] for r in published]
    assert len(set(versions)) == len(versions), "two publishers got the same version"
    assert sorted(versions, key=lambda v: int(v[1:])) == [f"v{i}" for i in range(1, len(versions) + 1)]
    assert store.versions(key()) == sorted(versions, key=lambda v: int(v[1:]))
    # The gate ran serially: each published version is faster than the one before it, and the current
    # version is the fastest ever offered (nothing was lost).
    chain = [store.load(key(), v).manifest.measurements.median_ms for v in store.versions(key())]
    assert chain == sorted(chain, reverse=True) and len(set(chain)) == len(chain)
    assert store.load(key()).manifest.measurements.median_ms == min(m for ms in medians for m in ms)
    assert all(r.ok for r in store.verify())
    assert len(store.journal(key())) == 12 and all(r[3] for r in results)


KILLED_PUBLISHER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from test_artifacts import candidate
    import kernsearch.artifacts._artifacts as A
    import kernsearch.artifacts._store as S  # where a version's files are written
    real_write = S.write_atomic
    def slow_write(path, text):
        if path.name == "manifest.json":  # half the manifest on disk, then hang until killed
            real_write(path, text[: len(text) // 2])
            open({marker!r}, "w").close()
            time.sleep(120)
        real_write(path, text)
    S.write_atomic = slow_write
    A.ArtifactStore({root!r}).publish(candidate(median=0.1, config={{"BM": 64}}))
""")


def test_kill_9_during_publish_leaves_the_store_valid(tmp_path: Path) -> None:
    root, marker = tmp_path / "store", tmp_path / "writing"
    store = ArtifactStore(root, lock_timeout=30)
    store.publish(candidate(median=1.0))
    script = KILLED_PUBLISHER.format(tests=str(Path(__file__).parent), root=str(root), marker=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.time() < deadline, "the publisher never reached the manifest write"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # Readers see only the complete v1; the half-written version is a hidden temporary folder.
    assert store.versions(key()) == ["v1"] and store.pointer(key()).version == "v1"
    assert store.load(key()).version == "v1" and all(r.ok for r in store.verify())
    assert len(store.stale_temporaries()) == 1
    # The dead publisher's lock is gone: the next publish gets v2 at once.
    out = store.publish(candidate(median=0.2, config={"BM": 64}))
    assert out.published and out.version == "v2"


def test_a_busy_key_is_refused_cleanly_after_the_timeout(published: ArtifactStore) -> None:
    with open(published.key_dir(key()) / ".lock", "a+") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        t0 = time.monotonic()
        with pytest.raises(ArtifactError, match="is busy: another publisher holds"):
            ArtifactStore(published.root, lock_timeout=0.3).publish(candidate(median=0.1))
        assert time.monotonic() - t0 < 5
    assert published.versions(key()) == ["v1"]


def test_evidence_helpers_take_timings_and_checks(tmp_path: Path) -> None:
    import dataclasses

    from kernsearch.backends._base import Evidence, Timing
    from kernsearch.evaluation._verify import Check

    timing = Timing([1.0, 1.1, 0.9, 1.0, 1.05], Evidence.MEASURED)
    m = Measurements.from_timing(timing, Timing([2.0] * 5, Evidence.MEASURED))
    assert m.median_ms == 1.0 and m.speedup == pytest.approx(2.0)
    assert m.spread == pytest.approx(timing.spread) and m.spread > 0 and m.samples_ms == timing.samples_ms
    corr = Correctness.from_checks("device", [("64x64x64", Check(True, max_abs_err=1e-3, max_rel_err=1e-4)),
                                              ("65x63x61", Check(False, "wrong", 0.5, 0.2))])
    assert (corr.passed, corr.checks_run, corr.max_abs_error, corr.shapes_checked) == (
        False, 2, 0.5, ["64x64x64", "65x63x61"])
    out = ArtifactStore(tmp_path).publish(dataclasses.replace(candidate(), correctness=corr))
    assert not out.published and "failed verification" in out.reason


def test_an_unwritable_store_is_a_one_line_error(tmp_path: Path) -> None:
    root = tmp_path / "not-a-folder"
    root.write_text("a file where the store should be\n")
    with pytest.raises(ArtifactError, match="cannot publish to .*not-a-folder/gemm"):
        ArtifactStore(root).publish(candidate())
    from kernsearch import export
    from kernsearch.exporting._export import ExportError

    with pytest.raises(ExportError, match="cannot write the package under"):
        export(["gemm"], root / "dist", ArtifactStore(tmp_path / "empty"), version="1.0")


def test_a_cpu_search_result_publishes_with_real_interpreter_evidence(tmp_path: Path) -> None:
    """What a search on a machine without a GPU publishes: interpreter-verified, model-timed (modeled)."""
    from kernsearch import geometry, get_backend, render
    from kernsearch.evaluation._verify import verify_kernel

    fam, chip = load_family("gemm"), get_chip("M2 Max")
    space = Space(make_problem(fam, (64, 64, 64), "float32", chip), chip)
    config = space.parse_config("BM=64,LAYOUT_B=t")
    cpu = get_backend("cpu")
    checks = []
    for shape in [(64, 64, 64), (33, 20, 17)]:
        s = Space(make_problem(fam, shape, "float32", chip), chip)
        check, _ = verify_kernel(cpu, render(fam, config, "float32"), geometry(s, config), s.problem, seed=1)
        checks.append((s.problem.shape_text, check))
    correctness = Correctness.from_checks("interpreter", checks)
    assert correctness.passed and correctness.checks_run == 2 and 0 < correctness.max_abs_error < 1e-4
    predicted = get_backend("model", chip=chip).predict_ms(space, config)
    out = ArtifactStore(tmp_path).publish(Candidate.for_config(
        space, config, target="metal", correctness=correctness, evidence="modeled",
        measurements=Measurements(median_ms=predicted, spread=0.0), study="cpu-search"))
    assert out.published, out.reason
    m = ArtifactStore(tmp_path).load(key()).manifest
    assert m.evidence == "modeled" and m.correctness.verifier == "interpreter"
    assert m.correctness.shapes_checked == ["33x20x17", "64x64x64"] and m.measurements.median_ms == predicted


def test_a_kernel_for_another_vendor_is_refused(tmp_path):
    """A Metal kernel never becomes an NVIDIA chip's artifact (nor CUDA an Apple chip's)."""
    from kernsearch import ArtifactStore, Candidate, Space, get_chip, load_family, make_problem
    from kernsearch.artifacts._manifest import ArtifactError, Correctness, Measurements

    fam = load_family("gemm")
    chip = get_chip("H100")
    space = Space(make_problem(fam, "64,64,64", "float16", chip), chip)
    cfg = space.parse_config("MMA=scalar")
    candidate = Candidate.for_config(space, cfg, target="metal", evidence="modeled",
                                     correctness=Correctness(verifier="interpreter", passed=True,
                                                             shapes_checked=["64x64x64"], max_abs_error=0.0,
                                                             checks_run=1),
                                     measurements=Measurements(median_ms=1.0, spread=0.0))
    with pytest.raises(ArtifactError, match="metal kernel cannot run on H100"):
        ArtifactStore(tmp_path).publish(candidate)
