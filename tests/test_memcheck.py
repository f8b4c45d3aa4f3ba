"""A CUDA winner's reads are checked before it is published (issue 36): its verification launches run once more in a
child under NVIDIA's memcheck (``kernsearch.backends._memcheck``), and the verdict is typed: clean, a report (the
winner refused, the line naming the kind), not available, unfinished (said, never a pass).

There is no GPU here: ``compute-sanitizer`` is a fake placed first on ``PATH`` (:func:`fake_tool`) that checks the
command it is given as the real one would be (the child module, the job the parent wrote, the hash), writes the
child's result as a child that launched would, and prints a report in the real tool's format (the lines of a
compute-sanitizer 2024 run: ``Invalid __global__ read of size 2 bytes``, ``by thread``, ``Address ... is out of
bounds``, ``and is N bytes after the nearest allocation at ... of size N bytes``, ``ERROR SUMMARY``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kernsearch import get_chip, load_family, render
from kernsearch._vocabulary import Memcheck
from kernsearch.backends import _memcheck
from kernsearch.backends._memcheck import Job, MemcheckResult, memcheck
from kernsearch.backends._memcheck_child import ALIGN, PAGE, main, placement, read_job, run
from kernsearch.backends._memcheck_report import MARK, parse
from kernsearch.family._spec import builtin_families_dir
from kernsearch.studies._final import BoundsChecks, FinalistCheck

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"LAYOUT_W": "nk", "SG": 4, "KS": 1, "R": 1, "VEC": 4, "MB": 1}
#: W's allocation at the H200's ragged shape 3x4095x4092 (float16), placed at its allocation's end.
W_BYTES = 16 * 2 * 1024 * 1024
READ_REPORT = f"""\
========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 8 bytes
=========     at mlx::core::cu::custom_kernel_gemv_62b7cc97ccac_float16(const __half *, const __half *, __half *)+0x2d0
=========     by thread (96,0,0) in block (1023,0,0)
=========     Address 0x7f1c5e001ff8 is out of bounds
=========     and is 1,016 bytes after the nearest allocation at 0x7f1c5c000000 of size {W_BYTES:,} bytes
=========
========= Invalid __global__ read of size 8 bytes
=========     at mlx::core::cu::custom_kernel_gemv_62b7cc97ccac_float16(const __half *, const __half *, __half *)+0x2d0
=========     by thread (97,0,0) in block (1023,0,0)
=========     Address 0x7f1c5e002000 is out of bounds
=========     and is 1,024 bytes after the nearest allocation at 0x7f1c5c000000 of size {W_BYTES:,} bytes
=========
========= ERROR SUMMARY: 2 errors
"""
WRITE_REPORT = """\
========= COMPUTE-SANITIZER
========= Invalid __shared__ write of size 4 bytes
=========     at mlx::core::cu::custom_kernel_gemv_62b7cc97ccac_float16+0x1a40
=========     by thread (31,0,0) in block (7,0,0)
=========     Address 0x1040 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2dcdbf] in /usr/lib/x86_64-linux-gnu/libcuda.so.1
=========
========= ERROR SUMMARY: 1 error
"""
CLEAN_REPORT = "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 0 errors\n"

FAKE = """\
#!{python}
# A stand-in for NVIDIA's compute-sanitizer (tests/test_memcheck.py): checks its command line as the real one is
# given it, writes the child's result as a child that launched would, prints the scenario's report.
import json, os, subprocess, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "scenario.json")) as f:
    scenario = json.load(f)
args = sys.argv[1:]
with open(os.path.join(here, "called.json"), "w") as f:
    json.dump({{"argv": args, "env": sorted(os.environ), "cwd": os.getcwd()}}, f)
i = args.index("-m")
ok = args[:2] == ["--tool", "memcheck"] and args[i - 1] == sys.executable and \\
    args[i + 1] == "kernsearch.backends._memcheck_child" and len(args) == i + 4
with open(args[i + 2]) as f:
    job = json.load(f)
if not ok or job["sha256"] != args[i + 3]:
    print("========= Error: fake: not the command the real tool is given", flush=True)
    sys.exit(1)
shapes = ["x".join(map(str, s)) for s in job["shapes"]]
if scenario.get("sleep"):
    child = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(here, "grandchild.pid"), "w") as f:
        f.write(str(child.pid))
    time.sleep(60)
if scenario.get("flood"):
    sys.stdout.write(("x" * 99 + "\\n") * 40000)
