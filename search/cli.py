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


# -- artifacts and export (issue 5) -----------------------------------------------------------------------
artifacts_app = typer.Typer(no_args_is_help=True, help="Published kernel versions and their evidence.")
app.add_typer(artifacts_app, name="artifacts")
StoreOpt = typer.Option(None, "--store", envvar="KERNSEARCH_ARTIFACTS",
                        help="artifact store folder (default: ./artifacts)")
KeyArg = typer.Argument(..., help="FAMILY/CHIP/DTYPE/SHAPE[/vN], as `kernsearch artifacts list` prints it")


@artifacts_app.command("list")
def artifacts_list(store: Optional[str] = StoreOpt,
                   family: Optional[str] = typer.Option(None, "--family", help="only this family"),
                   all_versions: bool = typer.Option(False, "--all", help="every version, not only the current")) -> None:
    """Keys of the store with their current version, evidence and speed."""
    from ._artifacts import ArtifactStore
    from ._manifest import ArtifactError

    st = ArtifactStore(store)
    keys = [k for k in st.keys() if family is None or k.family == family]
    if not keys:
        out.print(f"no artifacts in {st.root}")
        return
    rows: list[tuple[str, ...]] = [("key", "version", "evidence", "median ms", "speedup", "verifier", "published",
                                     "state")]
    for key in keys:
        pointer = st.pointer(key) if _readable_pointer(st, key) else None
        versions = st.versions(key) if all_versions else ([pointer.version] if pointer else [])
        if not versions:
            rows.append((str(key), "-", "", "", "", "", "", "no version published (see journal)"))
        for version in versions:
            current = pointer is not None and version == pointer.version
            try:
                m = st.load(key, version).manifest
            except ArtifactError as exc:
                rows.append((str(key), version, "", "", "", "", "", f"unreadable: {exc}"))
                continue
            meas = m.measurements
            state = ("current" + (f", invalidated: {pointer.invalidated}" if pointer.invalidated else "")
                     if current and pointer else "")
            rows.append((str(key), version, m.evidence, f"{meas.median_ms:.4g}" if meas else "-",
                         f"{meas.speedup:.2f}x" if meas and meas.speedup else "-", m.correctness.verifier,
                         m.published_at.strftime("%Y-%m-%d"), state))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for i, row in enumerate(rows):  # plain columns: never truncated, easy to grep
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
        out.print(f"[bold]{line}[/]" if i == 0 else line, soft_wrap=True, markup=i == 0)


def _readable_pointer(st, key) -> bool:  # noqa: ANN001
    from ._manifest import ArtifactError

    try:
        st.pointer(key)
        return True
    except ArtifactError as exc:
        _warn_line(str(exc))
        return False


@artifacts_app.command("show")
def artifacts_show(key: str = KeyArg, store: Optional[str] = StoreOpt,
                   source: bool = typer.Option(False, "--source", help="also print the kernel header and body"),
                   as_json: bool = typer.Option(False, "--json", help="print the manifest as JSON")) -> None:
    """One version (default: the current one): manifest, evidence, gate decision and history."""
    from ._artifacts import ArtifactKey, ArtifactStore

    st = ArtifactStore(store)
    k, version = ArtifactKey.parse(key)
    art = st.load(k, version)
    m = art.manifest
    if as_json:
        sys.stdout.write(m.to_json())
        return
    pointer = st.pointer(k)
    state = "current" if pointer and pointer.version == art.version else "not current"
    if pointer and pointer.version == art.version and pointer.invalidated:
        state += f", invalidated: {pointer.invalidated}"
    meas, corr, tc = m.measurements, m.correctness, m.toolchain
    rows = [("evidence", m.evidence),
            ("chip", f"{m.chip.name} ({m.chip.vendor}; detected: "
                     f"{', '.join(f'{a}={b}' for a, b in m.chip.detected.items() if a in ('architecture', 'device_name')) or 'no, named'})"),
            ("problem", f"{m.problem.family} {'x'.join(map(str, m.problem.shape))} {m.problem.dtype}"),
            ("config", ",".join(f"{a}={b}" for a, b in m.config.items())),
            ("launch", f"grid {list(m.geometry.grid)}, threadgroup {list(m.geometry.threadgroup)}, "
                       f"shared memory {m.geometry.shared_memory} B"),
            ("kernel", f"{m.kernel.name} ({m.kernel.target}), source sha256 {m.source_sha256[:16]}…"),
            ("template", f"{m.template.file} sha256 {m.template.sha256[:16]}…"),
            ("toolchain", f"kernsearch {tc.kernsearch_version}, MLX {tc.mlx_version}, {tc.os} {tc.os_release}"
                          + (f", macOS {tc.macos_version} ({tc.macos_build})" if tc.macos_version else "")),
            ("timing", (f"median {meas.median_ms:.4g} ms, spread {meas.spread:.1%}, {len(meas.samples_ms)} samples"
                        + (f"; baseline {meas.baseline_median_ms:.4g} ms, speedup {meas.speedup:.2f}x"
                           if meas.baseline_median_ms and meas.speedup else "")) if meas else
             "none (interpreted: correctness only)"),
            ("correctness", f"{'passed' if corr.passed else 'FAILED'} on the {corr.verifier}: {corr.checks_run} "
                            f"check(s), shapes {', '.join(corr.shapes_checked)}, max abs error {corr.max_abs_error:.3g}"),
            ("study", m.study or "-"),
            ("created / published", f"{m.created_at.isoformat(timespec='seconds')} / "
                                    f"{m.published_at.isoformat(timespec='seconds')}"),
            ("gate", m.gate.reason + (f" (replaced {m.gate.replaced})" if m.gate.replaced else ""))]
    out.print(f"[bold]{k}/{art.version}[/] ({state}; manifest schema {m.schema_version})")
    for name, value in rows:
        out.print(f"  {name:<22}{value}", soft_wrap=True)
    history = st.journal(k)
    if history:
        out.print("history:")
        for h in history[-10:]:
            out.print(f"  {h.get('time', '')[:19]}  {h.get('outcome', '?'):<11} {h.get('version') or '':<5} "
                      f"{h.get('reason', '')}", soft_wrap=True)
    if source:
        sys.stdout.write(f"// ---- header ----\n{art.kernel.header}// ---- source ----\n{art.kernel.source}")


