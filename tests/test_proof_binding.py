"""Issue 36's building blocks, each on its own: a proof records the exact kernel it ran and a publish of another
rendering is refused; a study knows the family content it was made from; a write past an output's end changes
its poisoned guard zone; a ragged shape is off every tile; failures say where; the smaller rough edges (the
reference's vocabulary in its unknown-name error, `run` suggesting ``shape=``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from kernsearch import KernsearchError, Space, get_chip, load_family, make_problem
from kernsearch._errors import SpecError
from kernsearch._records import Figures, Proof, Winner
from kernsearch._vocabulary import Evidence, Verifier
from kernsearch.studies._final import FinalistCheck

FAMILY = Path(__file__).parent / "families" / "gate_gemv"
M2MAX = get_chip("M2 Max")
OFF_BY_ONE = ("const bool live = n0 + r < N;", "const bool live = n0 + r <= N;")


def copy(tmp_path: Path, change: tuple[str, str] | None = None) -> Path:
    folder = tmp_path / "gate_gemv"
    if not folder.exists():
        shutil.copytree(FAMILY, folder)
    if change is not None:
        path = folder / "gate_gemv.metal.j2"
        path.write_text(path.read_text().replace(*change))
    return folder


def test_a_final_check_keeps_the_kernel_it_proved() -> None:
    check = FinalistCheck(True, 0.01, (3, 66, 64), ("2x65x63",), 12, sha256="ab" * 32)
    assert FinalistCheck.from_dict(check.to_dict()) == check
    assert FinalistCheck.from_dict({"ok": True, "max_abs_err": 0.1, "shape": [1]}).sha256 == ""  # an older round


def test_a_winner_proven_as_another_kernel_than_its_config_renders_to_is_refused(tmp_path: Path) -> None:
    from kernsearch.artifacts._candidate import Candidate
    from kernsearch.artifacts._manifest import ArtifactError
    from kernsearch.family._render import render

    space = Space(make_problem(load_family(copy(tmp_path)), "3,100,256", "float16", M2MAX), M2MAX)
    config = {"TG": 64, "ROWS": 4}
    proof = Proof(Verifier.INTERPRETER, ("3x100x256",), 0.01)
    now = render(space.family, config, "float16", "metal").sha256
    figures = Figures(median_ms=0.01, spread=0.0)
    winner = Winner(1, config, Evidence.MODELED, figures, "S", proof, sha256=now)
    assert Winner.from_json(winner.to_json()) == winner
    assert Candidate.from_winner(winner, space, target="metal").kernel.sha256 == now
    stale = Winner(1, config, Evidence.MODELED, figures, "S", proof, sha256="0" * 64)
    with pytest.raises(ArtifactError, match="stale proof: the winner .trial 1. was proven as kernel 000000000000"):
        Candidate.from_winner(stale, space, target="metal")


def test_the_family_content_hash_follows_every_template_and_the_spec(tmp_path: Path) -> None:
    from kernsearch.family._identity import family_sha256

    folder = copy(tmp_path)
    before = family_sha256(load_family(folder))
    assert family_sha256(load_family(FAMILY)) == before  # the content, not the folder
    (folder / "notes.txt").write_text("not a template")
    assert family_sha256(load_family(folder)) == before
    (folder / "helpers.j2").write_text("{% macro m() %}{% endmacro %}")  # an include a template may read
    with_include = family_sha256(load_family(folder))
    assert with_include != before
    copy(tmp_path, OFF_BY_ONE)
    assert family_sha256(load_family(folder)) not in (before, with_include)


@pytest.mark.slow
def test_a_resumed_study_whose_family_changed_is_another_study(tmp_path: Path) -> None:
    from kernsearch.studies._objective import KernelObjective
    from kernsearch.studies._study import open_study, study_for

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    folder = copy(tmp_path)

    def objective() -> KernelObjective:
        return KernelObjective(make_problem(load_family(folder), "3,100,256", "float16", M2MAX), M2MAX, "model")

    first = objective()
    made = open_study(first, storage, "S", "random", 0)
    assert made.user_attrs["family_sha256"] == first.family_sha256()
    assert study_for(first, storage, "S").changed is None
    copy(tmp_path, OFF_BY_ONE)
    place = study_for(objective(), storage, "S")
    assert place.name == f"S@{objective().family_sha256()[:12]}" and place.trials == 0
    assert place.changed is not None and "study 'S' was made from another version of family gate_gemv" in \
        place.changed and "starts study" in place.changed
    assert open_study(objective(), storage, "S", "random", 0).study_name == place.name
    assert "resumes study" in (study_for(objective(), storage, "S").changed or "")


@pytest.mark.slow
def test_a_write_past_an_outputs_end_changes_its_guard_zone_and_is_a_bounds_error(tmp_path: Path) -> None:
    """The off-by-one at the ragged edge writes Y[b, N] of the last row b: past Y's end, where nothing is
    compared. In grid order every other bad write is overwritten by the next threadgroup's right value."""
    import kernsearch

    folder = copy(tmp_path, OFF_BY_ONE)
    ran = kernsearch.run(folder, "TG=64,ROWS=8", shape=(2, 65, 63), chip="M2 Max")
    bounds = [d for d in ran.diagnostics if d.kind == "device_bounds"]
    assert bounds and "a write past the end of output Y" in bounds[0].message, ran.diagnostics
    clean = kernsearch.run(FAMILY, "TG=64,ROWS=8", shape=(2, 65, 63), chip="M2 Max")
    assert not [d for d in clean.diagnostics if d.kind == "device_bounds"]


def test_a_ragged_shape_is_off_every_tile() -> None:
    from kernsearch.family._shapes import ragged_shape

    fam = load_family(FAMILY)
    for rows in (2, 4, 8):
        shape = ragged_shape(fam, "float16", M2MAX, {"TG": 64, "ROWS": rows}, (3, 64, 64))
        assert shape is not None and shape[1] % rows != 0, shape


def test_a_nan_found_in_fast_mode_says_that_check_mode_says_why() -> None:
    from kernsearch.evaluation._verify import Check
    from kernsearch.variants._tasks import _with_hint

    nan = Check(False, "nan", detail="Y: 3 element(s) NaN, first at (0, 5)")
    assert _with_hint(nan, {}).startswith("Y: 3 element(s) NaN, first at (0, 5); `kernsearch verify ... --check`")
    assert "--check" not in _with_hint(nan, {"mode": "check"})
    assert "--check" not in _with_hint(Check(False, "wrong", detail="Y: off"), {})


def test_an_unknown_reference_name_lists_the_vocabulary(tmp_path: Path) -> None:
    folder = copy(tmp_path)
    spec = folder / "family.toml"
    spec.write_text(spec.read_text().replace('reference = "silu(', 'reference = "gelu_tanh(', 1))
    with pytest.raises(SpecError) as caught:
        load_family(folder)
    text = str(caught.value)
    assert "unknown name(s) gelu_tanh" in text and "gelu (the exact, erf form)" in text and "matmul" in text
    assert "the inputs, dimensions and parameters x, Wg, Wu, B, N, K" in text


def test_run_suggests_shape_for_a_dim_no_input_carries() -> None:
    import kernsearch

    with pytest.raises(KernsearchError, match=r"no input given carries N: pass shape=\(B, N, K\) too"):
        kernsearch.run(FAMILY, "TG=64,ROWS=4", inputs={"x": np.zeros((2, 128))})
