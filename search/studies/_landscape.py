"""Tuning landscapes in KernelTuner's cache format: read recorded ones, write measured ones.

A landscape is one JSON object (gzipped when the file name ends in ``.gz``)::

    {"device_name": ..., "kernel_name": ..., "problem_size": ..., "tune_params_keys": [knob, ...],
     "tune_params": {knob: [values]}, "objective": "time",
     "cache": {"v1,v2,...": {knob: value, ..., "time": ms | "RuntimeFailedConfig", "times": [ms, ...], ...}}}

Configs absent from ``cache`` were not valid; an entry whose ``time`` is a string failed (the string
says how), except ``NotMeasured`` (:data:`NOT_MEASURED`): a sweep that ran out of time left that config
unmeasured, which says nothing about it, so reading drops it (counted in ``meta["not_measured"]``) and
replay treats it as absent rather than as a failure a search should learn to avoid.
Replay (:mod:`kernsearch.studies._replay`) reads landscapes as an objective; :class:`LandscapeWriter` writes
the same format (atomically: a reader never sees a half-written file) so a measured sweep can be replayed.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import KernsearchError
from .._safeio import UnsafeFile, read_bytes, write_atomic

#: The ``time`` a sweep writes for a config it had no time left to measure (not a failure of the config).
NOT_MEASURED = "NotMeasured"


def config_string(values: Any) -> str:
    """KernelTuner's cache key: knob values in ``tune_params_keys`` order, joined by commas."""
    return ",".join(str(v) for v in values)


#: Largest landscape read, compressed and uncompressed (the largest shared one is 16.5 MB of JSON).
LANDSCAPE_LIMIT = 256 << 20