@artifacts_app.command("verify")
def artifacts_verify(store: Optional[str] = StoreOpt) -> None:
    """Check every version's manifest schema and source hash, and every current pointer."""
    from ._artifacts import ArtifactStore
    from ._manifest import ArtifactError

    st = ArtifactStore(store)
    results = st.verify()
    bad = [r for r in results if not r.ok]
    for r in results:
        out.print(f"{'ok ' if r.ok else '[red]BAD[/]'} {r.where}" + ("" if r.ok else f": {r.message}"), soft_wrap=True)
    for tmp in st.stale_temporaries():
        out.print(f"[dim]note: {tmp} is a half-written version left by an interrupted publisher "
                  "(invisible to readers; safe to delete)[/]")
    if bad:
        raise ArtifactError(f"{len(bad)} of {len(results)} check(s) failed in {st.root}")
    out.print(f"{len(results)} version(s) verified in {st.root}" if results else f"no artifacts in {st.root}")


@app.command()
def export(families: Optional[list[str]] = typer.Argument(None, help="families to export (default: every "
                                                                     "family with artifacts)"),
           out_dir: str = typer.Option("dist", "--out", help="folder for the wheel and its source tree"),
           store: Optional[str] = StoreOpt,
           package: str = typer.Option("kernsearch_kernels", "--name", help="Python package name"),
           version: Optional[str] = typer.Option(None, "--version", help="package version (default: UTC date)")) -> None:
    """Build an installable package (a wheel) of the current artifacts, dispatching by chip and shape."""
    from ._artifacts import ArtifactStore
    from ._export import export as build

    result = build(families, out_dir, ArtifactStore(store), package=package, version=version)
    for note in result.notes:
        _warn_line(note)
    out.print(f"exported {', '.join(result.families)}: {len(result.artifacts)} artifact(s)"
              + (f" ({', '.join(result.artifacts)})" if result.artifacts else ""), soft_wrap=True)
    out.print(f"wheel: {result.wheel}\nsource: {result.source_dir}\ninstall: pip install {result.wheel}",
              soft_wrap=True)


# -- nightly flows (issue 6): the sub-app imports Prefect only inside its commands --------------------
from .flows._cli import app as _flows_app  # noqa: E402

app.add_typer(_flows_app, name="flows")


