"""Run ``kernsearch bench decode``: export the store's package, import it, build the step, time it.

The package is the one a user installs: ``export`` writes it (the fused families and the ones a plain step
calls) into a temporary folder, and it is imported from there under its own name, so every call goes through its
dispatcher exactly as in the user's process.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from .._vocabulary import ConsumerMode
from ..artifacts._artifacts import ArtifactStore
from ..exporting._export import export
from ..family._spec import Family, load_family
from ._call_stream import call_streams
from ._decode import (
    COMPILED,
    PACKAGE_FORMS,
    PLAIN_FORMS,
    DecodeReport,
    KernelChains,
    device_kind,
    evidence_for,
    interleaved,
    kernel_row,
    median,
    pipelined,
    rel_err,
    stream_reader,
    token_row,
)
from ._step import (
    EPS,
    BenchError,
    Call,
    Layer,
    StepShape,
    bind_layer,
    build_layers,
    call_inputs,
    package_step,
    plain_step,
)

#: The exported package's name while the benchmark imports it (not the default name: an installed
#: ``kernsearch_kernels`` of the user's stays untouched).
PACKAGE = "kernsearch_bench_kernels"

Say = Callable[[str], None]


def fused_families(shape: StepShape) -> dict[str, Family]:
    """The fused families the step calls, loaded from kernsearch's own templates; their eps must be the step's."""
    out = {}
    for call in shape.all_calls():
        if call.family in out:
            continue
        fam = load_family(call.family)
        eps = fam.param_values.get("eps")  # the value (``params`` holds the spec's Param records)
        if eps is not None and abs(float(eps) - EPS) > 1e-12:
            raise BenchError(f"{call.family}: its eps {float(eps):g} is not the step's {EPS:g}")
        out[call.family] = fam
    return out


def import_package(store: ArtifactStore, families: Sequence[str], work: Path) -> Any:
    """The store's current artifacts exported as a package (under ``work``) and imported from there."""
    result = export(list(families), work, store, package=PACKAGE, version="0.0.1")
    sys.modules.pop(PACKAGE, None)
    sys.path.insert(0, str(result.source_dir))
    try:
        return importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(result.source_dir))


def explain_calls(mx: Any, pkg: Any, shape: StepShape, families: dict[str, Family], layer: Layer,
                  m: int) -> dict[str, Any]:
    """Which kernel the package runs for each call of the layer at ``m`` rows, and why (its ``explain``): the
    package's ``Decision`` per call."""
    dt = getattr(mx, shape.dtype)
    out = {}
    for call in shape.all_calls():
        named = call_inputs(layer, call.role)
        named["X"] = mx.zeros((m, call.k), dtype=dt)
        named["R"] = mx.zeros((m, call.n), dtype=dt)
        arrays = [named[i.name] for i in families[call.family].inputs]
        out[f"M={m} {call.role}"] = getattr(pkg, call.family).explain(*arrays)
    return out


