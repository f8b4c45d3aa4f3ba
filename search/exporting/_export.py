"""Export: the store's current artifacts as an installable Python package (a wheel) for the code that uses them.

The package needs only ``mlx`` and ``numpy`` at run time. It holds the current artifact versions (source,
manifest) of the families exported, each family's default-config kernels, a dispatch table
(``dispatch.json``) and the run-time dispatcher (``exporting/runtime/_runtime.py``, copied verbatim), and
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
import re
import shutil
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import nodes

from .. import __version__
from .._errors import KernsearchError
from .._safeio import UnsafeFile, write_atomic
from ..artifacts._artifacts import ArtifactStore
from ..artifacts._manifest import ArtifactError
from ..family._expr import _ENV, Expr
from ..family._render import render
from ..family._spec import ARRAY_FUNCTIONS, DTYPES, Family, load_family
from ..hardware._targets import TARGETS
from .runtime._runtime import DEFAULT_MARGIN, FORMAT, decision_fields

DEFAULT_PACKAGE = "kernsearch_kernels"
#: Besides the standard library's modules, names an exported package may not take: it would shadow them.
SHADOWED = frozenset({"kernsearch", "mlx", "numpy"})
#: MLX has no CPU back-end on Linux without its ``cpu`` extra: consumers' CI must still get correct results.
RUNTIME_REQUIRES = ("mlx[cpu]>=0.29; sys_platform == 'linux'", "mlx>=0.29; sys_platform == 'darwin'",
                    "numpy>=1.26")
_BINOPS: dict[type[nodes.Node], str] = {nodes.Add: "+", nodes.Sub: "-", nodes.Mul: "*", nodes.Div: "/",
                                        nodes.FloorDiv: "//", nodes.Mod: "%", nodes.Pow: "**"}
_UNARY: dict[type[nodes.Node], str] = {nodes.Not: "not", nodes.Neg: "neg", nodes.Pos: "pos"}


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
    """A spec expression as the JSON tree ``_runtime.evaluate`` reads (refuses what it cannot evaluate)."""
    text = expr.text if isinstance(expr, Expr) else expr
    body = _ENV.parse("{{ " + text + " }}").body
    if len(body) != 1 or not isinstance(body[0], nodes.Output) or len(body[0].nodes) != 1:
        raise ExportError(f"{text!r}: not a single expression")
    try:
        return _tree(body[0].nodes[0])
    except ExportError as exc:
        raise ExportError(f"{text!r}: {exc}") from None


def _tree(node: nodes.Node) -> list[Any]:
    if isinstance(node, nodes.Const):
        if not isinstance(node.value, (bool, int, float, str, type(None))):
            raise ExportError(f"constant {node.value!r} cannot be exported")
        return ["const", node.value]
    if isinstance(node, nodes.Name):
        return ["name", node.name]
    if isinstance(node, (nodes.List, nodes.Tuple)):
        return ["list", [_tree(n) for n in node.items]]
    if isinstance(node, nodes.BinExpr) and type(node) in _BINOPS:
        return ["bin", _BINOPS[type(node)], _tree(node.left), _tree(node.right)]
    if isinstance(node, nodes.UnaryExpr) and type(node) in _UNARY:
        return [_UNARY[type(node)], _tree(node.node)]
    if isinstance(node, nodes.Concat):
        return ["concat", [_tree(n) for n in node.nodes]]
    if isinstance(node, nodes.And):
        return ["and", _tree(node.left), _tree(node.right)]
    if isinstance(node, nodes.Or):
        return ["or", _tree(node.left), _tree(node.right)]
    if isinstance(node, nodes.Compare):
        return ["cmp", _tree(node.expr), [[op.op, _tree(op.expr)] for op in node.ops]]
    if isinstance(node, nodes.CondExpr):
        return ["if", _tree(node.test), _tree(node.expr1), None if node.expr2 is None else _tree(node.expr2)]
    if isinstance(node, nodes.Call):
        if not isinstance(node.node, nodes.Name) or node.dyn_args is not None or node.dyn_kwargs is not None:
            raise ExportError("only calls of named functions with plain arguments can be exported")
        return ["call", node.node.name, [_tree(a) for a in node.args], {k.key: _tree(k.value) for k in node.kwargs}]
    if isinstance(node, nodes.Getattr):
        return ["attr", _tree(node.node), node.attr]
    if isinstance(node, nodes.Getitem) and not isinstance(node.arg, nodes.Slice):
        return ["item", _tree(node.node), _tree(node.arg)]
    raise ExportError(f"{type(node).__name__} expressions (filters, tests, slices...) cannot be exported")


# -- the dispatch table ----------------------------------------------------------------------------------

def _family_table(fam: Family) -> dict[str, Any]:
    inputs = []
    for t in fam.inputs:
        shape = expr_tree(t.shape)
        if shape[0] != "list" or any(a[0] not in ("name", "const") for a in shape[1]):
            raise ExportError(f"family {fam.name}: input {t.name} shape {t.shape.text!r} is not a list of "
                              "dimension names (the exported function reads the problem size off its inputs)")
        inputs.append({"name": t.name, "axes": [a[1] for a in shape[1]], "dtype": t.dtype,
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
        "array_functions": list(ARRAY_FUNCTIONS),
        "default": {"config": dict(fam.default), "kernels": {}},
        "artifacts": [],
    }


def _kernel_record(kernel: Any) -> dict[str, Any]:
    return {"name": kernel.name, "target": kernel.target, "input_names": list(kernel.input_names),
            "output_names": list(kernel.output_names), "template": [list(t) for t in kernel.template]}


def _artifact_record(pkg: Path, art: Any, invalidated: str | None) -> dict[str, Any]:
    """Ship one verified version: the exact manifest text and kernel files the store's checks read (never a
    second read of the store), and a dispatch record whose decision fields are its manifest's and whose
    ``content_sha256`` is the hash the store's index recorded at publish (the package checks both)."""
    m = art.manifest
    rel = f"artifacts/{art.key.path}/{art.version}"
    for filename, text in ((m.kernel.header_file, art.kernel.header), (m.kernel.source_file, art.kernel.source),
                           ("manifest.json", art.manifest_text)):
        _write(pkg / rel / filename, text)
    return {**decision_fields(json.loads(art.manifest_text)), "invalidated": invalidated,
            "manifest": f"{rel}/manifest.json", "content_sha256": art.content_sha256,
            "header": f"{rel}/{m.kernel.header_file}", "source": f"{rel}/{m.kernel.source_file}"}


