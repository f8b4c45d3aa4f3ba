"""Export: the store's current artifacts as an installable Python package (a wheel) for the code that uses them.

The package needs only ``mlx`` and ``numpy`` at run time. It holds the current artifact versions (source,
manifest) of the families exported, each family's default-config kernels, a dispatch table
(``dispatch.json``) and the run-time dispatcher (``exporting/runtime/_runtime.py`` with the shared rules it
applies, ``_rules.py`` with its ``_rules_*.py`` and ``_vocabulary.py``: all copied verbatim), and
exposes one function per family (``gemm(a, b)``) plus ``explain(...)``. Geometry and constraints for
shapes nobody tuned are computed at run time: the family's expressions are parsed here with Jinja's
parser and shipped as small JSON trees that the dispatcher evaluates without ``eval`` and without Jinja.

The source tree is a flit project (its ``pyproject.toml`` names ``flit_core`` as the build back-end); the
wheel beside it is built from that tree by ``flit_core`` in this process (no network, no build isolation),
so anyone can rebuild the same wheel from the tree with ``pip wheel`` or ``python -m build``.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from .. import __version__
from .._errors import KernsearchError
from .._rules import DEFAULT_MARGIN, TARGETS
from .._safeio import UnsafeFile, write_atomic
from .._vocabulary import Evidence
from ..artifacts._artifacts import ArtifactStore
from ..artifacts._manifest import MODELED_POLICY, ArtifactError
from ..family._expr import Expr
from ..family._render import render
from ..family._spec import ARRAY_FUNCTIONS, DTYPES, Family, load_family
from ..family._tree import TreeError
from ..family._tree import expr_tree as _expr_tree
from .runtime._runtime import FORMAT, decision_fields

DEFAULT_PACKAGE = "kernsearch_kernels"
#: Besides the standard library's modules, names an exported package may not take: it would shadow them.
SHADOWED = frozenset({"kernsearch", "mlx", "numpy"})
#: MLX has no CPU back-end on Linux without its ``cpu`` extra: consumers' CI must still get correct results.
RUNTIME_REQUIRES = ("mlx[cpu]>=0.29; sys_platform == 'linux'", "mlx>=0.29; sys_platform == 'darwin'",
                    "numpy>=1.26")


class ExportError(KernsearchError):
    """The export cannot be built (bad package name, an expression the run time cannot evaluate...)."""


@dataclass
class ExportResult:
    package: str
    version: str
    source_dir: Path
    wheel: Path
    families: list[str]
    artifacts: list[str] = field(default_factory=list)  # key/version of every artifact shipped
    notes: list[str] = field(default_factory=list)


# -- expressions as trees --------------------------------------------------------------------------------

def expr_tree(expr: Expr | str) -> list[Any]:
    """A spec expression as the JSON tree ``_runtime.evaluate`` reads (:func:`kernsearch.family._tree.expr_tree`)."""
    try:
        return _expr_tree(expr)
    except TreeError as exc:
        raise ExportError(str(exc)) from None


# -- the dispatch table ----------------------------------------------------------------------------------

def _family_table(fam: Family) -> dict[str, Any]:
    inputs = []
    for t in fam.inputs:
        shape = expr_tree(t.shape)
        if shape[0] not in ("list", "tuple") or any(a[0] not in ("name", "const") for a in shape[1]):
            raise ExportError(f"family {fam.name}: input {t.name} shape {t.shape.text!r} is not a list of "
                              "dimension names (the exported function reads the problem size off its inputs)")
        inputs.append({"name": t.name, "axes": [a[1] for a in shape[1]], "dtype": t.dtype, "weight": t.weight,
                       "transposed": expr_tree(t.transposed) if t.transposed is not None else None})
    launch = {name: expr_tree(e) for name in ("grid", "threadgroup", "shared_memory", "zero_outputs")
              if (e := getattr(fam.launch, name)) is not None}
    return {
        "description": fam.description,
        "dims": list(fam.dims),
        "dtypes": list(fam.problem.dtypes),
        "dtype_sizes": {d: DTYPES[d] for d in fam.problem.dtypes},
        "inputs": inputs,
        "outputs": [{"name": t.name, "shape": expr_tree(t.shape), "dtype": t.dtype} for t in fam.outputs],
        "derived": [[name, expr_tree(e)] for name, e in fam.derived.items()],
        "constraints": [{"name": c.name, "why": c.why, "expr": expr_tree(c.expr)} for c in fam.constraints],
        "launch": launch,
        "baseline": expr_tree(fam.baseline),
        "baseline_name": fam.baseline_name,
        "compile_baseline": fam.compile_baseline,
        "params": [{"name": n, "value": p.number, "dtype": p.dtype} for n, p in fam.params.items()],
        "transfer": fam.transfer,
        "modes": list(fam.consumer_modes),
        "array_functions": list(ARRAY_FUNCTIONS),
        "default": {"config": dict(fam.default), "kernels": {}},
        "artifacts": [],
    }


def _kernel_record(kernel: Any) -> dict[str, Any]:
    return {"name": kernel.name, "target": kernel.target, "input_names": list(kernel.input_names),
            "output_names": list(kernel.output_names), "template": [list(t) for t in kernel.template]}


def _artifact_record(pkg: Path, art: Any, invalidated: str | None) -> dict[str, Any]:
    """Ship one verified version: the exact manifest text and kernel files the store's checks read (never a
    second read of the store; an invalidated version's kernel files stay behind), and a dispatch record whose
    decision fields are its manifest's and whose ``content_sha256`` is the hash the store's index recorded at
    publish (the package checks both)."""
    m = art.manifest
    rel = f"artifacts/{art.key.path}/{art.version}"
    # An invalidated version ships its manifest (for `explain`) but no kernel: a record edited to drop the
    # invalidation then fails its integrity check (no files to hash), so nothing it could run is there.
    kernel_files = () if invalidated else ((m.kernel.header_file, art.kernel.header),
                                           (m.kernel.source_file, art.kernel.source))
    for filename, text in (*kernel_files, ("manifest.json", art.manifest_text)):
        _write(pkg / rel / filename, text)
    return {**decision_fields(json.loads(art.manifest_text)), "invalidated": invalidated,
            "manifest": f"{rel}/manifest.json", "content_sha256": art.content_sha256,
            "header": f"{rel}/{m.kernel.header_file}", "source": f"{rel}/{m.kernel.source_file}"}


def _chips() -> list[dict[str, Any]]:
    from ..hardware._chips import registry

    return [c.model_dump(exclude={"detected"}) for c in registry().values()]


# -- building --------------------------------------------------------------------------------------------

def _check_package_name(package: str) -> None:
    """The package name is a lower-case Python identifier that shadows no module it would be installed beside."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", package) or keyword.iskeyword(package):
        raise ExportError(f"package name {package!r} must be a lower-case Python identifier")
    if package in sys.stdlib_module_names or package in SHADOWED:
        whose = "Python's standard library" if package in sys.stdlib_module_names else "kernsearch and its packages"
        raise ExportError(f"package name {package!r} is a module of {whose}: installed, the package would shadow it "
                          "(choose another --name)")


