"""The command line: real output for good input, one line and exit 2 for bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import kernsearch_in_process


def ks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernsearch", *args], capture_output=True, text=True,
                          timeout=120)


def test_the_cli_starts_without_numpy_or_the_back_ends() -> None:
    """`kernsearch --help` and the commands that need no family (store, flows, chip...) start in ~0.25 s of CPU,
    not ~0.65 (issue 42: the suite starts hundreds of them): numpy, the back-ends and the study's records load
    with the command that uses them (`show` imports the final round's record when it reads a study)."""
    code = ("import sys, kernsearch.cli; "
            "print(sorted(m for m in ('numpy', 'kernsearch.backends', 'kernsearch.studies._final') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_families_lists_gemm() -> None:
    res = ks("families")
    assert res.returncode == 0, res.stderr
    assert "gemm" in res.stdout and "matrix multiply" in res.stdout


def test_chip_named_and_detected() -> None:
    res = ks("chip", "--chip", "m3-max")
    assert res.returncode == 0 and "M3 Max" in res.stdout and "40" in res.stdout and "400 GB/s" in res.stdout
    detected = ks("chip")
    assert detected.returncode == 0 and "detected" in detected.stdout


def test_chip_m5_max_shows_figures_and_their_sources() -> None:
    res = ks("chip", "--chip", "M5 Max")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())  # rich folds long lines
    assert "614 GB/s (Apple Newsroom 2026-03-03" in text
    assert "FP16 matrix peak (accel.) 71.7 TFLOP/s (estimate; Zakharko" in text
    assert "neural accelerators yes" in text


@pytest.mark.slow
def test_space_prints_counts_and_rejections() -> None:
    res = ks("space", "gemm", "--shape", "4096,4096,4096", "--dtype", "float16", "--chip", "M2 Max")
    assert res.returncode == 0, res.stderr
    total = int(res.stdout.split(" total")[0].split()[-1].strip("[]bold/"))
    valid = int(res.stdout.split(" valid")[0].split()[-1].strip("[]bold/"))
    # M2 Max has no neural accelerators: the tensor-op knobs add no valid config (45,486 before them)
    assert valid == 45486 and total > valid
    m5 = ks("space", "gemm", "--shape", "4096,4096,4096", "--dtype", "float16", "--chip", "M5 Max")
    assert m5.returncode == 0, m5.stderr
    assert int(m5.stdout.split(" valid")[0].split()[-1].strip("[]bold/")) > valid
    assert "tensor" in m5.stdout and "tensor_tile" in m5.stdout
    assert "rejected by" in res.stdout and "simdgroup_fragments" in res.stdout


def test_render_prints_header_and_body() -> None:
    res = ks("render", "gemm", "--config", "BM=64,BN=64,MMA=scalar", "--shape", "100,72,40", "--dtype", "float32")
    assert res.returncode == 0, res.stderr
    assert "---- header ----" in res.stdout and "#include <metal_stdlib>" in res.stdout
    assert "constexpr int BM = 64, BN = 64" in res.stdout and "fma(a_val[i], b_val[j]" in res.stdout
    assert "grid: [256, 2, 1]" in res.stdout


BAD_INPUT = [
    (["space", "nosuch"], "unknown family 'nosuch'"),
    (["render", "gemm", "--config", "BQ=1"], "unknown knob 'BQ'"),
    (["render", "gemm", "--config", "VEC=3"], "invalid value VEC=3"),
    (["render", "gemm", "--config", "STAGE=none,VEC=4"], "violates staging_knobs_need_staging"),
    (["space", "gemm", "--shape", "0,10,10"], "impossible shape"),
    (["space", "gemm", "--shape", "10,10"], "needs 3 sizes"),
    (["space", "gemm", "--dtype", "int8"], "dtype 'int8' not supported"),
    (["chip", "--chip", "M9 Hyper"], "unknown chip 'M9 Hyper'"),
    (["space", "/nonexistent/family"], "no family.toml"),
    (["tune", "gemm", "--patience", "-1"], "--patience must be 0 or more"),
    (["tune", "gemm", "--timeout", "0"], "--timeout must be more than 0"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT)
@pytest.mark.slow
def test_bad_input_is_one_line_exit_2(args: list[str], message: str) -> None:
    """The first case in a process of its own (its exit status, no traceback), the others through the same entry
    point in this process (issue 42: ~0.8 s of CPU a process)."""
    res = ks(*args) if args == BAD_INPUT[0][0] else kernsearch_in_process(*args)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [l for l in res.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_malformed_user_family_is_one_line(tmp_path) -> None:  # noqa: ANN001
    import shutil

    from kernsearch.family._spec import builtin_families_dir

    folder = tmp_path / "myfam"
    shutil.copytree(builtin_families_dir() / "gemm", folder)
    spec = folder / "family.toml"
    spec.write_text(spec.read_text().replace('expr = "tg_bytes <= chip.threadgroup_memory_bytes"',
                                             'expr = "tg_bytes <= chip.threadgroup_memory_bytes and BZ"'))
    res = ks("space", str(folder))
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "family.toml" in res.stderr and "BZ" in res.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["artifacts", "show", "gemm/x"], "expected FAMILY/CHIP/DTYPE/SHAPE[/vN]"),
    (["space", "/tmp/[abc]"], "/tmp/[abc]: no family.toml"),
])
def test_error_text_with_brackets_is_printed_verbatim(args: list[str], message: str) -> None:
    res = ks(*args)
    assert res.returncode == 2 and message in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("chip,verify,checked", [
    ("M2 Max", "finalists", "the winner and top finalists are verified on the CPU Metal interpreter"),
    ("M2 Max", "all", "every variant is verified on the CPU Metal interpreter"),
    ("M2 Max", "none", "[yellow]nothing is verified[/] (--verify none)"),
    ("H100", "finalists", "its CUDA kernels cannot run on the CPU Metal interpreter, so nothing is verified or "
                          "published"),
    ("H100", "none", "its CUDA kernels cannot run on the CPU Metal interpreter, so nothing is verified or "
                     "published; [yellow]nothing is verified[/] (--verify none)"),
])
def test_auto_on_a_machine_without_gpu_says_what_the_model_checks(chip: str, verify: str, checked: str) -> None:
    from kernsearch import get_chip
    from kernsearch.backends import select_backend

    chosen = select_backend("auto", chip, detected=get_chip("cpu"), verify=verify)
    assert chosen.backend == "model" and chosen.chip.name == chip
    assert chosen.note == (f"no GPU here: times are predicted by the performance model for {chip} ([bold]modeled[/], "
                           f"not measured); {checked}")
