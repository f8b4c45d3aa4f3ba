"""What a call and an artifact are checked against: the problem's dimensions read off the inputs, the family's
declared range (refused in the consumer's words), its constraints for a config, and an artifact's files
against the hashes the store recorded at publish. Part of the run-time dispatcher, copied verbatim into
every exported package."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

try:  # an exported package: the shared modules sit beside this file
    from ._rules import (  # type: ignore[import-not-found,unused-ignore]
        FUNCTIONS,
        ExpressionError,
        content_sha256,
        dispatch_figures,
        evaluate,
        names_in,
        timing_identity,
    )
except ImportError:  # kernsearch itself: the same modules, at the bottom of its package
    from ..._rules import (
        FUNCTIONS,
        ExpressionError,
        content_sha256,
        dispatch_figures,
        evaluate,
        names_in,
        timing_identity,
    )


def _files(entry: Dict[str, Any]) -> Tuple[str, str, str]:
    """What a tamper verdict is about: the two files and the hash they must have."""
    return (str(entry["header"]), str(entry["source"]), str(entry["sha256"]))


def _read_inside(root: Path, rel: str, limit: int = 4 << 20) -> str:
    """A kernel file of the package: a plain relative path inside it, a regular file, bounded."""
    parts = str(rel).split("/")
    if any(p in ("", ".", "..") for p in parts) or str(rel).startswith("/"):
        raise ValueError(f"{rel!r} is not a path inside the package")
    path = root.joinpath(*parts)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{rel} is not a regular file")
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"{rel} is larger than {limit} bytes")
    return data.decode("utf-8")


def decision_fields(m: Dict[str, Any]) -> Dict[str, Any]:
    """The fields of an artifact's dispatch record that come from its manifest (a parsed ``manifest.json``):
    export writes them from the manifest, and the dispatcher checks them against it before first use."""
    meas = m.get("measurements")
    tc, kernel, problem, chip = m["toolchain"], m["kernel"], m["problem"], m["chip"]
    return {
        "key": m["key"], "version": m["version"], "chip": chip["name"], "vendor": chip["vendor"],
        "lineage": list(chip["lineage"]), "dtype": problem["dtype"], "shape": list(problem["shape"]),
        "config": dict(m["config"]), "target": kernel["target"], "evidence": m["evidence"],
        **dispatch_figures(meas),
        "timing_identity": timing_identity(tc.get("mlx_version"), tc.get("os"), tc.get("macos_version"),
                                           tc.get("cuda_driver"), tc.get("nvrtc_version")),
        "kernel": {"name": kernel["name"], "target": kernel["target"], "input_names": list(kernel["input_names"]),
                   "output_names": list(kernel["output_names"]), "template": [list(t) for t in kernel["template"]]},
        "sha256": m["source_sha256"],
    }


def artifact_mismatch(root: Path, entry: Dict[str, Any]) -> str:
    """'' if an artifact's shipped manifest and kernel files hash to the content hash the store recorded at
    publish (``content_sha256`` of its record) and every decision field of the record is its manifest's; else
    why not. Not a signature (the package holds no secret): it catches every change to the shipped files or
    to ``dispatch.json`` that does not also forge the recorded hash."""
    try:
        text = _read_inside(root, str(entry["manifest"]))
        header, source = _read_inside(root, str(entry["header"])), _read_inside(root, str(entry["source"]))
    except (KeyError, OSError, UnicodeDecodeError, ValueError) as exc:
        return f"cannot read its manifest or kernel files ({exc})"
    if content_sha256(text, header, source) != entry.get("content_sha256"):
        return "its manifest or kernel files are not what the store recorded at publish (content hash mismatch)"
    try:
        fields = decision_fields(json.loads(text))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        return f"its manifest is unreadable ({type(exc).__name__})"
    wrong = sorted(k for k, v in fields.items() if entry.get(k) != v)
    return f"its dispatch record differs from its manifest in {', '.join(wrong)}" if wrong else ""


def _bind_dims(fam: Dict[str, Any], shapes: Sequence[Sequence[int]],
               specs: Optional[Sequence[Dict[str, Any]]] = None) -> Tuple[Optional[Dict[str, int]], str]:
    """Problem dimensions read off the input shapes (of ``specs``, some of the inputs, where given); (None, why)
    if they do not fit the family."""
    partial = specs is not None
    specs = fam["inputs"] if specs is None else specs
    if len(shapes) != len(specs):
        return None, f"{len(shapes)} inputs given, {len(specs)} expected"
    dims: Dict[str, int] = {}
    for spec, shape in zip(specs, shapes):
        if len(shape) != len(spec["axes"]):
            return None, f"{spec['name']} has {len(shape)} dimensions, expected {len(spec['axes'])}"
        for axis, size in zip(spec["axes"], shape):
            if isinstance(axis, int):
                if axis != size:
                    return None, f"{spec['name']}: size {size} where {axis} is required"
            elif dims.setdefault(axis, int(size)) != size:
                return None, f"{axis} is {dims[axis]} and {size}"
    missing = [d for d in fam["dims"] if d not in dims]
    if missing and not partial:
        return None, f"dimension(s) {missing} not given by any input"
    return dims, ""


def _range_rules(fam: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The family's constraints on the problem alone (its dimensions, dtype and what derives from them only)."""
    problem = set(fam["dims"]) | set(FUNCTIONS)
    for name, tree in fam["derived"]:
        if names_in(tree) <= problem:
            problem.add(name)
    return [c for c in fam["constraints"] if names_in(c["expr"]) <= problem]


