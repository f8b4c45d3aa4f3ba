"""One record of a result's figures (``_records.Figures``): the final round, the winner and the manifest hold it, and
the exported package's dispatch record carries every figure of it. Adding a figure is one edit: these tests derive
the names from the record, and fail where a second declaration of them comes back."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

from kernsearch._records import Figures, ModeFigures, Winner
from kernsearch._vocabulary import Evidence
from kernsearch.artifacts._manifest import Measurements, parse_manifest
from kernsearch.exporting.runtime._runtime import decision_fields
from kernsearch.studies._final import FinalistTime, FinalRound

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "artifacts" / "gemm" / "H100" / "float16" / "16x4096x4096" / "v1" / "manifest.json"
NAMES = set(Figures.model_fields)


def every_figure() -> Figures:
    """Figures with every field set, each to a value of its own (derived from the record's fields)."""
    mode = ModeFigures(median_ms=1.0, baseline_median_ms=1.5, speedup=1.5, low=1.4, high=1.6, ratios=(1.5, 1.52))
    values: dict[str, object] = {}
    for i, (name, info) in enumerate(Figures.model_fields.items(), 1):
        counts = "int" in str(info.annotation)
        values[name] = {"graph": mode} if name == "modes" else i if counts else 0.5 + i
    values["versus"] = {"version": "v3", "modes": {"graph": (1.2, 1.25)}}
    return Figures.model_validate(values)


def test_every_holder_holds_the_one_record_and_declares_none_of_its_fields() -> None:
    own = set(Measurements.model_fields) - NAMES
    assert issubclass(Measurements, Figures) and own == {"samples_ms", "chain_calls"}
    for holder in (Winner, FinalRound):
        fields = {f.name: f.type for f in dataclasses.fields(holder)}
        assert "figures" in fields and "Figures" in str(fields["figures"]), holder
        assert not NAMES & set(fields), f"{holder.__name__} declares {sorted(NAMES & set(fields))} again"


def test_no_other_record_declares_the_figures() -> None:
    """A class anywhere in the package that declares two or more of the figures (beyond a time and its spread,
    which every timing has) is a second declaration. ``ModeFigures`` is the record of one consumer mode's figures,
    which ``Figures.modes`` holds."""
    distinctive = NAMES - {"median_ms", "spread", "modes"}
    found = []
    for file in (ROOT / "search").rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name not in ("Figures", "ModeFigures"):
                declared = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign)
                            and isinstance(s.target, ast.Name)}
                if len(declared & distinctive) >= 2:
                    found.append(f"{file.relative_to(ROOT)}:{node.name} {sorted(declared & distinctive)}")
    assert not found


def test_a_figure_travels_from_the_final_round_to_the_dispatch_record() -> None:
    """Every figure the final round holds reaches the winner, the stored round, the manifest and the dispatch
    record under its one name, with its value."""
    figures = every_figure()
    final = FinalRound(0, finalists={0: FinalistTime(figures.median_ms, figures.spread)}, figures=figures)
    assert FinalRound.from_dict(json.loads(json.dumps(final.to_dict()))) == final
    winner = Winner(0, {}, Evidence.MEASURED, figures)
    assert Winner.from_json(json.loads(json.dumps(winner.to_json()))) == winner
    stored = parse_manifest(STORED.read_text(), str(STORED))  # a manifest on disk, with the winner's figures
    manifest = stored.model_copy(update={"measurements": Measurements.of(winner)})
    read = parse_manifest(manifest.to_json(), "m")
    assert read.measurements is not None
    assert {n: getattr(read.measurements, n) for n in NAMES} == {n: getattr(figures, n) for n in NAMES}
    record = decision_fields(json.loads(manifest.to_json()))
    expected = figures.to_json()
    assert {n: record[n] for n in NAMES - {"versus"}} == {k: v for k, v in expected.items() if k != "versus"}
    assert not {"samples_ms", "chain_calls", "versus"} & set(record)  # versus: the gate's, not the dispatcher's


def test_a_manifest_on_disk_reads_into_the_record_and_its_dispatch_figures_are_its_own() -> None:
    stored = parse_manifest(STORED.read_text(), str(STORED))
    assert isinstance(stored.measurements, Figures)
    raw = json.loads(STORED.read_text())
    record = decision_fields(raw)
    assert {k: record[k] for k in raw["measurements"] if k != "samples_ms"} == \
        {k: v for k, v in raw["measurements"].items() if k != "samples_ms"}
