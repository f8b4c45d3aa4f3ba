"""The records a result travels in: a proof extended by a further check, read back from JSON."""

from __future__ import annotations

import pytest

from kernsearch._records import Figures, Proof, Winner
from kernsearch._vocabulary import Evidence, Verifier


def test_a_further_check_adds_its_new_shapes_once_and_the_larger_errors() -> None:
    """A nightly job's extra shapes may include one the search already proved: it is one shape, checked once."""
    searched = Proof(Verifier.INTERPRETER, ("60x60x60", "4096x4096x4096"), 0.001, 0.01, threadgroups_checked=12)
    extra = Proof(Verifier.INTERPRETER, ("60x60x60", "64x64x64"), 0.002, None)
    both = searched.also(extra)
    assert both.shapes == ("60x60x60", "4096x4096x4096", "64x64x64") and both.checks == 3
    assert (both.max_abs_err, both.max_rel_err, both.threadgroups_checked) == (0.002, 0.01, 12)


def test_checks_of_two_verifiers_are_not_one_proof() -> None:
    device = Proof(Verifier.DEVICE, ("64x64x64",), 0.001)
    with pytest.raises(ValueError, match="interpreter check cannot extend a proof on the device"):
        device.also(Proof(Verifier.INTERPRETER, ("60x60x60",), 0.001))


def test_a_winner_read_back_is_the_winner_and_a_malformed_one_is_refused() -> None:
    winner = Winner(3, {"BM": 64}, Evidence.MEASURED, Figures(median_ms=0.02, spread=0.01, baseline_median_ms=0.03),
                    "gemm/H100/float16/64x64x64/cuda", Proof(Verifier.DEVICE, ("64x64x64",), 0.001, 0.0001))
    assert Winner.from_json(winner.to_json()) == winner
    for bad in ({"config": {}, "evidence": "guessed", "median_ms": 1, "spread": 0},
                {"config": {}, "evidence": "measured", "median_ms": float("nan"), "spread": 0}, {"config": []}):
        with pytest.raises(ValueError):
            Winner.from_json(bad)


def test_a_manifest_with_an_unknown_word_names_the_words_it_takes() -> None:
    """A malformed manifest's one-line error lists the vocabulary's words, not the enums' members."""
    import json
    from pathlib import Path

    from kernsearch.artifacts._manifest import ArtifactError, parse_manifest

    text = next((Path(__file__).resolve().parents[1] / "artifacts").rglob("manifest.json")).read_text()
    for edit, said in ((lambda d: d.update(evidence="guessed"), "'measured', 'interpreted' or 'modeled'"),
                       (lambda d: d["correctness"].update(verifier="recorded"), "proven on the device or the interpreter")):
        data = json.loads(text)
        edit(data)
        with pytest.raises(ArtifactError) as error:
            parse_manifest(json.dumps(data), "m.json")
        assert said in str(error.value) and "<" not in str(error.value)
