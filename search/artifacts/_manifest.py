"""The artifact manifest: what a published kernel version is, where it came from, and how it was proven.

One ``manifest.json`` sits in every artifact version folder beside the rendered source it describes. It
is a pydantic model with a ``schema_version``; a reader refuses any other version (and any malformed
manifest) with one line saying why, because a kernel whose evidence cannot be read must not be shipped.
The schema is documented, field by field, in ``docs/artifacts.md``; bump :data:`SCHEMA_VERSION` (and
document the change there) whenever a field changes meaning or a required field is added.
"""

from __future__ import annotations

import json
import platform
import subprocess
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .._errors import KernsearchError
from .._records import Figures, ModeFigures, Proof, Winner
from .._rules import consumer_figures
from .._vocabulary import EVIDENCE_RANK, ConsumerMode, Dtype, Evidence, TargetName, Verifier

if TYPE_CHECKING:
    from ..hardware._chips import Chip
    from ..family._render import Geometry
    from ..evaluation._verify import Check
    from ..backends._base import Timing

#: The manifest schema this kernsearch writes; it also reads (and migrates) the versions below.
SCHEMA_VERSION = 2
#: Older schemas a reader migrates in memory (``kernsearch artifacts migrate`` rewrites the files).
MIGRATES_FROM = (1,)

#: An evidence kind as a manifest holds it (the vocabulary's ``Evidence``).
EvidenceKind = Evidence
__all__ = ["EVIDENCE_RANK", "MIGRATES_FROM", "MODELED_POLICY", "SCHEMA_VERSION", "ArtifactError", "ChipIdentity",
           "Correctness", "GateRecord", "KernelInfo", "KeyBusy", "LaunchGeometry", "Manifest", "Measurements",
           "ModeTiming", "ProblemInfo", "TemplateInfo", "Toolchain", "parse_manifest"]
#: What happens to a modeled result, in the one wording every place that says it uses (tune, the report, the
#: gate's reason, export's warning, the docs): a prediction is kept, never taken for a measured win.
MODELED_POLICY = ("a modeled result is stored and exported, but the exported package dispatches it only when its "
                  "consumer opts in (KERNSEARCH_KERNELS=modeled); otherwise the MLX op runs")
_SHA256 = r"^[0-9a-f]{64}$"


class ArtifactError(KernsearchError):
    """An artifact (or the store) cannot be used: tampered, malformed, unknown schema, busy, missing."""


