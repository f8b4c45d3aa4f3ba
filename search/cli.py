"""The ``kernsearch`` command line.

Every user error (:class:`KernsearchError`) becomes one line on stderr and exit code 2. Heavy imports
(MLX, Optuna, Prefect) happen inside the commands that need them, so ``kernsearch --help`` stays fast.
"""

from __future__ import annotations

import sys
import warnings
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ._errors import KernsearchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find, prove and ship the fastest variant of a GPU kernel for the chip it runs on.")
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)

FAMILY_HELP = "family name (see `kernsearch families`) or path to a family folder"
ShapeOpt = typer.Option(None, "--shape", help="problem shape, e.g. 4096,4096,4096 (default: the family's)")
DtypeOpt = typer.Option(None, "--dtype", help="float32, float16 or bfloat16 (default: the family's)")
ChipOpt = typer.Option(None, "--chip", help="chip name, e.g. 'M2 Max' or H100 (default: detected)")


def _warn_line(message: warnings.WarningMessage | str) -> None:
    text = message.message if isinstance(message, warnings.WarningMessage) else message
    err.print(f"[yellow]warning:[/] {text}")


def resolve_chip(name: str | None):  # noqa: ANN201 - returns a Chip
    """``--chip`` or detection; an unknown detected chip warns on one line."""
    from ._chips import resolve_chip as _resolve

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chip = _resolve(name)
    for w in caught:
        _warn_line(w)
    return chip


def problem_and_space(family: str, shape: str | None, dtype: str | None, chip_name: str | None):  # noqa: ANN201
    from ._space import Space, make_problem
    from ._spec import load_family

    fam = load_family(family)
    chip = resolve_chip(chip_name)
    problem = make_problem(fam, shape, dtype, chip)
    return fam, chip, problem, Space(problem, chip)


@app.command()
def families() -> None:
    """List kernel families with a one-line description."""
    from ._spec import builtin_family_names, load_family

    table = Table("family", "targets", "knobs", "description", box=None)
    for name in builtin_family_names():
        fam = load_family(name)
        table.add_row(name, ", ".join(fam.templates), str(len(fam.knobs)), fam.description)
    out.print(table)


@app.command()
def chip(name: Optional[str] = typer.Option(None, "--chip", help="show this chip instead of the detected one"),
         all_chips: bool = typer.Option(False, "--all", help="list every chip in the registry")) -> None:
    """Show the detected chip (or --chip NAME) and its figures."""
    from ._chips import DIE_CLASSES, registry

    if all_chips:
        table = Table("chip", "vendor", "cores", "GB/s", "FP32 TF", "FP16 TF", "bf16", "tg mem", box=None)
        for c in registry().values():
            table.add_row(c.name, c.vendor, str(c.gpu_cores), f"{c.memory_bandwidth_gbs:g}", f"{c.fp32_tflops:g}",
                          f"{c.peak_tflops('float16'):g}", "yes" if c.bfloat16 else "no",
                          f"{c.threadgroup_memory_bytes // 1024} KiB")
        out.print(table)
        return
    c = resolve_chip(name)
    source = "named with --chip" if name else ("detected" if c.known else "detected, unknown: conservative limits")
    out.print(f"[bold]{c.name}[/] ({c.vendor}, {source})")
    rows = [("GPU cores / SMs", c.gpu_cores), ("memory bandwidth", f"{c.memory_bandwidth_gbs:g} GB/s"),
            ("FP32 peak", f"{c.fp32_tflops:g} TFLOP/s"), ("FP16 peak", f"{c.peak_tflops('float16'):g} TFLOP/s"),
            ("bfloat16", "yes" if c.bfloat16 else "no"), ("SIMD width", c.simd_width),
            ("max threads / threadgroup", c.max_threads_per_threadgroup),
            ("threadgroup memory", f"{c.threadgroup_memory_bytes} bytes")]
    if c.generation is not None:
        rows.append(("generation / die", f"g{c.generation}{c.die} ({DIE_CLASSES.get(c.die or '', '?')})"))
    if c.architecture:
        rows.append(("architecture", c.architecture))
    if c.detected:
        rows.append(("device_info", ", ".join(f"{k}={v}" for k, v in c.detected.items() if k in ("architecture", "device_name"))))
    for key, value in rows:
        out.print(f"  {key:<28}{value}")


@app.command()
def space(family: str = typer.Argument(..., help=FAMILY_HELP), shape: Optional[str] = ShapeOpt,
          dtype: Optional[str] = DtypeOpt, chip_name: Optional[str] = ChipOpt) -> None:
    """Knobs and domains, total and valid config counts, and why configs were rejected."""
    fam, c, problem, sp = problem_and_space(family, shape, dtype, chip_name)
    out.print(f"[bold]{fam.name}[/] {problem.shape_text} {problem.dtype} on {c.name}")
    table = Table("knob", "kind", "values", "", box=None)
    for name, knob in fam.knobs.items():
        table.add_row(name, knob.kind, ", ".join(map(str, knob.values)), knob.help)
    out.print(table)
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
           config: Optional[str] = typer.Option(None, "--config", help="KNOB=VALUE,... (others: the default)"),
           shape: Optional[str] = ShapeOpt, dtype: Optional[str] = DtypeOpt, chip_name: Optional[str] = ChipOpt,
           target: str = typer.Option("metal", "--target", help="metal or cuda")) -> None:
    """Print the header and body of one variant, as mx.fast.metal_kernel takes them."""
    from ._render import geometry, render as render_variant

    fam, _, problem, sp = problem_and_space(family, shape, dtype, chip_name)
    cfg = sp.validate(sp.parse_config(config))
    kernel = render_variant(fam, cfg, problem.dtype, target)
    geo = geometry(sp, cfg)
    sys.stdout.write(f"// name: {kernel.name}\n// inputs: {', '.join(kernel.input_names)}"
                     f"{' (transposed: ' + ', '.join(geo.transposed_inputs) + ')' if geo.transposed_inputs else ''}"
                     f"; outputs: {', '.join(kernel.output_names)}; template: "
                     f"{', '.join(f'{k}={v}' for k, v in kernel.template)}\n"
                     f"// grid: {list(geo.grid)}  threadgroup: {list(geo.threadgroup)}  (shape {problem.shape_text})\n"
                     f"// ---- header ----\n{kernel.header}// ---- source ----\n{kernel.source}")


def main() -> None:
    """Console-script entry point: user errors → one line on stderr, exit 2."""
    try:
        app()
    except KernsearchError as exc:
        err.print(f"[red]error:[/] {exc}", soft_wrap=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
