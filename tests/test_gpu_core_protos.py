"""The twelfth session's core prototypes (benchmarks/gpu_core_ring.py, gpu_core_lean.py) stay runnable: their
variant names parse into the knobs their kernels compile with, their shared memory is what the kernel indexes, and
the lean kernel compiles with nvcc for sm_90 (CuPy compiles the same text on the GPU machine)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import gpu_core_lean as lean  # noqa: E402
import gpu_core_ring as ring  # noqa: E402


def test_variant_names_parse_into_their_knobs() -> None:
    assert ring.Ring.parse("r2u1s4b256p4m4") == ring.Ring("r2u1s4b256p4m4", 2, 1, 4, 256, 4, 4)
    assert ring.Ring.parse("r1u2s6b128p8").mb == 1
    assert lean.Lean.parse("l16u2m8") == lean.Lean("l16u2m8", 16, 2, 8)
    assert lean.Persistent.parse("p8u2m4b2") == lean.Persistent("p8u2m4b2", 8, 2, 4, 2)
    kinds = {"r": ring.Ring, "l": lean.Lean, "p": lean.Persistent}
    for bad in ("r1u1s4b256", "l4u2", "l4u2m", "p8u2m4"):
        with pytest.raises(SystemExit):
            kinds[bad[0]].parse(bad)


def test_shared_memory_covers_what_the_kernels_index() -> None:
    # ring: WARPS x STAGES x (RT x UNR x 32) 16-byte slots, then X's MB rows (2 bytes a value) and their chunk sums.
    assert ring.Ring.parse("r2u1s4b256p4m4").smem(4096) == 8 * 4 * 2 * 32 * 16 + 4 * (4096 * 2 + 128 * 4)
    # lean: X's pairs, the groups' off and sums of X, the K split's partial sums, the tile's (scale, bias) pairs.
    assert lean.Lean.parse("l8u2m4").smem(4096, 64) == 4 * 4096 * 2 + 2 * 4 * 64 * 4 + 8 * 32 * 16 + 16 * 64 * 4


def test_the_lean_core_compiles_for_sm90() -> None:
    """One compile (~8 s) of the lean cores' source (lean and its persistent form lean2, the M = 4 figures of the
    twelfth session's notes); the ring, measured slower everywhere, is only parsed."""
    from nvcc import NVCC, nvcc

    if NVCC is None:
        pytest.skip("no nvcc here")
    done = nvcc(["--ptx", "-arch=sm_90", *lean.Lean.parse("l8u2m4").defines(64)], lean.SOURCE)
    assert done.returncode == 0, done.stderr[:2000]