class KeyBusy(ArtifactError):
    """Another publisher held the artifact key for the whole lock timeout: worth trying again later."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KernelInfo(_Model):
    """What ``mx.fast.metal_kernel`` / ``cuda_kernel`` were given, minus the text (kept in files)."""

    name: str
    target: TargetName
    input_names: list[str] = Field(min_length=1)
    output_names: list[str] = Field(min_length=1)
    #: MLX template arguments, e.g. ``[["T", "float16"]]``.
    template: list[tuple[str, Any]] = Field(default_factory=list)
    #: Files beside the manifest, never a path: a tampered manifest cannot point outside its version.
    header_file: str = Field(pattern=r"^header\.(metal|cu)$")
    source_file: str = Field(pattern=r"^source\.(metal|cu)$")


class LaunchGeometry(_Model):
    """The launch of the tuned problem (the exported package recomputes it for other shapes)."""

    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: list[list[int]]
    output_dtypes: list[str]
    transposed_inputs: list[str] = Field(default_factory=list)
    shared_memory: int = Field(0, ge=0)
    #: Each kernel input's dtype (inputs, then scalar parameters); empty in older manifests (all the problem's).
    input_dtypes: list[str] = Field(default_factory=list)
    zero_outputs: bool = False

    @classmethod
    def of(cls, geo: Geometry) -> LaunchGeometry:
        return cls(grid=geo.grid, threadgroup=geo.threadgroup, output_shapes=[list(s) for s in geo.output_shapes],
                   output_dtypes=list(geo.output_dtypes), transposed_inputs=list(geo.transposed_inputs),
                   shared_memory=geo.shared_memory, input_dtypes=list(geo.input_dtypes), zero_outputs=geo.zero_outputs)

    def to_geometry(self) -> Geometry:
        from ..family._render import Geometry

        return Geometry(grid=tuple(self.grid), threadgroup=tuple(self.threadgroup),  # type: ignore[arg-type]
                        output_shapes=tuple(tuple(s) for s in self.output_shapes),
                        output_dtypes=tuple(self.output_dtypes), transposed_inputs=tuple(self.transposed_inputs),
                        shared_memory=self.shared_memory, input_dtypes=tuple(self.input_dtypes),
                        zero_outputs=self.zero_outputs)


class ChipIdentity(_Model):
    """The chip the result belongs to; ``detected`` is ``mx.device_info()`` ({} if named, not detected)."""

    name: str
    vendor: Literal["apple", "nvidia", "cpu"]
    generation: int | None = None
    die: str | None = None
    architecture: str | None = None
    #: (generation key, generation+die key): the export fallback chain matches on these.
    lineage: tuple[str | None, str | None] = (None, None)
    known: bool = True
    detected: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def of(cls, chip: Chip) -> ChipIdentity:
        return cls(name=chip.name, vendor=chip.vendor, generation=chip.generation, die=chip.die,
                   architecture=chip.architecture, lineage=chip.lineage, known=chip.known,
                   detected=_jsonable(chip.detected))


class Toolchain(_Model):
    """Software that turned the source into machine code; a change invalidates measured results."""

    kernsearch_version: str
    mlx_version: str
    python_version: str
    os: str  # platform.system(): Darwin, Linux
    os_release: str  # platform.release(): the Darwin / Linux kernel release
    #: macOS product version and build: the Metal compiler ships with the OS.
    macos_version: str | None = None
    macos_build: str | None = None
    #: NVIDIA: the kernel driver (from /proc/driver/nvidia/version) and NVRTC, which compiles cuda_kernel.
    cuda_driver: str | None = None
    nvrtc_version: str | None = None

    def timing_identity(self) -> dict[str, str | None]:
        """What can move a measured time when it changes: MLX minor version, macOS major version (the Metal
        compiler ships with the OS), CUDA driver and NVRTC version. The exported runtime compares the same."""
        from .._rules import timing_identity

        return timing_identity(self.mlx_version, self.os, self.macos_version, self.cuda_driver, self.nvrtc_version)

    @classmethod
    def detect(cls) -> Toolchain:
        from .. import __version__

        try:
            import mlx.core as mx

            mlx_version = str(getattr(mx, "__version__", "unknown"))
        except ImportError:  # pragma: no cover - MLX is a dependency
            mlx_version = "unavailable"
        macos = platform.mac_ver()[0] or None
        build = None
        if macos:
            try:
                build = subprocess.run(["sysctl", "-n", "kern.osversion"], capture_output=True, text=True,
                                       timeout=5).stdout.strip() or None
            except (OSError, subprocess.SubprocessError):
                build = None
        from .._rules import cuda_driver_version, nvrtc_version

        return cls(kernsearch_version=__version__, mlx_version=mlx_version, python_version=platform.python_version(),
                   os=platform.system(), os_release=platform.release(), macos_version=macos, macos_build=build,
                   cuda_driver=cuda_driver_version(), nvrtc_version=nvrtc_version())


class ProblemInfo(_Model):
    family: str
    dims: dict[str, int]
    shape: list[int] = Field(min_length=1)
    dtype: Dtype
    flops: float = Field(ge=0)
    bytes: float = Field(ge=0)


#: One consumer mode's figures in a manifest: the search's own record (``_records.ModeFigures``).
ModeTiming = ModeFigures


class Measurements(Figures):
    """Timing of the variant (and of the baseline MLX op on the same inputs), in milliseconds: its
    :class:`~kernsearch._records.Figures` (the final round's, the winner's: one declaration) and the samples.

    ``modes``: the consumer modes (``graph``, ``eager``, ``batch``) the final round timed through the package's
    call path, with cold weights (``weight_sets`` rotating copies of the weights) where the family has weights; the
    gate and the exported dispatcher act on the smallest lower bound of the modes the family declares
    (``_rules.consumer_low``: the interval of the per-round ``ratios`` where recorded). ``graph`` is a chain of
    ``chain_calls`` dependent calls; a manifest without ``chain_calls`` predates chains, and its ``graph`` figures
    read as ``batch`` (``_rules.consumer_figures``). Results without ``modes`` were timed by
    separate launches (before consumer judging): recorded, never dispatched."""

    samples_ms: list[float] = Field(default_factory=list)
    #: The length of the chain the ``graph`` figures timed (None: before chains, ``graph`` read as ``batch``).
    chain_calls: int | None = Field(None, ge=2)

    @model_validator(mode="before")
    @classmethod
    def _speedup(cls, data: Any) -> Any:
        """Speedup over the baseline, when only the two medians are given; ``graph`` figures given here (by
        this kernsearch, not read from a file: :func:`parse_manifest`) are a chain of the final round's length."""
        if isinstance(data, dict) and isinstance(data.get("modes"), dict) and ConsumerMode.GRAPH in data["modes"] \
                and data.get("chain_calls") is None:
            from ..evaluation._consumer import ConsumerPlan

            data = {**data, "chain_calls": ConsumerPlan().calls}
        if isinstance(data, dict) and data.get("speedup") is None:
            base, median = data.get("baseline_median_ms"), data.get("median_ms")
            if isinstance(base, (int, float)) and isinstance(median, (int, float)) and base > 0 and median > 0:
                data = {**data, "speedup": base / median}
        return data

    @classmethod
    def of(cls, winner: Winner) -> Measurements:
        """A search winner's figures: the final round's where it ran, else the trial's own."""
        return cls.model_validate(winner.figures.model_dump())

    @classmethod
    def from_timing(cls, timing: Timing, baseline: Timing | None = None) -> Measurements:
        """From two timings of one interleaved run (the range comes from their samples)."""
        if baseline is None or not timing.samples_ms or not baseline.samples_ms:
            return cls(median_ms=timing.median_ms, spread=timing.spread, samples_ms=list(timing.samples_ms),
                       baseline_median_ms=baseline.median_ms if baseline else None)
        from ..evaluation._measure import speedup

        s = speedup(list(timing.samples_ms), list(baseline.samples_ms))
        return cls(median_ms=timing.median_ms, spread=timing.spread, samples_ms=list(timing.samples_ms),
                   baseline_median_ms=baseline.median_ms, baseline_spread=baseline.spread, speedup=s.median,
                   speedup_low=s.low, speedup_high=s.high)