def _chips() -> list[dict[str, Any]]:
    from ..hardware._chips import registry

    return [c.model_dump(exclude={"detected"}) for c in registry().values()]


# -- building --------------------------------------------------------------------------------------------

def export(families: list[str] | None, out: str | Path, store: ArtifactStore | None = None,
           package: str = DEFAULT_PACKAGE, version: str | None = None) -> ExportResult:
    """Build the package source tree and its wheel under ``out``; returns where they are."""
    store = store or ArtifactStore()
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", package) or keyword.iskeyword(package):
        raise ExportError(f"package name {package!r} must be a lower-case Python identifier")
    if package in sys.stdlib_module_names or package in SHADOWED:
        whose = "Python's standard library" if package in sys.stdlib_module_names else "kernsearch and its packages"
        raise ExportError(f"package name {package!r} is a module of {whose}: installed, the package would shadow it "
                          "(choose another --name)")
    version = version or datetime.now(UTC).strftime("%Y.%m.%d.%H%M%S")
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", version):
        raise ExportError(f"version {version!r} must be numbers separated by dots, e.g. 1.2.0")
    # PEP 440's normal form (what pip shows and the wheel's name holds): no leading zeros, 2026.05.03 -> 2026.5.3.
    version = ".".join(part.lstrip("0") or "0" for part in version.split("."))
    names = list(dict.fromkeys(families or sorted({k.family for k in store.keys()})))
    if not names:
        raise ExportError(f"no artifacts in {store.root} and no family named: nothing to export "
                          "(name a family to ship its default config and MLX fallback)")

    if "\x00" in str(out):
        raise ExportError(f"cannot write the package under {str(out)[:200]!r}: a NUL byte in the name")
    try:
        return _export(names, Path(out), store, package, version)
    except OSError as exc:
        raise ExportError(f"cannot write the package under {str(out)[:200]!r}: {exc.strerror or exc}") from None