def _read_json(path: Path) -> Any:
    """A landscape file's JSON: a regular file only (a FIFO or device is refused, never waited on), its size
    bounded before and after gunzip."""
    raw = read_bytes(path, LANDSCAPE_LIMIT)
    try:
        if path.suffix == ".gz":
            inflate = zlib.decompressobj(wbits=31)  # gzip framing
            raw = inflate.decompress(raw, LANDSCAPE_LIMIT + 1)
            if len(raw) > LANDSCAPE_LIMIT:
                raise UnsafeFile(f"{path}: more than {LANDSCAPE_LIMIT} bytes uncompressed (refused)")
        return json.loads(raw.decode("utf-8"))
    except (zlib.error, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise KernsearchError(f"{path}: not a KernelTuner cache file: {' '.join(str(exc).split())[:200]}") from None


def _finite_time(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _check_cache(path: Path, cache: dict[str, Any], keys: list[Any]) -> None:
    """Every cache entry an object naming a value for each knob, its times well-formed (in the file's order, so
    the first bad entry is the one named)."""
    for name, entry in cache.items():
        if not isinstance(entry, dict):
            raise KernsearchError(f"{path}: cache entry {name!r} is not an object")
        lacking = [k for k in keys if k not in entry]
        if lacking:
            raise KernsearchError(f"{path}: cache entry {name!r} lacks knob(s) {', '.join(lacking)}")
        _check_times(path, name, entry)


def _check_times(path: Path, name: str, entry: dict[str, Any]) -> None:
    """A measured entry's ``time`` (and ``times``) are positive finite milliseconds; a failure is a string.
    A NaN or infinite time would otherwise win or lose every comparison (a search that ended "best nan ms")."""
    time, times = entry.get("time"), entry.get("times")
    if time is None or isinstance(time, str):  # a failure
        return
    if not _finite_time(time):
        raise KernsearchError(f"{path}: cache entry {str(name)[:80]!r}: time {str(time)[:40]} is not a positive "
                              "finite number of milliseconds (or a failure's name)")
    if times is not None and (not isinstance(times, list) or not times or not all(map(_finite_time, times))):
        raise KernsearchError(f"{path}: cache entry {str(name)[:80]!r}: times must be positive finite milliseconds")


@dataclass
class Landscape:
    """A recorded landscape: knobs, and per config either repeated times (ms) or a failure."""

    knobs: dict[str, list[Any]]
    entries: dict[str, dict[str, Any]]
    device_name: str = ""
    kernel_name: str = ""
    problem_size: Any = None
    objective: str = "time"
    path: Path | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    # -- reading ------------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Landscape:
        path = Path(path)
        data = _read_json(path)
        if not isinstance(data, dict) or not isinstance(data.get("tune_params"), dict) \
                or not isinstance(data.get("cache"), dict):
            raise KernsearchError(f"{path}: not a KernelTuner cache file (needs tune_params and cache)")
        keys = data.get("tune_params_keys") or list(data["tune_params"])
        missing = [k for k in keys if not isinstance(data["tune_params"].get(k), list)]
        if missing:
            raise KernsearchError(f"{path}: tune_params has no list of values for {', '.join(map(str, missing))}")
        knobs = {k: list(data["tune_params"][k]) for k in keys}
        _check_cache(path, data["cache"], keys)
        extra = {k: v for k, v in data.items() if k not in
                 ("tune_params_keys", "tune_params", "cache", "device_name", "kernel_name", "problem_size",
                  "objective")}
        entries = {name: e for name, e in data["cache"].items() if e.get("time") != NOT_MEASURED}
        if len(entries) < len(data["cache"]):
            extra["not_measured"] = len(data["cache"]) - len(entries)
        return cls(knobs=knobs, entries=entries, device_name=str(data.get("device_name", "")),
                   kernel_name=str(data.get("kernel_name", "")), problem_size=data.get("problem_size"),
                   objective=str(data.get("objective", "time")), path=path, meta=extra)

    def key(self, config: dict[str, Any]) -> str:
        return config_string(config[k] for k in self.knobs)

    def config_of(self, entry: dict[str, Any]) -> dict[str, Any]:
        return {k: entry[k] for k in self.knobs}

    def entry(self, config: dict[str, Any]) -> dict[str, Any] | None:
        return self.entries.get(self.key(config))

    @staticmethod
    def failed(entry: dict[str, Any]) -> bool:
        return not isinstance(entry.get("time"), (int, float)) or isinstance(entry.get("time"), bool)

    def samples(self, config: dict[str, Any]) -> list[float] | None:
        """The recorded repeated times of ``config``; None when it is absent or failed."""
        entry = self.entry(config)
        if entry is None or self.failed(entry):
            return None
        times = entry.get("times") or [entry["time"]]
        return [float(t) for t in times]

    def configs(self) -> Iterator[dict[str, Any]]:
        """Every config the file holds (the valid space), failed ones included."""
        for entry in self.entries.values():
            yield self.config_of(entry)

    def optimum(self) -> tuple[dict[str, Any], float]:
        """The config with the lowest recorded ``time`` and that time."""
        ok = [e for e in self.entries.values() if not self.failed(e)]
        if not ok:
            raise KernsearchError(f"{self.path}: no successful config in this landscape")
        best = min(ok, key=lambda e: float(e["time"]))
        return self.config_of(best), float(best["time"])

    def __len__(self) -> int:
        return len(self.entries)


class LandscapeWriter:
    """Collects measured configs and writes them as a KernelTuner cache file.

    ``add`` records one config (``times`` in ms, or ``failure`` for a config that failed); ``save``
    writes the whole file atomically (temp file + rename), so it may be called after every config.
    """

    def __init__(self, path: str | Path, knobs: dict[str, list[Any]], *, device_name: str = "",
                 kernel_name: str = "", problem_size: Any = None, objective: str = "time",
                 **meta: Any) -> None:
        self.path = Path(path)
        self.knobs = {k: list(v) for k, v in knobs.items()}
        self.header = {"device_name": device_name, "kernel_name": kernel_name, "problem_size": problem_size,
                       **meta, "tune_params_keys": list(self.knobs), "tune_params": self.knobs,
                       "objective": objective}
        self.cache: dict[str, dict[str, Any]] = {}

    def add(self, config: dict[str, Any], times: list[float] | None = None, *, failure: str | None = None,
            **extra: Any) -> None:
        missing = [k for k in self.knobs if k not in config]
        if missing:
            raise KernsearchError(f"landscape entry lacks knob(s) {', '.join(missing)}")
        if (times is None) == (failure is None):
            raise ValueError("give either times or failure")
        entry: dict[str, Any] = {k: _plain(config[k]) for k in self.knobs}
        if failure is not None:
            entry["time"] = failure
        else:
            samples = [float(t) for t in times]  # type: ignore[union-attr]
            entry["time"] = sum(samples) / len(samples)  # KernelTuner records the mean as `time`
            entry["times"] = samples
        entry.update({k: _plain(v) for k, v in extra.items()})
        self.cache[config_string(entry[k] for k in self.knobs)] = entry

    def save(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({**self.header, "cache": self.cache}).encode("utf-8")
        if self.path.suffix == ".gz":
            data = gzip.compress(data, mtime=0)
        try:
            write_atomic(self.path, data)
        except UnsafeFile as exc:
            raise KernsearchError(f"cannot write the landscape: {exc}") from None
        return self.path


def _plain(value: Any) -> Any:
    """JSON-friendly scalars (NumPy numbers become Python numbers)."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value