class Correctness(_Model):
    """How the variant was proven correct against the float64 reference."""

    verifier: Verifier
    passed: bool
    shapes_checked: list[str] = Field(min_length=1)
    max_abs_error: float = Field(ge=0)
    max_rel_error: float | None = Field(None, ge=0)
    checks_run: int = Field(ge=1)

    @field_validator("verifier")
    @classmethod
    def _proven_where_it_ran(cls, v: Verifier) -> Verifier:
        if v not in (Verifier.DEVICE, Verifier.INTERPRETER):  # a replayed landscape publishes nothing
            raise ValueError(f"a published kernel is proven on the {Verifier.DEVICE} or the {Verifier.INTERPRETER}")
        return v

    @classmethod
    def of(cls, proof: Proof) -> Correctness:
        """A passed proof: where, at which shapes (in the order checked), its largest errors, how many checks."""
        return cls(verifier=proof.verifier, passed=True, shapes_checked=list(proof.shapes),  # type: ignore[arg-type,unused-ignore]
                   max_abs_error=proof.max_abs_err, max_rel_error=proof.max_rel_err, checks_run=proof.checks)

    @classmethod
    def from_checks(cls, verifier: str, checks: list[tuple[str, Check]]) -> Correctness:
        """From ``[(shape_text, Check), ...]``: passed only if every check passed."""
        if not checks:
            raise ArtifactError("correctness evidence needs at least one check")
        return cls(verifier=verifier, passed=all(c.ok for _, c in checks),
                   shapes_checked=sorted({s for s, _ in checks}),
                   max_abs_error=max(c.max_abs_err for _, c in checks),
                   max_rel_error=max(c.max_rel_err for _, c in checks), checks_run=len(checks))


