"""``kernsearch bench``: what a consumer of the exported package gets (``decode``: ms per token of a decode step)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .._errors import KernsearchError, not_empty
from ._step import BenchError, StepShape

if TYPE_CHECKING:
    from ._decode import DecodeReport

app = typer.Typer(no_args_is_help=True, help="Benchmarks of the exported package as consumers call it.")


def _ms(text: str) -> list[int]:
    try:
        ms = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise BenchError(f"--m {text!r}: comma-separated row counts, e.g. 1,4") from None
    if not ms or any(not 1 <= m <= 16 for m in ms) or len(ms) > 16:
        raise BenchError(f"--m {text!r}: 1 to 16 rows each (a decode step's batch), at most 16 values")
    return list(dict.fromkeys(ms))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@app.command()
def decode(hidden: int = typer.Option(4096, "--hidden", help="model width"),
           ffn: int = typer.Option(11008, "--ffn", help="MLP width"),
           layers: int = typer.Option(32, "--layers", help="layers per token"),
           m: str = typer.Option("1,4", "--m", help="rows per step (batch), comma-separated"),
           bits: int = typer.Option(4, "--bits", help="4 or 8"),
           group: int = typer.Option(64, "--group", help="quantization group: 32, 64 or 128"),
           dtype: str = typer.Option("float16", "--dtype", help="activations, scales and biases: float16, "
                                     "bfloat16 or float32", callback=not_empty),
           rounds: int = typer.Option(30, "--rounds", help="interleaved rounds per comparison (paired)"),
           kernels: bool = typer.Option(True, "--kernels/--no-kernels", help="also time each fused kernel alone"),
           store: str | None = typer.Option(None, "--store", envvar="KERNSEARCH_ARTIFACTS",
                                            help="artifact store folder (default: ./artifacts)", callback=not_empty),
           chip_name: str | None = typer.Option(None, "--chip", help="chip name (default: detected)",
                                                callback=not_empty),
           job: str | None = typer.Option(None, "--job", help="write the job file that tunes every shape the step "
                                          "calls (for `kernsearch flows run`) and stop", callback=not_empty),
           as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
           mlx_lm: bool = typer.Option(False, "--mlx-lm", help="an mlx-lm Llama model (random weights, quantized "
                                       "by mlx-lm) generating with mlx-lm's own loop, with and without "
                                       "kernsearch_kernels.patch (needs kernsearch[lm])"),
           heads: int = typer.Option(32, "--heads", help="--mlx-lm: attention heads"),
           kv_heads: int = typer.Option(32, "--kv-heads", help="--mlx-lm: key/value heads (fewer: GQA)"),
           vocab: int = typer.Option(32000, "--vocab", help="--mlx-lm: vocabulary size"),
           prompt: int = typer.Option(128, "--prompt", help="--mlx-lm: prompt tokens"),
           tokens: int = typer.Option(128, "--tokens", help="--mlx-lm: generated tokens"),
           always_patch: bool = typer.Option(False, "--always-patch", help="--mlx-lm: patch(model, always=True), "
                                             "every decode step through the package, kernels or not")) -> None:
    """A Llama-shaped decode step (attention left out) through plain MLX and through the exported package.

    Prints ms per token, tokens/s, the share of the streaming-read bandwidth measured in the same run and of the
    chip's spec bandwidth, which kernel each call ran, and the package's output error against plain MLX's.
    """
    from .._options import Rounds, check
    from ..artifacts._artifacts import ArtifactStore
    from ..hardware._chips import resolve_chip

    shape = StepShape(hidden, ffn, layers, bits, group, dtype).check()
    rows = _ms(m)
    check(Rounds, rounds, "--rounds")
    st = ArtifactStore(store)
    if mlx_lm:
        from ._mlx_lm import LmConfig, run_mlx_lm

        config = LmConfig(hidden, ffn, layers, heads, kv_heads, vocab, bits, group, dtype)
        lm = run_mlx_lm(config, prompt, tokens, min(rounds, 100), st, _say, always=always_patch)
        print(json.dumps(lm.to_json(), indent=1) if as_json else "\n".join(lm.lines()))
        return
    chip = resolve_chip(chip_name)
    if job is not None:
        _write_job(shape, rows, chip.name, chip.vendor, Path(st.root), job)
        return
    from ._run import run_decode

    report = run_decode(shape, rows, rounds, st, chip, _say, kernels=kernels)
    if as_json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        _print(report)


def _write_job(shape: StepShape, ms: list[int], chip: str, vendor: str, store: Path, path: str) -> None:
    from .._safeio import write_atomic
    from ._job import job_text

    if vendor == "cpu":
        raise BenchError("--job: no GPU here; name the chip the job tunes for with --chip (e.g. --chip H200)")
    try:
        write_atomic(path, job_text(shape, ms, chip, store.resolve()))
    except OSError as exc:
        raise KernsearchError(f"cannot write the job file {path!r}: {exc.strerror or exc}") from None
    _say(f"wrote {path}: run `kernsearch flows run {path}` to tune the step's shapes on {chip}, then "
         "`kernsearch bench decode` with the same options")


def _print(report: DecodeReport) -> None:
    from .._console import out

    kind = report.evidence or "CPU timings, not a GPU's"
    out.print(f"decode step on {report.chip} ({report.device}, MLX {report.mlx}; {kind}): {report.shape.layers} "
              f"layers, hidden {report.shape.hidden}, FFN {report.shape.ffn}, {report.shape.bits}-bit g"
              f"{report.shape.group}, {report.bytes_per_token / 1e9:.2f} GB of weights per token", soft_wrap=True)
    for r in report.rows:
        stream = "" if r.stream_ms is None else (f"; stream {r.stream_ms:.3f} ms: package at {r.pct_of_stream:.0f} % "
                                                 f"of the streaming read, {r.pct_of_spec:.0f} % of spec bandwidth")
        every = ", ".join(f"{f} {ms:.3f}" for f, ms in r.forms_ms.items())
        out.print(f"M={r.M}, {r.loop} loop: plain MLX ({r.mlx_form}) {r.mlx_ms:.3f} ms/token "
                  f"({r.tokens_per_s_mlx:.0f} tok/s), {r.package_form} {r.package_ms:.3f} ms/token "
                  f"({r.tokens_per_s_package:.0f} tok/s): {r.speedup:.2f}x (99 % interval {r.low:.2f}-{r.high:.2f})"
                  f"{stream}; output rel. error {r.rel_err:.1e}; ms/token of every form: {every}",
                  soft_wrap=True, markup=False)
    for line in report.explain.values():
        out.print(f"  {line}", soft_wrap=True, markup=False)
    for note in report.notes:
        out.print(f"note: {note}", soft_wrap=True, markup=False)
