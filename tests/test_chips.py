"""The chip registry and detection from mx.device_info()."""

from __future__ import annotations

import pytest

from kernsearch import detect_chip, get_chip
from kernsearch._errors import ChipError
from kernsearch.hardware._chips import chip_from_device_info, registry


def test_registry_covers_m1_to_m4_tiers_and_nvidia() -> None:
    names = set(registry())
    for gen in ("M1", "M2", "M3"):
        assert {gen, f"{gen} Pro", f"{gen} Max", f"{gen} Ultra"} <= names
    assert {"M4", "M4 Pro", "M4 Max", "H100", "H200", "cpu"} <= names
    for chip in registry().values():
        assert chip.threadgroup_memory_bytes >= 32768 and chip.max_threads_per_threadgroup == 1024
        assert chip.gpu_cores > 0 and chip.memory_bandwidth_gbs > 0 and chip.fp32_tflops > 0


@pytest.mark.parametrize(("arch", "device", "expected"), [
    ("applegpu_g13g", "Apple M1", "M1"),
    ("applegpu_g13s", "Apple M1 Pro", "M1 Pro"),
    ("applegpu_g14c", "Apple M2 Max", "M2 Max"),
    ("applegpu_g15d", "Apple M3 Ultra", "M3 Ultra"),
    ("applegpu_g16s", "Apple M4 Pro", "M4 Pro"),
    ("sm_90", "NVIDIA H100 80GB HBM3", "H100"),
    ("sm_90", "NVIDIA H200", "H200"),
    ("x86_64", "AMD EPYC", "cpu"),
])
def test_detection(arch: str, device: str, expected: str) -> None:
    chip = chip_from_device_info({"architecture": arch, "device_name": device})
    assert chip.name == expected and chip.known
    assert chip.detected == {"architecture": arch, "device_name": device}


def test_bfloat16_only_from_m2_and_apple_fp16_rate() -> None:
    assert not get_chip("M1 Max").bfloat16 and get_chip("M2").bfloat16
    assert get_chip("M2 Max").peak_tflops("float16") == get_chip("M2 Max").fp32_tflops
    assert get_chip("H100").peak_tflops("float16") > 10 * get_chip("H100").peak_tflops("float32")


def test_unknown_chips_get_conservative_limits_and_a_warning() -> None:
    with pytest.warns(UserWarning, match="unknown chip 'Apple M7 Max'"):
        chip = chip_from_device_info({"architecture": "applegpu_g19c", "device_name": "Apple M7 Max"})
    assert not chip.known and chip.vendor == "apple" and chip.generation == 19
    assert chip.gpu_cores == min(c.gpu_cores for c in registry().values() if c.vendor == "apple")
    with pytest.warns(UserWarning):
        nv = chip_from_device_info({"architecture": "sm_120", "device_name": "NVIDIA RTX 9090"})
    assert nv.vendor == "nvidia" and nv.threadgroup_memory_bytes == 49152


def test_lookup_by_loose_name_and_unknown_name() -> None:
    assert get_chip("m2max").name == get_chip("M2-Max").name == "M2 Max"
    with pytest.raises(ChipError, match="unknown chip 'M9'"):
        get_chip("M9")


def test_detect_here_uses_mlx_device_info() -> None:
    import mlx.core as mx

    chip = detect_chip()
    assert chip.detected == dict(mx.device_info())


@pytest.mark.parametrize(("arch", "expected"), [("applegpu_g17g", "M5"), ("applegpu_g17s", "M5 Pro"),
                                                 ("applegpu_g17c", "M5 Max")])
def test_m5_tiers_detected_with_neural_accelerators(arch: str, expected: str) -> None:
    chip = chip_from_device_info({"architecture": arch, "device_name": f"Apple {expected}"})
    assert chip.name == expected and chip.known and chip.neural_accelerators
    assert chip.lineage == ("apple-g17", f"apple-g17{arch[-1]}")
    # the matrix rate is the accelerators' (16-bit only), well above the SIMD rate, and marked an estimate
    assert chip.tensor_tflops("float16") == chip.tensor_fp16_tflops > 3 * chip.fp32_tflops
    assert chip.tensor_tflops("float32") is None
    assert chip.figure_source("tensor_fp16_tflops").startswith("estimate; Zakharko")
    assert "Apple Newsroom" in chip.figure_source("memory_bandwidth_gbs")


def test_only_m5_has_neural_accelerators() -> None:
    with_accel = {c.name for c in registry().values() if c.neural_accelerators}
    assert with_accel == {"M5", "M5 Pro", "M5 Max"}
    assert get_chip("M4 Max").tensor_tflops("float16") is None


def test_m5_peak_is_the_accelerators_for_16_bit_and_the_simd_rate_otherwise() -> None:
    m5 = get_chip("M5 Max")
    assert m5.peak_tflops("float16") == m5.tensor_fp16_tflops > m5.simd_tflops("float16") == m5.fp32_tflops
    assert m5.peak_tflops("float32") == m5.fp32_tflops


def test_per_core_figures_are_data_in_the_registry() -> None:
    """The performance model's per-core figures come from chips.toml ([cores.VENDOR]), complete per vendor."""
    import dataclasses

    from kernsearch.backends._model import CoreFigures, core_figures
    from kernsearch.hardware._chips import core_tables

    fields = {f.name for f in dataclasses.fields(CoreFigures)}
    tables = core_tables()
    assert set(tables) == {"apple", "nvidia"} and all(set(t) == fields for t in tables.values())
    assert core_figures("nvidia").threadgroup_memory == tables["nvidia"]["threadgroup_memory"] == 233472
    assert core_figures("cpu") == core_figures("apple")  # the CPU pseudo-chip borrows Apple's


@pytest.mark.parametrize(("arch", "device", "expected"), [
    ("applegpu_g14s", "Apple M2 Max", "M2 Max"),  # one die letter reported for two tiers: the name decides
    ("applegpu_g14s", "Apple M2 Pro", "M2 Pro"),
    ("applegpu_g15s", "Apple M3 Max", "M3 Max"),
    ("applegpu_g14s", "", "M2 Pro"),  # no name: the die letter
    ("applegpu_g15s", "Apple M2 Max", "M3 Pro"),  # a name of another generation is not this chip's
])
def test_the_device_name_decides_where_the_architecture_matches_several_chips(arch: str, device: str,
                                                                               expected: str) -> None:
    """Issue 24: an M2 Max was reported as an M2 Pro, in kernsearch and in the exported package's dispatcher."""
    from kernsearch.exporting._export import _chips
    from kernsearch.exporting.runtime._runtime import identify

    assert chip_from_device_info({"architecture": arch, "device_name": device}).name == expected
    assert identify({"architecture": arch, "device_name": device}, _chips())["name"] == expected
