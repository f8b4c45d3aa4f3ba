"""Re-validate a loaded manifest against its family: a store only holds what the gate could have written.

The store's index proves a version's manifest and files are the ones published (its content hash); the
re-check proves that what was published is something publishing could write, on every load:

- names: family, kernel, tensor and knob names are identifiers; the chip is one the registry knows (or a
  detected stand-in); text fields are short, printable and single-line;
- evidence: ``measured`` only with a detected GPU of that chip's lineage (as publishing requires);
  timings finite, positive and no faster than the chip's peak rate allows;
- against the family the version was rendered from (kept in the store at publish: ``_snapshot``), the whole
  gate runs again: config complete and in its domains, constraints, launch geometry, the rendered source
  (never skipped: a family that changed since publishing does not matter, its recorded state is used), the
  template's hash and the problem's figures.
"""

from __future__ import annotations

import math
import re
import warnings
from typing import TYPE_CHECKING, Any

from .._errors import KernsearchError
from .._vocabulary import Evidence, Verifier
from ._manifest import ArtifactError
from .._options import MAX_GRID, MAX_SHARED_MEMORY, MAX_THREADGROUP
from ..hardware._targets import target_of

if TYPE_CHECKING:
    from ._manifest import Manifest
    from ..family._render import KernelSource
    from ..family._spec import Family

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_FAMILY = re.compile(r"[a-z][a-z0-9_]{0,47}")
_KERNEL = re.compile(r"kernsearch_[a-z][a-z0-9_]{0,47}_[0-9a-f]{12}")
_TEXT = re.compile(r"[^\x00-\x1f\x7f]{0,200}")
#: No kernel launch completes faster than this (ms), whatever the problem.
MIN_MS = 1e-4


def recheck(manifest: Manifest, kernel: KernelSource, family: Family) -> None:
    """Raise :class:`ArtifactError` (one line) if ``manifest`` is not something publishing could write with
    ``family`` (the family it was rendered from)."""
    _names(manifest)
    chip = _chip(manifest)
    _timings(manifest, chip)
    _geometry_bounds(manifest)
    _against_family(manifest, kernel, family, chip)


def _fail(manifest: Manifest, why: str) -> ArtifactError:
    return ArtifactError(f"manifest {manifest.key}/{manifest.version} is not one publishing could write: {why}")


def _names(m: Manifest) -> None:
    if not _FAMILY.fullmatch(m.family) or m.problem.family != m.family:
        raise _fail(m, f"family name {m.family[:60]!r}")
    if not _KERNEL.fullmatch(m.kernel.name) or not m.kernel.name.startswith(f"kernsearch_{m.family}_"):
        raise _fail(m, f"kernel name {m.kernel.name[:60]!r}")
    for name in [*m.kernel.input_names, *m.kernel.output_names, *m.config, *m.problem.dims,
                 *m.geometry.transposed_inputs]:
        if not _IDENT.fullmatch(name):
            raise _fail(m, f"name {name[:60]!r} is not an identifier")
    for text in (m.chip.name, m.study or "", m.gate.reason[:200], *(str(v) for v in m.config.values())):
        if not _TEXT.fullmatch(text):
            raise _fail(m, f"text {text[:60]!r} is too long or holds control characters")
    if [list(t) for t in m.kernel.template] != [["T", m.problem.dtype]]:
        raise _fail(m, f"kernel template arguments {m.kernel.template!r}")
    known = {"float32", "float16", "bfloat16", "uint32", "int32"}
    if not set(m.geometry.output_dtypes) <= known or not set(m.geometry.input_dtypes) <= known:
        raise _fail(m, "unknown input or output dtype")


def _chip(m: Manifest) -> Any:
    from ..hardware._chips import chip_from_device_info, get_chip

    if m.chip.known:
        try:
            chip = get_chip(m.chip.name)
        except KernsearchError:
            raise _fail(m, f"unknown chip {m.chip.name[:60]!r}") from None
        if (chip.vendor, chip.lineage) != (m.chip.vendor, tuple(m.chip.lineage)):
            raise _fail(m, f"chip identity does not match the registry's {chip.name}")
    elif m.chip.detected:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            chip = chip_from_device_info(m.chip.detected)
        if chip.vendor != m.chip.vendor:
            raise _fail(m, "an unknown chip's identity does not match its device information")
    else:
        raise _fail(m, "an unknown chip must carry the device information it was detected from")
    if m.evidence == Evidence.MEASURED:
        if m.chip.vendor == "cpu" or not m.chip.detected:
            raise _fail(m, "measured evidence without a detected GPU")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            seen = chip_from_device_info(m.chip.detected)
        if (seen.vendor, seen.lineage) != (m.chip.vendor, tuple(m.chip.lineage)):
            raise _fail(m, "measured evidence from a device that is not this chip")
        if m.correctness.verifier != Verifier.DEVICE:
            raise _fail(m, "measured evidence verified off the device")
    runs = target_of(m.chip.vendor)
    if runs is not None and m.kernel.target != runs:
        raise _fail(m, f"a {m.kernel.target} kernel on {m.chip.name}")
    return chip.model_copy(update={"detected": dict(m.chip.detected)})


def _finite(m: Manifest, value: float | None, what: str, low: float = 0.0) -> None:
    if value is None:
        return
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= low:
        raise _fail(m, f"{what} {value!r} is not a finite number above {low:g}")


