"""What a search offers the artifact store: a :class:`Candidate` and the key (:class:`ArtifactKey`) it
belongs to, and the manifest it drafts (:class:`Draft`, :func:`draft_manifest`), which both the store's gate
and the re-check of a loaded manifest (``_recheck``) use.

Every publish drafts its candidate from a search's :class:`~kernsearch._records.Winner` with
:meth:`Candidate.from_winner` (``kernsearch tune --publish``, the nightly flow and ``TuneResult.publish`` alike).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .._records import Winner
from .._vocabulary import EVIDENCE_RANK, Evidence
from ._manifest import (
    SCHEMA_VERSION,
    ArtifactError,
    ChipIdentity,
    Correctness,
    KernelInfo,
    LaunchGeometry,
    GateRecord,
    Manifest,
    Measurements,
    ProblemInfo,
    TemplateInfo,
    Toolchain,
    utcnow,
)
from ..family._render import Geometry, KernelSource, geometry, render
from ..hardware._targets import get_target, target_of

if TYPE_CHECKING:
    from ..hardware._chips import Chip
    from ..family._space import Config, Space
    from ..family._spec import Family

_VERSION = re.compile(r"^v([1-9][0-9]*)$")
_PART = re.compile(r"^(?!\.)[A-Za-z0-9._-]+$")
_KEY_CHAR = re.compile(r"[A-Za-z0-9._ -]")


def chip_slug(name: str) -> str:
    """A chip name as a folder name: ``M2 Max`` → ``M2-Max``."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-")
    if not slug:
        raise ArtifactError(f"chip name {name!r} cannot name a folder")
    return slug


@dataclass(frozen=True, order=True)
class ArtifactKey:
    """family / chip / dtype / shape: what one line of versions is about."""

    family: str
    chip: str  # the chip's slug
    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        for part in (self.family, self.chip, self.dtype):  # each is one folder name inside the store
            if not _PART.match(part):
                raise ArtifactError(f"{part!r} cannot name an artifact folder (letters, digits, . _ - only)")
        if not self.shape or any(s <= 0 for s in self.shape):
            raise ArtifactError(f"bad shape {self.shape!r} for an artifact key")

    @property
    def path(self) -> str:
        return f"{self.family}/{self.chip}/{self.dtype}/{'x'.join(map(str, self.shape))}"

    def __str__(self) -> str:
        return self.path

    @classmethod
    def parse(cls, text: str) -> tuple[ArtifactKey, str | None]:
        """``gemm/M2-Max/float16/64x64x64`` (optionally ``/v2``) → (key, version or None)."""
        parts = [p for p in text.strip().strip("/").split("/") if p]
        version = parts.pop() if len(parts) == 5 and _VERSION.match(parts[-1]) else None
        if len(parts) != 4:
            raise ArtifactError(f"bad artifact key {text!r}: expected FAMILY/CHIP/DTYPE/SHAPE[/vN], "
                                "e.g. gemm/M2-Max/float16/4096x4096x4096")
        family, chip, dtype, shape = parts
        odd = next((ch for part in parts for ch in part if not _KEY_CHAR.match(ch)), None)
        if odd is not None:  # never silently dropped: an invisible mark (U+200F) would name another key
            raise ArtifactError(f"bad artifact key {text[:200]!r}: it holds {odd!r} (U+{ord(odd):04X}); keys use "
                                "letters, digits, '.', '_', '-' (and spaces in a chip name)")
        if not re.fullmatch(r"[0-9]{1,10}(x[0-9]{1,10})*", shape):
            raise ArtifactError(f"bad artifact key {text!r}: shape {shape!r} is not like 64x64x64")
        return cls(family, chip_slug(chip), dtype, tuple(int(s) for s in shape.split("x"))), version


