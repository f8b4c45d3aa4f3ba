"""A user's own family with two outputs (issue 25): tests/families/residual_rmsnorm, a fused residual add +
RMSNorm (y = rms_norm(x + r, w, eps), h = x + r) with Metal and CUDA templates.

Every output is checked: the spec gives one reference and one baseline value per output (a table by name or
a list by position) or is a one-line error; verification compares every output on the interpreter and on a
(simulated) device, so a variant whose second output is wrong fails and is never published."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernsearch import KernsearchError, Space, geometry, get_backend, get_chip, load_family, make_problem, render
from kernsearch._errors import SpecError
from kernsearch.evaluation._verify import compare, make_inputs, reference, verify_kernel

FAMILY = Path(__file__).parent / "families" / "residual_rmsnorm"
M2MAX = get_chip("M2 Max")
#: The planted fault: after writing y, the kernel overwrites h with y (y itself stays right).
WRONG_H = ('{{ store("y + base + i", "o") | indent(8) }}\n',
           '{{ store("y + base + i", "o") | indent(8) }}\n        {{ store("h + base + i", "o") | indent(8) }}\n')


def copy_family(tmp_path: Path, spec: tuple[str, str] | None = None, template: tuple[str, str] | None = None) -> Path:
    """The fixture family copied under ``tmp_path``, with one text replacement in its spec and/or templates. A
    replacement that is a top-level key (``reference = ...``) goes to the top of the spec (TOML puts keys after
    a table header into that table)."""
    folder = tmp_path / "residual_rmsnorm"
    shutil.copytree(FAMILY, folder)
    for name, change in (("family.toml", spec), ("residual_rmsnorm.metal.j2", template),
                         ("residual_rmsnorm.cu.j2", template)):
        if change is not None:
            text = (folder / name).read_text()
            assert change[0] in text or name.endswith(".cu.j2"), (name, change[0])
            old, new = change
            if re.match(r"(reference|baseline) = ", new):
                text, new = new + text, ""
            (folder / name).write_text(text.replace(old, new))
    return folder


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernsearch", *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd)


def space(folder: Path = FAMILY, shape: str = "5,72", dtype: str = "float32") -> Space:
    return Space(make_problem(load_family(folder), shape, dtype, M2MAX), M2MAX)


# -- the spec: one value per output ------------------------------------------------------------------------

def test_the_fixture_gives_a_reference_and_a_baseline_value_per_output_by_name() -> None:
    fam = load_family(FAMILY)
    assert [t.name for t in fam.outputs] == ["y", "h"] and set(fam.templates) == {"metal", "cuda"}
    assert fam.reference.text == "[rms_norm(x + r, w, eps), x + r]"
    assert fam.baseline_name == "mx.fast.rms_norm and MLX x + r"
    sp = space()
    logical = make_inputs(sp.problem, 0)
    y, h = reference(sp.problem, logical)
    np.testing.assert_array_equal(h, logical["x"] + logical["r"])
    assert y.shape == h.shape == (5, 72)


SINGLE = ('[reference]\ny = "rms_norm(x + r, w, eps)"\nh = "x + r"\n', 'reference = "rms_norm(x + r, w, eps)"\n')


@pytest.mark.parametrize(("change", "message"), [
    (SINGLE, "reference: 1 value(s) for 2 output(s) (y, h)"),
    (('[reference]\ny = "rms_norm(x + r, w, eps)"\nh = "x + r"\n',
      'reference = ["rms_norm(x + r, w, eps)", "x + r", "x"]\n'), "reference: 3 value(s) for 2 output(s)"),
    (('[reference]\ny = "rms_norm(x + r, w, eps)"\nh = "x + r"\n',
      'reference = "[rms_norm(x + r, w, eps), x + r, x]"\n'), "reference: 3 value(s) for 2 output(s)"),
    (('[baseline]\ny = "rms_norm(x + r, w, eps)"\nh = "x + r"\n', 'baseline = "rms_norm(x + r, w, eps)"\n'),
     "baseline: 1 value(s) for 2 output(s) (y, h)"),
    (('h = "x + r"\n\n[baseline]', 'z = "x + r"\n\n[baseline]'),
     "reference: one expression per output, by name: no value for output(s) h; z is not an output"),
    (('[reference]\ny = "rms_norm(x + r, w, eps)"\n', '[reference]\ny = "[x, r]"\n'),
     "reference: value 1: '[x, r]' is a list"),
])
def test_a_reference_or_baseline_with_the_wrong_number_of_values_is_a_spec_error(tmp_path: Path, change, message):
    folder = copy_family(tmp_path, spec=change)
    with pytest.raises(SpecError) as exc:
        load_family(folder)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_the_positional_forms_load_like_the_table() -> None:
    from kernsearch.family._spec import parse_family, per_output

    assert per_output(["rms_norm(x + r, w, eps)", "x + r"], ["y", "h"]).text == load_family(FAMILY).reference.text
    assert per_output("[rms_norm(x + r, w, eps), x + r]", ["y", "h"]).text == load_family(FAMILY).reference.text
    assert per_output({"h": "x + r", "y": "rms_norm(x + r, w, eps)"}, ["y", "h"]).text == \
        load_family(FAMILY).reference.text  # a table is ordered as [[outputs]], not as written
    with pytest.raises(SpecError, match="expected an expression string, a list of them"):
        parse_family({"reference": 3.5j}, "x.toml")


@pytest.mark.slow
def test_a_single_reference_for_two_outputs_is_one_line_and_exit_2_in_the_cli(tmp_path: Path) -> None:
    folder = copy_family(tmp_path, spec=SINGLE)
    done = run_cli("verify", str(folder), "--shape", "5,72", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "reference: 1 value(s) for 2 output(s)" in done.stderr


def test_a_reference_value_of_the_wrong_shape_is_a_spec_error_not_a_failed_variant(tmp_path: Path) -> None:
    folder = copy_family(tmp_path, spec=('h = "x + r"\n\n[baseline]', 'h = "sum(x + r, axis=1)"\n\n[baseline]'))
    sp = space(folder)
    with pytest.raises(SpecError, match=r"reference: the value for output h has shape \(5,\) at 5x72; the output "
                                        r"is declared \[R, N\] = \(5, 72\)"):
        reference(sp.problem, make_inputs(sp.problem, 0))


def test_compare_fails_a_variant_that_returns_fewer_outputs_than_the_reference() -> None:
    sp = space()
    refs = reference(sp.problem, make_inputs(sp.problem, 0))
    check = compare(sp.problem, refs[:1], refs)
    assert not check.ok and check.reason == "shape" and "1 output(s), expected 2" in check.detail
    assert compare(sp.problem, refs, refs).ok


# -- verification: every output ----------------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "dtype", "cfg"), [("5,72", "float32", "TG=64,ROWS=2,VEC=4"),
                                                     ("9,130", "float16", "TG=32,ROWS=1,VEC=2"),
                                                     ("3,40", "bfloat16", "TG=128,ROWS=4,VEC=1")])
def test_the_fixture_verifies_on_the_interpreter(shape: str, dtype: str, cfg: str) -> None:
    sp = space(shape=shape, dtype=dtype)
    config = sp.validate(sp.parse_config(cfg))
    check, diagnostics = verify_kernel(get_backend("cpu"), render(sp.family, config, dtype), geometry(sp, config),
                                       sp.problem, mode="check", chip=M2MAX)
    assert check.ok, check.summary()
    assert not [d for d in diagnostics if d.severity == "error"]


def test_a_wrong_second_output_fails_verify_and_names_it(tmp_path: Path) -> None:
    folder = copy_family(tmp_path, template=WRONG_H)
    sp = space(folder)
    config = sp.validate(sp.parse_config("TG=64,ROWS=2"))
    check, _ = verify_kernel(get_backend("cpu"), render(sp.family, config, "float32"), geometry(sp, config),
                             sp.problem, chip=M2MAX)
    assert not check.ok and check.reason == "wrong" and check.detail.startswith("h: ")


@pytest.mark.slow
def test_verify_fails_a_wrong_second_output_in_the_cli(tmp_path: Path) -> None:
    folder = copy_family(tmp_path, template=WRONG_H)
    done = run_cli("verify", str(folder), "--shape", "5,72", "--dtype", "float32", "--config", "TG=64,ROWS=2",
                   cwd=tmp_path)
    assert done.returncode == 1 and "FAIL (wrong)" in done.stdout and "h: " in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
def test_the_cuda_twin_compiles_for_every_valid_h100_config(tmp_path: Path) -> None:
    """No NVIDIA GPU here: nvcc compiles every valid H100 config (dtypes rotating) as MLX wraps it."""
    from rowfamilies import H100, NVCC, nvcc_compiles

    if NVCC is None:
        pytest.skip("no nvcc")
    fam = load_family(FAMILY)
    dtypes = ("float16", "bfloat16", "float32")
    configs = Space(make_problem(fam, "512,2048", "float16", H100), H100).enumerate().valid
    assert len(configs) > 30
    errors = nvcc_compiles(fam, [(c, dtypes[i % 3]) for i, c in enumerate(configs)], tmp_path)
    assert not errors, errors


# -- never published: on the interpreter (a modeled search) and on a device (simulated) ----------------------

@pytest.mark.slow
def test_a_modeled_search_never_publishes_a_variant_with_a_wrong_second_output(tmp_path: Path) -> None:
    folder = copy_family(tmp_path, template=WRONG_H)
    store = tmp_path / "store"
    done = subprocess.run([sys.executable, "-m", "kernsearch", "tune", str(folder), "--shape", "6,96", "--dtype",
                           "float32", "--trials", "12", "--publish", "--storage", ":memory:"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**__import__("os").environ, "KERNSEARCH_ARTIFACTS": str(store)})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no correct variant found" in done.stdout and "FAIL (wrong)" in done.stdout
    assert not list(store.rglob("manifest.json"))  # nothing published


from kernsearch.backends import Evidence as _Evidence  # noqa: E402
from kernsearch.backends._base import BaseBackend as _BaseBackend  # noqa: E402
from kernsearch.backends._base import Timing as _Timing  # noqa: E402


class SimulatedDevice(_BaseBackend):
    """A measured back-end without a GPU: runs each kernel on the interpreter (the exact Metal source) and
    "times" it on a virtual clock (1 ms + TG µs; the baseline op 3 ms), so the measured pipeline runs whole."""

    name = "simulated"
    evidence = _Evidence.MEASURED
    target = "metal"
    times_as_consumers = True

    def __init__(self) -> None:
        self.cpu = get_backend("cpu")
        self.now_ms = 0.0

    def clock(self) -> float:
        return self.now_ms / 1e3

    def run(self, kernel, geometry, inputs, dtype, init_value=float("nan"), **options):  # noqa: ANN001, ANN201
        return self.cpu.run(kernel, geometry, inputs, dtype, init_value=init_value, timeout=30.0)

    def _launcher(self, ms: float):  # noqa: ANN202
        def launch(i: int, previous: object = None) -> None:
            self.now_ms += ms

        def sync() -> None:
            self.now_ms += 0.05

        return launch, sync

    def launcher(self, kernel, geometry, inputs, dtype, sets=None):  # noqa: ANN001, ANN201
        return self._launcher(1.0 + geometry.threadgroup[0] / 1000)

    def baseline_launcher(self, family, problem, logical, sets=None):  # noqa: ANN001, ANN201
        return self._launcher(3.0)

    def consumer_kernel(self, kernel, geometry, family, problem, sets):  # noqa: ANN001, ANN201
        return self._launcher(1.0 + geometry.threadgroup[0] / 1000)[0]  # the final round: as consumers call it

    def consumer_op(self, family, problem, sets):  # noqa: ANN001, ANN201
        return self._launcher(3.0)[0]

    def evaluate(self, outputs) -> None:  # noqa: ANN001
        self.now_ms += 0.002

    def sync(self) -> None:
        self.now_ms += 0.05

    def time(self, kernel, geometry, inputs, dtype, **options):  # noqa: ANN001, ANN201
        from kernsearch.evaluation._measure import measure

        return _Timing(measure(*self.launcher(kernel, geometry, inputs, dtype), clock=self.clock), self.evidence)


@pytest.mark.slow
def test_a_measured_search_compares_every_output_on_the_device(tmp_path: Path) -> None:
    """On a (simulated) device, verification before timing compares h too: the correct family wins, the one
    whose h is wrong fails every trial with 'wrong' naming h, has no winner, and its publish is refused."""
    from kernsearch import ArtifactStore, run_study
    from kernsearch.studies._objective import KernelObjective

    allowed = [{"TG": 32, "ROWS": 1, "VEC": 4}, {"TG": 64, "ROWS": 2, "VEC": 2}]
    results = {}
    for label, folder in (("right", FAMILY), ("wrong", copy_family(tmp_path, template=WRONG_H))):
        objective = KernelObjective(make_problem(load_family(folder), "6,96", "float32", M2MAX), M2MAX,
                                    "test_user_family:SimulatedDevice", timeout=60.0, compile_workers=0)
        objective.valid_configs = lambda: allowed  # type: ignore[method-assign]
        objective.violation = lambda c: None if c in allowed else "not_in_this_test"  # type: ignore[method-assign]
        objective.default = lambda: None  # type: ignore[method-assign]
        result = run_study(objective, trials=2, sampler="grid", finalists=2, seed=0,
                           storage=f"sqlite:///{tmp_path / (label + '.db')}")
        results[label] = (objective, result)
    objective, right = results["right"]
    assert not right.failures and right.best is not None and right.best.verified == "device"
    assert right.best.config == allowed[0] and right.final.beats_baseline  # 1.032 ms vs the op's 3 ms
    objective, wrong = results["wrong"]
    assert wrong.failures == {"wrong": 2} and wrong.best is None and wrong.final is None
    import optuna

    details = [t.user_attrs["failure"]["detail"] for t in optuna.load_study(
        study_name=wrong.study_name, storage=f"sqlite:///{tmp_path / 'wrong.db'}").trials
        if t.user_attrs.get("status") == "failed"]
    assert len(details) == 2 and all(d.startswith("h: ") for d in details), details
    with pytest.raises(KernsearchError, match="no correct winner"):
        objective.publish(wrong, ArtifactStore(tmp_path / "store"))
    assert not list((tmp_path / "store").rglob("manifest.json"))


# -- a template typo: the tune's checks name the template file and line ---------------------------------------

def test_a_template_typo_fails_with_the_template_file_and_line_in_the_tunes_checks(tmp_path: Path) -> None:
    from kernsearch._errors import VariantFailure
    from kernsearch.variants._tasks import VariantTask, verify_variant

    folder = copy_family(tmp_path, template=("const float scale = rsqrt(", "const float scale = rsqrtt("))
    line = 1 + next(i for i, t in enumerate((folder / "residual_rmsnorm.metal.j2").read_text().splitlines())
                    if "rsqrtt(" in t)
    task = VariantTask(family=str(folder), shape=(6, 96), dtype="float32", chip="M2 Max", backend="cpu",
                       config={"TG": 64, "ROWS": 2, "VEC": 4}, options={"timeout": 30.0})
    with pytest.raises(VariantFailure) as exc:
        verify_variant(task)  # what a modeled search's interpreter check runs, in its worker
    assert exc.value.reason == "compile"
    assert exc.value.detail.startswith(f"residual_rmsnorm.metal.j2:{line}: use of undeclared identifier 'rsqrtt' "
                                       "(kernel line "), exc.value.detail


# -- the minor points: listing a family of your own, a family without a CUDA twin ------------------------------

@pytest.mark.slow
def test_families_lists_the_folders_named_beside_the_builtins(tmp_path: Path) -> None:
    shutil.copytree(FAMILY, tmp_path / "mine")
    done = run_cli("families", "mine", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "./mine" in done.stdout and "y, h" in done.stdout and "rmsnorm" in done.stdout
    missing = run_cli("families", "nothing-here", cwd=tmp_path)
    assert missing.returncode == 2 and "no family.toml" in missing.stderr and len(missing.stderr.splitlines()) == 1


def test_a_family_without_a_cuda_twin_is_valid_and_says_what_it_lacks_for_an_nvidia_chip(tmp_path: Path) -> None:
    """A CUDA twin is optional: the family loads, verifies and tunes for Apple chips; named for an NVIDIA chip,
    tune says in one line what is missing and what to do."""
    from kernsearch.studies._objective import KernelObjective

    folder = copy_family(tmp_path, spec=('cuda = "residual_rmsnorm.cu.j2"\n', ""))
    fam = load_family(folder)
    assert set(fam.templates) == {"metal"}
    h100 = get_chip("H100")
    with pytest.raises(KernsearchError) as exc:
        KernelObjective(make_problem(fam, "64,512", "float16", h100), h100, "model")
    assert str(exc.value) == ("family residual_rmsnorm has no cuda template (the model predicts the cuda kernel that "
                              "H100 would run); it has metal only: add templates.cuda to its family.toml, or tune it "
                              "for a chip that runs metal")
    KernelObjective(make_problem(fam, "64,512", "float16", M2MAX), M2MAX, "model", verify="none")  # Apple: fine


@pytest.mark.slow
def test_the_exported_function_returns_every_output_like_the_kernel_path(tmp_path: Path) -> None:
    """The package's MLX-op path (no GPU here) returns a tuple of both outputs, as a kernel launch does; the
    parameter eps is fixed at export (the function takes the tensors only)."""
    import importlib.util
    import inspect

    import mlx.core as mx

    from kernsearch import ArtifactStore, export

    result = export([str(FAMILY)], tmp_path / "dist", ArtifactStore(tmp_path / "store"), package="ks_two",
                    version="1.0")
    pkg = result.source_dir / "ks_two"
    spec = importlib.util.spec_from_file_location("ks_two", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["ks_two"] = module
    try:
        spec.loader.exec_module(module)
        assert str(inspect.signature(module.residual_rmsnorm)) == "(x, r, w, /, *, modeled=False)"
        sp = space(shape="3,64")
        logical = make_inputs(sp.problem, 2)
        out = module.residual_rmsnorm(*(mx.array(logical[n].astype(np.float32)) for n in ("x", "r", "w")))
        assert isinstance(out, tuple) and len(out) == 2
        for got, want in zip(out, reference(sp.problem, logical)):
            np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-5)
    finally:
        sys.modules.pop("ks_two", None)
