"""Job files: what a nightly run tunes, declared in a small TOML (or YAML) file.

A job names a family, the problem shapes and dtypes, the chips it is for and a budget; a nightly run on
a machine takes only the jobs listed for that machine's chip and expands each into one *unit* per
(shape, dtype): one study, one artifact key. Example (``flows/jobs/example.toml`` ships with kernsearch)::

    artifacts = "artifacts"              # artifact store (relative paths: from this file's folder)
    storage = "sqlite:///studies.db"     # Optuna storage, shared by the machines of one chip
    export = "dist"                      # export the package here after a run that published

    [defaults]                           # any job field; a job's own value wins
    trials = 100
    time_budget = "20m"

    [[jobs]]
    family = "gemm"
    shapes = ["4096,4096,4096", "16,4096,4096"]
    dtypes = ["float16"]
    chips = ["M2 Max", "M3 Max"]

Loading checks everything a run would trip on later (family, chips, shapes, dtypes, budgets), so a bad
job file is one line naming the file and the field, before any search starts.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kernsearch import KernsearchError, _safeio
from kernsearch._options import Count, Gain, Seed, Timeout
from kernsearch._rules import DEFAULT_MARGIN
from kernsearch._vocabulary import Target

#: What a job may tune on: ``auto``, a measuring back-end (named after the target it runs) or the model.
BACKENDS = ("auto", Target.METAL.value, Target.CUDA.value, "model")


class JobFileError(KernsearchError):
    """A job file cannot be used (unreadable, malformed, unknown family or chip, bad shape...)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobOptions(_Model):
    """Budget and search options; ``[defaults]`` holds the same fields."""

    backend: Literal[BACKENDS] = "auto"  # type: ignore[valid-type]
    trials: Count | None = 100
    #: New configs to evaluate each night on top of what the study holds (still capped by ``trials``);
    #: without it a study that holds ``trials`` configs only re-checks its winner.
    trials_per_night: Count | None = None
    time_budget: str | None = None
    patience: Count | None = None
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    seed: Seed = 0
    finalists: Count = 3
    #: Seconds one kernel variant may take (build + verify + time) before its worker is killed.
    timeout: Timeout = 120.0
    #: Which trials of a modeled search the interpreter verifies: the finalists (default), every trial (a compile
    #: each: slower, but a wrong variant never counts as a trial's time), or none (then nothing is published).
    verify: Literal["finalists", "all", "none"] = "finalists"
    #: Extra shapes the winner is verified on before publishing ("68,68,68"); default: one small ragged shape
    #: derived from the winner's config (where the family's constraints hold for it: kernsearch.family._shapes).
    verify_shapes: list[str] | None = None
    #: Relative speed-up the gate requires on top of the measured noise (0.02 = 2 %).
    min_gain: Gain = 0.0
    #: A measured winner is dispatched only if the lower bound of its speedup over the MLX op exceeds
    #: 1 + margin (0.03 = 3 %); a loser is recorded in the journal, not dispatched (docs/artifacts.md).
    margin: Gain = DEFAULT_MARGIN
    #: Seconds the whole tune step may take (default: the time budget + 50 % + 10 min, or 2 h without one).
    step_timeout: Timeout | None = None

    @field_validator("verify_shapes", mode="before")
    @classmethod
    def _verify_shapes(cls, value: Any) -> Any:
        return _shape_text(value)

    @field_validator("time_budget")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is not None:
            from kernsearch.studies._study import parse_duration

            try:
                parse_duration(value)
            except KernsearchError as exc:
                raise ValueError(str(exc)) from None
        return value


class Job(JobOptions):
    name: str | None = None
    family: str
    shapes: list[str] = Field(default_factory=list)  # empty: the family's default shape
    dtypes: list[str] = Field(default_factory=list)  # empty: the family's default dtype
    chips: list[str] = Field(min_length=1)

    @field_validator("shapes", mode="before")
    @classmethod
    def _shapes(cls, value: Any) -> Any:
        return _shape_text(value)


class JobFile(_Model):
    artifacts: str | None = None
    storage: str | None = None
    export: str | None = None
    defaults: JobOptions = Field(default_factory=JobOptions)
    jobs: list[Job] = Field(min_length=1)


