"""The final round as typed data: its stored form (study attribute ``final``, ``tune --json``) is the one
stored studies have, it reads back as it was written, and a stored round is never trusted."""

from __future__ import annotations

import json

from kernsearch import FinalistCheck, FinalistTime, FinalRound

#: As the model back-end's final round has always been stored (kernsearch 0.1.0).
INTERPRETED = {"winner": 4, "verified_on": "interpreter", "verify_shape": [64, 64, 64],
               "checks": {"4": {"ok": True, "max_abs_err": 1e-06, "shape": [64, 64, 64], "also": ["96x96x96", "67x61x69"],
                                "threadgroups_checked": None},
                          "7": {"ok": False, "reason": "wrong", "detail": "max abs err 3.2"},
                          "9": {"ok": True, "max_abs_err": 2e-06, "shape": [64, 64, 64]}},
               "baseline": None, "note": "times are predictions of the performance model (modeled), not measurements"}
MEASURED = {"winner": 2, "finalists": {"2": {"median_ms": 0.5, "spread": 0.01}, "0": {"median_ms": 0.6, "spread": 0.02}},
            "lead_exceeds_noise": True, "baseline_median_ms": 1.0, "baseline_spread": 0.03, "speedup": 2.0,
            "speedup_low": 1.9, "speedup_high": 2.1, "beats_baseline": True}
REPLAYED = {"winner": 3, "finalists": {"3": {"median_ms": 1.5}}, "note": "replayed from x; measured on A100, not here"}


def test_stored_rounds_read_back_typed_and_write_back_unchanged():
    for stored in (INTERPRETED, MEASURED, REPLAYED, {"winner": None, "note": "final round interrupted"}, {"winner": 1}):
        final = FinalRound.from_dict(json.loads(json.dumps(stored)))
        assert final is not None and final.to_dict() == stored
        assert json.dumps(final.to_dict()) == json.dumps(stored)  # key order too
    interpreted = FinalRound.from_dict(INTERPRETED)
    assert interpreted.checks[4] == FinalistCheck(True, 1e-06, (64, 64, 64), ("96x96x96", "67x61x69"))
    assert interpreted.checks[7].reason == "wrong" and not interpreted.checks[7].ok
    assert interpreted.checks[9].also is None and interpreted.verify_shape == (64, 64, 64)
    measured = FinalRound.from_dict(MEASURED)
    assert measured.finalists == {2: FinalistTime(0.5, 0.01), 0: FinalistTime(0.6, 0.02)}
    f = measured.figures
    assert f is not None and (f.median_ms, f.spread, f.speedup, f.speedup_low, f.speedup_high) == (0.5, 0.01, 2.0, 1.9,
                                                                                                   2.1)
    assert FinalRound.from_dict(REPLAYED).finalists[3].spread is None


def test_no_round_is_none():
    assert FinalRound.from_dict({}) is None and FinalRound.from_dict(None) is None
    assert FinalRound.from_dict([1, 2]) is None and FinalRound.from_dict("final") is None


def test_a_stored_round_is_not_trusted():
    hostile = {"winner": "4", "speedup": "fast", "speedup_low": True, "lead_exceeds_noise": 1, "note": ["x"],
               "verify_shape": "64", "checks": {"4": {"ok": True}, "x": {"ok": False}, "²": {"ok": False},
                                                "5": {"ok": "yes"}, "6": [], "8": {"ok": True, "max_abs_err": 0.1,
                                                                                   "shape": ["a", 3]}},
               "finalists": {"1": {"median_ms": None}, "2": 3, "3": {"median_ms": 0.2, "spread": "wide"}}}
    final = FinalRound.from_dict(hostile)
    assert final == FinalRound(None, checks={8: FinalistCheck(True, 0.1, (3,))}, finalists={3: FinalistTime(0.2)})
