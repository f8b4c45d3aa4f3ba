"""The sandbox kernel templates render in.

Templates come from family folders others write. They render in Jinja's
``ImmutableSandboxedEnvironment`` with ``StrictUndefined`` and, on top of it:

- no globals at all (Jinja's ``range``, ``dict``, ``lipsum``, ``cycler``, ``joiner``, ``namespace`` are gone);
- only the filters and tests in :data:`FILTERS` / :data:`TESTS`;
- no attribute access except loop variables (``loop.index``...) and record fields;
- ``*``, ``**``, ``+`` and ``%`` bounded like spec expressions (no ``'x' * 10**9``);
- templates are loaded only from the family folder itself, through :mod:`_safeio` (no links, no special
  files, size-capped), and a render stops after :data:`RENDER_SECONDS` or :data:`MAX_OUTPUT` characters.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from jinja2 import BaseLoader, StrictUndefined, TemplateNotFound, nodes
from jinja2.filters import FILTERS as DEFAULT_FILTERS
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.tests import TESTS as DEFAULT_TESTS

from .. import _safeio
from ._expr import ExprError, _binary

FILTERS = ("indent", "trim", "upper", "lower", "join", "int", "abs", "length", "replace", "first", "last",
           "min", "max", "default", "string", "center")
TESTS = ("defined", "undefined", "none", "even", "odd", "divisibleby", "eq", "ne", "lt", "le", "gt", "ge",
         "in", "number", "string", "sameas", "true", "false", "boolean", "integer")
LOOP_ATTRIBUTES = frozenset({"index", "index0", "first", "last", "length", "revindex", "revindex0"})
RENDER_SECONDS = 20.0
MAX_OUTPUT = 4 << 20
TEMPLATE_LIMIT = 1 << 20


class TemplateLimit(Exception):
    """A template exceeded the sandbox's time or size bound."""


class FolderLoader(BaseLoader):
    """Templates from one folder only, read through :mod:`_safeio` (no ``..``, links or special files)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def get_source(self, environment: Any, template: str) -> tuple[str, str, Callable[[], bool]]:
        parts = template.split("/")
        if any(p in ("", ".", "..") or p.startswith(".") for p in parts) or len(parts) > 4:
            raise TemplateNotFound(template)
        path = self.folder.joinpath(*parts)
        if not _safeio.is_regular(path):
            raise TemplateNotFound(template)
        try:
            text = _safeio.read_text(path, TEMPLATE_LIMIT)
        except _safeio.UnsafeFile:
            raise TemplateNotFound(template) from None
        return text, str(path), lambda: False


class TemplateSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with only whitelisted filters/tests, no globals and bounded operators."""

    intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/", "-"})

    def __init__(self, folder: Path | None = None) -> None:
        super().__init__(loader=FolderLoader(folder) if folder is not None else None, undefined=StrictUndefined,
                         keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False,
                         cache_size=50)
        self.globals.clear()
        self.filters = {name: DEFAULT_FILTERS[name] for name in FILTERS}
        self.tests = {name: DEFAULT_TESTS[name] for name in TESTS}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if attr.startswith("_"):
            return False
        if isinstance(obj, LoopContext):
            return attr in LOOP_ATTRIBUTES
        fields = getattr(type(obj), "model_fields", None)
        return isinstance(fields, dict) and attr in fields

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        kind = {"*": nodes.Mul, "**": nodes.Pow, "+": nodes.Add, "%": nodes.Mod, "//": nodes.FloorDiv,
                "/": nodes.Div, "-": nodes.Sub}[operator]
        try:
            return _binary(kind, left, right)
        except ExprError as exc:
            raise self.security_error(str(exc)) from None

    @staticmethod
    def security_error(message: str) -> Exception:
        from jinja2.exceptions import SecurityError

        return SecurityError(message)


def bounded_join(chunks: Iterable[str]) -> str:
    """Join a render's output, refusing more than :data:`MAX_OUTPUT` characters."""
    out: list[str] = []
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > MAX_OUTPUT:
            raise TemplateLimit(f"template output larger than {MAX_OUTPUT} characters")
        out.append(chunk)
    return "".join(out)


@contextmanager
def render_deadline(seconds: float = RENDER_SECONDS) -> Iterator[None]:
    """Stop a render that runs longer than ``seconds`` (main thread only; elsewhere size bounds apply)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TemplateLimit(f"template took longer than {seconds:g} s to render")

    previous = signal.signal(signal.SIGALRM, expire)
    old_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if old_timer[0]:
            signal.setitimer(signal.ITIMER_REAL, *old_timer)