class Unit(_Model):
    """One study of a nightly run: a job's family on one shape, dtype and chip."""

    job: str
    family: str  # a built-in family name or an absolute family folder
    family_name: str  # the family's own name (the artifact store's key)
    shape: tuple[int, ...]
    dtype: str
    chip: str
    options: JobOptions
    verify_shapes: tuple[tuple[int, ...], ...]

    @property
    def name(self) -> str:
        return f"{self.job}:{self.dtype}:{'x'.join(map(str, self.shape))}"

    @property
    def shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    def step_timeout(self) -> float:
        """How long the tune step may run before it is killed."""
        from kernsearch.studies._study import parse_duration

        if self.options.step_timeout is not None:
            return self.options.step_timeout
        budget = parse_duration(self.options.time_budget)
        return 7200.0 if budget is None else budget * 1.5 + 600.0


class Jobs:
    """A loaded, checked job file; paths in it are resolved against its folder."""

    def __init__(self, path: Path, spec: JobFile) -> None:
        self.path = path
        self.spec = spec
        here = path.parent
        self.artifacts: Path | None = _resolve(here, spec.artifacts) if spec.artifacts else None
        self.export: Path | None = _resolve(here, spec.export) if spec.export else None
        self.storage: str | None = _resolve_storage(here, spec.storage)

    def chips(self) -> list[str]:
        """Every chip some job is for, in file order."""
        return list(dict.fromkeys(c for job in self.spec.jobs for c in job.chips))

    def families(self) -> list[str]:
        """Every family of the file (names, or absolute folders), in file order."""
        return list(dict.fromkeys(_family_ref(self.path.parent, job.family) for job in self.spec.jobs))

    def units(self, chip: str | None = None) -> list[Unit]:
        """The units for ``chip`` (a registry name; every chip when None), in file order."""
        from kernsearch import get_chip

        wanted = get_chip(chip).name if chip is not None else None
        out = []
        for i, job in enumerate(self.spec.jobs):
            for chip_name in job.chips:
                canonical = get_chip(chip_name).name
                if wanted is not None and canonical != wanted:
                    continue
                out.extend(self._expand(i, job, canonical))
        return out

    def _expand(self, index: int, job: Job, chip_name: str) -> list[Unit]:
        from kernsearch import get_chip, load_family, make_problem

        family = _family_ref(self.path.parent, job.family)
        fam = load_family(family)
        chip = get_chip(chip_name)
        options = _merged(self.spec.defaults, job)
        units = []
        for dtype in job.dtypes or [None]:
            for shape in job.shapes or [None]:
                problem = make_problem(fam, shape, dtype, chip)
                extra = options.verify_shapes
                # none given: the verify step derives one from the winner (a fixed one is invalid for many configs)
                verify = [make_problem(fam, s, problem.dtype, chip).shape for s in extra] if extra is not None else []
                units.append(Unit(job=job.name or f"{fam.name}#{index + 1}", family=family,
                                  family_name=fam.name, shape=problem.shape,
                                  dtype=problem.dtype, chip=chip.name, options=options,
                                  verify_shapes=tuple(tuple(s) for s in verify)))
        return units


def load_jobs(path: str | Path) -> Jobs:
    """Read and check a job file (``.toml``, ``.yaml`` or ``.yml``); any problem is a :class:`JobFileError`."""
    path = Path(path)
    try:
        text = _safeio.read_text(path, _safeio.SPEC_LIMIT)
    except _safeio.UnsafeFile as exc:
        raise JobFileError(f"cannot read the job file: {exc}") from None
    if not _safeio.json_depth_ok(text.replace("'", '"')):
        raise JobFileError(f"{path}: nested deeper than {_safeio.JSON_DEPTH} levels (refused)")
    data = _parse(path, text)
    try:
        spec = JobFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise JobFileError(f"{path}: {where}: {first['msg'].removeprefix('Value error, ')}{more}") from None
    try:
        jobs = Jobs(path.resolve(), spec)
    except (OSError, ValueError) as exc:  # a NUL byte, a link loop
        raise JobFileError(f"{path}: a path in it is not usable ({exc})") from None
    _check_paths(path, jobs)
    for i, job in enumerate(spec.jobs):  # every unit must be buildable: fail now, not at 2 a.m.
        try:
            jobs._expand(i, job, job.chips[0])
            for chip in job.chips[1:]:
                jobs._expand(i, job, chip)
        except KernsearchError as exc:
            raise JobFileError(f"{path}: jobs.{i}: {exc}") from None
    return jobs


