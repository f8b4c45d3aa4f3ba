"""The targets table, a shared rule (``_rules``): what each kind of kernel source is, which GPUs run it, how MLX
builds it, and the text its kernel factory is handed.

Standard library only, Python >= 3.9 (shipped verbatim in every exported package, beside ``_rules.py``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from ._rules_include import included
from ._vocabulary import Target


@dataclass(frozen=True)
class TargetInfo:
    """One kind of kernel source: its row of the targets table."""

    name: str
    #: The GPU vendor whose chips run it (a chip of another vendor cannot).
    vendor: str
    #: File suffix of its sources (``gemm.cu.j2`` renders ``source.cu`` in an exported package).
    suffix: str
    #: The kernel factory, ``module:attribute.path`` (``mlx.core:fast.metal_kernel``): called with the source's
    #: ``name``, ``input_names``, ``output_names``, ``source``, ``header`` (and ``shared_memory`` where the row says
    #: so), it builds a kernel object. Imported only when a kernel is built (:func:`kernel_factory`).
    factory: str
    #: The CPU interpreter (``kernsearch.interp``) runs it: modeled winners can be verified without a GPU.
    interpreter: bool
    #: The language's name in sentences ("a modeled CUDA kernel").
    language: str
    #: The kernel object fixes its dynamic shared memory when made (``cuda_kernel(shared_memory=...)``).
    shared_memory_at_build: bool = False
    #: Sources reach the factory without comments, indentation and blank lines (:func:`kernel_text`: the factory
    #: re-reads the source on every call).
    compact: bool = False
    #: The factory gets each (compact) text as one ``#include`` line of a content-addressed file that holds it
    #: (:func:`factory_texts`, ``_rules_include``): MLX's CUDA back-end rebuilds and hashes the text on every call.
    include: bool = False


#: One row per target. Adding a target (say, Metal with tensor operations) adds a row here, a member of
#: ``_vocabulary.Target`` and a back-end whose ``target`` names it; nothing else compares target or vendor names.
TARGETS: Dict[str, TargetInfo] = {t.name: t for t in (
    TargetInfo(Target.METAL.value, vendor="apple", suffix=Target.METAL.value, factory="mlx.core:fast.metal_kernel",
               interpreter=True, language="Metal"),
    TargetInfo(Target.CUDA.value, vendor="nvidia", suffix="cu", factory="mlx.core:fast.cuda_kernel", interpreter=False,
               language="CUDA", shared_memory_at_build=True, compact=True, include=True),
)}
#: Where a chip runs nothing of ours (the ``cpu`` pseudo-chip), commands render for this target.
DEFAULT_TARGET = Target.METAL.value
#: The target the CPU interpreter runs (its first row that says so): a CUDA kernel's twin is checked in it.
INTERPRETER_TARGET = next(t.name for t in TARGETS.values() if t.interpreter)
#: The target a vendor's GPUs run: its first row (a later row for the same vendor is an alternative, not the default).
VENDOR_TARGETS: Dict[str, str] = dict(reversed([(t.vendor, t.name) for t in TARGETS.values()]))
#: The targets whose kernel object fixes its shared memory when made.
SHARED_MEMORY_AT_BUILD = frozenset(t.name for t in TARGETS.values() if t.shared_memory_at_build)


def kernel_factory(target: str) -> Callable[..., Any]:
    """The callable its row names that builds ``target``'s kernel objects (``mx.fast.metal_kernel``...), imported
    now; an unknown target builds with the default target's (an older package's records name no target)."""
    row = TARGETS.get(target, TARGETS[DEFAULT_TARGET])
    module, _, path = row.factory.partition(":")
    found: Any = importlib.import_module(module)
    for attribute in path.split("."):
        found = getattr(found, attribute)
    return found  # type: ignore[no-any-return]


def compact(text: str) -> str:
    """Source text without its comments, indentation and blank lines. MLX's CUDA back-end rebuilds a custom kernel's
    whole source on every call and hashes it on every eval: on an H200 each KB costs ~0.5 us of host time a call
    (benchmarks/gpu_host_cost.py), as much as a small kernel's GPU time. A line holding a quote keeps its text after
    ``//`` (a string may hold one); preprocessor lines keep their own line."""
    lines = []
    for line in text.splitlines():
        kept = line.strip()
        if "//" in kept and '"' not in kept:
            kept = kept[:kept.index("//")].rstrip()
        if kept:
            lines.append(kept)
    return "\n".join(lines) + "\n"


def kernel_text(target: str, text: str) -> str:
    """A source (or header) as it is handed to its target's kernel factory: compact where the row says so. The
    store keeps the source as rendered (readable); the search's device runs and the package's runtime both build
    from this text, so what was proved is what runs."""
    row = TARGETS.get(target, TARGETS[DEFAULT_TARGET])
    return compact(text) if row.compact else text


@dataclass(frozen=True)
class KernelTexts:
    """A kernel's header and source as its target's kernel factory is handed them (:func:`factory_texts`)."""

    header: str
    source: str


def factory_texts(target: str, header: str, source: str, shared_memory: int = 0) -> KernelTexts:
    """What a target's kernel factory builds from: the texts as :func:`kernel_text` makes them and, where the row
    says ``include``, each as an ``#include`` of a file holding it (the text itself where no safe file can be
    written: ``_rules_include``). The search's device runs and the package's runtime both build through here, so
    what was proved is what runs.

    Where the row fixes dynamic shared memory at build, a nonzero ``shared_memory`` is named in the header: MLX keys
    a compiled module by the kernel's name and source and opts it into more than 48 KB only when it first loads it,
    so two kernel objects of one source with different sizes would share the first one's limit (the larger then
    fails to launch: seen on the H200, seventh session)."""
    row = TARGETS.get(target, TARGETS[DEFAULT_TARGET])
    header, source = kernel_text(target, header), kernel_text(target, source)
    if row.include:
        header, source = included(header), included(source)
    if row.shared_memory_at_build and shared_memory > 0:
        sep = "" if not header or header.endswith("\n") else "\n"
        header = f"{header}{sep}// dynamic shared memory: {int(shared_memory)} bytes\n"
    return KernelTexts(header, source)


def target_of(vendor: str) -> Optional[str]:
    """The target a vendor's GPUs run, None for a vendor with no GPU target (the ``cpu`` pseudo-chip)."""
    return VENDOR_TARGETS.get(vendor)
