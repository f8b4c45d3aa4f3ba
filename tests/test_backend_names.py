"""No module outside ``search/backends/`` tests a back-end's name (issue 12).

A caller that compares names (``backend == "model"``, ``backend in ("metal", "cuda")``) has to change with
every new back-end; a caller that asks the back-end (``backend_class(name).measures``) does not. The walk
reads every module of ``search/`` and ``flows/`` except the back-ends themselves and the export runtime (a
standalone file shipped inside exported wheels, which imports nothing of kernsearch) and fails on any
comparison (``==``, ``!=``, ``in``, ``not in``) of anything against a string literal that is a back-end name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NAMES = {"model", "metal", "cuda", "cpu", "replay", "auto"}
SKIP = (ROOT / "search" / "backends", ROOT / "search" / "exporting" / "runtime")
#: Other vocabularies that share a word with back-end names: a chip's vendor ("cpu": no GPU) and a study's
#: sampler ("auto": the model-ranked valid-set search). A comparison whose other side is one of these is not
#: about back-ends.
OTHER_VOCABULARIES = {"vendor", "sampler"}
#: Functions whose argument is another vocabulary's name (module relative to ROOT, function).
OTHER_FUNCTIONS = {("search/studies/_samplers.py", "make_sampler")}


def _strings(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    if isinstance(node, ast.Dict):  # ``x in {"metal": ..., "cuda": ...}``
        return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return set()


def _word(node: ast.expr) -> str | None:
    """The last identifier of ``a.b.vendor`` / ``vendor`` / ``get("vendor")``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    return None


def offenders(file: Path) -> list[str]:
    rel = file.relative_to(ROOT).as_posix()
    tree = ast.parse(file.read_text(), str(file))
    found: list[str] = []

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name)
                continue
            if isinstance(child, ast.Compare) and (rel, function) not in OTHER_FUNCTIONS:
                operands = [child.left, *child.comparators]
                for op, (left, right) in zip(child.ops, zip(operands, operands[1:])):
                    if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                        continue
                    for literal, other in ((left, right), (right, left)):
                        names = _strings(literal) & NAMES
                        if names and _word(other) not in OTHER_VOCABULARIES:
                            found.append(f"{rel}:{child.lineno}: {ast.unparse(child)}")
            visit(child, function)

    visit(tree, None)
    return found


def test_walk_finds_a_name_comparison(tmp_path: Path) -> None:
    """The walk itself sees the comparisons it exists to forbid (and passes the other vocabularies)."""
    code = ('def f(backend, chip, sampler, impl):\n'
            '    a = backend == "model"\n'
            '    b = backend in ("metal", "cuda")\n'
            '    c = "cpu" != impl.name\n'
            '    d = {"apple": "metal"}.get(chip.vendor) == "metal"\n'
            '    e = chip.vendor == "cpu" or sampler == "auto" or backend == "tpe"\n')
    file = ROOT / "tests" / "_backend_names_probe.py"
    try:
        file.write_text(code)
        lines = [o.split(":")[1] for o in offenders(file)]
    finally:
        file.unlink()
    assert lines == ["2", "3", "4", "5"]


def test_no_module_outside_backends_tests_a_backend_name() -> None:
    files = [f for folder in ("search", "flows") for f in sorted((ROOT / folder).rglob("*.py"))
             if not any(f.is_relative_to(skip) for skip in SKIP)]
    assert len(files) > 30  # the walk saw the package
    found = [o for f in files for o in offenders(f)]
    assert not found, "compare capabilities, not back-end names:\n" + "\n".join(found)


# -- what callers ask instead: capabilities and one selection ------------------------------------------

def test_backends_declare_what_callers_ask() -> None:
    from kernsearch._errors import BackendError
    from kernsearch.backends import backend_class

    metal, cuda, cpu, model = (backend_class(n) for n in ("metal", "cuda", "cpu", "model"))
    assert metal.measures_device and cuda.measures_device and not cpu.measures_device and not model.measures_device
    assert metal.rotates_inputs and metal.compiles_ahead and not model.compiles_ahead
    assert model.predicts and not metal.predicts and cpu.interprets and not cuda.interprets
    assert (model.verifier(), cpu.verifier(), cuda.verifier()) == ("cpu", "cpu", "cuda")
    with pytest.raises(BackendError, match="checks correctness only"):
        cpu.check_tunable()
    model.check_tunable()  # no refusal
    with pytest.raises(BackendError, match="unknown back-end 'replay'"):  # an objective, not a device
        backend_class("replay")


def test_select_backend_decides_auto_for_the_cli_and_the_flows() -> None:
    from kernsearch import get_chip
    from kernsearch.backends import select_backend
    from kernsearch.hardware._chips import registry

    nothing, h100, m2 = registry()["cpu"], get_chip("H100"), get_chip("M2 Max")
    assert select_backend("auto", detected=h100) == select_backend("auto", "H100", detected=h100)
    assert (select_backend("auto", detected=h100).backend, select_backend("auto", detected=m2).backend) == (
        "cuda", "metal")
    alone = select_backend("auto", detected=nothing)
    assert (alone.backend, alone.chip.name) == ("model", "M2 Max") and "no GPU here" in (alone.note or "")
    other = select_backend("auto", "H100", detected=m2)
    assert (other.backend, other.chip.name) == ("model", "H100")
    assert "M2 Max is not the chip to tune for" in (other.note or "") and "nothing is verified" in (other.note or "")
    refused = select_backend("metal", "H100", detected=m2)  # a measurement belongs to the GPU it ran on
    assert refused.chip.name == "M2 Max" and "measures the GPU here (M2 Max), not H100" in (refused.refusal or "")
    assert select_backend("cuda", detected=nothing).refusal is None  # the back-end itself says it cannot run
    assert select_backend("model", "H100", detected=m2).chip.name == "H100"
