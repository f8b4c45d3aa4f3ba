"""The GEMM CUDA template (gemm.cu.j2) and its NVIDIA rules in family.toml, checked without a GPU.

Every valid H100 config renders, deterministically and to distinct code; the NVIDIA-only constraints
reject what the template cannot build and leave the Apple space exactly as it was; the dynamic shared
memory the launch asks for covers the template's tiles; the measured H100 landscape committed under
benchmarks/data is complete for its sub-space and replays.
"""

from __future__ import annotations

import itertools
import re
import shutil
from pathlib import Path

import pytest

from kernsearch import Space, geometry, get_chip, make_problem, render

REPO = Path(__file__).resolve().parents[1]
LANDSCAPE = REPO / "benchmarks" / "data" / "gemm_H100_float16_2048x2048x2048.json"
H100 = get_chip("H100")


def _code(source: str) -> str:
    return "\n".join(line for line in source.splitlines() if not line.strip().startswith("//"))


@pytest.fixture(scope="module")
def h100_float16(gemm) -> list[dict]:  # noqa: ANN001
    """The valid float16 configs on the H100 at an aligned shape (a ragged shape's are a subset: only
    vector_alignment reads the shape, and it is stricter there)."""
    return Space(make_problem(gemm, "4096,4096,4096", "float16", H100), H100).enumerate().valid


#: ``make test`` renders every 11th valid config (~2,700 of ~29,600: every value of every knob, checked below; ~2 s
#: of CPU for ~15); the e2e lane (CI: make test-all) renders every one, which runs the same lines.
STRIDES = [11, pytest.param(1, marks=pytest.mark.e2e, id="every")]


@pytest.mark.slow
@pytest.mark.parametrize("stride", STRIDES)
def test_every_valid_h100_config_renders_to_distinct_cuda_source(gemm, h100_float16, stride: int) -> None:  # noqa: ANN001
    """Every valid float16 H100 config (every ``stride``-th) renders to the code its knobs name, each to its own."""
    assert len(h100_float16) > 20000
    chosen = h100_float16[::stride]
    for name in gemm.knobs:  # every value of every knob is rendered
        assert {c[name] for c in chosen} == {c[name] for c in h100_float16}, name
    digests = set()
    for cfg in chosen:
        kernel = render(gemm, cfg, "float16", "cuda")
        assert kernel.target == "cuda" and kernel.template == (("T", "float16"),)
        assert "A_shape[0]" in kernel.source and "C[r * N + c]" in kernel.source
        if cfg["MMA"] == "simdgroup":
            assert "wmma::mma_sync" in kernel.source and "#include <mma.h>" in kernel.header
        else:
            assert "fmaf(" in kernel.source and "wmma" not in kernel.source + kernel.header
        # float16: copies of VEC * 2 bytes; cp.async takes 4, 8 or 16, so VEC=1 copies are plain loads
        assert ("cp.async" in kernel.header) == (cfg["STAGE"] != "none" and cfg["VEC"] > 1)
        digests.add(kernel.sha256)
    assert len(digests) == len(chosen)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_other_dtypes_render_with_their_type(gemm, h100_float16, dtype: str) -> None:  # noqa: ANN001
    space = Space(make_problem(gemm, "4096,4096,4096", dtype, H100), H100)
    valid = [c for c in h100_float16[::50] if space.is_valid(c)]
    assert len(valid) > 200
    for cfg in valid:
        kernel = render(gemm, cfg, dtype, "cuda")
        assert kernel.template == (("T", dtype),)
        if dtype == "float32":
            assert cfg["MMA"] == "scalar"  # no WMMA for float32 (tf32 would miss the tolerance)


def test_each_knob_changes_the_cuda_code(gemm) -> None:  # noqa: ANN001
    space = Space(make_problem(gemm, "64,64,64", "float16", H100), H100)
    base = space.validate(space.parse_config("BM=64,BN=64,BK=16,WM=2,WN=2,MMA=scalar,STAGE=AB,VEC=2,PAD=4"))
    base_code = _code(render(gemm, base, "float16", "cuda").source)
    changed, tried = set(), set()
    for knob, spec in gemm.knobs.items():
        for value in spec.values:
            cfg = {**base, knob: value}
            if value == base[knob] or not space.is_valid(cfg):
                continue
            tried.add(knob)
            assert _code(render(gemm, cfg, "float16", "cuda").source) != base_code, f"{knob}={value}"
            changed.add(knob)
    # every knob with another valid value on H100 changes the code (TSCOPE/TACC need MMA=tensor: Apple M5)
    assert changed == tried and tried >= set(gemm.knobs) - {"TSCOPE", "TACC"}


def test_cuda_render_is_byte_identical_across_processes(gemm, hashes_in_fresh_process) -> None:  # noqa: ANN001
    texts = ["", "MMA=scalar,STAGE=A,LAYOUT_B=t,DOUBLE_BUFFER=true,VEC=4", "BM=128,BN=128,BK=32,VEC=4,PAD=4"]
    space = Space(make_problem(gemm, "64,64,64", "float16", H100), H100)
    here = [render(gemm, space.parse_config(t), "float16", "cuda").sha256 for t in texts]
    there = hashes_in_fresh_process("H100", texts, "cuda")
    assert there == here