def _check_paths(path: Path, jobs: Jobs) -> None:
    """Every path the run reads or writes, checked now by the command line's own rules (``--store``,
    ``--out``, ``--storage``): a device, FIFO or file where a folder belongs is one line at load, not a
    Prefect traceback at 2 a.m."""
    from kernsearch import ArtifactStore
    from kernsearch.studies._storage import check_url

    if jobs.artifacts is not None:
        try:
            if os.path.lexists(jobs.artifacts) and not _safeio.is_real_dir(jobs.artifacts):
                raise JobFileError(f"{path}: artifacts: {jobs.artifacts} is not a folder (an artifact store is a "
                                   "folder)")
            ArtifactStore(jobs.artifacts).check_writable()
        except KernsearchError as exc:
            raise JobFileError(str(exc) if isinstance(exc, JobFileError) else f"{path}: artifacts: {exc}") \
                from None
    if jobs.export is not None:
        _check_folder(path, "export", jobs.export)
    if jobs.storage is not None:
        try:
            check_url(jobs.storage)
        except KernsearchError as exc:
            raise JobFileError(f"{path}: storage: {exc}") from None
        db = jobs.storage.removeprefix("sqlite:///") if jobs.storage.startswith("sqlite:///") else None
        if db and os.path.lexists(db) and not _safeio.is_regular(db):
            raise JobFileError(f"{path}: storage: {db} is not a regular file (a link, folder, FIFO or device: "
                               "refused)")


def _check_folder(path: Path, field: str, folder: Path) -> None:
    """A folder the run writes: absent (its nearest existing parent a writable folder) or a real folder."""
    where = folder
    while not os.path.lexists(where) and where.parent != where:
        where = where.parent
    if not _safeio.is_real_dir(where) or not os.access(where, os.W_OK | os.X_OK):
        what = "is not a folder" if not _safeio.is_real_dir(where) else "is not writable"
        raise JobFileError(f"{path}: {field}: {where} {what} (the package is written into a folder)")


def _parse(path: Path, text: str) -> Any:
    suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise JobFileError(f"{path}: not valid TOML: {' '.join(str(exc).split())}") from None
        except RecursionError:
            raise JobFileError(f"{path}: nested too deeply") from None
    if suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise JobFileError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
        except RecursionError:
            raise JobFileError(f"{path}: nested too deeply") from None
        if not isinstance(data, dict):
            raise JobFileError(f"{path}: a job file is a mapping with a `jobs` list")
        return data
    raise JobFileError(f"{path}: unknown job file type {suffix or '(none)'!r}: use .toml, .yaml or .yml")


def _shape_text(value: Any) -> Any:
    """Shapes may be written as text ("64,64,64") or as lists of sizes ([64, 64, 64])."""
    if isinstance(value, list):
        return [",".join(map(str, s)) if isinstance(s, list) else s for s in value]
    return value


def _merged(defaults: JobOptions, job: Job) -> JobOptions:
    """The job's options over the file's defaults (a field the job sets wins)."""
    values = defaults.model_dump()
    values.update({k: getattr(job, k) for k in job.model_fields_set if k in JobOptions.model_fields})
    return JobOptions.model_validate(values)


def _resolve(here: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (here / p).resolve()


def _family_ref(here: Path, name: str) -> str:
    """A built-in family name stays a name; a path (``./myfam``) is made absolute from the job file."""
    if "/" in name or name.startswith("."):
        return str(_resolve(here, name))
    return name


def _resolve_storage(here: Path, url: str | None) -> str | None:
    """A relative SQLite path is taken from the job file's folder; other URLs are used as written."""
    if url is None:
        return None
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url[len(prefix):].startswith("/") and url != ":memory:":
        return prefix + str((here / url[len(prefix):]).resolve())
    return url
