"""``families``, ``chip``, ``space``, ``render``, ``predict``: what a family, a chip and one variant are, without
running anything on a device."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from .._console import err, out
from .._errors import not_empty
from .._vocabulary import Target
from ._app import (
    FAMILY_HELP,
    ChipOpt,
    DtypeOpt,
    ShapeOpt,
    _fmt,
    app,
    problem_and_space,
    resolve_chip,
)

if TYPE_CHECKING:
    from ..hardware._chips import Chip


@app.command()
def families(folders: list[str] | None = typer.Argument(
        None, help="family folders of your own to list too (each is checked as `tune` would load it)")) -> None:
    """List kernel families with a one-line description: the built-in ones, and the folders named."""
    from ..family._spec import builtin_family_names, load_family

    table = Table("family", "targets", "knobs", "outputs", "description", box=None)
    loaded = [(name, load_family(name)) for name in builtin_family_names()]
    for folder in folders or []:
        given = folder if "/" in folder or folder.startswith(".") else f"./{folder}"  # a folder, never a built-in
        loaded.append((given, load_family(given)))
    table.columns[0].no_wrap = True
    for name, fam in loaded:
        table.add_row(escape(name), ", ".join(fam.templates), str(len(fam.knobs)),
                      ", ".join(t.name for t in fam.outputs), escape(fam.description))
    out.print(table)


def _print_all_chips() -> None:
    """``chip --all``: one row a chip of the registry; a matrix figure that is an estimate is starred."""
    from ..hardware._chips import registry

    table = Table("chip", "vendor", "cores", "GB/s", "FP32 TF", "FP16 TF", "matrix TF", "bf16", "tg mem",
                  box=None)
    for c in registry().values():
        matrix = f"{c.tensor_fp16_tflops:g}{'*' if 'tensor_fp16_tflops' in c.estimated else ''}" \
            if c.tensor_fp16_tflops else "-"
        table.add_row(c.name, c.vendor, str(c.gpu_cores), f"{c.memory_bandwidth_gbs:g}", f"{c.fp32_tflops:g}",
                      f"{c.simd_tflops('float16'):g}", matrix, "yes" if c.bfloat16 else "no",
                      f"{c.threadgroup_memory_bytes // 1024} KiB")
    out.print(table)
    out.print("* estimate; `kernsearch chip --chip NAME` shows each figure's source")


def _identity_rows(c: Chip) -> list[tuple[str, str, object]]:
    """What identifies the chip beyond its figures (generation and die, architecture, what the device reported),
    each only where known; no figure source (they are not figures)."""
    from ..hardware._chips import DIE_CLASSES

    rows: list[tuple[str, str, object]] = []
    if c.generation is not None:
        rows.append(("generation / die", "", f"g{c.generation}{c.die} ({DIE_CLASSES.get(c.die or '', '?')})"))
    if c.architecture:
        rows.append(("architecture", "", c.architecture))
    if c.detected:
        rows.append(("device_info", "", ", ".join(f"{k}={v}" for k, v in c.detected.items()
                                                 if k in ("architecture", "device_name"))))
    return rows


@app.command()
def chip(name: str | None = typer.Option(None, "--chip", help="show this chip instead of the detected one",
                                         callback=not_empty),
         all_chips: bool = typer.Option(False, "--all", help="list every chip in the registry")) -> None:
    """Show the detected chip (or --chip NAME) and its figures."""
    if all_chips:
        _print_all_chips()
        return
    c = resolve_chip(name)
    source = "named with --chip" if name else ("detected" if c.known else "detected, unknown: conservative limits")
    out.print(f"[bold]{c.name}[/] ({c.vendor}, {source})")
    rows: list[tuple[str, str, object]] = [
        ("GPU cores / SMs", "gpu_cores", c.gpu_cores),
        ("memory bandwidth", "memory_bandwidth_gbs", f"{c.memory_bandwidth_gbs:g} GB/s"),
        ("FP32 peak", "fp32_tflops", f"{c.fp32_tflops:g} TFLOP/s"),
        ("FP16 peak", "fp16_tflops", f"{c.simd_tflops('float16'):g} TFLOP/s"),
        ("neural accelerators", "neural_accelerators", "yes" if c.neural_accelerators else "no"),
        ("bfloat16", "bfloat16", "yes" if c.bfloat16 else "no"), ("SIMD width", "simd_width", c.simd_width),
        ("max threads / threadgroup", "max_threads_per_threadgroup", c.max_threads_per_threadgroup),
        ("threadgroup memory", "threadgroup_memory_bytes", f"{c.threadgroup_memory_bytes} bytes"),
        ("system cache", "system_cache_mb", f"{c.system_cache_mb:g} MB")]
    if c.tensor_fp16_tflops:
        rows.insert(5, ("FP16 matrix peak (accel.)", "tensor_fp16_tflops", f"{c.tensor_fp16_tflops:g} TFLOP/s"))
    rows += _identity_rows(c)
    for key, field, value in rows:
        source = c.figure_source(field) if field else ""
        out.print(f"  {key:<28}{value}" + (f"  [dim]({source})[/]" if source else ""), highlight=False)


@app.command()
def space(family: str = typer.Argument(..., help=FAMILY_HELP), shape: str | None = ShapeOpt,
          dtype: str | None = DtypeOpt, chip_name: str | None = ChipOpt) -> None:
    """Knobs and domains, total and valid config counts, and why configs were rejected."""
    fam, c, problem, sp = problem_and_space(family, shape, dtype, chip_name)
    out.print(f"[bold]{fam.name}[/] {problem.shape_text} {problem.dtype} on {c.name}")
    table = Table("knob", "kind", "values", "", box=None)
    for name, knob in fam.knobs.items():
        table.add_row(name, knob.kind, ", ".join(map(str, knob.values)), knob.help)
    out.print(table)
    from .._progress import Display

    with Display(err):  # a big space takes seconds (gemm: 2.5 million configs)
        summary = sp.enumerate()
    rejected = summary.total - len(summary.valid)
    out.print(f"configs: {summary.total} total, [bold]{len(summary.valid)} valid[/], {rejected} rejected")
    if summary.rejected:
        why = {con.name: con.why for con in fam.constraints}
        table = Table("rejected by", "configs", "rule", box=None)
        for name, count in summary.rejected.most_common():
            table.add_row(name, str(count), why.get(name, ""))
        out.print(table)
        out.print("[dim](each rejected config is counted once, under the first constraint it violates)[/]")
    default_bad = sp.violations(dict(fam.default))
    if default_bad:
        out.print(f"[yellow]the default config is invalid here:[/] {'; '.join(map(str, default_bad))}")


@app.command()
def render(family: str = typer.Argument(..., help=FAMILY_HELP),
           config: str | None = typer.Option(None, "--config", help="KNOB=VALUE,... (others: the default)"),
           shape: str | None = ShapeOpt, dtype: str | None = DtypeOpt, chip_name: str | None = ChipOpt,
           target: Target = typer.Option(Target.METAL, "--target", help="the kernel language")) -> None:
    """Print the header and body of one variant, as mx.fast.metal_kernel takes them."""
    from ..family._render import geometry
    from ..family._render import render as render_variant

    fam, _, problem, sp = problem_and_space(family, shape, dtype, chip_name)
    cfg = sp.validate(sp.parse_config(config))
    kernel = render_variant(fam, cfg, problem.dtype, target.value)
    geo = geometry(sp, cfg)
    sys.stdout.write(f"// name: {kernel.name}\n// inputs: {', '.join(kernel.input_names)}"
                     f"{' (transposed: ' + ', '.join(geo.transposed_inputs) + ')' if geo.transposed_inputs else ''}"
                     f"; outputs: {', '.join(kernel.output_names)}; template: "
                     f"{', '.join(f'{k}={v}' for k, v in kernel.template)}\n"
                     f"// grid: {list(geo.grid)}  threadgroup: {list(geo.threadgroup)}  (shape {problem.shape_text})\n"
                     f"// ---- header ----\n{kernel.header}// ---- source ----\n{kernel.source}")


@app.command()
def predict(family: str = typer.Argument(..., help=FAMILY_HELP),
            config: str | None = typer.Option(None, "--config", help="KNOB=VALUE,... (others: the default)"),
            shape: str | None = ShapeOpt, dtype: str | None = DtypeOpt,
            chip_name: str | None = typer.Option(None, "--chip", help="chip to predict for (default: the GPU "
                                                    "here, else M2 Max, as every command)", callback=not_empty),
            as_json: bool = typer.Option(False, "--json", help="print the breakdown as JSON")) -> None:
    """Predict one variant's time with the performance model: modeled, never a measurement."""
    import json

    from ..backends import PREDICTOR, get_backend

    _, c, problem, sp = problem_and_space(family, shape, dtype, chip_name)
    cfg = sp.validate(sp.parse_config(config))
    b = get_backend(PREDICTOR, chip=c).breakdown(sp, cfg)
    if as_json:
        sys.stdout.write(json.dumps({"config": cfg, **b}) + "\n")
        return
    from ..studies._kernel import roofline, roofline_pct

    pct, limit = roofline_pct(c, problem, b["time_ms"]), roofline(c, problem)[1]
    out.print(f"[bold]{problem.family.name}[/] {problem.shape_text} {problem.dtype} on {c.name}: "
              f"[bold]{b['time_ms']:.4g} ms modeled[/] (a prediction, not a measurement), "
              f"{b['predicted_tflops']:.3g} TFLOP/s, {_fmt(pct, '.0f')} % of the roofline ({limit}), "
              f"bound: {b['bound']}")
    for key, value in b.items():
        if key not in ("evidence", "chip", "time_ms", "bound"):
            out.print(f"  {key:<30}{value:.4g}" if isinstance(value, float) else f"  {key:<30}{value}")

