"""kernsearch's modules import each other without cycles, lazy imports included.

A cycle hidden in a function-level import still ties two modules together (neither can be understood,
tested or moved without the other) and breaks as soon as someone hoists the import. The walk reads every
``import`` of every module of the installed layout (``[tool.setuptools] package-dir``), at any depth,
except those under ``if TYPE_CHECKING:`` (annotations only), and looks for strongly connected components.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def modules() -> dict[str, Path]:
    """Module name → file, as the package-dir mapping installs them (setup.py ships every folder under its roots,
    so every ``.py`` file below a mapped folder is a module of the install)."""
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found: dict[str, Path] = {}
    for package, folder in mapped.items():
        root = ROOT / folder
        for file in root.rglob("*.py"):
            parts = file.relative_to(root).with_suffix("").parts
            if "__pycache__" not in parts:
                found[".".join([package, *(parts[:-1] if parts[-1] == "__init__" else parts)])] = file
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(name: str, file: Path, known: dict[str, Path]) -> set[str]:
    """The kernsearch modules ``name`` imports anywhere in its body (not under TYPE_CHECKING)."""
    package = name if file.stem == "__init__" else name.rpartition(".")[0]
    wanted: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                wanted.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")
                    anchor = anchor[:len(anchor) - (child.level - 1)]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                wanted.add(base)
                wanted.update(f"{base}.{a.name}" for a in child.names)  # `from . import _safeio`
            visit(child)

    visit(ast.parse(file.read_text(encoding="utf-8")))
    edges = set()
    for target in wanted:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_walk_sees_every_package_and_finds_a_planted_cycle() -> None:
    known = modules()
    assert {"kernsearch.cli", "kernsearch.studies._study", "kernsearch.flows._cli", "kernsearch.backends",
            "kernsearch.exporting.runtime._runtime", "kernsearch.interp"} <= set(known)
    measured = "kernsearch.studies._measured"
    assert "kernsearch.studies._trial" in imports(measured, known[measured], known)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    known = modules()
    graph = {name: imports(name, file, known) for name, file in known.items()}
    found = cycles(graph)
    described = ["; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c) for c in found]
    assert not found, "import cycles: " + " | ".join(described)


def floor(module: str, known: dict[str, Path]) -> str:
    """The unit a module belongs to in the floors: its subpackage (``kernsearch.studies``), or itself for a module
    at the top (``kernsearch._rules``, ``kernsearch.cli``). The rules' own modules (``kernsearch._rules_expr``...)
    are one unit with ``kernsearch._rules``: one floor, shipped together."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and known[module].stem == "__init__"):
        return ".".join(parts[:2])
    if len(parts) == 2 and parts[1].startswith("_rules_"):
        return "kernsearch._rules"
    return module


def subpackage_graph(graph: dict[str, set[str]], known: dict[str, Path]) -> dict[str, set[str]]:
    """``graph`` with every subpackage's modules merged into one node (edges inside a subpackage dropped)."""
    merged: dict[str, set[str]] = {}
    for name, edges in graph.items():
        mine = floor(name, known)
        merged.setdefault(mine, set()).update(floor(e, known) for e in edges if floor(e, known) != mine)
    for edges in list(merged.values()):
        for e in edges:
            merged.setdefault(e, set())
    return merged


def test_the_subpackage_walk_merges_modules_and_finds_a_planted_cycle() -> None:
    known = {"kernsearch.a._x": Path("x.py"), "kernsearch.a._y": Path("y.py"), "kernsearch.b": Path("__init__.py"),
             "kernsearch.b._z": Path("z.py"), "kernsearch._rules": Path("_rules.py")}
    graph = {"kernsearch.a._x": {"kernsearch.b._z"}, "kernsearch.a._y": {"kernsearch._rules"},
             "kernsearch.b._z": {"kernsearch.a._y"}, "kernsearch.b": set(), "kernsearch._rules": set()}
    assert cycles(graph) == []  # no cycle between modules ...
    merged = subpackage_graph(graph, known)
    assert merged["kernsearch.a"] == {"kernsearch.b", "kernsearch._rules"}
    assert cycles(merged) == [["kernsearch.a", "kernsearch.b"]]  # ... but one between the subpackages


def test_no_cycles_between_subpackages() -> None:
    """The floors of the house (README's layout): a subpackage imports only the ones below it, never back."""
    known = modules()
    graph = {name: imports(name, file, known) for name, file in known.items()}
    merged = subpackage_graph(graph, known)
    assert {"kernsearch.studies", "kernsearch.artifacts", "kernsearch.exporting", "kernsearch._rules"} <= set(merged)
    found = cycles(merged)
    described = []
    for c in found:
        pairs = [f"{m} -> {e}" for m in sorted(graph) if floor(m, known) in c for e in sorted(graph[m])
                 if floor(e, known) in c and floor(e, known) != floor(m, known)]
        described.append("; ".join(pairs))
    assert not found, "cycles between subpackages: " + " | ".join(described)


def levels(merged: dict[str, set[str]]) -> dict[str, int]:
    """Each unit's floor: 0 for one importing nothing of kernsearch, else one above the highest it imports."""
    found: dict[str, int] = {}

    def level(unit: str) -> int:
        if unit not in found:
            found[unit] = 0  # (no cycles: test_no_cycles_between_subpackages)
            found[unit] = 1 + max((level(e) for e in merged[unit]), default=-1)
        return found[unit]

    for unit in merged:
        level(unit)
    return found


def drawn_floors(page: str) -> dict[str, int]:
    """The floors docs/architecture.md draws: ``kernsearch.<unit>`` → the number on its line."""
    import re

    block = page.split("```text\n", 1)[1].split("```", 1)[0]
    drawn = {}
    for line in block.splitlines():
        m = re.match(r"\s*(\d+)\s+(.*?)\s*─", line)
        if m:
            for word in m.group(2).split():
                drawn["kernsearch." + word.rstrip("/").removesuffix(".py")] = int(m.group(1))
    return drawn


def test_the_architecture_page_draws_every_floor_where_the_imports_put_it() -> None:
    known = modules()
    merged = subpackage_graph({name: imports(name, file, known) for name, file in known.items()}, known)
    actual = {unit: floor for unit, floor in levels(merged).items()
              if unit not in ("kernsearch", "kernsearch.__main__", "kernsearch.templates")}
    drawn = drawn_floors((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert drawn == actual


def test_the_data_path_names_only_what_exists() -> None:
    """Every record and step the data-path drawing names is a class or function of the package."""
    import re

    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    drawing = page.split("```text\n")[2].split("```", 1)[0]
    defined = set()
    for file in modules().values():
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                defined.add(node.name)
    named = set(re.findall(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)+\b|\b(?:Proof|Measurement|Winner|Draft|Manifest|Family|"
                           r"Problem|Space|Dispatcher)\b", drawing))
    named |= set(re.findall(r"\b[a-z]+_[a-z_]+\b", drawing)) - {"ragged"}
    named |= {m.split(".")[1] for m in re.findall(r"\b[A-Z]\w+\.\w+", drawing)}
    assert named and not named - defined, sorted(named - defined)