@dataclass(frozen=True)
class Candidate:
    """A search result offered for publication."""

    family: Family
    chip: Chip
    dtype: str
    shape: tuple[int, ...]
    config: Config
    kernel: KernelSource
    geometry: Geometry
    correctness: Correctness
    evidence: Evidence
    measurements: Measurements | None = None
    study: str | None = None
    created_at: datetime = field(default_factory=utcnow)
    #: Detected at publish time when not given (tests inject one to simulate a toolchain change).
    toolchain: Toolchain | None = None

    def __post_init__(self) -> None:
        if self.evidence not in EVIDENCE_RANK:
            raise ArtifactError(f"unknown evidence kind {str(self.evidence)[:40]!r} (measured, interpreted or modeled)")
        object.__setattr__(self, "evidence", Evidence(self.evidence))  # a kind given by its name is the kind

    @classmethod
    def for_config(cls, space: Space, config: Config, *, target: str, correctness: Correctness,
                   evidence: Evidence, measurements: Measurements | None = None,
                   study: str | None = None, toolchain: Toolchain | None = None) -> Candidate:
        """Render ``config`` for the space's problem and wrap it with its evidence."""
        problem = space.problem
        return cls(family=space.family, chip=space.chip, dtype=problem.dtype, shape=problem.shape,
                   config=dict(config), kernel=render(space.family, config, problem.dtype, target),
                   geometry=geometry(space, config), correctness=correctness, evidence=evidence,
                   measurements=measurements, study=study, toolchain=toolchain)

    @classmethod
    def from_winner(cls, winner: Winner, space: Space, *, target: str,
                    toolchain: Toolchain | None = None) -> Candidate:
        """The candidate of a search's winner on ``space`` (its problem, on the chip it was tuned or measured on),
        rendered for ``target``: its proof as the correctness, its figures as the measurements (none for
        interpreted evidence). The one way a search's result becomes a candidate; a winner proven nowhere is
        refused (one line)."""
        if winner.proof is None:
            raise ArtifactError(f"the winner (trial {winner.number}) was not verified"
                                + (f": {winner.unproven}" if winner.unproven else "") + ": refusing to publish it")
        measurements = None if winner.evidence == Evidence.INTERPRETED else Measurements.of(winner)
        made = cls.for_config(space, winner.config, target=target, correctness=Correctness.of(winner.proof),
                              evidence=winner.evidence, measurements=measurements, study=winner.study,
                              toolchain=toolchain)
        if winner.sha256 and made.kernel.sha256 != winner.sha256:  # a proof is of one exact kernel
            raise ArtifactError(f"stale proof: the winner (trial {winner.number}) was proven as kernel "
                                f"{winner.sha256[:12]}, its config renders now to {made.kernel.sha256[:12]} (the "
                                f"family {space.family.name} changed since): refusing to publish it")
        return made

    @property
    def key(self) -> ArtifactKey:
        return ArtifactKey(self.family.name, chip_slug(self.chip.name), self.dtype, tuple(self.shape))


@dataclass(frozen=True)
class Draft:
    """Every field of a candidate's manifest but its version, gate record and publication time: what the gate
    decides on, what the journal records of an attempt, and what the re-check of a loaded version compares."""

    family: str
    key: str
    kernel: KernelInfo
    source_sha256: str
    template: TemplateInfo
    config: dict[str, Any]
    geometry: LaunchGeometry
    chip: ChipIdentity
    toolchain: Toolchain
    problem: ProblemInfo
    evidence: Evidence
    measurements: Measurements | None
    correctness: Correctness
    study: str | None
    created_at: datetime

    def manifest(self, version: str, gate: GateRecord) -> Manifest:
        """The manifest of this draft published as ``version`` (now), with the gate's reason."""
        return Manifest(schema_version=SCHEMA_VERSION, family=self.family, version=version, key=self.key,
                        kernel=self.kernel, source_sha256=self.source_sha256, template=self.template,
                        config=self.config, geometry=self.geometry, chip=self.chip, toolchain=self.toolchain,
                        problem=self.problem, evidence=self.evidence.value, measurements=self.measurements,
                        correctness=self.correctness, study=self.study, created_at=self.created_at,
                        published_at=utcnow(), gate=gate)


