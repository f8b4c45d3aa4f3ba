"""`kernsearch verify` on the cpu back-end: pass/fail, error vs the reference, diagnostics, exit codes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernsearch import Geometry, KernelSource, get_backend


def verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kernsearch", "verify", *args], capture_output=True, text=True,
                          timeout=300)


def test_verify_passes_and_prints_the_error():
    proc = verify("gemm", "--config", "BM=32,BN=64,MMA=scalar,STAGE=A", "--shape", "33,65,7", "--dtype", "float32")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pass: max abs err" in proc.stdout and "interpreted" in proc.stdout and "M2 Max" in proc.stdout


@pytest.mark.slow
def test_verify_bad_input_is_one_line_exit_2():
    proc = verify("gemm", "--config", "MMA=tensor")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "MMA" in proc.stderr and "Traceback" not in proc.stderr
    proc = verify("gemm", "--check", "--sanitize")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_verify_fails_with_a_race_named_at_the_template_line(tmp_path: Path, gemm):
    """A copy of the GEMM family with the barrier after the tile loads deleted: exit 1, race, template line."""
    fam = tmp_path / "gemm_bug"
    shutil.copytree(gemm.path, fam)
    tmpl = fam / "gemm.metal.j2"
    text = tmpl.read_text()
    marker = "        {{ load_tiles(\"\", \"k0\") | indent(8) }}\n        threadgroup_barrier(mem_flags::mem_threadgroup);\n"
    assert marker in text
    tmpl.write_text(text.replace(marker, "        {{ load_tiles(\"\", \"k0\") | indent(8) }}\n        // no barrier\n"))
    proc = verify(str(fam), "--config", "MMA=scalar", "--shape", "32,32,16", "--dtype", "float32", "--check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "error: race" in proc.stdout and "gemm.metal.j2:" in proc.stdout


def test_verify_sanitize_mode_runs():
    proc = verify("gemm", "--shape", "33,65,7", "--dtype", "bfloat16", "--sanitize")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sanitize mode" in proc.stdout and "pass" in proc.stdout


def test_simdgroup_barrier_orders_lanes_of_one_simdgroup():
    """Lane l reads what lane l^1 wrote: without simdgroup_barrier the lanes' lockstep is named (a warning, and the
    hardware's answer), with it nothing is reported (check mode)."""
    src = """
    threadgroup float buf[32];
    uint l = thread_index_in_simdgroup;
    buf[l] = A[l];
    {barrier}
    C[l] = buf[l ^ 1u];
"""
    geo = Geometry(grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=((32,),), output_dtypes=("float32",))
    a = np.arange(32, dtype=np.float64)
    cpu = get_backend("cpu")
    results = {}
    for name, barrier in (("none", ""), ("simd", "simdgroup_barrier(mem_flags::mem_threadgroup);")):
        k = KernelSource("sb", "metal", ("A",), ("C",), "", src.replace("{barrier}", barrier), (("T", "float32"),))
        results[name] = cpu.run(k, geo, [a], "float32", mode="check")
    assert {(d.kind, d.severity) for d in results["none"].diagnostics} == {("simdgroup_synchronous", "warning")}
    assert np.array_equal(results["none"].outputs[0], a.astype(int) ^ 1)
    assert results["simd"].diagnostics == []
    assert np.array_equal(results["simd"].outputs[0], a.astype(int) ^ 1)


def test_compile_error_in_a_template_names_the_template_line(tmp_path: Path, gemm):
    fam = tmp_path / "gemm_typo"
    shutil.copytree(gemm.path, fam)
    tmpl = fam / "gemm.metal.j2"
    lines = tmpl.read_text().split("\n")
    idx = next(i for i, line in enumerate(lines) if "const int row0 =" in line)
    lines[idx] = lines[idx].replace("const int row0 =", "const int row0 = undeclared_name +")
    tmpl.write_text("\n".join(lines))
    proc = verify(str(fam), "--shape", "32,32,16", "--dtype", "float32")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL (compile)" in proc.stdout and "undeclared_name" in proc.stdout
    assert f"gemm.metal.j2:{idx + 1}" in proc.stdout