def _export(names: list[str], out: Path, store: ArtifactStore, package: str, version: str) -> ExportResult:
    source_dir = out / f"{package}-{version}"
    if source_dir.exists():
        shutil.rmtree(source_dir)
    pkg = source_dir / package
    pkg.mkdir(parents=True)
    table: dict[str, Any] = {"format": FORMAT, "package": package, "version": version, "margin": DEFAULT_MARGIN,
                             "kernsearch_version": __version__,
                             "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
                             "chips": _chips(), "families": {}}
    result = ExportResult(package, version, source_dir, out / "unbuilt", [])
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
        shipped = 0
        # Current versions, verified on load (tampered ones stop the export); invalidated ones travel as
        # records the dispatcher never runs, so `explain` can say why (e.g. "0.26x of mx.matmul").
        for art, invalidated in store.current_artifacts(fam.name, with_invalidated=True):
            entry["artifacts"].append(_artifact_record(pkg, art, invalidated))
            if invalidated is None:
                result.artifacts.append(f"{art.key.path}/{art.version}")
                shipped += 1
        if not shipped:
            result.notes.append(f"{fam.name}: no artifact in {store.root} is measured to beat the MLX op; every "
                                "call runs the MLX op")
        table["families"][fam.name] = entry
        result.families.append(fam.name)

    _write(pkg / "dispatch.json", json.dumps(table, indent=1) + "\n")
    runtime = resources.files("kernsearch.exporting.runtime").joinpath("_runtime.py").read_text(encoding="utf-8")
    _write(pkg / "_runtime.py", runtime)
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

import functools as _functools
import inspect as _inspect
import keyword as _keyword
import re as _re
from pathlib import Path as _Path

from ._runtime import Decision, Dispatcher

_dispatcher = Dispatcher(_Path(__file__).resolve().parent)
__version__ = str(_dispatcher.table.get("version", ""))
_NAME = _re.compile(r"[a-z][a-z0-9_]{0,47}")
_PARAM = _re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def explain(family, *arrays, chip=None, modeled=False):
    """Which artifact (or fallback) ``family(*arrays)`` uses here (or on ``chip``: a name or device_info).

    ``modeled=True`` also considers modeled (never measured) artifacts, as ``KERNSEARCH_KERNELS=modeled`` does.
    """
    return _dispatcher.explain(family, *arrays, chip=chip, modeled=modeled)


def _function(family, entry):
    # A C-level partial of the dispatcher: a planned call costs one Python frame (Dispatcher.call) on top of
    # the op or kernel, which matters against MLX ops of a few microseconds.
    call = _functools.partial(_dispatcher.call, family)

    def explain_call(*arrays, chip=None, modeled=False):
        return _dispatcher.explain(family, *arrays, chip=chip, modeled=modeled)

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
    return call


__all__ = ["explain", "Decision", "Dispatcher"]
for _family, _entry in _dispatcher.table.get("families", {}).items():
    _public = _family + "_" if _keyword.iskeyword(_family) or _family in __all__ else _family
    if isinstance(_family, str) and _NAME.fullmatch(_family) and _public not in globals():
        globals()[_public] = _function(_family, _entry)
        __all__.append(_public)
'''


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

    expected = out / f"{package}-{version}-py3-none-any.whl"
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
