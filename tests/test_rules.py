"""The shared rules (issue 30): kernsearch and its exported packages apply one file of rules, not two copies.

``kernsearch._rules`` (targets, beating the op, the timing identity, chip identification, hashes, the expression
evaluator, the baseline vocabulary; with the ``_rules_*`` modules it reads them from) and ``kernsearch._vocabulary``
are imported by the core and shipped byte for byte into every exported package, whose dispatcher imports them from
beside itself.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import kernsearch._rules as rules
import kernsearch._vocabulary as vocabulary
from kernsearch.exporting.runtime import _runtime


def test_the_core_applies_the_shipped_rules_themselves() -> None:
    """Every floor of kernsearch reads the rules from the module that ships, never a restatement of them."""
    from kernsearch.artifacts import _gate
    from kernsearch.family import _expr, _render, _vocab
    from kernsearch.hardware import _chips, _targets
    from kernsearch.studies import _tune

    assert _runtime.evaluate is rules.evaluate and _expr.evaluate is rules.evaluate
    assert _runtime.beats_op is rules.beats_op is _gate.beats_op is _tune.beats_op
    assert _runtime.source_sha256 is rules.source_sha256 is _render.source_sha256
    assert _runtime.identify is rules.identify is _chips.identify
    assert _runtime.lineage is rules.lineage is _chips.lineage
    assert _targets.TARGETS is rules.TARGETS and _runtime.kernel_factory is rules.kernel_factory
    assert _runtime.mlx_vocabulary is rules.mlx_namespace is _vocab.mlx_namespace
    assert _runtime.Evidence is vocabulary.Evidence


def test_an_exported_package_holds_the_core_s_rules_byte_for_byte_and_imports_its_own(tmp_path: Path) -> None:
    from kernsearch import ArtifactStore, export

    result = export(["softmax"], tmp_path / "dist", ArtifactStore(tmp_path / "store"), package="ks_rules_pkg")
    pkg = result.source_dir / result.package
    runtime = Path(_runtime.__file__).parent
    modules = sorted(f.name for f in runtime.glob("_*.py") if f.name != "__init__.py")
    assert {"_runtime.py", "_patch.py"} < set(modules)  # the dispatcher is several modules: each one ships
    core_root = Path(rules.__file__).parent
    rule_modules = sorted(f.name for f in core_root.glob("_rules*.py"))
    assert {"_rules.py", "_rules_expr.py", "_rules_decision.py"} < set(rule_modules)  # the rules are several modules
    modules += rule_modules
    with zipfile.ZipFile(result.wheel) as wheel:
        shipped = ([(n, runtime / n) for n in modules if n not in rule_modules]
                   + [(n, core_root / n) for n in rule_modules] + [("_vocabulary.py", Path(vocabulary.__file__))])
        for name, core_file in shipped:
            core = core_file.read_bytes()
            assert (pkg / name).read_bytes() == core, name
            assert wheel.read(f"{result.package}/{name}") == core, name
    # The package's dispatcher uses the rules beside it, with kernsearch not importable at all: every module of it
    # is the package's own.
    names = [n.removesuffix(".py") for n in modules]
    probe = ("import sys; sys.modules['kernsearch'] = None; import mlx.core as mx; "
             f"import importlib, ks_rules_pkg as p, ks_rules_pkg._runtime as r; names = {names!r}; "
             "assert r.evaluate.__module__ == 'ks_rules_pkg._rules_expr', r.evaluate.__module__; "
             "assert r.Evidence.__module__ == 'ks_rules_pkg._vocabulary', r.Evidence.__module__; "
             "mods = [importlib.import_module('ks_rules_pkg.' + n) for n in names]; "
             "assert all(m.__file__.startswith(p.__path__[0]) for m in mods), [m.__file__ for m in mods]; "
             "assert not [m for m, v in sys.modules.items() if m.startswith('kernsearch') and v], 'kernsearch imported'; "
             "print(round(float(p.softmax(mx.ones((2, 8))).sum()), 3))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=result.source_dir, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "2.0", done.stderr[-2000:]
