"""Targets as data: what each kind of kernel source is, which GPUs run it and how MLX builds it.

One row per target. Adding a target (say, Metal with tensor operations) adds a row here and a back-end in
``backends/`` whose ``target`` names it; nothing else compares target or vendor names. The exported
runtime (``exporting/runtime/_runtime.py``) imports nothing of kernsearch and keeps its own copy of the
columns it needs; ``tests/test_targets.py`` checks the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._errors import KernsearchError

#: The target names, as a type for validated models (family specs, manifests); equal to ``TARGETS``' keys.
TargetName = Literal["metal", "cuda"]


@dataclass(frozen=True)
class Target:
    """One kind of kernel source."""

    name: str
    #: The GPU vendor whose chips run it (a chip of another vendor cannot).
    vendor: str
    #: File suffix of its sources (``gemm.cu.j2`` renders ``source.cu`` in an exported package).
    suffix: str
    #: ``mx.fast.<this>`` builds a kernel from a rendered source.
    mlx_kernel: str
    #: The CPU interpreter (``kernsearch.interp``) runs it: modeled winners can be verified without a GPU.
    interpreter: bool
    #: The kernel object fixes its dynamic shared memory when made (``cuda_kernel(shared_memory=...)``).
    shared_memory_at_build: bool = False


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("metal", vendor="apple", suffix="metal", mlx_kernel="metal_kernel", interpreter=True),
    Target("cuda", vendor="nvidia", suffix="cu", mlx_kernel="cuda_kernel", interpreter=False,
           shared_memory_at_build=True),
)}

#: Where a chip runs nothing of ours (the ``cpu`` pseudo-chip), commands render for this target.
DEFAULT_TARGET = "metal"


def get_target(name: str) -> Target:
    """A target by name; an unknown one is a one-line error."""
    if name not in TARGETS:
        raise KernsearchError(f"unknown target {name!r} (known: {', '.join(TARGETS)})")
    return TARGETS[name]


def target_of(vendor: str) -> str | None:
    """The target a vendor's GPUs run, None for a vendor with no GPU target (the ``cpu`` pseudo-chip)."""
    return next((t.name for t in TARGETS.values() if t.vendor == vendor), None)


def chip_target(vendor: str) -> str:
    """What a chip of ``vendor`` runs, modeled or measured (:data:`DEFAULT_TARGET` for the CPU pseudo-chip)."""
    return target_of(vendor) or DEFAULT_TARGET


def interpretable(target: str) -> bool:
    """Whether the CPU interpreter runs ``target``'s kernels."""
    return get_target(target).interpreter
