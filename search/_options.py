"""Every numeric option, checked in one place for the command line and job files alike.

Each option is an annotated type (pydantic ``Field`` bounds, no NaN or infinity) that job-file models use
as their field type; :func:`check` applies the same type to a command-line value and turns a violation
into one :class:`KernsearchError` line naming the flag. A value no bound allows (``--timeout nan``,
``--seed -1``, ``--seed 4294967296``, ``timeout = inf``) is refused before anything starts.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import Field, TypeAdapter, ValidationError

from ._errors import KernsearchError

#: Seconds a variant (or a step) may run before it counts as hung: finite, positive, at most a day.
Timeout = Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)]
#: Random seeds: what NumPy and Optuna accept.
Seed = Annotated[int, Field(ge=0, lt=2**32)]
#: Trial counts, finalists and the like.
Count = Annotated[int, Field(ge=1, le=1_000_000)]
#: Trials without improvement before a search stops (0: never).
Patience = Annotated[int, Field(ge=0, le=1_000_000)]
#: Rows of a table.
Rows = Annotated[int, Field(ge=1, le=100_000)]
#: Paired rounds of a benchmark's comparison (a median's confidence interval needs a few).
Rounds = Annotated[int, Field(ge=3, le=10_000)]
#: A relative gain (0.02 = 2 %).
Gain = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]

#: Launch geometry bounds: grid threads per axis, threads per threadgroup axis, shared memory bytes.
MAX_GRID = 2**31 - 1
MAX_THREADGROUP = 1024
MAX_SHARED_MEMORY = 1 << 20

_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def check(kind: Any, value: Any, flag: str) -> Any:
    """``value`` validated as ``kind`` (e.g. :data:`Timeout`); one-line error naming ``flag`` otherwise."""
    if value is None:
        return None
    adapter = _ADAPTERS.setdefault(kind, TypeAdapter(kind))
    if isinstance(value, float) and not math.isfinite(value):
        raise KernsearchError(f"{flag} must be a finite number, not {value}")
    try:
        return adapter.validate_python(value, strict=False)
    except ValidationError as exc:
        first = exc.errors()[0]
        ctx = first.get("ctx", {})
        words = {"greater_than": f"more than {ctx.get('gt')}", "greater_than_equal": f"{ctx.get('ge')} or more",
                 "less_than": f"less than {ctx.get('lt')}", "less_than_equal": f"at most {ctx.get('le')}",
                 "finite_number": "a finite number"}.get(first["type"])
        msg = f"must be {words}" if words else first["msg"].removeprefix("Value error, ")
        raise KernsearchError(f"{flag} {msg} (got {str(value)[:40]})") from None


def geometry_ints(values: Any, where: str, n: int | None, low: int, high: int) -> tuple[int, ...]:
    """A launch list (grid, threadgroup, an output shape) as integers in ``[low, high]``; else ValueError."""
    if not isinstance(values, (list, tuple)) or (n is not None and len(values) != n) or len(values) > 8:
        count = f"{n} " if n is not None else ""
        raise ValueError(f"{where} must be a list of {count}integers")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or isinstance(v, float) and (
                not math.isfinite(v) or v != int(v)):
            raise ValueError(f"{where} must be a list of integers (got {str(v)[:40]})")
        iv = int(v)
        if not low <= iv <= high:
            raise ValueError(f"{where}: {iv} is outside [{low}, {high}]")
        out.append(iv)
    return tuple(out)