def _flats(mx: Any, shape: StepShape, layers: int) -> list[dict[str, Any]]:
    """Per layer, per call, a buffer of the call's weight bytes for the streaming read (distinct values: distinct
    memory)."""
    return [{c.role: mx.zeros((shape.matrix_bytes(c) // 4,), dtype=mx.uint32) + i for c in shape.all_calls()}
            for i in range(layers)]


def run_decode(shape: StepShape, ms: Sequence[int], rounds: int, store: ArtifactStore, chip: Any, say: Say,
               kernels: bool = True, seed: int = 0) -> DecodeReport:
    import mlx.core as mx

    shape.check()
    kind = device_kind(mx)
    families = fused_families(shape)
    spec = float(chip.memory_bandwidth_gbs) if kind is not None else None
    report = DecodeReport(chip.name, kind or "cpu", evidence_for(kind), str(getattr(mx, "__version__", "?")), shape,
                          shape.layers * shape.layer_bytes(), spec)
    buffer = os.environ.get("MLX_MAX_OPS_PER_BUFFER")
    if buffer is not None:  # MLX reads it at start: it sizes both sides' command buffers (docs/decode.md)
        report.notes.append(f"MLX_MAX_OPS_PER_BUFFER={buffer[:20]!r} in the environment: MLX's command buffers, "
                            "plain MLX's and the package's alike, commit after that many ops")
    if kind is None:
        report.notes.append("MLX's CPU back-end: the timings are the CPU's, not a GPU's; the run checks the "
                            "package's output against plain MLX's")
    with tempfile.TemporaryDirectory(prefix="kernsearch-bench-") as tmp:
        say("exporting the store's package (fused decode families)")
        pkg = import_package(store, list(families), Path(tmp))
        layers = build_layers(mx, shape, seed, say)
        bound = [bind_layer(pkg, families, lay, shape.all_calls()) for lay in layers]
        read = stream_reader(mx, kind)
        flats = _flats(mx, shape, len(layers)) if read is not None else None
        if flats is not None:
            mx.eval(flats)
        for m in ms:
            decisions = explain_calls(mx, pkg, shape, families, layers[0], m)
            report.explain.update({k: str(d) for k, d in decisions.items()})
            report.rows.extend(_step_rows(mx, shape, layers, bound, flats, read, m, rounds, spec, say))
            if kernels:
                streams = call_streams(mx, kind, families, layers[0]) if kind is not None else None
                chains = KernelChains(mx, shape, layers, bound, flats, read, streams)
                for call in shape.all_calls():
                    decision = decisions[f"M={m} {call.role}"]
                    report.kernels.append(_kernel_row(chains, call, shape, m, rounds, decision, say))
    return report


def _step_forms(mx: Any, shape: StepShape, layers: Sequence[Layer],
                bound: Sequence[Any]) -> dict[str, Callable[[Any], list[Any]]]:
    """Every form of the step (:data:`PLAIN_FORMS`, :data:`PACKAGE_FORMS`), each also under ``mx.compile``."""
    steps = {PLAIN_FORMS[0]: plain_step(mx, layers, False), PLAIN_FORMS[1]: plain_step(mx, layers, True),
             PACKAGE_FORMS[0]: package_step(bound, shape.hidden, 2),
             PACKAGE_FORMS[1]: package_step(bound, shape.hidden, 4)}
    return {**steps, **{name + COMPILED: mx.compile(step) for name, step in steps.items()}}


def _step_rows(mx: Any, shape: StepShape, layers: Sequence[Layer], bound: Sequence[Any],
               flats: Sequence[dict[str, Any]] | None, read: Any, m: int, rounds: int, spec_gbs: float | None,
               say: Say, tokens: int = 8) -> list[Any]:
    """The step at ``m`` rows in each consumer loop (:data:`LOOPS`): one eval per token, and mlx-lm's pipelined
    loop over ``tokens`` dependent tokens; plain MLX's fastest form is the reference in each."""
    dt = getattr(mx, shape.dtype)
    x0 = (0.5 * mx.random.normal((m, shape.hidden), key=mx.random.key(100 + m))).astype(dt)
    mx.eval(x0)
    steps = _step_forms(mx, shape, layers, bound)
    want = steps[PLAIN_FORMS[1]](x0)[0]
    rel = max(rel_err(mx, step(x0)[0], want) for name, step in steps.items()
              if name.removesuffix(COMPILED) in PACKAGE_FORMS)
    forms: dict[str, Callable[[], Any]] = {name: partial(step, x0) for name, step in steps.items()}
    if read is not None and flats is not None:
        def stream() -> Any:
            d = mx.zeros((1,), dtype=mx.uint32)
            for f in flats:
                for c in shape.calls2():  # the same bytes in as many launches as the package's layer
                    d = read(f[c.role], d)
            return d

        forms["stream"] = stream
    say(f"M={m}: timing the step, one eval per token ({len(forms)} forms, {rounds} rounds, interleaved)")
    t = interleaved(mx, forms, rounds)
    stream_ms = median(t["stream"]) if "stream" in t else None
    rows = [token_row(shape, m, "sync", t, rel, spec_gbs, stream_ms)]
    say(f"M={m}: timing the step in mlx-lm's pipelined loop ({len(steps)} forms, {rounds} rounds of {tokens} tokens)")
    rows.append(token_row(shape, m, "pipelined", pipelined(mx, steps, x0, rounds, tokens), rel, spec_gbs,
                          stream_ms))
    for row in rows:
        every = ", ".join(f"{f} {ms:.3f}" for f, ms in row.forms_ms.items())
        say(f"M={m} {row.loop}: plain MLX ({row.mlx_form}) {row.mlx_ms:.3f} ms/token; {row.package_form} "
            f"{row.package_ms:.3f} ms/token: {row.speedup:.2f}x ({row.low:.2f}-{row.high:.2f}); output rel. error "
            f"{row.rel_err:.1e}; every form: {every}")
    return rows


def judged_low(decision: Any) -> float | None:
    """The lower bound of the chain (graph mode) figure the artifact a decision took was published on; None where
    it took the op or the family default (:meth:`~kernsearch.exporting.runtime._decision.Decision.judged_low`)."""
    low: float | None = decision.judged_low(ConsumerMode.GRAPH)
    return low


def _kernel_row(chains: KernelChains, call: Call, shape: StepShape, m: int, rounds: int, decision: Any,
                say: Say) -> Any:
    t = interleaved(chains.mx, chains.forms(call, m), rounds)
    row = replace(kernel_row(call, shape, m, t, len(chains.layers), str(decision.artifact or "op")),
                  gate_low=judged_low(decision))
    stream = "" if row.stream_us is None else f", stream {row.stream_us:.1f} us ({row.pct_of_stream:.0f} %)"
    if row.call_stream_us is not None:
        stream += f", stream as the call is called {row.call_stream_us:.1f} us ({row.pct_of_call_stream:.0f} %)"
    if row.us_compiled is not None and row.stream_us_compiled is not None:
        stream += (f"; compiled chains {row.us_compiled:.1f} us vs stream {row.stream_us_compiled:.1f} us "
                   f"({row.pct_of_stream_compiled:.0f} %)")
    judged = "" if row.gate_low is None else f", published on a chain bound of {row.gate_low:.2f}x" + (
        " (BELOW it here)" if row.speedup < row.gate_low else "")
    say(f"M={m} {call.role} ({call.family} {row.shape}): {row.us:.1f} us/call vs op {row.op_us:.1f} "
        f"({row.speedup:.2f}x){stream}; runs {row.chose}{judged}")
    return row