def _normal_version(version: str | None) -> str:
    """``version`` (default: the UTC time) checked as numbers separated by dots, in PEP 440's normal form (what
    pip shows and the wheel's name holds): no leading zeros, 2026.05.03 -> 2026.5.3."""
    version = version or datetime.now(UTC).strftime("%Y.%m.%d.%H%M%S")
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", version):
        raise ExportError(f"version {version!r} must be numbers separated by dots, e.g. 1.2.0")
    return ".".join(part.lstrip("0") or "0" for part in version.split("."))


def export(families: list[str] | None, out: str | Path, store: ArtifactStore | None = None,
           package: str = DEFAULT_PACKAGE, version: str | None = None) -> ExportResult:
    """Build the package source tree and its wheel under ``out``; returns where they are.

    ``families``: built-in names or family folders; None ships every built-in family (the MLX op path for those
    without artifacts) and every family of the store that is built in. Everything is built in a fresh folder
    inside ``out`` and moved into place only when complete, so a failed export changes nothing there; a
    successful one leaves ``out`` holding this package's one current wheel and its source tree (earlier
    versions of the package are removed). Versions never collide: a default (UTC time) version already in
    ``out`` gets a further ``.N``."""
    store = store or ArtifactStore()
    _check_package_name(package)
    given = version
    version = _normal_version(version)
    notes: list[str] = []
    names = list(dict.fromkeys(families)) if families else default_families(store, notes)
    if "\x00" in str(out):
        raise ExportError(f"cannot write the package under {str(out)[:200]!r}: a NUL byte in the name")
    out = Path(out)
    try:
        version = _free_version(out, package, version) if given is None else version
        made_out = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".kernsearch-export-", dir=out))
    except OSError as exc:
        raise ExportError(f"cannot write the package under {str(out)[:200]!r}: {exc.strerror or exc}") from None
    try:
        built = _export(names, staging, store, package, version)
        result = _move_into_place(built, staging, out)
        _remove_older(out, package, result)
    except OSError as exc:
        raise ExportError(f"cannot write the package under {str(out)[:200]!r}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if made_out and not any(out.iterdir()):  # a failed export into a folder it made leaves no folder
            out.rmdir()
    result.notes[:0] = notes
    return result


def default_families(store: ArtifactStore, notes: list[str]) -> list[str]:
    """What a plain ``export`` ships: every built-in family, then the store's other families it can load (none:
    a family folder is named by path; such artifacts are left out with a note)."""
    from ..family._spec import builtin_family_names

    builtin = builtin_family_names()
    stored = sorted({k.family for k in store.keys()})
    others = [name for name in stored if name not in builtin]
    if others:
        notes.append(f"artifacts of {', '.join(others)} left out: not a built-in family; name the family's folder "
                     "to export it (kernsearch export ./FOLDER ...)")
    return builtin


def _free_version(out: Path, package: str, version: str) -> str:
    """``version``, or the smallest ``version.N`` (else ``LATEST.N``) above every version of the package already
    in ``out``: a default version never collides with one there (two exports in one second) and never goes
    back (pip upgrades to it)."""
    found = [_version_key(m.group(1)) for p in out.glob(f"{package}-*") if (m := re.fullmatch(
        rf"{re.escape(package)}-([0-9]+(?:\.[0-9]+)*)(?:-py3-none-any\.whl)?", p.name))] if out.is_dir() else []
    top = max(found, default=())
    if _version_key(version) > top:
        return version
    base = version if _version_key(version) + (sys.maxsize,) > top else ".".join(map(str, top))
    n = 1
    while _version_key(f"{base}.{n}") <= top:
        n += 1
    return f"{base}.{n}"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _wheel_name(package: str, version: str) -> str:
    return f"{package}-{version}-py3-none-any.whl"


def _move_into_place(built: ExportResult, staging: Path, out: Path) -> ExportResult:
    """The finished source tree and wheel moved from ``staging`` into ``out`` (same file system: renames); what
    they replace (the same version exported again) goes into ``staging`` and is deleted with it."""
    replaced = staging / "replaced"
    replaced.mkdir()
    moved = []
    for path in (built.source_dir, built.wheel):
        target = out / path.name
        if target.exists() or target.is_symlink():
            os.replace(target, replaced / path.name)
        os.replace(path, target)
        moved.append(target)
    built.source_dir, built.wheel = moved
    return built


def _remove_older(out: Path, package: str, current: ExportResult) -> None:
    """Earlier exports of ``package`` in ``out`` (its wheels and source trees, recognised by name and content):
    ``--out`` holds one current wheel. Links and anything else are left alone."""
    version = r"[0-9]+(?:\.[0-9]+)*"
    for path in out.iterdir():
        if path in (current.source_dir, current.wheel) or path.is_symlink():
            continue
        try:
            if re.fullmatch(rf"{re.escape(package)}-{version}-py3-none-any\.whl", path.name) and path.is_file():
                path.unlink()
            elif re.fullmatch(rf"{re.escape(package)}-{version}", path.name) and path.is_dir() and \
                    (path / "pyproject.toml").is_file() and (path / package / "dispatch.json").is_file():
                shutil.rmtree(path)
        except OSError:  # the new package is in place; an old one left behind is no failure of this export
            continue


def _export(names: list[str], out: Path, store: ArtifactStore, package: str, version: str) -> ExportResult:
    source_dir = out / f"{package}-{version}"
    pkg = source_dir / package
    pkg.mkdir(parents=True)
    table: dict[str, Any] = {"format": FORMAT, "package": package, "version": version, "margin": DEFAULT_MARGIN,
                             "kernsearch_version": __version__,
                             "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
                             "chips": _chips(), "families": {}}
    result = ExportResult(package, version, source_dir, out / "unbuilt", [])
    bare: list[str] = []  # families with nothing measured to dispatch: the MLX op everywhere
    for name in names:
        fam = load_family(name)
        entry = _family_table(fam)
        for target in fam.templates:
            for dtype in fam.problem.dtypes:
                kernel = render(fam, dict(fam.default), dtype, target)
                rel, suffix = f"defaults/{fam.name}/{target}-{dtype}", TARGETS[target].suffix
                _write(pkg / rel / f"header.{suffix}", kernel.header)
                _write(pkg / rel / f"source.{suffix}", kernel.source)
                entry["default"]["kernels"][f"{target}:{dtype}"] = {
                    "config": dict(fam.default), "kernel": _kernel_record(kernel), "sha256": kernel.sha256,
                    "header": f"{rel}/header.{suffix}", "source": f"{rel}/source.{suffix}"}
        shipped: list[str] = []
        # Current versions, verified on load (tampered ones stop the export); invalidated ones travel as
        # records the dispatcher never runs, so `explain` can say why (e.g. "0.26x of mx.matmul").
        for art, invalidated in store.current_artifacts(fam.name, with_invalidated=True):
            m = art.manifest
            entry["artifacts"].append(_artifact_record(pkg, art, invalidated))
            if invalidated is None:
                result.artifacts.append(f"{art.key.path}/{art.version}")
                shipped.append(m.evidence)
        if Evidence.MODELED in shipped and Evidence.MEASURED not in shipped:
            result.notes.append(f"{fam.name}: ships only modeled artifacts ({shipped.count(Evidence.MODELED)}), "
                                f"none measured: {MODELED_POLICY}")
        elif Evidence.MEASURED not in shipped:
            bare.append(fam.name)
        table["families"][fam.name] = entry
        result.families.append(fam.name)
    if bare:
        result.notes.append(f"{', '.join(bare)}: no artifact in {store.root} is measured to beat the MLX op; every "
                            "call runs the MLX op")

    _write(pkg / "dispatch.json", json.dumps(table, indent=1) + "\n")
    for name, data in shipped_modules().items():
        _write_bytes(pkg / name, data)
    _write(pkg / "__init__.py", _init_module(table, package))
    _write(source_dir / "pyproject.toml", _pyproject(package, version))
    result.wheel = build_wheel(source_dir, package, version, out)
    return result


#: The exported package's ``__init__.py``: constant text. Everything that varies (families, their
#: descriptions, chips, configs) is data in ``dispatch.json``, read at import; no text from a manifest, a
#: spec or an artifact ever becomes Python source.
INIT_MODULE = '''"""Tuned MLX kernels exported by kernsearch.

Each family in ``dispatch.json`` is a function of this package (``gemm(a, b)``...). It picks the kernel for
the chip it runs on (exact chip, same generation and die, same generation, the family's default config,
then the plain MLX op) and the nearest tuned shape valid for the call; ``FAMILY.explain(*arrays)`` and
``explain(family, *arrays)`` say which and why. Needs only mlx and numpy. ``dispatch.json`` is data: no
text in it is ever executed.
"""

import inspect as _inspect
import keyword as _keyword
import re as _re
from pathlib import Path as _Path

from ._patch import Patcher as _Patcher
from ._runtime import Decision, Dispatcher

_dispatcher = Dispatcher(_Path(__file__).resolve().parent)
__version__ = str(_dispatcher.table.get("version", ""))
_NAME = _re.compile(r"[a-z][a-z0-9_]{0,47}")
_PARAM = _re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def explain(family, *arrays, chip=None, modeled=False):
    """Which artifact (or fallback) ``family(*arrays)`` uses here (or on ``chip``: a name or device_info).

    ``modeled=True`` also considers modeled (never measured) artifacts, as ``KERNSEARCH_KERNELS=modeled`` does.
    ``explain(model)``: what each layer of an mlx-lm model runs, patched or not (``patch``).
    """
    if not isinstance(family, str):
        return _patcher.explain(family)
    return _dispatcher.explain(family, *arrays, chip=chip, modeled=modeled)


_patcher = _Patcher(_dispatcher)


def patch(model, always=False, compiled=True):
    """Run an mlx-lm model of the Llama family through this package's fused families where a kernel was measured to
    win on this chip (``always=True``: every decode step, kernels or not; ``compiled=False``: each call through the
    package's front on every step, not replayed by ``mx.compile``; see ``_patch.py``)."""
    return _patcher.patch(model, always=always, compiled=compiled)


def unpatch(model):
    """Undo ``patch(model)``: the model's blocks run mlx-lm's own forward again."""
    return _patcher.unpatch(model)


def _function(family, entry):
    # The dispatcher's closure for the family: a planned call costs one Python frame on top of the op or
    # kernel, which matters against MLX ops of a few microseconds.
    call = _dispatcher.function(family)

    def explain_call(*arrays, chip=None, modeled=False):
        return _dispatcher.explain(family, *arrays, chip=chip, modeled=modeled)

    def bind(*weights, chip=None, modeled=False):
        """This family with its weights fixed: ``f = FAMILY.bind(W, ...); f(X)``, planned once per X's shape."""
        return _dispatcher.bind(family, *weights, chip=chip, modeled=modeled)

    names = [str(i.get("name", "")) for i in entry.get("inputs", [])]
    params = [n.lower() if _PARAM.fullmatch(n) and not _keyword.iskeyword(n.lower()) else "x%d" % i
              for i, n in enumerate(names)]
    if len(set(params)) == len(params):
        call.__signature__ = _inspect.Signature(
            [_inspect.Parameter(p, _inspect.Parameter.POSITIONAL_ONLY) for p in params]
            + [_inspect.Parameter("modeled", _inspect.Parameter.KEYWORD_ONLY, default=False)])
    call.__name__ = call.__qualname__ = family
    call.__doc__ = str(entry.get("description", ""))[:2000]
    call.explain = explain_call
    if any(i.get("weight") for i in entry.get("inputs", [])):
        call.bind = bind
    return call


__all__ = ["explain", "patch", "unpatch", "Decision", "Dispatcher"]
for _family, _entry in _dispatcher.table.get("families", {}).items():
    _public = _family + "_" if _keyword.iskeyword(_family) or _family in __all__ else _family
    if isinstance(_family, str) and _NAME.fullmatch(_family) and _public not in globals():
        globals()[_public] = _function(_family, _entry)
        __all__.append(_public)
'''


#: Where the dispatcher's own modules live in kernsearch: every ``_*.py`` there ships (a module added there ships
#: without being listed; each imports its siblings and the shared modules relatively, as they sit in the package).
RUNTIME_PACKAGE = "kernsearch.exporting.runtime"
#: Where kernsearch keeps the shared modules the dispatcher imports: ``_vocabulary.py`` and the rules, ``_rules.py``
#: and every ``_rules_*.py`` beside it (a rules module added there ships without being listed).
SHARED_PACKAGE = "kernsearch"


def _shipped() -> dict[str, str]:
    runtime = sorted(f.name for f in resources.files(RUNTIME_PACKAGE).iterdir()
                     if f.name.startswith("_") and f.name.endswith(".py") and f.name != "__init__.py")
    rules = sorted(f.name for f in resources.files(SHARED_PACKAGE).iterdir()
                   if re.fullmatch(r"_rules(_[a-z0-9_]+)?\.py", f.name))
    return {**dict.fromkeys(runtime, RUNTIME_PACKAGE), **dict.fromkeys([*rules, "_vocabulary.py"], SHARED_PACKAGE)}


#: The modules of the package's dispatcher, by file name: where kernsearch keeps each (copied byte for byte).
SHIPPED = _shipped()


def shipped_modules() -> dict[str, bytes]:
    """The dispatcher's modules as an exported package holds them: kernsearch's own files, byte for byte (the rules
    and the vocabulary are the very modules kernsearch imports)."""
    return {name: resources.files(package).joinpath(name).read_bytes() for name, package in SHIPPED.items()}


def _init_module(table: dict[str, Any], package: str) -> str:
    """The package's ``__init__.py``: always :data:`INIT_MODULE`, whatever the table holds."""
    return INIT_MODULE


def _pyproject(package: str, version: str) -> str:
    deps = ", ".join(json.dumps(r) for r in RUNTIME_REQUIRES)
    return f'''[build-system]
requires = ["flit_core>=3.9,<5"]
build-backend = "flit_core.buildapi"

[project]
name = "{package.replace("_", "-")}"
version = "{version}"
description = "Tuned MLX kernels exported by kernsearch"
requires-python = ">=3.9"
dependencies = [{deps}]

[tool.flit.module]
name = "{package}"
'''


def build_wheel(source_dir: Path, package: str, version: str, out: Path) -> Path:
    """``out/{package}-{version}-py3-none-any.whl``, built by flit_core from ``source_dir`` (its pyproject.toml).

    Every value in that pyproject.toml is checked here (package name, version) or constant: no text from a
    manifest reaches the metadata. Static name, version and description: flit never imports the package.
    """
    import tempfile

    from flit_core.wheel import make_wheel_in

    expected = out / _wheel_name(package, version)
    # Built in a private folder, then moved beside the tree by the one safe write (a link or special file
    # planted at the wheel's name in ``out`` is refused, never written through).
    with tempfile.TemporaryDirectory(prefix="ks-wheel-") as private:
        built = Path(make_wheel_in(source_dir / "pyproject.toml", Path(private)).file)
        if built.name != expected.name:  # pragma: no cover - the version is normalised before export writes
            raise ExportError(f"flit_core named the wheel {built.name}, expected {expected.name}")
        _write_bytes(expected, built.read_bytes())
    return expected


def _write(path: Path, text: str) -> None:
    _write_bytes(path, text.encode("utf-8"))


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomic(path, data)
    except UnsafeFile as exc:
        raise ExportError(f"cannot write the package: {exc}") from None


__all__ = ["ArtifactError", "ExportError", "ExportResult", "build_wheel", "export", "expr_tree"]
