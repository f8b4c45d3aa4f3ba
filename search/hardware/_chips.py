"""The chip registry and chip detection.

Figures live in ``chips.toml`` (data, not code). Detection reads ``mx.device_info()``: on Metal the
``architecture`` string (``applegpu_g14c``: generation 14 = M2, die class ``c`` = Max) with the
``device_name`` for the tier; on CUDA the ``architecture`` (``sm_90``) and ``device_name``. An unknown
chip gets conservative limits and a warning, never a crash; ``--chip NAME`` overrides detection.
"""

from __future__ import annotations

import tomllib
import warnings
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .._errors import ChipError
from .._rules import UnknownChip, choose_chip, identify, lineage, named_chip

DIE_CLASSES = {"g": "base", "s": "Pro", "c": "Max", "d": "Ultra"}


class Chip(BaseModel):
    """One GPU's limits and peak figures, as constraints and the performance model read them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    vendor: Literal["apple", "nvidia", "cpu"]
    generation: int | None = None
    die: str | None = None
    architecture: str | None = None
    device_match: str | None = None
    gpu_cores: int
    memory_bandwidth_gbs: float
    fp32_tflops: float
    fp16_tflops: float | None = None
    bfloat16: bool
    simd_width: int = 32
    max_threads_per_threadgroup: int = 1024
    threadgroup_memory_bytes: int
    max_registers_per_thread: int = 128
    system_cache_mb: float = 8
    neural_accelerators: bool = False
    tensor_fp16_tflops: float | None = None
    sources: dict[str, str] = Field(default_factory=dict)
    estimated: tuple[str, ...] = ()
    known: bool = True
    detected: dict[str, Any] = Field(default_factory=dict)

    def simd_tflops(self, dtype: str) -> float:
        """Peak rate of the GPU cores' own ALUs / matrix units (tensor cores for 16-bit types on NVIDIA)."""
        if dtype in ("float16", "bfloat16") and self.fp16_tflops:
            return self.fp16_tflops
        return self.fp32_tflops

    def peak_tflops(self, dtype: str) -> float:
        """The chip's best arithmetic rate for ``dtype``: the neural accelerators' where they take it."""
        return max(self.simd_tflops(dtype), self.tensor_tflops(dtype) or 0.0)

    def tensor_tflops(self, dtype: str) -> float | None:
        """Peak matrix rate of the neural accelerators for ``dtype`` (None: no accelerator for it).

        Only 16-bit inputs are accelerated in the published measurements; float32 runs on the SIMD units.
        """
        if self.neural_accelerators and dtype in ("float16", "bfloat16"):
            return self.tensor_fp16_tflops
        return None

    def figure_source(self, field: str) -> str:
        """Where a figure comes from, and whether it is an estimate (empty when the registry header covers it)."""
        source = self.sources.get(field, "")
        if field in self.estimated:
            source = f"estimate; {source}" if source else "estimate"
        return source

    @property
    def lineage(self) -> tuple[str | None, str | None]:
        """(generation key, generation+die key) used by the export fallback chain (``_rules.lineage``)."""
        return lineage({"vendor": self.vendor, "generation": self.generation, "die": self.die,
                        "architecture": self.architecture})


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    return tomllib.loads(resources.files("kernsearch.hardware").joinpath("chips.toml").read_text())


def core_tables() -> dict[str, dict[str, Any]]:
    """Per-vendor figures of one GPU core (``[cores.VENDOR]`` in chips.toml), as the performance model reads
    them: a new architecture adds a table there, not code."""
    return {vendor: dict(figures) for vendor, figures in _data().get("cores", {}).items()}


@lru_cache(maxsize=1)
def registry() -> dict[str, Chip]:
    """All known chips by name, in registry order."""
    data = _data()
    chips: dict[str, Chip] = {}
    for vendor in ("apple", "nvidia", "cpu"):
        for entry in data.get(vendor, []):
            merged = {"vendor": vendor, **data["defaults"].get(vendor, {}), **entry}
            if vendor == "apple":
                merged.setdefault("fp16_tflops", merged["fp32_tflops"])  # same rate on Apple GPUs
            chips[merged["name"]] = Chip(**merged)
    return chips


def get_chip(name: str) -> Chip:
    """Look a chip up by name (``"M2 Max"``, ``m2max``, ``Apple M2-Max``, ``H100`` all work: ``_rules.named_chip``,
    the exported package's own lookup); an unknown name is a one-line error."""
    chips = registry()
    try:
        return chips[named_chip(name, [{"name": n} for n in chips])["name"]]
    except UnknownChip as exc:
        raise ChipError(str(exc)) from None


def chip_from_device_info(info: dict[str, Any]) -> Chip:
    """Identify the chip MLX reports (``_rules.identify``, as the exported package does); an unknown chip gets
    conservative limits and a warning."""
    chips = registry()
    record = identify(info, [c.model_dump(exclude={"detected"}) for c in chips.values()])
    if "stand_in_for" not in record:
        return chips[record["name"]].model_copy(update={"detected": dict(info)})
    based_on = record.pop("stand_in_for")
    warnings.warn(f"unknown chip {record['name']!r} ({info.get('architecture')}): using conservative limits "
                  f"of {based_on}; pass --chip NAME to choose one", stacklevel=2)
    return Chip(**{**record, "detected": dict(info)})


def detect_chip() -> Chip:
    """The chip MLX runs on here (imports MLX: call only where a chip is needed)."""
    import mlx.core as mx

    try:
        info = dict(mx.device_info())
    except Exception:  # noqa: BLE001 - older MLX or no device: fall back to the CPU entry
        info = {}
    return chip_from_device_info(info)


def resolve_chip(name: str | Chip | None = None, *, measures: bool = False, target: str | None = None,
                 default: bool = False, detected: Chip | None = None, quiet: bool = False) -> Chip:
    """The chip results are for: kernsearch's one chip resolution (``_rules.choose_chip``, the rule the exported
    package applies too), for every command, the library and the flows.

    Without options: ``--chip NAME`` if given, else the chip detected here (the ``cpu`` pseudo-chip where there is
    no GPU). ``measures``/``target``: those of the back-end the results come from (``BaseBackend.measures_device``,
    ``.target``): one that measures gives results for the GPU here whatever is named. ``default``: with nothing
    named and no GPU here that runs ``target`` (any GPU's, for None), the default M-series chip: what the commands
    work for (``space``, ``render``, ``predict``, ``verify``, ``tune``). ``detected``: the chip here, when the caller
    has detected it already (else detection runs only where needed). ``quiet``: an unknown detected chip does not
    warn (a flow's worker reports its chip itself)."""
    def here() -> Chip:
        if detected is not None:
            return detected
        if not quiet:
            return detect_chip()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return detect_chip()

    return choose_chip(name, lambda n: n if isinstance(n, Chip) else get_chip(n), here, lambda c: c.vendor,
                       measures=measures, target=target, default=default_apple_chip if default else None)


def default_apple_chip() -> Chip:
    """The M-series chip named when nothing Apple is present and the user named none."""
    return get_chip("M2 Max")