def _check_timing_chip(c: Candidate) -> None:
    """A measured claim names the GPU that timed it: detected on that machine (not named, not a CPU), and of
    the lineage its device info says."""
    if c.chip.vendor == "cpu" or not c.chip.detected:
        raise ArtifactError(f"measured evidence needs a GPU detected on the machine that timed it (the Chip "
                            f"from detect_chip(), carrying mx.device_info()); chip {c.chip.name} was "
                            f"{'named, not detected' if not c.chip.detected else 'a CPU'}")
    import warnings

    from ..hardware._chips import chip_from_device_info

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unknown GPU is fine here; only its lineage matters
        seen = chip_from_device_info(c.chip.detected)
    if (seen.vendor, seen.lineage) != (c.chip.vendor, c.chip.lineage):
        raise ArtifactError(f"chip {c.chip.name} does not match the device that timed it "
                            f"({c.chip.detected.get('device_name')}, {c.chip.detected.get('architecture')})")


def draft_manifest(c: Candidate) -> Draft:
    """Every manifest field but version, gate and published_at; refuses inconsistent candidates."""
    from ..family._space import Space, make_problem

    fam, kind = c.family, c.evidence
    if kind == Evidence.MEASURED:
        _check_timing_chip(c)
    if kind == Evidence.INTERPRETED and c.measurements is not None:
        raise ArtifactError("interpreted evidence is correctness only: drop the measurements or call them modeled")
    if kind != Evidence.INTERPRETED and c.measurements is None:
        raise ArtifactError(f"{kind} evidence needs measurements (median, spread, samples)")
    if c.kernel.target not in fam.templates:
        raise ArtifactError(f"family {fam.name} has no {c.kernel.target} template")
    runs = target_of(c.chip.vendor)
    if runs is not None and c.kernel.target != runs:
        raise ArtifactError(f"a {c.kernel.target} kernel cannot run on {c.chip.name} ({runs} only)")
    problem = make_problem(fam, tuple(c.shape), c.dtype)
    space = Space(problem, c.chip)
    bad = space.violations(dict(c.config))
    if bad:
        raise ArtifactError(f"config is not valid for {c.key}: " + "; ".join(map(str, bad)))
    if LaunchGeometry.of(geometry(space, dict(c.config))) != LaunchGeometry.of(c.geometry):
        raise ArtifactError(f"geometry does not match the family's launch for this config and shape ({c.key})")
    sha = c.kernel.sha256
    if render(fam, dict(c.config), c.dtype, c.kernel.target).sha256 != sha:
        raise ArtifactError(f"kernel source differs from what {fam.templates[c.kernel.target]} renders for "
                            "this config (stale template or edited source)")
    template_file = fam.template_path(c.kernel.target)
    suffix = get_target(c.kernel.target).suffix
    return Draft(
        family=fam.name,
        key=c.key.path,
        kernel=KernelInfo(name=c.kernel.name, target=c.kernel.target, input_names=list(c.kernel.input_names),
                          output_names=list(c.kernel.output_names), template=[tuple(t) for t in c.kernel.template],
                          header_file=f"header.{suffix}", source_file=f"source.{suffix}"),
        source_sha256=sha,
        template=TemplateInfo(file=template_file.name, sha256=hashlib.sha256(_template_bytes(fam, c)).hexdigest()),
        config=dict(c.config),
        geometry=LaunchGeometry.of(c.geometry),
        chip=ChipIdentity.of(c.chip),
        toolchain=c.toolchain or Toolchain.detect(),
        problem=ProblemInfo(family=fam.name, dims=problem.dims, shape=list(problem.shape), dtype=problem.dtype,
                            flops=problem.flops(), bytes=problem.bytes()),
        evidence=kind,
        measurements=c.measurements,
        correctness=c.correctness,
        study=c.study,
        created_at=c.created_at,
    )


def _template_bytes(fam: Family, c: Candidate) -> bytes:
    """The family's template file (a plain file inside its folder: a link is refused, never followed)."""
    from .. import _safeio

    try:
        return _safeio.read_inside(fam.path, [fam.templates[c.kernel.target]])  # type: ignore[index]
    except _safeio.UnsafeFile as exc:
        raise ArtifactError(f"cannot read the family's template: {exc}") from None