def _timings(m: Manifest, chip: Any) -> None:
    for value, what in ((m.problem.flops, "problem.flops"), (m.problem.bytes, "problem.bytes"),
                        (m.correctness.max_abs_error + 1, "correctness.max_abs_error"),
                        ((m.correctness.max_rel_error or 0) + 1, "correctness.max_rel_error")):
        _finite(m, value, what, low=-1.0)
    if m.measurements is None:
        return
    meas = m.measurements
    _finite(m, meas.median_ms, "median_ms", MIN_MS)
    _finite(m, meas.spread + 1, "spread")
    _finite(m, meas.baseline_median_ms, "baseline_median_ms", MIN_MS)
    _finite(m, meas.speedup, "speedup")
    if meas.speedup is not None and meas.speedup > 1000:
        raise _fail(m, f"speedup {meas.speedup:g} over the MLX op is not credible")
    for sample in meas.samples_ms:
        _finite(m, sample, "a sample", MIN_MS)
    peaks = [p for p in (chip.fp32_tflops, chip.fp16_tflops, chip.tensor_fp16_tflops) if p]
    if peaks and m.problem.flops > 0:
        fastest_ms = m.problem.flops / (max(peaks) * 1e12) * 1e3
        if meas.median_ms < fastest_ms / 2:
            raise _fail(m, f"median {meas.median_ms:g} ms is faster than {chip.name}'s peak allows "
                           f"({fastest_ms:.3g} ms for {m.problem.flops:g} FLOP)")


def _geometry_bounds(m: Manifest) -> None:
    g = m.geometry
    if any(not 1 <= v <= MAX_GRID for v in g.grid) or any(not 1 <= v <= MAX_THREADGROUP for v in g.threadgroup):
        raise _fail(m, f"launch grid {list(g.grid)} / threadgroup {list(g.threadgroup)} out of bounds")
    if not 0 <= g.shared_memory <= MAX_SHARED_MEMORY:
        raise _fail(m, f"shared memory {str(g.shared_memory)[:20]} out of bounds")
    if any(not 1 <= s <= MAX_GRID for shape in g.output_shapes for s in shape) or \
            any(not 1 <= s <= MAX_GRID for s in m.problem.shape):
        raise _fail(m, "a shape is out of bounds")


def _check_config(m: Manifest, fam: Family) -> None:
    """Every knob of the manifest's config is the family's, its value in the knob's domain and of its type."""
    for knob, value in m.config.items():
        if knob not in fam.knobs:
            raise _fail(m, f"unknown knob {knob}")
        domain = fam.knobs[knob].values
        if value not in domain or type(value) is not type(domain[0]):
            raise _fail(m, f"{knob}={value!r} is outside its domain {domain}")


def _check_kernel_interface(m: Manifest, fam: Family) -> None:
    """The kernel's buffers are the family's: names, then dtypes (where the manifest records them)."""
    if list(m.kernel.input_names) != list(fam.kernel_input_names) or \
            list(m.kernel.output_names) != [t.name for t in fam.outputs]:
        raise _fail(m, "kernel inputs/outputs differ from the family's")
    outputs_differ = list(m.geometry.output_dtypes) != list(fam.output_dtypes(m.problem.dtype))
    inputs_differ = list(m.geometry.input_dtypes) != list(fam.kernel_input_dtypes(m.problem.dtype))
    if (m.geometry.output_dtypes and outputs_differ) or (m.geometry.input_dtypes and inputs_differ):
        raise _fail(m, "kernel input/output dtypes differ from the family's")


def _against_family(m: Manifest, kernel: KernelSource, fam: Family, chip: Any) -> None:
    from ._candidate import Candidate, draft_manifest

    if fam.name != m.family:
        raise _fail(m, f"family {fam.name} is not the manifest's {m.family}")
    _check_config(m, fam)
    _check_kernel_interface(m, fam)
    if list(m.problem.dims) != list(fam.dims) or list(m.problem.dims.values()) != list(m.problem.shape):
        raise _fail(m, "problem dimensions differ from the family's")
    # Knobs the family has beyond the manifest's (a version indexed by `artifacts migrate` against a newer
    # family) take their defaults: the rendered source must still be the published one, so a default that
    # changes the kernel is caught.
    config = {**fam.default, **m.config}
    from ._manifest import Toolchain

    candidate = Candidate(family=fam, chip=chip, dtype=m.problem.dtype, shape=tuple(m.problem.shape),
                          config=config, kernel=kernel, geometry=m.geometry.to_geometry(),
                          correctness=m.correctness, evidence=Evidence(m.evidence), measurements=m.measurements,
                          study=m.study, toolchain=Toolchain(**m.toolchain.model_dump()))
    try:
        draft = draft_manifest(candidate)  # the gate's own checks: domains, constraints, geometry, source
    except KernsearchError as exc:
        raise _fail(m, str(exc)) from None
    if draft.source_sha256 != m.source_sha256 or draft.problem != m.problem:
        raise _fail(m, "source hash or problem figures differ from what the family gives")
    if draft.template != m.template:
        raise _fail(m, f"rendered from {m.template.file} sha256 {m.template.sha256[:12]}, but the family it was "
                       f"published with has sha256 {draft.template.sha256[:12]}")
