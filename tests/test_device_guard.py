"""Out-of-bounds checks of a search measured on a GPU (issue 36): every verification run on the device gives each
output a poisoned guard zone after its end (``kernsearch.backends._guard``), the final round proves the winner at a
ragged shape off every tile, and a publish line says exactly which checks ran (``BoundsChecks.text``).

The device is ``benchmarks/interpreted_gpu.py``: the metal back-end's own ``run`` (the outputs it declares, the fill
it asks for), its kernel object replaced by the CPU interpreter in grid order, reporting nothing of its own.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kernsearch import Space, geometry, get_chip, load_family, make_problem, render
from kernsearch.backends._guard import POISON, OutputGuard, guard_elements, guarded_run
from kernsearch.evaluation._verify import SENTINEL, verify_kernel
from kernsearch.family._shapes import ragged_shape
from kernsearch.family._spec import builtin_families_dir
from kernsearch.studies._final import BoundsChecks, FinalistCheck

REPO = Path(__file__).resolve().parents[1]
#: A gemv config with 4 outputs per threadgroup (SG 4 x R 1) and 4-element vectors along K.
CONFIG = {"LAYOUT_W": "nk", "SG": 4, "KS": 1, "R": 1, "VEC": 4, "MB": 1}
#: The off-by-one at the ragged edge: row N is loaded (past W's end) and written (past Y's end, for the last row).
OFF_BY_ONE = ("n0 + r < N", "n0 + r <= N")


@pytest.fixture
def device():  # noqa: ANN201
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from interpreted_gpu import InterpretedGPU

        yield InterpretedGPU()
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def planted_gemv(tmp_path: Path, change: tuple[str, str] | None) -> Path:
    folder = tmp_path / "gemv"
    shutil.copytree(builtin_families_dir() / "gemv", folder)
    if change is not None:
        text = (folder / "gemv.metal.j2").read_text()
        assert change[0] in text
        (folder / "gemv.metal.j2").write_text(text.replace(*change))
    return folder


def verify_on(device, folder: Path, shape: str):  # noqa: ANN001, ANN201
    fam, chip = load_family(str(folder)), get_chip("M2 Max")
    problem = make_problem(fam, shape, "float16", chip)
    space = Space(problem, chip)
    assert space.is_valid(CONFIG)
    return verify_kernel(device, render(fam, CONFIG, "float16", "metal"), geometry(space, CONFIG), problem)


# -- the guard zone itself ---------------------------------------------------------------------------------------
def _geometry(shape: tuple[int, ...] = (3, 5), dtype: str = "float16"):  # noqa: ANN202
    fam, chip = load_family("gemv"), get_chip("M2 Max")
    geo = geometry(Space(make_problem(fam, "3,64,64", "float16", chip), chip), dict(fam.default))
    return replace(geo, output_shapes=(shape,), output_dtypes=(dtype,))


def _writing(past_end: float | None):  # noqa: ANN202
    """A launch that writes every output element (1.0) and, given ``past_end``, that value one element past it."""
    launched: list[tuple[tuple[int, ...], float | None]] = []

    def launch(geo, init):  # noqa: ANN001, ANN202
        shape = geo.output_shapes[0]
        launched.append((tuple(shape), init))
        out = np.full(shape, np.nan if init is None else init)
        n = 15
        out[:n] = 1.0
        if past_end is not None:
            out[n] = past_end
        return [out]

    return launch, launched


@pytest.mark.parametrize("written", [0.25, float("nan"), 0.0])
def test_a_write_past_the_end_is_reported_whatever_it_writes(written: float) -> None:
    """A NaN written where NaN was filled (a read past an input's end finds a NaN-filled buffer) shows nothing: a NaN
    fill is followed by a run filled with the poison, whose guard is checked. A zero fill is kept (accumulating and
    persistent kernels need it): there only a zero written goes unseen."""
    for init in (float("nan"), 0.0, SENTINEL):
        launch, launched = _writing(written)
        outputs, found = guarded_run(launch, _geometry(), init, ("Y",))
        assert outputs[0].shape == (3, 5) and np.all(outputs[0] == 1.0)
        assert all(shape == (15 + guard_elements((3, 5), "float16"),) for shape, _ in launched)
        assert [i for _, i in launched][1:] == ([POISON] if np.isnan(init) else [])
        if init == 0.0 and written == 0.0:
            assert found == []
            continue
        assert [d.kind for d in found] == ["device_bounds"], (written, init)
        assert "past the end of output Y on the device (element 0" in found[0].message


def test_an_untouched_guard_reports_nothing_and_an_integer_output_is_not_guarded() -> None:
    launch, _ = _writing(None)
    assert guarded_run(launch, _geometry(), float("nan"), ("Y",))[1] == []
    launch, _ = _writing(7.0)
    assert guarded_run(launch, _geometry(dtype="uint32"), 0.0, ("S",))[1] == []  # NaN's cast is the platform's


def test_a_guard_zone_spans_a_whole_row_past_the_end() -> None:
    assert guard_elements((3, 5), "float16") == 2048 and guard_elements((3, 5), "float32") == 1024
    assert guard_elements((2, 8192), "float16") == 8192  # an off-by-one in the row count writes a whole row
    assert OutputGuard(_geometry(), None).geometry.output_shapes == ((3, 5),)  # unfilled: nothing to guard


# -- through the metal back-end's run ------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_device_reports_a_write_past_the_end_at_a_ragged_shape(device, tmp_path: Path) -> None:  # noqa: ANN001
    """At 3x199x256 the last threadgroup has a thread at row N = 199: it writes Y[3 * 199], one past the end. The row
    it reads past W's end holds NaN here (and on a GPU, maybe: the pool's last NaN-filled buffer)."""
    bugged = planted_gemv(tmp_path, OFF_BY_ONE)
    check, diagnostics = verify_on(device, bugged, "3,199,256")
    assert check.ok  # every compared element is right: only the guard zone shows the bug
    assert [d.kind for d in diagnostics] == ["device_bounds"]
    assert "a write past the end of output Y on the device" in diagnostics[0].message
    guard = guard_elements((3, 199), "float16")
    assert {tuple(c["output_shapes"][0]) for c in device.launched} == {(3 * 199 + guard,)}
    inits = [c["init_value"] for c in device.launched]
    assert np.isnan(inits[0]) and inits[1:] == [POISON]  # the fill asked for (NaN), then the poison
    check, diagnostics = verify_on(device, bugged, "3,200,256")  # on the tiles: the bug does not show
    assert check.ok and diagnostics == []
    clean = planted_gemv(tmp_path / "clean", None)
    check, diagnostics = verify_on(device, clean, "3,199,256")
    assert check.ok and diagnostics == []


# -- the ragged shape the winner is proven at ------------------------------------------------------------------------
def test_the_ragged_shape_leaves_no_dim_a_multiple_of_the_tiles_where_the_config_allows() -> None:
    """N and K cut together by 4 (K must stay a multiple of VEC = 4) gave 3x252x252, which the config's 4 outputs per
    threadgroup divide: the off-by-one above never showed. Each dim is cut on its own now: N by 1, K by 4."""
    fam, chip = load_family("gemv"), get_chip("M2 Max")
    assert ragged_shape(fam, "float16", chip, CONFIG, (3, 256, 256)) == (3, 255, 252)
    assert ragged_shape(fam, "float16", chip, CONFIG, (3, 64, 64)) == (3, 63, 60)
    assert ragged_shape(fam, "float16", chip, {**CONFIG, "LAYOUT_W": "kn"}, (3, 64, 64)) == (3, 60, 63)


# -- what a publish says ---------------------------------------------------------------------------------------------
def test_a_publish_line_says_exactly_which_checks_ran() -> None:
    whole = "sanitizer build, guard zones, reversed threadgroups"
    assert BoundsChecks(interpreter="metal", target="metal").text() == f"checked ({whole})"  # modeled
    assert BoundsChecks(True, "metal", "metal").text() == f"checked (guard zones on the device; {whole} on the " \
        "interpreter)"
    cuda = BoundsChecks(True, "metal", "cuda").text()
    assert cuda.startswith("guard zones checked on the device; out-of-bounds reads and threadgroup order of this "
                           "cuda kernel: not checked (the GPU allows neither)") and "its metal twin checked" in cuda
    assert "checked (" not in cuda.split(";")[0]  # never "bounds: checked" for what the GPU cannot check
    none = BoundsChecks(True, None, "cuda", "no interpreter here: no C++ compiler").text()
    assert none.endswith("the interpreter's checks did not run (no interpreter here: no C++ compiler)")
    check = FinalistCheck(True, 0.1, (3, 4), ("3x3",), bounds=BoundsChecks(True, "metal", "cuda"))
    assert FinalistCheck.from_dict(check.to_dict()) == check
    forged = {**check.to_dict(), "bounds": {"device": "yes", "interpreter": 3, "why_not": "x" * 5000}}
    read = FinalistCheck.from_dict(forged)
    assert read is not None and read.bounds == BoundsChecks(False, None, "", "x" * 300)


@pytest.mark.parametrize("path, twin", [("mma", False), ("h2", False), ("fma", True)])
def test_a_cuda_config_without_a_metal_twin_is_published_on_the_device_checks_alone(path: str, twin: bool) -> None:
    """A tensor-core or half2 config (NVIDIA-only) has no Metal twin: the interpreter's checks are said not to run
    (why), rather than failing the winner on the twin's ``#error`` (which refused every mma winner on an H200)."""
    from kernsearch.studies._measured import MeasuredObjective

    h200 = get_chip("H200")
    fam = load_family("qmatvec")
    problem = make_problem(fam, "1,4096,4096,512,64", "float16", h200)
    config = next(c for c in Space(problem, h200).enumerate().valid if c["PATH"] == path)
    objective = MeasuredObjective.__new__(MeasuredObjective)  # only what the bounds rule reads
    objective.family, objective.problem, objective.target = fam, problem, "cuda"
    bounds = objective._bounds(config)
    if twin:
        assert bounds.why_not == "" or "no interpreter here" in bounds.why_not
    else:
        assert bounds.interpreter is None and "no metal twin" in bounds.why_not, bounds
        assert "checks of this cuda kernel" in bounds.text() or bounds.why_not in bounds.text()