@app.command()
def verify(family: str = typer.Argument(..., help=FAMILY_HELP),
           config: Optional[str] = typer.Option(None, "--config", help="KNOB=VALUE,... (others: the default)"),
           shape: Optional[str] = ShapeOpt, dtype: Optional[str] = DtypeOpt, chip_name: Optional[str] = ChipOpt,
           backend: str = typer.Option("cpu", "--backend", help="cpu (the Metal interpreter), metal or cuda"),
           check: bool = typer.Option(False, "--check", help="cpu: also detect threadgroup races, reads of "
                                      "never-written and out-of-bounds threadgroup memory"),
           sanitize: bool = typer.Option(False, "--sanitize", help="cpu: detect device-buffer out-of-bounds "
                                         "accesses (AddressSanitizer)"),
           seed: int = typer.Option(0, "--seed", help="seed of the random inputs"),
           timeout: float = typer.Option(30.0, "--timeout", help="cpu: seconds before a hanging kernel is stopped")
           ) -> None:
    """Run one variant against the float64 NumPy reference: pass/fail, error, diagnostics (exit 1 on fail)."""
    from ._chips import default_apple_chip
    from ._errors import VariantFailure
    from rich.markup import escape

    from ._render import geometry, render as render_variant
    from ._space import format_config
    from ._verify import tolerance, verify_kernel
    from .backends import get_backend

    if check and sanitize:
        raise KernsearchError("--check and --sanitize are separate runs: give one of them")
    if backend == "cpu" and chip_name is None:
        detected = resolve_chip(None)
        chip_name = detected.name if detected.vendor == "apple" else default_apple_chip().name
    fam, c, problem, sp = problem_and_space(family, shape, dtype, chip_name)
    cfg = sp.validate(sp.parse_config(config))
    be = get_backend(backend)
    be.check_available()
    target = be.target or "metal"
    kernel = render_variant(fam, cfg, problem.dtype, target)
    geo = geometry(sp, cfg)
    options: dict = {}
    mode = "sanitize" if sanitize else ("check" if check else "fast")
    if backend == "cpu":
        from .interp import template_lines

        options = {"mode": mode, "timeout": timeout, "chip": c, "lines": template_lines(fam, cfg, problem.dtype, target)}
    elif check or sanitize:
        raise KernsearchError("--check and --sanitize need --backend cpu")
    how = f"{be.name} back-end ({be.evidence.value}" + (f", {mode} mode)" if backend == "cpu" else ")")
    out.print(f"[bold]{fam.name}[/] {problem.shape_text} {problem.dtype} for {c.name} · "
              f"{format_config(cfg)} · {how}", soft_wrap=True)
    try:
        result, diagnostics = verify_kernel(be, kernel, geo, problem, seed, **options)
    except VariantFailure as exc:
        out.print(f"[red]FAIL ({exc.reason})[/]: {escape(exc.detail)}", soft_wrap=True)
        raise typer.Exit(1) from None
    rtol, atol = tolerance(problem)
    colour = "green" if result.ok else "red"
    out.print(f"[{colour}]{result.summary()}[/] (tolerance: rtol {rtol:g}, atol {atol:.3g})", soft_wrap=True)
    errors = [d for d in diagnostics if d.severity == "error"]
    for d in diagnostics:
        out.print(f"  [{'red' if d.severity == 'error' else 'yellow'}]{escape(str(d))}[/]", soft_wrap=True)
    if not result.ok or errors:
        if result.ok:
            out.print(f"[red]FAIL[/]: {len(errors)} error diagnostic(s)")
        raise typer.Exit(1)


@app.command()
def predict(family: str = typer.Argument(..., help=FAMILY_HELP),
            config: Optional[str] = typer.Option(None, "--config", help="KNOB=VALUE,... (others: the default)"),
            shape: Optional[str] = ShapeOpt, dtype: Optional[str] = DtypeOpt,
            chip_name: Optional[str] = typer.Option(None, "--chip", help="chip to predict for (default: M2 Max)"),
            as_json: bool = typer.Option(False, "--json", help="print the breakdown as JSON")) -> None:
    """Predict one variant's time with the performance model: modeled, never a measurement."""
    import json

    from ._chips import default_apple_chip
    from .backends import get_backend

    _, c, problem, sp = problem_and_space(family, shape, dtype, chip_name or default_apple_chip().name)
    cfg = sp.validate(sp.parse_config(config))
    b = get_backend("model", chip=c).breakdown(sp, cfg)
    if as_json:
        sys.stdout.write(json.dumps({"config": cfg, **b}) + "\n")
        return
    peak = c.peak_tflops(problem.dtype)
    out.print(f"[bold]{problem.family.name}[/] {problem.shape_text} {problem.dtype} on {c.name}: "
              f"[bold]{b['time_ms']:.4g} ms modeled[/] (a prediction, not a measurement), "
              f"{b['predicted_tflops']:.3g} TFLOP/s = {100 * b['predicted_tflops'] / peak:.0f} % of peak, "
              f"bound: {b['bound']}")
    for key, value in b.items():
        if key not in ("evidence", "chip", "time_ms", "bound"):
            out.print(f"  {key:<30}{value:.4g}" if isinstance(value, float) else f"  {key:<30}{value}")


def main() -> None:
    """Console-script entry point: user errors → one line on stderr, exit 2."""
    try:
        app()
    except KernsearchError as exc:
        err.print(f"[red]error:[/] {exc}", soft_wrap=True)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