if scenario.get("result", True):
    with open(os.path.join(os.path.dirname(args[i + 2]), "result.json"), "w") as f:
        json.dump({{"launched": shapes, "allocations": {{"X at " + shapes[0]: {page}, "W at " + shapes[0]: {w}, "W at " + shapes[-1]: {page}}}}}, f)
report = scenario["report"].splitlines(keepends=True)
print(report[0], end="")
print("{mark}" + shapes[0])
print("".join(report[1:]), end="")
for s in shapes[1:]:
    print("{mark}" + s)
sys.exit(scenario["rc"])
"""


def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report: str, rc: int, **scenario: object) -> Path:
    """A fake compute-sanitizer first on PATH (and no fallback folder): its folder."""
    folder = tmp_path / "fakebin"
    folder.mkdir(exist_ok=True)
    tool = folder / "compute-sanitizer"
    tool.write_text(FAKE.format(python=sys.executable, w=W_BYTES, page=PAGE, mark=MARK))
    tool.chmod(0o755)
    (folder / "scenario.json").write_text(json.dumps({"report": report, "rc": rc, **scenario}))
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(_memcheck, "TOOL_DIRS", ())
    return folder


def a_job(family: str | Path = "gemv", shapes: tuple[tuple[int, ...], ...] = ((3, 63, 60), (3, 64, 64))) -> Job:
    fam = load_family(str(family))
    sha = render(fam, CONFIG, "float16", "metal").sha256
    return Job.model_validate({"family": str(fam.path), "target": "metal", "dtype": "float16", "chip": "M2 Max",
                               "config": CONFIG, "shapes": [list(s) for s in shapes], "seed": 0, "sha256": sha})


# -- the report ------------------------------------------------------------------------------------------------------
def test_a_report_is_read_into_typed_findings_with_the_shape_they_ran_at() -> None:
    text = READ_REPORT.replace("========= Invalid", f"{MARK}3x4095x4092\n========= Invalid", 1)
    report = parse(text)
    assert report.errors == 2 and report.tool_error == ""
    first = report.findings[0]
    assert first.kind == "out-of-bounds read" and first.line == "Invalid __global__ read of size 8 bytes"
    assert first.function.startswith("mlx::core::cu::custom_kernel_gemv_62b7cc97ccac_float16(")
    assert first.thread == "thread (96,0,0) in block (1023,0,0)" and first.shape == "3x4095x4092"
    assert first.allocation_bytes == W_BYTES and first.beyond.startswith("1016 bytes after the nearest allocation")
    write = parse(WRITE_REPORT).findings
    assert [f.kind for f in write] == ["out-of-bounds write of shared memory"] and write[0].beyond == ""
    misaligned = parse("========= Invalid __global__ read of size 16 bytes\n=========     Address 0x7 is misaligned\n")
    assert misaligned.findings[0].kind == "misaligned read" and misaligned.errors is None  # no summary: unfinished
    assert parse(CLEAN_REPORT).findings == () and parse(CLEAN_REPORT).errors == 0
    noise = parse("========= COMPUTE-SANITIZER\n========= Target application returned an error\n"
                  "========= Error: process didn't terminate successfully\n")
    assert noise.findings == () and noise.tool_error == "Error: process didn't terminate successfully"


# -- the tool's run ------------------------------------------------------------------------------------------------
def test_a_read_past_an_input_is_refused_naming_the_kind_the_buffer_and_the_shape(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fake_tool(tmp_path, monkeypatch, READ_REPORT, 86)
    monkeypatch.setenv("KERNSEARCH_NOT_FOR_THE_CHILD", "1")
    result = memcheck(a_job(), timeout=60)
    assert result.state == Memcheck.REPORTED and result.refuses and result.at == "3x63x60"
    assert result.text() == "memcheck: out-of-bounds read of W (1016 bytes after the nearest allocation of size " \
        f"{W_BYTES} bytes, Invalid __global__ read of size 8 bytes, thread (96,0,0) in block (1023,0,0), in " \
        "custom_kernel_gemv_62b7cc97ccac_float16) at 3x63x60; 1 more"
    called = json.loads((folder / "called.json").read_text())
    assert called["argv"][:4] == ["--tool", "memcheck", "--error-exitcode", "86"] and "--padding" in called["argv"]
    assert "KERNSEARCH_NOT_FOR_THE_CHILD" not in called["env"] and "PATH" in called["env"]  # listed variables only
    assert Path(called["cwd"]).name.startswith("kernsearch-memcheck-") and not Path(called["cwd"]).exists()


def test_a_clean_run_is_clean_and_an_error_count_without_details_still_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_tool(tmp_path, monkeypatch, CLEAN_REPORT, 0)
    clean = memcheck(a_job(), timeout=60)
    assert clean == MemcheckResult(Memcheck.CLEAN, "", ("3x63x60", "3x64x64"))
    assert clean.text() == "memcheck: clean at 3x63x60, 3x64x64"
    fake_tool(tmp_path, monkeypatch, "========= COMPUTE-SANITIZER\n", 0)  # no summary: not the tool's "clean"
    assert memcheck(a_job(), timeout=60) == MemcheckResult(Memcheck.UNFINISHED, "no ERROR SUMMARY line from the tool",
                                                           ("3x63x60", "3x64x64"))
    fake_tool(tmp_path, monkeypatch, "========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 3 errors\n", 86)
    assert memcheck(a_job(), timeout=60).refuses
    fake_tool(tmp_path, monkeypatch, READ_REPORT, 86, flood=True)  # 4 MB before the report: the head is read
    flooded = memcheck(a_job(), timeout=60)
    assert flooded.refuses and "none could be read" in flooded.detail


def test_no_tool_is_not_available_and_a_child_that_stopped_is_unfinished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_memcheck, "TOOL_DIRS", (tmp_path / "cuda" / "bin",))
    absent = memcheck(a_job(), timeout=60)
    assert absent.state == Memcheck.NOT_AVAILABLE and not absent.refuses
    assert absent.text() == f"memcheck: not available (compute-sanitizer not found on PATH or in {tmp_path}/cuda/bin)"
    shutil.copytree(fake_tool(tmp_path, monkeypatch, CLEAN_REPORT, 0), tmp_path / "cuda" / "bin")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_memcheck, "TOOL_DIRS", (tmp_path / "cuda" / "bin",))
    assert memcheck(a_job(), timeout=60).state == Memcheck.CLEAN  # found in the CUDA toolkit's folder
    fake_tool(tmp_path, monkeypatch, "========= Target application returned an error\n"
                                     "========= ERROR SUMMARY: 1 error\n", 86, result=False)
    stopped = memcheck(a_job(), timeout=60)
    assert stopped.state == Memcheck.UNFINISHED and "launched 0 of 2 shapes (exit status 86" in stopped.detail


def test_a_run_past_its_time_is_unfinished_and_leaves_no_process(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = fake_tool(tmp_path, monkeypatch, CLEAN_REPORT, 0, sleep=True)
    start = time.monotonic()
    result = memcheck(a_job(), timeout=1.0)
    assert time.monotonic() - start < 15
    assert result.state == Memcheck.UNFINISHED and result.text() == \
        "memcheck: unfinished (timed out after 1 s)"
    pid = int((folder / "grandchild.pid").read_text())
    time.sleep(0.2)
    status = Path(f"/proc/{pid}/status")  # the tool's own child was killed with it (its process group): gone, or
    assert not status.exists() or "State:\tZ" in status.read_text()  # a zombie left to init to reap


# -- the child -------------------------------------------------------------------------------------------------------
def test_the_child_runs_nothing_but_the_proven_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = a_job()
    path = tmp_path / "job.json"
    path.write_text(job.model_dump_json())
    assert main([str(path), "0" * 64]) == 2  # not the hash the parent proved
    assert capsys.readouterr().err.strip().startswith("memcheck child: the job names kernel")
    path.write_text(job.model_dump_json().replace('"seed":0', '"seed":0,"run":"os.system"'))
    assert main([str(path), job.sha256]) == 2
    assert "is not a memcheck job" in capsys.readouterr().err
    family = tmp_path / "gemv"
    shutil.copytree(builtin_families_dir() / "gemv", family)
    changed = a_job(family)
    template = family / "gemv.metal.j2"
    template.write_text(template.read_text().replace("n0 + r < N", "n0 + r <= N"))
    path.write_text(changed.model_dump_json())
    done = subprocess.run([sys.executable, "-m", "kernsearch.backends._memcheck_child", str(path), changed.sha256],
                          capture_output=True, text=True, timeout=120)  # a fresh process, as under the tool
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert "renders now to kernel" in done.stderr and "the family changed" in done.stderr
    assert "the family changed" in json.loads((tmp_path / "result.json").read_text())["error"]
    assert read_job(path, changed.sha256) == changed


def test_each_input_ends_within_an_alignment_of_its_allocation() -> None:
    """MLX's CUDA allocator rounds a buffer up to 16 KiB: W at 3x4095x4092 (float16, 33,513,480 bytes) would end
    8,184 bytes before its allocation's end, exactly one row: a read one row past W stays inside and memcheck sees
    nothing. Placed at its allocation's end it overshoots by at most ALIGN bytes."""
    nbytes = 4095 * 4092 * 2
    allocation, lead = placement(nbytes)
    assert allocation == W_BYTES and allocation % PAGE == 0 and lead % ALIGN == 0
    assert 0 <= allocation - lead - nbytes < ALIGN and -(-nbytes // 16384) * 16384 - nbytes == 4092 * 2
    for n in (1, 255, 256, 16384, 16385, 100000):
        allocation, lead = placement(n)
        assert allocation % PAGE == 0 and lead % ALIGN == 0 and 0 <= allocation - lead - n < ALIGN


@pytest.mark.slow
def test_the_child_launches_each_shape_at_the_end_of_its_allocations_with_guard_zones(tmp_path: Path) -> None:
    """The child's launches on the dry-run GPU (the metal back-end's code, kernels on the interpreter): the inputs it
    placed are the verification's, and a write past Y's end is seen in the guard zone there too."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from interpreted_gpu import InterpretedGPU

        device = InterpretedGPU()
        done = run(a_job(shapes=((3, 63, 60),)), backend=device)
        assert done.launched == ["3x63x60"] and done.guard == "" and done.error == ""
        assert {"X at 3x63x60", "W at 3x63x60"} <= set(done.allocations)
        assert all(v % PAGE == 0 for v in done.allocations.values())
        assert [c["init_value"] for c in device.launched] == [pytest.approx(-0.00164794921875)]  # one launch
        family = tmp_path / "gemv"
        shutil.copytree(builtin_families_dir() / "gemv", family)
        template = family / "gemv.metal.j2"
        template.write_text(template.read_text().replace("m0 + i < M && n0 + r < N", "m0 + i < M && n0 + r <= N"))
        bad = run(a_job(family, shapes=((3, 63, 60),)), backend=InterpretedGPU())
        assert "a write past the end of output Y on the device" in bad.guard
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


# -- what the final round and the publish line do with it ---------------------------------------------------------
def test_the_publish_line_says_the_memcheck_verdict() -> None:
    clean = BoundsChecks(True, "metal", "cuda", memcheck=MemcheckResult(Memcheck.CLEAN, "", ("3x4095x4092",)))
    assert clean.text().startswith("guard zones checked on the device; memcheck: clean at 3x4095x4092 (out-of-bounds "
                                   "reads and writes of this cuda kernel); threadgroup order of this cuda kernel: not "
                                   "checked")
    absent = BoundsChecks(True, None, "cuda", "this config has no metal twin to check (mma)",
                          MemcheckResult(Memcheck.NOT_AVAILABLE, "compute-sanitizer not found"))
    assert absent.text().startswith("guard zones checked on the device; memcheck: not available (compute-sanitizer "
                                    "not found); out-of-bounds reads and threadgroup order of this cuda kernel: not "
                                    "checked")
    check = FinalistCheck(True, 0.1, (3, 4), ("3x3",), bounds=clean)
    assert FinalistCheck.from_dict(check.to_dict()) == check
    forged = {**check.to_dict(), "bounds": {**clean.to_dict(), "memcheck": {"state": "clean", "at": "$(rm)"}}}
    read = FinalistCheck.from_dict(forged)
    assert read is not None and read.bounds is not None and read.bounds.memcheck == MemcheckResult(Memcheck.CLEAN)
    assert BoundsChecks.from_dict({**clean.to_dict(), "memcheck": {"state": "passed"}}).memcheck is None  # type: ignore[union-attr]


def tune(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    folder = tmp_path / "gemv"
    shutil.copytree(builtin_families_dir() / "gemv", folder)
    env = dict(os.environ, KERNSEARCH_ARTIFACTS=str(tmp_path / "store"), COLUMNS="200",
               PYTHONPATH=os.pathsep.join([str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "kernsearch", "tune", str(folder), "--backend",
                           "interpreted_gpu:MemcheckedGPU", "--chip", "M2 Max", "--shape", "3,64,64", "--trials", "2",
                           "--storage", ":memory:", *extra], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env=env)


@pytest.mark.slow
def test_a_winner_memcheck_reports_on_is_refused_and_never_published(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry-run GPU with the cuda back-end's memcheck step, a fake tool reporting a read past W: every finalist is
    refused with a FAIL line naming memcheck's kind, the buffer and the shape, and nothing is published."""
    fake_tool(tmp_path, monkeypatch, READ_REPORT, 86)
    done = tune(tmp_path, "--publish")
    out = done.stdout + done.stderr
    fails = [line for line in out.splitlines() if line.startswith("trial ") and "FAIL (device_bounds)" in line]
    assert fails and all(": at a launch under memcheck 3x63x" in line and ": memcheck: out-of-bounds read of W (1016 "
                         "bytes after the nearest allocation" in line for line in fails), out[-3000:]
    assert "no finalist passed the checks before publishing" in out and done.returncode != 0
    assert "published as" not in out and not list((tmp_path / "store").rglob("manifest.json"))
    fake_tool(tmp_path, monkeypatch, CLEAN_REPORT, 0)
    shutil.rmtree(tmp_path / "gemv")
    clean = json.loads(tune(tmp_path, "--json").stdout)["final"]
    bounds = clean["checks"][str(clean["winner"])]["bounds"]
    assert bounds["memcheck"] == {"state": "clean", "detail": "", "shapes": ["3x63x60", "3x64x64"], "at": ""}


def test_inputs_placed_on_the_cpu_are_the_inputs() -> None:
    """The placement keeps every value (MLX's CPU back-end here: a view of the flat array's tail)."""
    from kernsearch.backends._memcheck_child import tail_placed

    x = np.arange(3 * 5, dtype=np.float16).reshape(3, 5)
    placed, allocation = tail_placed(x, "float16")
    assert allocation == PAGE and np.array_equal(np.array(placed), x) and tuple(placed.shape) == (3, 5)


# -- on the GPU machine: the real tool, the real child, MLX's CUDA back-end -----------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("planted", [False, True])
def test_on_a_gpu_memcheck_refuses_a_read_past_w_and_passes_the_clean_kernel(tmp_path: Path, planted: bool) -> None:
    """``PYTHONPATH=/tmp/site:$PWD python3 -m pytest -m gpu tests/test_memcheck.py -s``: gemv's CUDA template at 3x4095x
    4092 and 4x4096x4096 (H200), clean, then with the nk layout's load guard made ``<= N`` (a row past W's end read at
    the ragged shape, never written: the device's checks pass it)."""
    from kernsearch import Space, make_problem
    from kernsearch._errors import BackendError
    from kernsearch.backends import get_backend
    from kernsearch.family._shapes import ragged_shape

    try:
        get_backend("cuda").check_available()
    except BackendError as exc:
        pytest.skip(f"needs a CUDA GPU with MLX's CUDA back-end: {exc}")
    if _memcheck.find_tool() is None:
        pytest.skip("needs compute-sanitizer (on PATH or in /usr/local/cuda/bin)")
    folder = tmp_path / "gemv"
    shutil.copytree(builtin_families_dir() / "gemv", folder)
    if planted:
        template = folder / "gemv.cu.j2"
        old = "            if (n0 + r < N) {"
        assert old in template.read_text()
        template.write_text(template.read_text().replace(old, "            if (n0 + r <= N) {"))
    fam, chip = load_family(str(folder)), get_chip("H200")
    config = dict(fam.default)
    assert Space(make_problem(fam, "4,4096,4096", "float16", chip), chip).is_valid(config)
    ragged = ragged_shape(fam, "float16", chip, config, (4, 4096, 4096))
    assert ragged is not None
    job = Job.model_validate({"family": str(folder), "target": "cuda", "dtype": "float16", "chip": chip.name,
                              "config": config, "shapes": [list(ragged), [4, 4096, 4096]], "seed": 0,
                              "sha256": render(fam, config, "float16", "cuda").sha256})
    start = time.monotonic()
    result = memcheck(job, timeout=600)
    print(f"\n{'planted read past W' if planted else 'clean'}: {result.text()} ({time.monotonic() - start:.0f} s)")
    if planted:
        assert result.refuses and result.text().startswith("memcheck: out-of-bounds read of W ("), result
    else:
        assert result.state == Memcheck.CLEAN, result
