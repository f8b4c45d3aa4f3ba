"""The sandbox kernel templates render in.

Templates come from family folders others write. They render in Jinja's
``ImmutableSandboxedEnvironment`` with ``StrictUndefined`` and, on top of it:

- no globals at all (Jinja's ``range``, ``dict``, ``lipsum``, ``cycler``, ``joiner``, ``namespace`` are gone);
- only the filters and tests in :data:`FILTERS` / :data:`TESTS`;
- no attribute access except loop variables (``loop.index``...) and record fields;
- ``*``, ``**``, ``+`` and ``%`` bounded like spec expressions (no ``'x' * 10**9``);
- every string a template builds is bounded *before* it is built: ``~``, macro, block and ``{% set %}``
  bodies, ``{{ }}`` output of lists, and the filters that grow text (``center``, ``indent``, ``replace``,
  ``join``...) refuse a result over :data:`MAX_OUTPUT` characters; ``str.format`` is not reachable (a memory
  bomb is an error, not an out-of-memory kill: a time bound alone cannot stop one allocation);
- templates are loaded only from the family folder itself and from the shared template library
  (``_lib/NAME``: kernsearch's ``templates/_lib``), through :mod:`_safeio` (no file links, no special files,
  size-capped; the real path of the file and of every folder on the way must stay inside the family folder,
  or the library's, so a linked folder cannot lead outside), and a render stops after :data:`RENDER_SECONDS`
  or :data:`MAX_OUTPUT` characters.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import BaseLoader, StrictUndefined, TemplateNotFound, nodes
from jinja2.bccache import Bucket, BytecodeCache
from jinja2.compiler import CodeGenerator, Frame
from jinja2.environment import TemplateModule
from jinja2.filters import FILTERS as DEFAULT_FILTERS
from jinja2.runtime import LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.tests import TESTS as DEFAULT_TESTS

from .. import _safeio
from ._expr import ExprError, binary

FILTERS = ("indent", "trim", "upper", "lower", "join", "int", "abs", "length", "replace", "first", "last",
           "min", "max", "default", "string", "center")
TESTS = ("defined", "undefined", "none", "even", "odd", "divisibleby", "eq", "ne", "lt", "le", "gt", "ge",
         "in", "number", "string", "sameas", "true", "false", "boolean", "integer")
LOOP_ATTRIBUTES = frozenset({"index", "index0", "first", "last", "length", "revindex", "revindex0"})
RENDER_SECONDS = 20.0
MAX_OUTPUT = 4 << 20
TEMPLATE_LIMIT = 1 << 20
#: Template names under this folder come from the shared library (``{% import "_lib/qmatvec.metal.j2" %}``).
LIBRARY = "_lib"


def library_dir() -> Path:
    """The shared template library every family may import from (``templates/_lib``)."""
    return Path(str(resources.files("kernsearch.templates"))) / LIBRARY


class TemplateLimit(Exception):
    """A template exceeded the sandbox's time or size bound."""


class FolderLoader(BaseLoader):
    """Templates from one folder and the shared library only, read through :mod:`_safeio`: plain names (no
    ``..``, hidden or absolute names), regular files, and a real path inside the folder (or the library) for the
    file and every folder on the way, so a linked folder (``sub -> /etc``) cannot lead an include, import or
    extends elsewhere.

    ``_lib/NAME`` is the library's ``NAME``, unless the family folder has a ``_lib`` entry of its own: then it is
    that folder's (a store's snapshot keeps the library files a version read, as they were).
    ``loaded`` keeps the text of every template served, by the name asked (what a publish records with the version)."""

    def __init__(self, folder: Path, library: Path | None = None) -> None:
        self.folder = Path(folder)
        self.library = library_dir() if library is None else Path(library)
        self.loaded: dict[str, str] = {}

    def get_source(self, environment: Any, template: str) -> tuple[str, str, Callable[[], bool]]:
        parts = template.split("/")
        if any(p in ("", ".", "..") or p.startswith(".") for p in parts) or len(parts) > 4:
            raise TemplateNotFound(template, f"template {template[:100]!r}: not a plain name inside the family "
                                   "folder or the template library (refused)")
        root, inner = self.folder, parts
        if parts[0] == LIBRARY and len(parts) > 1 and not os.path.lexists(self.folder / LIBRARY):
            root, inner = self.library, parts[1:]
        try:
            text = _safeio.read_inside(root, inner, TEMPLATE_LIMIT).decode("utf-8")
        except _safeio.UnsafeFile as exc:
            raise TemplateNotFound(template, f"template {template[:100]!r}: {exc}") from None
        except UnicodeDecodeError:
            raise TemplateNotFound(template, f"template {template[:100]!r}: not UTF-8 text") from None
        self.loaded[template] = text
        # Up to date for the sandbox's life: a template is read and compiled once per sandbox (Jinja re-read and
        # recompiled every ``{% import ... with context %}`` on every render when this said False).
        return text, str(root.joinpath(*inner)), lambda: True


def text_size(value: Any, limit: int = MAX_OUTPUT) -> int:
    """An upper bound of ``len(str(value))``, found without building the text; over ``limit`` it raises
    :class:`TemplateLimit` (so ``[[big] * 10**4] * 10**4`` is refused before ``str()`` allocates it)."""
    if isinstance(value, str):
        if len(value) > limit:
            raise TemplateLimit(f"template text larger than {limit} characters")
        return len(value)
    total, stack = 0, [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += 4 * len(item) + 2  # repr() inside a container: quotes and escapes
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, int) and not isinstance(item, bool):
            total += item.bit_length() // 3 + 2
        else:
            total += 64  # numbers, booleans, None, macros: short
        if total > limit:
            raise TemplateLimit(f"template text larger than {limit} characters")
    return total


