"""What the GPU scripts record about the machine: the device and the toolchain that built the kernels."""

from __future__ import annotations

import platform
import shutil
import subprocess
from typing import Any


def _first_line(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[-1].strip() if out else None


def toolchain(dry_run: bool = False) -> dict[str, Any]:
    """MLX (and its CUDA build's NVRTC, through MLX), the driver, nvcc when present, Python, kernsearch's commit."""
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import mlx.core as mx

        info["mlx"] = mx.__version__
    except ImportError:
        info["mlx"] = None
    if not dry_run:
        info["driver"] = _first_line(["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader"])
        info["nvcc"] = _first_line(["nvcc", "--version"])
    info["kernsearch_commit"] = _first_line(["git", "rev-parse", "--short", "HEAD"])
    return info


def device(dry_run: bool, chip_name: str = "H100") -> tuple[Any, dict[str, Any]]:
    """(chip, device info): the detected GPU, or for a dry run the named chip and a note saying it is simulated."""
    if dry_run:
        from kernsearch import get_chip

        return get_chip(chip_name), {"device_name": f"simulated {chip_name} (dry run: nothing is measured)"}
    from gpu_gemm import device_chip

    return device_chip()
