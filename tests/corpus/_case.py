"""One corpus kernel: Metal source as a user would hand it to ``mx.fast.metal_kernel``, its launch, inputs and
a NumPy reference. Each ``kNN_*.py`` beside this file defines ``MODELLED_ON`` (the public kernel whose style and
features it follows — written here, not copied), ``FEATURES`` and ``case()``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

rng = np.random.default_rng


@dataclass
class Case:
    source: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, MLX dtype)
    reference: Callable[..., list[np.ndarray]]  # called with the inputs (float64 / exact ints)
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    header: str = ""
    input_dtypes: list[str | None] | None = None
    atomic_outputs: bool = False
    template: tuple[tuple[str, Any], ...] = ()
    dtype: str = "float32"
    rtol: float = 1e-5
    atol: float = 1e-5
    init_value: float | None = float("nan")
    #: "pass"; "race" (check mode must report a race); "order" (the schedule fuzz must report a dependence);
    #: "outside" (documented as outside the subset: must be refused or fail to compile, with ``reason``).
    expect: str = "pass"
    reason: str = ""
    #: correct only because the lanes of a simdgroup run in lockstep: check mode must name it (a warning)
    lockstep: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