def bounded_str(value: Any) -> str:
    """``str(value)``, refused when it would exceed :data:`MAX_OUTPUT` characters."""
    if isinstance(value, str):
        return value
    text_size(value)
    return str(value)


def _int_arg(args: tuple[Any, ...], kwargs: dict[str, Any], index: int, key: str, default: Any) -> Any:
    return args[index] if len(args) > index else kwargs.get(key, default)


def _growth(name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """How many characters filter ``name`` may add to ``value`` (0 for filters that never grow text)."""
    if name == "center":
        width = _int_arg(args, kwargs, 0, "width", 80)
        return width if isinstance(width, int) else 0
    if name == "indent":
        width = _int_arg(args, kwargs, 0, "width", 4)
        step = len(bounded_str(width)) if isinstance(width, str) else width if isinstance(width, int) else 0
        return (bounded_str(value).count("\n") + 1) * max(0, step)
    if name == "replace":
        old = bounded_str(_int_arg(args, kwargs, 0, "old", ""))
        new = bounded_str(_int_arg(args, kwargs, 1, "new", ""))
        text = bounded_str(value)
        hits = text.count(old) if old else len(text) + 1
        count = _int_arg(args, kwargs, 2, "count", None)
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        return hits * len(new)
    if name == "join":
        sep = bounded_str(_int_arg(args, kwargs, 0, "d", ""))
        return len(sep) * len(value) if isinstance(value, (list, tuple, str, dict)) else 0
    return 0


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its input and the text it may add checked against :data:`MAX_OUTPUT` before it runs."""
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0  # eval_ctx / context / environment

    @functools.wraps(fn)  # keeps jinja_pass_arg
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if len(args) > skip:
            value, rest = args[skip], args[skip + 1:]
            if text_size(value) + _growth(name, value, rest, kwargs) > MAX_OUTPUT:
                raise TemplateLimit(f"{name}: template text larger than {MAX_OUTPUT} characters")
        return fn(*args, **kwargs)

    return bounded


class _BoundedConcat(CodeGenerator):
    """``a ~ b`` compiles to the environment's bounded join instead of Jinja's unbounded ``str_join``."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.join_text((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class CompiledTemplates(BytecodeCache):
    """The code templates compiled to, kept in this process's memory (never in a file) by template file and the
    checksum of its source (Jinja's buckets): a family loaded again, or rendered after its load compiled its templates
    in another sandbox, reuses the code its unchanged source compiled to (gemm's two templates: ~50 ms a load); a
    changed source is compiled again. Every sandbox compiles alike (the same class and options), so they share it."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._codes: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def load_bytecode(self, bucket: Bucket) -> None:
        with self._lock:
            code = self._codes.get(bucket.key)
            if code is not None:
                self._codes.move_to_end(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)  # ignored (compiled again) where the source's checksum differs

    def dump_bytecode(self, bucket: Bucket) -> None:
        code = bucket.bytecode_to_string()
        with self._lock:
            self._codes[bucket.key] = code
            self._codes.move_to_end(bucket.key)
            while len(self._codes) > self.size:
                self._codes.popitem(last=False)


class TemplateSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox, with only whitelisted filters/tests, no globals and bounded operators."""

    #: Shared by every sandbox (:class:`CompiledTemplates`).
    compiled = CompiledTemplates()

    intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/", "-"})
    code_generator_class = _BoundedConcat
    #: Macro, block and ``{% set %}`` bodies are joined with this (the compiled code's ``concat``).
    concat = staticmethod(lambda chunks: bounded_join(chunks))

    def __init__(self, folder: Path | None = None, library: Path | None = None) -> None:
        super().__init__(loader=FolderLoader(folder, library) if folder is not None else None,
                         undefined=StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                         lstrip_blocks=True, autoescape=False, cache_size=50, finalize=bounded_str,
                         bytecode_cache=self.compiled)
        self.globals.clear()
        self.filters = {name: _bounded_filter(name, DEFAULT_FILTERS[name]) for name in FILTERS}
        self.tests = {name: DEFAULT_TESTS[name] for name in TESTS}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if attr.startswith("_"):
            return False
        if isinstance(obj, LoopContext):
            return attr in LOOP_ATTRIBUTES
        if isinstance(obj, TemplateModule):  # {% import "_lib/x.j2" as core %}: its macros, core.source()
            return isinstance(value, Macro)
        fields = getattr(type(obj), "model_fields", None)
        return isinstance(fields, dict) and attr in fields

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        try:
            return binary(operator, left, right)
        except ExprError as exc:
            raise self.security_error(str(exc)) from None

    def wrap_str_format(self, value: Any) -> None:
        """No ``'{:>9999999999}'.format(x)``: ``str.format`` is an unsafe attribute like any method."""
        return None

    @staticmethod
    def join_text(parts: Iterable[Any]) -> str:
        """``a ~ b ~ c``: each part as text, the whole bounded by :data:`MAX_OUTPUT`."""
        return bounded_join(bounded_str(p) for p in parts)

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
