"""Rendering: every valid config renders, deterministically, and distinct configs give distinct source."""

from __future__ import annotations

import hashlib

import pytest

from kernsearch import Space, geometry, get_chip, make_problem, render
from kernsearch.family._spec import DTYPES

SHAPES = ["4096,4096,4096", "33,65,7"]


@pytest.fixture(scope="module")
def valid_configs(gemm) -> dict[str, list[dict]]:  # noqa: ANN001
    """Union over both shapes of the valid configs, per dtype (M2 Max limits)."""
    chip = get_chip("M2 Max")
    out: dict[str, list[dict]] = {}
    for dtype in DTYPES:
        seen: dict[tuple, dict] = {}
        for shape in SHAPES:
            for cfg in Space(make_problem(gemm, shape, dtype, chip), chip).enumerate().valid:
                seen.setdefault(tuple(cfg.items()), cfg)
        out[dtype] = list(seen.values())
    return out


#: ``make test`` renders every 11th valid config of each dtype (~7,100 of ~45,500: every value of every knob, checked
#: below; ~8 s of CPU with the fixture's walks, for ~21-30 s); the e2e lane (CI: make test-all) renders every one,
#: which runs the same lines.
STRIDES = [11, pytest.param(1, marks=pytest.mark.e2e, id="every")]


@pytest.mark.slow
@pytest.mark.parametrize("stride", STRIDES)
def test_every_valid_config_renders_to_distinct_source(gemm, valid_configs, stride: int) -> None:  # noqa: ANN001
    """Every config valid in some dtype (every ``stride``-th of each dtype's) renders once (in the first dtype where it
    is valid), and distinct configs give distinct source. The Metal source does not depend on the dtype (MLX's
    template argument T carries it): every 25th of those configs of each dtype, rendered in that dtype, is the same
    source with T set to it. Rendering all ~45,000 configs in each of the three dtypes (85 s of CPU) proved nothing
    more than this (~35 s)."""
    def code(kernel) -> str:  # noqa: ANN001  (the text itself: KernelSource.sha256 also hashes T, the dtype)
        return hashlib.sha256(f"{kernel.header}\0{kernel.source}".encode()).hexdigest()

    chosen = {dtype: valid_configs[dtype][::stride] for dtype in DTYPES}
    for name in gemm.knobs:  # every value of every knob is rendered
        assert {c[name] for d in DTYPES for c in chosen[d]} == {c[name] for d in DTYPES for c in valid_configs[d]}
    rendered: dict[tuple, str] = {}
    for dtype in DTYPES:
        for cfg in chosen[dtype]:
            key = tuple(cfg.items())
            if key in rendered:
                continue
            kernel = render(gemm, cfg, dtype)
            assert kernel.template == (("T", dtype),)
            assert "C[" in kernel.source and "A_shape[0]" in kernel.source
            rendered[key] = code(kernel)
    assert all(len(valid_configs[dtype]) > 10000 for dtype in DTYPES)
    assert len(set(rendered.values())) == len(rendered)  # distinct knob values -> distinct source
    for dtype in DTYPES:
        for cfg in chosen[dtype][::25]:
            kernel = render(gemm, cfg, dtype)
            assert kernel.template == (("T", dtype),) and code(kernel) == rendered[tuple(cfg.items())], (dtype, cfg)


def test_each_knob_changes_the_source(gemm) -> None:  # noqa: ANN001
    """Changing any single knob of a valid config (to another valid value) changes the code itself."""
    chip = get_chip("M2 Max")
    sp = Space(make_problem(gemm, "64,64,64", "float16", chip), chip)
    base = sp.parse_config("BM=64,BN=64,BK=16,WM=2,WN=2,STAGE=AB,VEC=2,PAD=4")
    base_src = render(gemm, base, "float16").source
    for knob, spec in gemm.knobs.items():
        for value in spec.values:
            cfg = {**base, knob: value}
            if value == base[knob] or not sp.is_valid(cfg):
                continue
            src = render(gemm, cfg, "float16").source
            code = lambda s: "\n".join(l for l in s.splitlines() if not l.strip().startswith("//"))  # noqa: E731
            assert code(src) != code(base_src), f"{knob}={value} did not change the code"


def test_render_is_byte_identical_across_processes(gemm, hashes_in_fresh_process) -> None:  # noqa: ANN001
    cfgs = ["BM=64,MMA=scalar", "STAGE=A,DOUBLE_BUFFER=true,LAYOUT_B=t,VEC=4", "STAGE=none"]
    here = []
    chip = get_chip("M2 Max")
    sp = Space(make_problem(gemm, "64,64,64", "float16", chip), chip)
    for text in cfgs:
        kernel = render(gemm, sp.parse_config(text), "float16")
        assert kernel == render(gemm, sp.parse_config(text), "float16")
        here.append(kernel.sha256)
    there = hashes_in_fresh_process("M2 Max", cfgs)
    assert there == here


def test_geometry_counts_threads_and_covers_ragged_edges(gemm) -> None:  # noqa: ANN001
    chip = get_chip("M2 Max")
    sp = Space(make_problem(gemm, "33,65,7", "float32", chip), chip)
    cfg = sp.parse_config("BM=32,BN=64,WM=2,WN=2,LAYOUT_B=t")
    geo = geometry(sp, cfg)
    assert geo.threadgroup == (128, 1, 1)
    assert geo.grid == (2 * 128, 2, 1)  # ceil(65/64) x ceil(33/32) threadgroups, grid counted in threads
    assert geo.output_shapes == ((33, 65),) and geo.transposed_inputs == ("B",)


def test_missing_template_variable_is_an_error(tmp_path, gemm) -> None:  # noqa: ANN001
    import shutil

    from kernsearch import KernsearchError, load_family

    folder = tmp_path / "fam"
    shutil.copytree(gemm.path, folder)
    tmpl = folder / "gemm.metal.j2"
    tmpl.write_text(tmpl.read_text().replace("constexpr int BM = {{ BM }}", "constexpr int BM = {{ BMX }}"))
    fam = load_family(str(folder))
    with pytest.raises(KernsearchError, match="BMX"):
        render(fam, dict(fam.default), "float32")
