"""Issue 39, case 6: the exported package refuses shapes outside the family's declared range in the consumer's
words, before the op runs: ``qmatvec.bind(W, S, B)(mx.zeros((0, 512)))`` killed the process with SIGFPE (an MLX
bug at M = 0; the family covers M = 1..16), and a wrong-shape call of the bound form said "unknown name 'K'"."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kernsearch import ArtifactStore
from kernsearch.exporting._export import export

pytest.importorskip("mlx.core")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("range")
    result = export(["qmatvec"], base / "dist", ArtifactStore(base / "store"), package="ks_range", version="1.0")
    return result.source_dir


def _run(package: Path, body: str) -> subprocess.CompletedProcess[str]:
    """The calls in a fresh process (a crash there is a signal, not a test-runner death)."""
    code = textwrap.dedent("""
        import mlx.core as mx
        import ks_range
        W = mx.random.normal((64, 512)).astype(mx.float16)
        Wq, S, B = mx.quantize(W, group_size=64, bits=4)
        def attempt(what, fn):
            try:
                fn()
                print(what, "ran")
            except ValueError as exc:
                print(what, "refused:", exc)
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=package)


@pytest.mark.slow
def test_zero_and_too_many_rows_are_refused_in_the_consumers_words(package: Path) -> None:
    proc = _run(package, """
        attempt("bound M=0", lambda: mx.eval(ks_range.qmatvec.bind(Wq, S, B)(mx.zeros((0, 512), mx.float16))))
        attempt("plain M=0", lambda: mx.eval(ks_range.qmatvec(mx.zeros((0, 512), mx.float16), Wq, S, B)))
        attempt("bound M=17", lambda: mx.eval(ks_range.qmatvec.bind(Wq, S, B)(mx.zeros((17, 512), mx.float16))))
        attempt("bound K wrong", lambda: mx.eval(ks_range.qmatvec.bind(Wq, S, B)(mx.zeros((1, 500), mx.float16))))
        attempt("bound M=1", lambda: mx.eval(ks_range.qmatvec.bind(Wq, S, B)(mx.ones((1, 512), mx.float16))))
        attempt("plain M=16", lambda: mx.eval(ks_range.qmatvec(mx.ones((16, 512), mx.float16), Wq, S, B)))
    """)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    out = proc.stdout
    assert "bound M=0 refused: qmatvec: X has 0 rows; this kernel takes 1 to 16" in out, out
    assert "plain M=0 refused: qmatvec: X has 0 rows; this kernel takes 1 to 16" in out, out
    assert "bound M=17 refused: qmatvec: X has 17 rows; this kernel takes 1 to 16" in out, out
    assert "bound K wrong refused: qmatvec: " in out and "unknown name" not in out, out
    assert "bound M=1 ran" in out and "plain M=16 ran" in out, out