def _upper_bound(fam: Dict[str, Any], dim: str) -> Optional[int]:
    """``B`` of a constraint ``dim <= B`` (a declared range), if the family has one."""
    for c in _range_rules(fam):
        e = c["expr"]
        if e[0] == "cmp" and e[1] == ["name", dim] and len(e[2]) == 1 and e[2][0][0] == "lteq" \
                and e[2][0][1][0] == "const" and isinstance(e[2][0][1][1], int):
            return int(e[2][0][1][1])
    return None


def _size_words(fam: Dict[str, Any], dim: str, size: int) -> str:
    """``X has 0 rows``: a dimension as the consumer passed it (the first input that carries it)."""
    for spec in fam["inputs"]:
        if dim in spec["axes"]:
            axis, ndim = spec["axes"].index(dim), len(spec["axes"])
            what = ("rows" if axis == 0 else "columns") if ndim == 2 else f"elements on axis {axis}"
            return f"{spec['name']} has {size} {what}"
    return f"{dim} is {size}"


def shape_refusal(family: str, fam: Dict[str, Any], shapes: Sequence[Sequence[int]]) -> str:
    """'' if the shapes are in the family's declared range, else why not in the consumer's words
    (``qmatvec: X has 0 rows; this kernel takes 1 to 16``); shapes that do not bind are left to the op."""
    dims, why = _bind_dims(fam, shapes)
    if dims is None:  # the op needs the dimensions: say which input does not fit, not "unknown name 'K'"
        needs = names_in(fam["baseline"]) & set(fam["dims"])
        return f"{family}: the inputs do not fit together: {why}" if needs else ""
    return _dims_refusal(family, fam, dims)


def weights_refusal(family: str, fam: Dict[str, Any], slots: Sequence[int], shapes: Sequence[Sequence[int]]) -> str:
    """'' if the weights (inputs ``slots``, of ``shapes``) fit together and what they alone fix is in the family's
    range, else why not: checked once where :meth:`Dispatcher.bind` binds them to the op (what needs the
    activations too, e.g. the rows of X, is checked once per activation shape)."""
    dims, why = _bind_dims(fam, shapes, [fam["inputs"][i] for i in slots])
    if dims is None:
        return f"{family}: the weights do not fit together: {why}"
    return _dims_refusal(family, fam, dims)


def _dims_refusal(family: str, fam: Dict[str, Any], dims: Dict[str, int]) -> str:
    """'' if the dimensions given (all of the family's, or those its weights fix) are in its declared range; a
    rule that needs a dimension not given is not judged here."""
    for dim in fam["dims"]:
        bound = _upper_bound(fam, dim)
        if dim in dims and (dims[dim] < 1 or (bound is not None and dims[dim] > bound)):
            takes = f"1 to {bound}" if bound is not None else "at least 1"
            return f"{family}: {_size_words(fam, dim, dims[dim])}; this kernel takes {takes}"
    names: Dict[str, Any] = {**FUNCTIONS, **dims}
    for name, tree in fam["derived"]:
        try:
            names[name] = evaluate(tree, names)
        except (ExpressionError, ArithmeticError, TypeError, ValueError, KeyError):
            continue
    for c in _range_rules(fam):
        try:
            ok = evaluate(c["expr"], names)
        except (ExpressionError, ArithmeticError, TypeError, ValueError, KeyError):
            continue  # it needs what is not given (a dtype's size, the activations' rows): judged elsewhere
        if not ok:
            given = ", ".join(f"{n} = {dims[n]}" for n in fam["dims"] if n in dims)
            return f"{family}: inputs with {given} are outside what it takes: {c.get('why') or c['name']}"
    return ""


def _context(fam: Dict[str, Any], config: Dict[str, Any], dims: Dict[str, int], chip: Dict[str, Any],
             dtype: str) -> Dict[str, Any]:
    names: Dict[str, Any] = {**FUNCTIONS, **dims, "dtype": dtype, "dtype_size": fam["dtype_sizes"][dtype],
                             "chip": chip, **config}
    for name, tree in fam["derived"]:
        names[name] = evaluate(tree, names)
    return names


def violation(fam: Dict[str, Any], config: Dict[str, Any], dims: Dict[str, int], chip: Dict[str, Any],
              dtype: str) -> str:
    """'' if ``config`` obeys every family constraint for this shape and chip, else the first violated."""
    try:
        names = _context(fam, config, dims, chip, dtype)
        for c in fam["constraints"]:
            if not evaluate(c["expr"], names):
                return f"violates {c['name']}" + (f" ({c['why']})" if c.get("why") else "")
    except (ExpressionError, ArithmeticError, TypeError, ValueError, KeyError) as exc:
        return f"cannot evaluate constraints: {exc}"
    return ""


def _dtype_name(arrays: Sequence[Any], fam: Optional[Dict[str, Any]] = None) -> str:
    """The problem dtype ``T``: that of the inputs the family types as ``T`` (all of them, in older tables)."""
    specs = (fam or {}).get("inputs") or []
    typed = [a for i, a in enumerate(arrays) if i >= len(specs) or specs[i].get("dtype", "T") == "T"]
    names = {str(a.dtype).rsplit(".", 1)[-1] for a in typed or arrays}
    return names.pop() if len(names) == 1 else "mixed"


def mx_dtype(name: Any) -> Any:
    """The MLX dtype ``name`` names (a package's tables are data: a name of anything else of ``mlx.core``, a
    function, a class, is refused, not returned)."""
    import mlx.core as mx

    dtype = getattr(mx, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, mx.Dtype):
        raise ValueError(f"{str(name)[:40]!r} is not an MLX dtype")
    return dtype


def _out_dtype(spec: Dict[str, Any], dtype: str) -> Any:
    return mx_dtype(dtype if spec.get("dtype", "T") == "T" else spec["dtype"])
