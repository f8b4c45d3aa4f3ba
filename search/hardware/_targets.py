"""Targets as data: what each kind of kernel source is, which GPUs run it and how MLX builds it.

The table is one of the shared rules (``kernsearch._rules.TARGETS``, shipped verbatim to exported packages, whose
dispatcher reads the same rows); this module is kernsearch's view of it, with one-line errors. Adding a target (say,
Metal with tensor operations) adds a row there, a member of ``_vocabulary.Target`` and a back-end in
``backends/`` whose ``target`` names it; nothing else compares target or vendor names.
"""

from __future__ import annotations

from .._errors import KernsearchError
from .._rules import DEFAULT_TARGET, INTERPRETER_TARGET, TARGETS, TargetInfo, kernel_factory, target_of
from .._vocabulary import TargetName

__all__ = ["DEFAULT_TARGET", "INTERPRETER_TARGET", "TARGETS", "TargetInfo", "TargetName", "chip_target", "get_target",
           "interpretable", "kernel_factory", "target_of"]


def get_target(name: str) -> TargetInfo:
    """A target by name; an unknown one is a one-line error."""
    if name not in TARGETS:
        raise KernsearchError(f"unknown target {name!r} (known: {', '.join(TARGETS)})")
    return TARGETS[name]


def chip_target(vendor: str) -> str:
    """What a chip of ``vendor`` runs, modeled or measured (:data:`DEFAULT_TARGET` for the CPU pseudo-chip)."""
    return target_of(vendor) or DEFAULT_TARGET


def interpretable(target: str) -> bool:
    """Whether the CPU interpreter runs ``target``'s kernels."""
    return get_target(target).interpreter