class TemplateInfo(_Model):
    file: str
    sha256: str = Field(pattern=_SHA256)


class GateRecord(_Model):
    """Why the regression gate let this version become current."""

    reason: str
    replaced: str | None = None  # the version that was current before


class Manifest(_Model):
    """Schema version 2 of an artifact version's manifest (see docs/artifacts.md)."""

    schema_version: Literal[2]
    family: str
    version: str = Field(pattern=r"^v[1-9][0-9]*$")
    #: family/chip-slug/dtype/shape: the store key (and folder) this version belongs to.
    key: str
    kernel: KernelInfo
    source_sha256: str = Field(pattern=_SHA256)
    template: TemplateInfo
    config: dict[str, bool | int | str]
    geometry: LaunchGeometry
    chip: ChipIdentity
    toolchain: Toolchain
    problem: ProblemInfo
    evidence: EvidenceKind
    measurements: Measurements | None = None
    correctness: Correctness
    study: str | None = None
    created_at: datetime
    published_at: datetime
    gate: GateRecord

    @field_validator("created_at", "published_at")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.evidence != Evidence.INTERPRETED and self.measurements is None:
            raise ValueError(f"{self.evidence} evidence needs measurements")
        if self.evidence == Evidence.INTERPRETED and self.measurements is not None:
            raise ValueError("interpreted evidence is correctness only: it carries no timing")
        if not self.correctness.passed:
            raise ValueError("a version that failed verification cannot be an artifact")
        return self

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=False) + "\n"


def parse_manifest(text: str | bytes, where: str) -> Manifest:
    """Read a manifest; anything but a valid schema-1 manifest is an :class:`ArtifactError` (one line)."""
    from .._safeio import UnsafeFile, loads_json

    try:
        data = loads_json(text.decode("utf-8") if isinstance(text, bytes) else text, where)
    except UnicodeDecodeError:
        raise ArtifactError(f"{where}: malformed manifest: not UTF-8") from None
    except UnsafeFile as exc:
        why = str(exc).removeprefix(f"{where}: ").replace("not valid JSON", "not JSON")
        raise ArtifactError(f"{where}: malformed manifest: {why}") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{where}: malformed manifest: expected a JSON object")
    if "schema_version" not in data:
        raise ArtifactError(f"{where}: malformed manifest: no schema_version")
    version = data["schema_version"]
    if isinstance(version, bool) or version not in (SCHEMA_VERSION, *MIGRATES_FROM):
        raise ArtifactError(f"{where}: unknown manifest schema version {version!r} "
                            f"(this kernsearch reads version {SCHEMA_VERSION} and migrates 1)")
    if version == 1:
        data = migrate_v1(data)
    meas = data.get("measurements")
    if isinstance(meas, dict) and isinstance(meas.get("modes"), dict):  # graph before chains: batch
        data = {**data, "measurements": {**meas, "modes": consumer_figures(meas)}}
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ArtifactError(f"{where}: malformed manifest: {field}: "
                            f"{first['msg'].removeprefix('Value error, ')}{more}") from None


def migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2: new toolchain fields unknown; the speedup range estimated from the kernel's spread.

    Schema 1 kept no baseline spread, so the baseline is assumed as noisy as the kernel: low = speedup *
    (1 - s/2) / (1 + s/2), the p10/p90 bound for a spread s on both sides.
    """
    out = {**data, "schema_version": 2}
    m = data.get("measurements")
    if isinstance(m, dict) and isinstance(m.get("spread"), (int, float)):
        base, median, s = m.get("baseline_median_ms"), m.get("median_ms"), float(m["spread"])
        if isinstance(base, (int, float)) and isinstance(median, (int, float)) and base > 0 and median > 0:
            point = base / median
            out["measurements"] = {**m, "speedup": m.get("speedup") or point,
                                   "speedup_low": point * max(1 - s / 2, 1e-9) / (1 + s / 2),
                                   "speedup_high": point * (1 + s / 2) / max(1 - s / 2, 1e-9)}
    return out


def utcnow() -> datetime:
    return datetime.now(UTC)


def _jsonable(value: Any) -> Any:
    """device_info values as JSON can hold them (numbers, strings; anything else as its text)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
