"""Chips, a shared rule (``_rules``): a chip's lineage, its identification from ``mx.device_info()``, its name, and
which chip results are for (:func:`choose_chip`, the one chip rule).

Standard library only, Python >= 3.9 (shipped verbatim in every exported package, beside ``_rules.py``).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from ._rules_targets import target_of

#: Threadgroup (shared) memory assumed for an unknown NVIDIA GPU: what every kernel may use without an opt-in.
UNKNOWN_NVIDIA_SHARED_MEMORY = 49152


def lineage(chip: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """(generation key, generation+die key) of a chip record: what the export fallback chain matches on."""
    if chip.get("vendor") == "apple" and chip.get("generation") is not None:
        return f"apple-g{chip['generation']}", f"apple-g{chip['generation']}{chip.get('die') or ''}"
    if chip.get("architecture"):
        return chip["architecture"], chip["architecture"]
    return None, None


def identify(info: Dict[str, Any], registry: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The chip record for ``mx.device_info()`` output; for a GPU the registry does not know, a conservative
    stand-in: the smallest known chip of its vendor (of its generation if known), named as the device, ``known``
    False, ``stand_in_for`` the name of the chip it copies. No GPU: the registry's ``cpu`` record.

    On Metal the ``architecture`` string (``applegpu_g14c``: generation 14, die ``c``) with the ``device_name`` for
    the tier (one die letter is reported for more than one tier); on CUDA the ``architecture`` (``sm_90``) and a
    registry chip's ``device_match`` in the ``device_name``."""
    arch, device = str(info.get("architecture", "")), str(info.get("device_name", ""))
    apple = re.fullmatch(r"applegpu_g(\d+)([a-z])", arch)
    if apple:
        return _apple(registry, int(apple.group(1)), apple.group(2), device, device or arch)
    if arch.startswith("sm_"):
        for chip in registry:
            if chip.get("architecture") == arch and chip.get("device_match") and chip["device_match"] in device:
                return dict(chip)
        return _stand_in(registry, "nvidia", device or arch, architecture=arch)
    cpu = next((c for c in registry if c.get("vendor") == "cpu"), {"name": "cpu", "vendor": "cpu"})
    return dict(cpu)


def _apple(registry: List[Dict[str, Any]], gen: int, die: str, device: str, name: str) -> Dict[str, Any]:
    """An Apple GPU of generation ``gen`` and die letter ``die``: the registry chip of that generation whose name the
    device name holds (the longest name first: "M2 Max" before "M2"), else the first of that generation and die,
    else a stand-in named ``name``."""
    for chip in sorted(registry, key=lambda c: -len(str(c.get("name", "")))):
        if chip.get("vendor") == "apple" and chip.get("generation") == gen and re.search(
                rf"(?<!\w){re.escape(str(chip.get('name', '')))}(?!\w)", device, re.IGNORECASE):
            return dict(chip)
    for chip in registry:
        if chip.get("generation") == gen and chip.get("die") == die:
            return dict(chip)
    return _stand_in(registry, "apple", name, generation=gen, die=die)


def _stand_in(registry: List[Dict[str, Any]], vendor: str, name: str, **identity: Any) -> Dict[str, Any]:
    same = [c for c in registry if c.get("vendor") == vendor] or [{"vendor": vendor}]
    gen = [c for c in same if identity.get("generation") in (None, c.get("generation"))]
    smallest = min(gen or same, key=lambda c: c.get("gpu_cores", 0))
    record = {**smallest, "name": name, "known": False, "die": None, "generation": None, "architecture": None,
              "stand_in_for": smallest.get("name"), **identity}
    if vendor == "nvidia":
        record["threadgroup_memory_bytes"] = UNKNOWN_NVIDIA_SHARED_MEMORY
    return record


#: The longest chip name looked up: a longer one is no chip's, and is not echoed whole.
MAX_CHIP_NAME = 64

_Chip = TypeVar("_Chip")


class UnknownChip(ValueError):
    """A chip name no chip of the registry has (its message is one line: the name, bounded, and the known ones)."""


def chip_key(name: str) -> str:
    """A chip name as every caller compares it: case, white space, ``-``, ``_`` and a leading "apple" ignored
    (``M2 Max``, ``m2max``, ``Apple M2-Max`` name one chip)."""
    return re.sub(r"[\s_\-]+", "", name).lower().removeprefix("apple")


def named_chip(name: Any, registry: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """The registry's record of the chip ``name`` names (:func:`chip_key`); :class:`UnknownChip` for any other name,
    one too long to be a chip's, or a value that is not a string."""
    fits = isinstance(name, str) and len(name) <= MAX_CHIP_NAME
    if fits:
        wanted = chip_key(name)
        for chip in registry:
            if chip_key(str(chip.get("name", ""))) == wanted:
                return dict(chip)
    shown = repr(name) if fits else repr(name)[:MAX_CHIP_NAME] + "..."
    raise UnknownChip(f"unknown chip {shown} (known: {', '.join(str(c.get('name')) for c in registry)})")


def choose_chip(named: Any, lookup: Callable[[Any], _Chip], here: Callable[[], _Chip], vendor: Callable[[_Chip], str],
                *, measures: bool = False, target: Optional[str] = None,
                default: Optional[Callable[[], _Chip]] = None) -> _Chip:
    """The one chip rule: the chip results are for, for kernsearch's commands, library and flows and for the exported
    package's calls alike (each passes its own registry's ``lookup``, detection ``here`` and records' ``vendor``).

    A back-end that ``measures`` gives results for the chip ``here``, whatever is named (a measurement belongs to the
    GPU it ran on). Otherwise the chip ``named`` (``lookup`` refuses an unknown name: never replaced by another
    chip). Otherwise the chip here; where a ``default`` is given, only if it is a GPU that runs ``target`` (None: any
    GPU's kernels), else ``default()`` (what a command works for with no such GPU here). ``here`` is called only
    where it is needed (detection imports MLX and may warn)."""
    if measures:
        return here()
    if named is not None:
        return lookup(named)
    chip = here()
    if default is None:
        return chip
    runs = target_of(vendor(chip))
    return chip if runs is not None and (target is None or runs == target) else default()
