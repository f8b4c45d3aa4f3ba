"""The code templates compile to is kept in memory (family/_template.py CompiledTemplates): a family loaded again
compiles nothing, a changed template is compiled again, and the cache is bounded."""

from __future__ import annotations

import shutil
from pathlib import Path

import jinja2
import pytest

from kernsearch import load_family
from kernsearch._errors import SpecError
from kernsearch.family._render import render
from kernsearch.family._template import CompiledTemplates, TemplateSandbox

REPO = Path(__file__).resolve().parents[1]


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the templates Jinja compiles from now on."""
    names: list[str] = []
    compile_ = jinja2.Environment.compile

    def counted(self, source, name=None, filename=None, raw=False, defer_init=False):  # noqa: ANN001, ANN202
        names.append(name)
        return compile_(self, source, name, filename, raw, defer_init)

    monkeypatch.setattr(jinja2.Environment, "compile", counted)
    return names


def _copy(tmp_path: Path, name: str = "gemm") -> Path:
    folder = tmp_path / name
    shutil.copytree(REPO / "templates" / "gemm", folder)
    return folder


def test_a_family_loaded_again_and_rendered_compiles_nothing_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    folder = _copy(tmp_path)
    compiled = _compiles(monkeypatch)
    fam = load_family(folder)
    first = len(compiled)
    assert first >= 2  # the Metal and CUDA templates (and what they import)
    again = load_family(folder)
    source = render(again, dict(again.default), "float32")
    assert len(compiled) == first, compiled[first:]  # the second load and the render reused the code
    assert source.source == render(fam, dict(fam.default), "float32").source


def test_a_changed_template_is_compiled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _copy(tmp_path)
    load_family(folder)
    template = folder / "gemm.metal.j2"
    text = template.read_text()
    template.write_text(text.replace("{% block source %}\n", "{% block source %}\n    // changed here\n", 1))
    compiled = _compiles(monkeypatch)
    fam = load_family(folder)
    assert "gemm.metal.j2" in compiled
    assert "// changed here" in render(fam, dict(fam.default), "float32").source
    template.write_text(text.replace("{% block source %}\n", "{% block source %}\n    {% if %}\n", 1))
    with pytest.raises(SpecError, match="template syntax error"):
        load_family(folder)


def test_the_cache_keeps_the_most_recently_used_templates() -> None:
    cache = CompiledTemplates(size=2)
    env = TemplateSandbox()
    env.bytecode_cache = cache
    for name in ("a", "b", "a", "c"):  # "b" is the least recently used when "c" comes
        bucket = cache.get_bucket(env, name, name, f"{{{{ 1 }}}} {name}")
        if bucket.code is None:
            bucket.code = compile("x = 1", name, "exec")
            cache.set_bucket(bucket)
    assert len(cache._codes) == 2
    assert cache.get_bucket(env, "a", "a", "{{ 1 }} a").code is not None
    assert cache.get_bucket(env, "b", "b", "{{ 1 }} b").code is None
    assert TemplateSandbox(None).bytecode_cache is TemplateSandbox.compiled