def test_nvidia_constraints_reject_what_the_template_cannot_build(gemm) -> None:  # noqa: ANN001
    space = Space(make_problem(gemm, "4096,4096,4096", "float32", H100), H100)
    assert [v.constraint for v in space.violations(dict(gemm.default))] == ["cuda_wmma_fragments"]
    f16 = Space(make_problem(gemm, "4096,4096,4096", "float16", H100), H100)
    assert f16.is_valid(dict(gemm.default))  # the family default runs on the H100 (WMMA, 16x16 per warp)
    assert "cuda_wmma_fragments" in {v.constraint for v in f16.violations({**gemm.default, "STAGE": "A"})}
    assert "cuda_wmma_fragments" in {v.constraint for v in f16.violations({**gemm.default, "BK": 8})}
    big = f16.parse_config("BM=128,BN=128,BK=32,WM=2,WN=4,MMA=scalar,VEC=4,DOUBLE_BUFFER=true,PAD=4")
    f32 = Space(make_problem(gemm, "4096,4096,4096", "float32", H100), H100)
    assert f32.is_valid(big) and geometry(f32, big).shared_memory == (128 * 36 + 32 * 132) * 2 * 4
    no_opt_in = H100.model_copy(update={"threadgroup_memory_bytes": 49152})
    small_smem = Space(make_problem(gemm, "4096,4096,4096", "float32", no_opt_in), no_opt_in)
    assert "cuda_shared_memory" in {v.constraint for v in small_smem.violations(big)}


def test_shared_memory_covers_the_tiles_the_template_declares(gemm, h100_float16) -> None:  # noqa: ANN001
    """Launch bytes >= the tiles the rendered code indexes (and the WMMA scratch): no overrun possible."""
    space = Space(make_problem(gemm, "4096,4096,4096", "float16", H100), H100)
    for cfg in h100_float16[::37]:
        if not space.is_valid(cfg):
            continue
        src = render(gemm, cfg, "float16", "cuda").source
        consts = {k: int(v) for k, v in re.findall(r"\b(BM|BN|BK)\s*=\s*(\d+)", src)}
        pads = dict(re.findall(r"constexpr int (LDA|LDB) = (?:BK|BN) \+ (\d+);", src))
        tiles = 0
        if "LDA" in pads:
            tiles += consts["BM"] * (consts["BK"] + int(pads["LDA"]))
        if "LDB" in pads:
            tiles += (consts["BK"] * (consts["BN"] + int(pads["LDB"])) if cfg["LAYOUT_B"] == "n"
                      else consts["BN"] * (consts["BK"] + int(pads["LDB"])))
        need = tiles * (2 if cfg["DOUBLE_BUFFER"] else 1) * 2
        if cfg["MMA"] == "simdgroup":
            need = max(need, 1024 * cfg["WM"] * cfg["WN"])
        assert geometry(space, cfg).shared_memory == need
        assert ("extern __shared__" in src) == (need > 0)


@pytest.mark.slow
def test_apple_space_is_unchanged_by_the_cuda_rules(gemm, tmp_path) -> None:  # noqa: ANN001
    """Strip every NVIDIA rule from a copy of the family: the M2 Max space must come out identical."""
    from kernsearch import load_family

    folder = tmp_path / "gemm"
    shutil.copytree(gemm.path, folder)
    spec = folder / "family.toml"
    text = spec.read_text().replace("chip.vendor == 'nvidia' or ", "")
    text = re.sub(r"\[\[constraints\]\]\nname = \"cuda_[a-z_]+\"\nexpr = .*\nwhy = .*\n", "", text)
    assert "cuda_wmma" not in text and "cuda_shared_memory\"" not in text
    spec.write_text(text)
    plain = load_family(str(folder))
    chip = get_chip("M2 Max")
    for shape in ("33,65,7",):
        ours = Space(make_problem(gemm, shape, "float16", chip), chip).enumerate()
        theirs = Space(make_problem(plain, shape, "float16", chip), chip).enumerate()
        assert ours.valid == theirs.valid and ours.total == theirs.total


def test_measured_landscape_is_complete_and_replays(gemm) -> None:  # noqa: ANN001
    import json

    from kernsearch.studies._landscape import Landscape
    from kernsearch.studies._replay import Replay

    land = Landscape.load(LANDSCAPE)
    data = json.loads(LANDSCAPE.read_text())
    assert data["device_name"].startswith("NVIDIA H100") and data["evidence"] == "measured"
    space = Space(make_problem(gemm, "2048,2048,2048", "float16", H100), H100)
    names = list(gemm.knobs)
    # knobs added after the recording (MMA=tensor's TSCOPE/TACC) take their default
    sub = [dict(zip(names, v)) for v in itertools.product(*(land.knobs.get(n, [gemm.default[n]]) for n in names))]
    valid = [c for c in sub if space.is_valid(c)]
    assert len(valid) >= 300 and {land.key(c) for c in valid} == set(land.entries)  # all valid, nothing else
    for entry in land.entries.values():
        assert Landscape.failed(entry) or (len(entry["times"]) == 10 and entry["compile_time"] > 0)
    best, best_ms = land.optimum()
    replay = Replay(path=LANDSCAPE)
    assert min(replay.sample(best)) > 0 and best_ms == min(
        sum(e["times"]) / len(e["times"]) for e in land.entries.values() if not Landscape.failed(e))
