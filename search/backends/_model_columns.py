"""The ``model`` back-end's predictions of many configs at once (the search's ranking of a whole space): the model's
entries evaluated a column at a time and its arithmetic NumPy's over the columns, the same numbers as
:meth:`~kernsearch.backends._model.ModelBackend.predict` config by config, byte for byte."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import KernsearchError
from .._records import Prediction
from ..family._columns import Column, evaluated
from ..family._space import Config, Space
from ._model import CoreFigures, ModelBackend, _Evaluator, _reachable_peak


class _Unusual(Exception):
    """A batch the columns do not cover (an invalid config, a value the model refuses, an expression error, a
    degenerate chip figure): :func:`predict_many` predicts it config by config instead, as :meth:`predict` does."""


def predict_many(backend: ModelBackend, space: Space, configs: list[Config]) -> list[Prediction]:
    """:meth:`ModelBackend.predict` of each config (inf where it raises a :class:`~kernsearch._errors.
    KernsearchError`; any other error is raised), the same numbers, byte for byte: the model's entries are
    evaluated a column at a time (each entry's value looked up once per config by the values it reads) and its
    arithmetic is NumPy's over the columns (the same IEEE operations in the same order). A batch with anything
    unusual is predicted config by config. Ranking gemm's 44,004 valid configs at 64x64x64: ~4 s -> ~0.4 s."""
    ev = backend._evaluator(space)
    try:
        if ev.family.model and configs:
            return _columns_predict(ev, configs)
    except _Unusual:
        pass
    out = []
    for c in configs:
        try:
            out.append(backend.predict(space, c))
        except KernsearchError:
            out.append(Prediction(math.inf, math.inf))
    return out


def _column(ev: _Evaluator, step: tuple[str, str, Any, Any, dict[Any, Any]], cols: dict[str, Column],
            n: int) -> Column:
    """One entry's value for every config (``_Evaluator._run``'s, its memo shared; evaluated in a context of what it
    reads: one that reads anything else is an expression error, and the batch goes config by config), once per
    combination of the values it reads (``family/_columns``: a loop over the configs took ~1 s for gemm's 44,004)."""
    where, _, expr, _, memo = step
    names = sorted(name for name in expr.names if name not in ev.base)

    def evaluate(read: list[Any]) -> Any:
        return ev._eval(where, expr, {**ev.base, **dict(zip(names, read))})

    try:
        return evaluated(names, cols, n, memo, evaluate)
    except (TypeError, KernsearchError, KeyError):  # unhashable, an expression error, an unbound name
        raise _Unusual from None


def _given(ev: _Evaluator, cols: dict[str, Column], key: str) -> np.ndarray | None:
    """:meth:`_Evaluator.number` of every config as a float64 column (None: the family has no such entry)."""
    if key not in ev.family.model:
        return None
    col = cols[key]
    if not all(isinstance(v, (int, float)) for v in col.values):
        raise _Unusual
    try:
        arr: np.ndarray = np.array(col.values, dtype=np.float64)[col.codes]
    except (OverflowError, ValueError):
        raise _Unusual from None
    if np.isnan(arr).any() or (arr < 0).any() or (key != "fma_per_fetch" and np.isinf(arr).any()):
        raise _Unusual
    return arr


def _numbers(ev: _Evaluator, cols: dict[str, Column], key: str, default: float, n: int) -> np.ndarray:
    """:func:`_given`, ``default`` where the family has no such entry."""
    given = _given(ev, cols, key)
    return np.full(n, default) if given is None else given


def _columns_predict(ev: _Evaluator, configs: list[Config]) -> list[Prediction]:
    knobs = list(ev.family.knobs)
    if any(c.keys() != ev.family.knobs.keys() for c in configs) or set(knobs) & set(ev.base):
        raise _Unusual
    n = len(configs)
    try:
        cols = {k: Column.of([c[k] for c in configs]) for k in knobs}
    except TypeError:  # an unhashable knob value, or values of several types (1 and True)
        raise _Unusual from None
    for step in ev._derived:
        cols[step[1]] = _column(ev, step, cols, n)
    if not all(all(_column(ev, step, cols, n).values) for step in ev._checks):
        raise _Unusual  # an invalid config
    for step in ev._early:
        cols[step[1]] = _column(ev, step, cols, n)
    tgs, threads, resident, concurrent = _occupancy(ev, cols)
    cols["concurrent"] = Column.of([int(v) for v in concurrent])
    for step in ev._late:
        cols[step[1]] = _column(ev, step, cols, n)
    return _columns_time(ev, cols, tgs, threads, resident)


def _occupancy(ev: _Evaluator, cols: dict[str, Column]) -> tuple[np.ndarray, ...]:
    """Threadgroups, threads per threadgroup, resident threadgroups per core and concurrent ones (``_predict``)."""
    chip, core = ev.chip, ev.core
    raw_tgs, raw_threads = _given(ev, cols, "threadgroups"), _given(ev, cols, "threadgroup_threads")
    if raw_tgs is None or raw_threads is None:
        raise _Unusual  # threads from the launch's expression: config by config
    tg_mem, regs = (_numbers(ev, cols, key, 0.0, len(raw_tgs)) for key in ("threadgroup_memory", "registers"))
    tgs = np.maximum(1.0, np.ceil(raw_tgs))
    threads = np.maximum(1.0, raw_threads)
    with np.errstate(divide="ignore", invalid="ignore"):
        limits = [np.full(len(tgs), float(core.max_threadgroups)), np.floor_divide(float(core.max_threads), threads),
                  np.where(tg_mem != 0, np.floor_divide(float(core.threadgroup_memory), tg_mem), np.inf),
                  np.where(regs != 0, np.floor_divide(float(core.registers), regs * threads), np.inf)]
    resident = np.floor(np.maximum(1.0, np.minimum.reduce(limits)))
    concurrent = np.minimum(tgs, float(chip.gpu_cores) * resident)
    if not (np.isfinite(resident).all() and (tgs < 2**53).all()):
        raise _Unusual
    return tgs, threads, resident, concurrent


def _peaks(ev: _Evaluator, matrix: np.ndarray, accelerator: np.ndarray) -> np.ndarray:
    """:func:`_reachable_peak` of each config's inner product (four cases, each asked of the chip once)."""
    try:
        case = {(m, a): _reachable_peak(ev.chip, ev.core, ev.problem.dtype, m, a) for m in (False, True)
                for a in (False, True)}
        ev.chip.peak_tflops(ev.problem.dtype)  # the breakdown asks it: where it raises, so does every config
    except Exception:  # noqa: BLE001 - config by config: the same error, where it is raised
        raise _Unusual from None
    return np.select([matrix & accelerator, matrix & ~accelerator, ~matrix & accelerator],
                     [case[True, True], case[True, False], case[False, True]], case[False, False])


def _columns_time(ev: _Evaluator, cols: dict[str, Column], tgs: np.ndarray, threads: np.ndarray,
                  resident: np.ndarray) -> list[Prediction]:
    """``_predict``'s time and core time of every config, its operations in its order on float64 columns."""
    chip, core = ev.chip, ev.core
    n = len(tgs)
    num = {key: _numbers(ev, cols, key, default, n) for key, default in (
        ("flops", math.nan), ("cache_bytes", math.nan), ("load_bytes", 0.0), ("loads_in_flight", 1.0),
        ("buffers", 1.0), ("matrix", 0.0), ("accelerator", 0.0), ("fma_per_fetch", math.inf),
        ("device_fetch_fraction", 0.0), ("bank_conflicts", 1.0), ("barriers", 0.0), ("copy_instructions", 0.0),
        ("threadgroup_bytes", 0.0), ("stream_bytes", 0.0))}
    flops, cache_bytes = num["flops"], num["cache_bytes"]  # required entries (checked with the family)
    dtype_size = float(ev.base.get("dtype_size", 4))
    load_bytes = np.where(num["load_bytes"] != 0, num["load_bytes"], dtype_size)
    in_flight = np.minimum(np.maximum(1.0, num["loads_in_flight"]), core.max_loads_in_flight)
    buffers = np.maximum(1.0, num["buffers"])
    reuse = num["fma_per_fetch"]
    device_share = np.minimum(1.0, num["device_fetch_fraction"])
    conflicts = np.maximum(1.0, num["bank_conflicts"])
    stream = num["stream_bytes"]
    traffic = cache_bytes + stream * core.cache_bandwidth_factor
    peak = _peaks(ev, num["matrix"] != 0, num["accelerator"] != 0)
    fetch_cost = (1 - device_share) * conflicts + device_share * core.device_fetch_cost
    cores = chip.gpu_cores
    with np.errstate(divide="ignore", invalid="ignore"):
        compute_eff = np.where(np.isinf(reuse), 1.0, np.where(reuse > 0, reuse / (reuse + fetch_cost), 0.0))
    core_flops = peak * 1e12 / cores * np.maximum(compute_eff, 1e-6)
    core_ops = chip.fp32_tflops * 1e12 / 2 / cores
    core_bw = chip.memory_bandwidth_gbs * 1e9 * core.cache_bandwidth_factor / cores
    needed_in_flight = core.latency_ns * 1e-9 * core_bw
    core_tg_bw = chip.fp32_tflops * 1e12 / cores * core.threadgroup_bytes_per_flop
    if not ((core_flops > 0).all() and core_ops and needed_in_flight and core_tg_bw and core_bw
            and (load_bytes > 0).all() and chip.simd_width and core.simdgroups_to_fill):
        raise _Unusual  # a division by zero, raised config by config
    work = flops / core_flops + num["copy_instructions"] / core_ops
    simdgroups = np.ceil(threads / chip.simd_width)
    lanes = _Lanes(core, simdgroups, threads, load_bytes, in_flight, needed_in_flight, work, num["threadgroup_bytes"],
                   core_tg_bw, traffic, core_bw, buffers, num["barriers"])
    per_core = np.ceil(tgs / cores)
    full, rest = np.divmod(per_core, resident)
    with np.errstate(divide="ignore", invalid="ignore"):
        core_time = np.where(full > 0, full * lanes.batch(resident), 0.0) + np.where(rest > 0, lanes.batch(rest), 0.0)
    dram = _dram(ev, cols, tgs, cache_bytes, stream)
    dram_time = dram / (chip.memory_bandwidth_gbs * 1e9)
    total = core.launch_us * 1e-6 + np.maximum(core_time, dram_time)
    if not (total > 0).all():
        raise _Unusual  # the breakdown divides by it
    return [Prediction(t, c) for t, c in zip((total * 1e3).tolist(), (core_time * 1e3).tolist())]


@dataclass(frozen=True)
class _Lanes:
    """``_predict``'s ``batch``: seconds for k co-resident threadgroups on one core, for a column of k."""

    core: CoreFigures
    simdgroups: np.ndarray
    threads: np.ndarray
    load_bytes: np.ndarray
    in_flight: np.ndarray
    needed_in_flight: float
    work: np.ndarray
    tg_traffic: np.ndarray
    core_tg_bw: float
    traffic: np.ndarray
    core_bw: float
    buffers: np.ndarray
    barriers: np.ndarray

    def batch(self, k: np.ndarray) -> np.ndarray:
        core = self.core
        hide = np.minimum(1.0, k * self.simdgroups / core.simdgroups_to_fill)
        mlp = np.minimum(1.0, k * self.threads * self.load_bytes * self.in_flight / self.needed_in_flight)
        tc = k * self.work / hide
        tt = k * self.tg_traffic / (self.core_tg_bw * hide)
        tm = k * self.traffic / (self.core_bw * mlp)
        inside = np.maximum(tc, tt)
        overlap = 1.0 - 1.0 / (k * self.buffers)
        stall = self.barriers * core.barrier_ns * 1e-9 / k
        return np.asarray(np.maximum(inside, tm) + (1 - overlap) * np.minimum(inside, tm) + stall)


def _dram(ev: _Evaluator, cols: dict[str, Column], tgs: np.ndarray, cache_bytes: np.ndarray,
          stream: np.ndarray) -> np.ndarray:
    """``_predict``'s DRAM bytes of every config."""
    unique = ev.problem_bytes
    given = _given(ev, cols, "dram_bytes")
    if given is None or unique <= ev.chip.system_cache_mb * 2**20 / 2:
        return np.full(len(tgs), float(unique))
    return np.asarray(np.minimum(np.maximum(given, unique), tgs * (cache_bytes + stream)))
