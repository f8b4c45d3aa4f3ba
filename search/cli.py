"""The ``kernsearch`` command line.

Every user error (:class:`KernsearchError`) becomes one line on stderr and exit code 2. Heavy imports
(MLX, Optuna, Prefect) happen inside the commands that need them, so ``kernsearch --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._console import err, out
from ._errors import KernsearchError, VariantFailure, not_empty
from ._rules import DEFAULT_MARGIN, DEFAULT_TARGET, modes_text
from ._vocabulary import Evidence, Severity, Target, TrialStatus, Verifier
from .studies._final import FinalistCheck, FinalRound


class VerifyChoice(str, Enum):
    """``tune --verify``: which trials of a modeled search the interpreter checks."""

    all = "all"
    finalists = "finalists"
    none = "none"


class SamplerChoice(str, Enum):
    """``tune --sampler`` (the study's ``SAMPLERS``; tests/test_study_cli.py checks the two agree)."""

    default = "default"
    tpe = "tpe"
    random = "random"
    grid = "grid"
    auto = "auto"
    forest = "forest"
    hybrid = "hybrid"

if TYPE_CHECKING:
    from collections.abc import Callable

    from ._progress import Display
    from .artifacts._artifacts import ArtifactStore, PublishOutcome
    from .artifacts._candidate import ArtifactKey
    from .artifacts._manifest import Manifest
    from .backends._base import BaseBackend
    from .family._space import Problem, Space
    from .family._spec import Family
    from .hardware._chips import Chip
    from .studies._study import Objective, StudyResult, TrialSummary
    from .studies._study import Progress as ProgressInfo

def _flags_take_no_value() -> None:
    """Typer's help prints a type beside every option, flags included (``--publish <bool>``), as if a flag took a
    value, which it does not (``--publish true`` is refused): a flag's row shows none."""
    from typer.core import TyperOption

    typed = getattr(TyperOption, "display_type_rich", None)
    if typed is None:  # a Typer without it (older than 0.16) prints no type for flags anyway
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_bool_flag else typed(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()
app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Find, prove and ship the fastest variant of a GPU kernel for the chip it runs on.")

FAMILY_HELP = "family name (see `kernsearch families`) or path to a family folder"
ShapeOpt = typer.Option(None, "--shape", help="problem shape, e.g. 4096,4096,4096 (default: the family's)")
DtypeOpt = typer.Option(None, "--dtype", help="float32, float16 or bfloat16 (default: the family's)",
                        callback=not_empty)
ChipOpt = typer.Option(None, "--chip", help="chip name, e.g. 'M2 Max' or H100 (default: detected)",
                       callback=not_empty)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            out.print(f"kernsearch {version('kernsearch')}", highlight=False)
        except PackageNotFoundError:
            out.print("kernsearch (not installed: run from a source tree)")
        raise typer.Exit()


@app.callback()
def _root(show_version: bool = typer.Option(False, "--version", "-V", callback=_version, is_eager=True,
                                            help="print the version and exit")) -> None:
    """Find, prove and ship the fastest variant of a GPU kernel for the chip it runs on."""


def _warn_line(message: warnings.WarningMessage | str) -> None:
    text = message.message if isinstance(message, warnings.WarningMessage) else message
    err.print(f"[yellow]warning:[/] {escape(str(text))}")


def resolve_chip(name: str | None, target: bool = False) -> Chip:
    """``--chip`` or detection; an unknown detected chip warns on one line. ``target``: the chip commands
    work for (``_chips.target_chip``: with no GPU here, the default M-series chip, not the cpu pseudo-chip)."""
    from .hardware._chips import resolve_chip as _resolve
    from .hardware._chips import target_chip

    with _warnings_as_lines():
        return target_chip(name) if target else _resolve(name)


@contextlib.contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """Warnings raised inside (an unknown detected chip) are printed as one line each, even on an error."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            for w in caught:
                _warn_line(w)


def problem_and_space(family: str, shape: str | None, dtype: str | None,
                      chip_name: str | None) -> tuple[Family, Chip, Problem, Space]:
    from .family._space import Space, make_problem
    from .family._spec import load_family

    fam = load_family(family)
    chip = resolve_chip(chip_name, target=True)
    problem = make_problem(fam, shape, dtype, chip)
    return fam, chip, problem, Space(problem, chip)


@app.command()
def families(folders: list[str] | None = typer.Argument(
        None, help="family folders of your own to list too (each is checked as `tune` would load it)")) -> None:
    """List kernel families with a one-line description: the built-in ones, and the folders named."""
    from .family._spec import builtin_family_names, load_family

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
    from .hardware._chips import registry

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
    from .hardware._chips import DIE_CLASSES

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
    from ._progress import Display

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
    from .family._render import geometry
    from .family._render import render as render_variant

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


# -- artifacts and export (issue 5) -----------------------------------------------------------------------
artifacts_app = typer.Typer(no_args_is_help=True, help="Published kernel versions and their evidence.")
app.add_typer(artifacts_app, name="artifacts")
StoreOpt = typer.Option(None, "--store", envvar="KERNSEARCH_ARTIFACTS",
                        help="artifact store folder (default: ./artifacts)", callback=not_empty)
KeyArg = typer.Argument(..., help="FAMILY/CHIP/DTYPE/SHAPE or FAMILY/CHIP/DTYPE/SHAPE/vN, as "
                                  "`kernsearch artifacts list` prints it")


@artifacts_app.command("list")
def artifacts_list(store: str | None = StoreOpt,
                   family: str | None = typer.Option(None, "--family", help="only this family"),
                   all_versions: bool = typer.Option(False, "--all", help="every version, not only the current"),
                   ) -> None:
    """Keys of the store with their current version, evidence and speed."""
    from .artifacts._artifacts import ArtifactStore

    st = ArtifactStore(store)
    _check_store_folder(st)
    keys = [k for k in st.keys() if family is None or k.family == family]
    if not keys:
        out.print(f"no artifacts in {st.root}")
        return
    rows: list[tuple[str, ...]] = [("key", "version", "evidence", "median ms", "speedup", "verifier", "published",
                                     "state")]
    for key in keys:
        rows += _key_rows(st, key, all_versions)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for i, row in enumerate(rows):  # plain columns: never truncated, easy to grep
        line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
        out.print(f"[bold]{line}[/]" if i == 0 else line, soft_wrap=True, markup=i == 0)


def _key_rows(st: ArtifactStore, key: ArtifactKey, all_versions: bool) -> list[tuple[str, ...]]:
    """``artifacts list``'s rows for one key: its current version (or every version), a version whose manifest
    cannot be read shown as such rather than failing the whole listing."""
    from .artifacts._manifest import ArtifactError

    rows: list[tuple[str, ...]] = []
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
    return rows


def _check_store_folder(st: ArtifactStore) -> None:
    """A store path that exists must be a folder (a file, FIFO or device is a mistake, not an empty store)."""
    from .artifacts._manifest import ArtifactError

    try:
        exists = st.root.exists() or st.root.is_symlink()
    except (OSError, ValueError):
        raise ArtifactError(f"--store {str(st.root)[:200]!r}: not a usable path") from None
    if exists and not st.root.is_dir():
        raise ArtifactError(f"--store {st.root}: not a folder (an artifact store is a folder)")


def _readable_pointer(st: ArtifactStore, key: ArtifactKey) -> bool:
    from .artifacts._manifest import ArtifactError

    try:
        st.pointer(key)
        return True
    except ArtifactError as exc:
        _warn_line(str(exc))
        return False


@artifacts_app.command("show")
def artifacts_show(key: str = KeyArg, store: str | None = StoreOpt,
                   source: bool = typer.Option(False, "--source", help="also print the kernel header and body"),
                   as_json: bool = typer.Option(False, "--json", help="print the manifest as JSON")) -> None:
    """One version (default: the current one): manifest, evidence, gate decision and history."""
    from .artifacts._artifacts import ArtifactStore
    from .artifacts._candidate import ArtifactKey

    st = ArtifactStore(store)
    _check_store_folder(st)
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
    rows = _manifest_rows(m)
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


def _manifest_rows(m: Manifest) -> list[tuple[str, str]]:
    """``artifacts show``'s table: what a version claims (evidence, chip, launch, timing, correctness, gate), one
    labelled line each."""
    meas, corr, tc = m.measurements, m.correctness, m.toolchain
    detected = ", ".join(f"{a}={b}" for a, b in m.chip.detected.items() if a in ("architecture", "device_name"))
    rows = [("evidence", m.evidence),
            ("chip", f"{m.chip.name} ({m.chip.vendor}; detected: {detected or 'no, named'})"),
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
                            f"check(s), shapes {', '.join(corr.shapes_checked)}, "
                            f"max abs error {corr.max_abs_error:.3g}"),
            ("study", m.study or "-"),
            ("created / published", f"{m.created_at.isoformat(timespec='seconds')} / "
                                    f"{m.published_at.isoformat(timespec='seconds')}"),
            ("gate", m.gate.reason + (f" (replaced {m.gate.replaced})" if m.gate.replaced else ""))]
    return rows


def _repair_store(st: ArtifactStore) -> None:
    """``verify --repair``: finish or roll back what interrupted publishers left, the store's own first, then each
    key's, printing each fix so the user sees what changed."""
    for fix in st.repair_store():
        out.print(f"repaired {escape(str(st.root))}: {escape(fix)}", soft_wrap=True)
    for k in st.keys():
        for fix in st.repair(k):
            out.print(f"repaired {escape(str(k))}: {escape(fix)}", soft_wrap=True)


def _print_leftovers(st: ArtifactStore) -> None:
    """What interrupted publishers left (the store's, then each key's): reported, not failed, with the fix
    ``--repair`` would make."""
    for left in st.store_leftovers():
        out.print(f"[yellow]leftover[/] {escape(str(st.root))}: {escape(left.problem)} (--repair: "
                  f"{escape(left.fix)})", soft_wrap=True)
    for k in st.keys():
        for left in st.crash_leftovers(k):
            out.print(f"[yellow]leftover[/] {escape(str(k))}: {escape(left.problem)} (--repair: {escape(left.fix)})",
                      soft_wrap=True)


@artifacts_app.command("verify")
def artifacts_verify(store: str | None = StoreOpt,
                     repair: bool = typer.Option(False, "--repair", help="finish or roll back what interrupted "
                                                 "publishers left (journal, pointer, half-written versions)")) -> None:
    """Check every version's manifest schema and source hash, and every current pointer."""
    from .artifacts._artifacts import ArtifactStore
    from .artifacts._manifest import ArtifactError

    st = ArtifactStore(store)
    _check_store_folder(st)
    if repair:
        _repair_store(st)
    results = st.verify()
    bad = [r for r in results if not r.ok]
    for r in results:
        out.print(f"{'ok ' if r.ok else '[red]BAD[/]'} {escape(str(r.where))}"
                  + ("" if r.ok else f": {escape(r.message)}"), soft_wrap=True)
    _print_leftovers(st)
    if bad:
        raise ArtifactError(f"{len(bad)} of {len(results)} check(s) failed in {st.root}")
    versions = sum(r.version for r in results)
    out.print(f"{versions} version(s) verified in {st.root}" if versions else f"no artifacts in {st.root}")


@artifacts_app.command("migrate")
def artifacts_migrate(store: str | None = StoreOpt,
                      family: list[str] = typer.Option([], "--family", help="a family folder versions may have "
                                                        "been rendered from (repeatable; the built-in families "
                                                        "are always tried)", callback=not_empty),
                      untrusted_to: str | None = typer.Option(
                          None, "--untrusted-to", help="re-judge the versions the store key cannot vouch for: "
                          "'modeled' (measured claims become predictions) or 'invalidated' (not dispatched); "
                          "without it such a store is refused")) -> None:
    """Bring a store under the current rules: index every version the store index lacks (after its full
    check, against the family it was rendered from, kept in the store), rewrite older manifests, seal the index
    with KERNSEARCH_STORE_KEY if set. Never seals what it cannot vouch for: a measured claim no keyed chain
    covers (or any version of a keyed store its chain does not cover) is refused unless --untrusted-to
    re-judges it; a truncated or rolled-back keyed index is refused."""
    from .artifacts._artifacts import ArtifactStore
    from .family._spec import load_family

    st = ArtifactStore(store)
    _check_store_folder(st)
    done = st.migrate([load_family(f if "/" in f else f"./{f}") for f in family], untrusted_to)
    for item in done:
        out.print(escape(item), soft_wrap=True)
    refused = [d for d in done if ": not indexed: " in d]
    out.print(f"{len(done) - len(refused)} change(s) made in {st.root}"
              + (f"; {len(refused)} version(s) not indexed (still refused)" if refused else ""))


@artifacts_app.command("rejudge")
def artifacts_rejudge(store: str | None = StoreOpt, margin: float = typer.Option(
        DEFAULT_MARGIN, "--margin", min=0.0, max=10.0,
        help="required lower bound of the speedup over the op, minus 1")) -> None:
    """Apply the "beats the MLX op" rule to every current measured version; losers stop being dispatched."""
    from .artifacts._artifacts import ArtifactStore

    st = ArtifactStore(store)
    _check_store_folder(st)
    done = st.rejudge(margin)
    for key, why in done:
        out.print(f"{escape(str(key))}: not dispatched: {escape(why)}", soft_wrap=True)
    out.print(f"{len(done)} current version(s) invalidated in {st.root}")


@app.command()
def export(families: list[str] | None = typer.Argument(None, help="families to export: built-in names or family "
                                                                     "folders (default: every built-in family)"),
           out_dir: str = typer.Option("dist", "--out", help="folder for the wheel and its source tree (it keeps "
                                       "the package's current export only)"),
           store: str | None = StoreOpt,
           package: str = typer.Option("kernsearch_kernels", "--name", help="Python package name"),
           version: str | None = typer.Option(None, "--version", help="package version (default: UTC date)")) -> None:
    """Build an installable package (a wheel) of the current artifacts, dispatching by chip and shape."""
    from .artifacts._artifacts import ArtifactStore
    from .exporting._export import export as build

    st = ArtifactStore(store)
    _check_store_folder(st)
    result = build(families, out_dir, st, package=package, version=version)
    for note in result.notes:
        _warn_line(note)
    out.print(f"exported {', '.join(result.families)}: {len(result.artifacts)} artifact(s)"
              + (f" ({', '.join(result.artifacts)})" if result.artifacts else ""), soft_wrap=True)
    out.print(f"wheel: {result.wheel}\nsource: {result.source_dir}\ninstall: pip install {result.wheel}",
              soft_wrap=True)


@app.command("explain")
def explain_cmd(family: str = typer.Argument(..., help=FAMILY_HELP), shape: str | None = ShapeOpt,
                dtype: str | None = DtypeOpt,
                chip_name: str | None = typer.Option(None, "--chip", help="the chip the call runs on (default: this "
                                                         "machine's, as the exported package detects it)"),
                store: str | None = StoreOpt,
                modeled: bool = typer.Option(False, "--modeled", help="also use modeled artifacts (the consumer's "
                                             "opt-in: KERNSEARCH_KERNELS=modeled)")) -> None:
    """Which kernel the exported package would run for one call (an artifact, the family default or the MLX op),
    and why: the package's own `explain`, on the store's current artifacts."""
    import tempfile
    from pathlib import Path

    from .artifacts._artifacts import ArtifactStore
    from .exporting._export import export as build
    from .exporting.runtime._runtime import Dispatcher
    from .family._space import make_problem
    from .family._spec import load_family

    fam = load_family(family)
    chip = resolve_chip(chip_name) if chip_name else None
    problem = make_problem(fam, shape, dtype, chip)
    ctx = problem._ctx()
    shapes = [tuple(int(d) for d in t.shape(ctx)) for t in fam.inputs]  # the call's arrays, as a consumer passes them
    with tempfile.TemporaryDirectory(prefix="kernsearch-explain-") as tmp:
        built = build([family], Path(tmp), ArtifactStore(store))  # a bad store: one line (no progress line first)
        dispatcher = Dispatcher(built.source_dir / built.package)
        decision = dispatcher.decide(fam.name, shapes, problem.dtype, chip.name if chip else None, modeled)
        runs_kernels = bool(dispatcher.running_chip(chip.name if chip else None)[1])
    out.print(str(decision), soft_wrap=True, markup=False)
    if chip is None and not runs_kernels:
        out.print("(no GPU here: the package runs the MLX op on this machine; --chip NAME explains a call on "
                  "another chip)", soft_wrap=True, markup=False)


# -- nightly flows (issue 6): the sub-app imports Prefect only inside its commands --------------------
from .flows._cli import app as _flows_app  # noqa: E402

app.add_typer(_flows_app, name="flows")

from .bench._cli import app as _bench_app  # noqa: E402

app.add_typer(_bench_app, name="bench")


@app.command()
def verify(family: str = typer.Argument(..., help=FAMILY_HELP),
           config: str | None = typer.Option(None, "--config", help="KNOB=VALUE,... (others: the default)"),
           shape: str | None = ShapeOpt, dtype: str | None = DtypeOpt, chip_name: str | None = ChipOpt,
           backend: str = typer.Option("cpu", "--backend", help="cpu (the Metal interpreter), metal or cuda"),
           check: bool = typer.Option(False, "--check", help="cpu: also detect threadgroup races, reads of "
                                      "never-written and out-of-bounds threadgroup memory"),
           sanitize: bool = typer.Option(False, "--sanitize", help="cpu: detect device-buffer out-of-bounds "
                                         "accesses (AddressSanitizer)"),
           seed: int = typer.Option(0, "--seed", help="seed of the random inputs"),
           timeout: float = typer.Option(30.0, "--timeout", help="cpu: seconds before a hanging kernel is stopped"),
           full: bool = typer.Option(False, "--full", help="cpu: run every threadgroup of a big problem (default: "
                                     "8 threadgroups: the corners and edge middles, when there are more than 64)")
           ) -> None:
    """Run one variant against the float64 NumPy reference: pass/fail, error, diagnostics (exit 1 on fail)."""
    from . import _options
    from ._progress import Display
    from ._steps import step
    from .evaluation._verify import check_size, verify_kernel
    from .family._render import geometry
    from .family._render import render as render_variant
    from .family._space import Space, format_config, make_problem
    from .family._spec import load_family

    _options.check(_options.Seed, seed, "--seed")
    _options.check(_options.Timeout, timeout, "--timeout")
    if check and sanitize:
        raise KernsearchError("--check and --sanitize are separate runs: give one of them")
    be, c = _verifier(backend, chip_name, check or sanitize)
    fam = load_family(family)
    problem = make_problem(fam, shape, dtype, c)
    sp = Space(problem, c)
    check_size(problem)
    cfg = sp.validate(sp.parse_config(config))
    kernel = render_variant(fam, cfg, problem.dtype, be.target or DEFAULT_TARGET)
    geo = geometry(sp, cfg)
    mode = "sanitize" if sanitize else ("check" if check else "fast")
    options, sampled = _interpreter_options(be, fam, cfg, problem, geo, mode, timeout, c, seed, full)
    how = f"{be.name} back-end ({be.evidence}" + (f", {mode} mode)" if be.interprets else ")") + sampled
    out.print(f"[bold]{fam.name}[/] {problem.shape_text} {problem.dtype} for {c.name} · "
              f"{format_config(cfg)} · {how}", soft_wrap=True)
    try:
        with Display(err), step(f"running {problem.shape_text} on the {be.name} back-end"):
            result, diagnostics = verify_kernel(be, kernel, geo, problem, seed, **options)
    except VariantFailure as exc:
        _verify_failed(exc, be.interprets, timeout, problem.shape_text)
    _print_verified(result, diagnostics, problem)


def _verifier(backend: str, chip_name: str | None, diagnoses: bool) -> tuple[BaseBackend, Chip]:
    """The back-end `verify` runs on (available here) and the chip it verifies for: the one named (a check is not a
    timing: another chip's space may be checked on the GPU here), else ``backends.chip_for``'s."""
    from .backends import backend_class, chip_for
    from .hardware._chips import get_chip

    be_class = backend_class(backend)
    if diagnoses and not be_class.interprets:
        raise KernsearchError("--check and --sanitize need --backend cpu")
    with _warnings_as_lines():  # an unknown detected chip warns on one line
        chip = get_chip(chip_name) if chip_name else chip_for(be_class)
    be = be_class()
    be.check_available()
    return be, chip


def _interpreter_options(be: BaseBackend, fam: Family, cfg: dict[str, Any], problem: Problem, geo: Any, mode: str,
                         timeout: float, chip: Chip, seed: int, full: bool) -> tuple[dict[str, Any], str]:
    """The interpreter's options for one run (a sample of a big grid's threadgroups unless ``full``), and how the
    banner says what is sampled."""
    if not be.interprets:
        return {}, ""
    from .evaluation._verify import sample_threadgroups, threadgroup_counts
    from .interp import template_lines

    options: dict[str, Any] = {"mode": mode, "timeout": timeout, "chip": chip,
                               "lines": template_lines(fam, cfg, problem.dtype, be.target or DEFAULT_TARGET)}
    counts = threadgroup_counts(geo)
    groups = counts[0] * counts[1] * counts[2]
    if groups <= 64 or full:
        return options, ""
    options["threadgroups"] = sample_threadgroups(geo, 8, seed)  # a 4096³ GEMM takes minutes: check a sample
    return options, f", {len(options['threadgroups'])} of {groups} threadgroups (corners, edge middles; --full: all)"


def _verify_failed(exc: VariantFailure, interprets: bool, timeout: float, shape: str) -> NoReturn:
    if exc.reason == "timeout" and interprets:  # slow interpretation is no verdict on the kernel
        out.print(f"[yellow]NO VERDICT (timeout)[/]: the interpreter did not finish in {timeout:g} s at "
                  f"{shape}; this says nothing about the kernel (a hang and a big problem look "
                  "alike here): try a smaller --shape or a longer --timeout", soft_wrap=True)
        raise typer.Exit(1) from None
    out.print(f"[red]FAIL ({exc.reason})[/]: {escape(exc.detail)}", soft_wrap=True)
    raise typer.Exit(1) from None


def _print_verified(result: Any, diagnostics: list[Any], problem: Problem) -> None:
    from .evaluation._verify import tolerance

    rtol, atol = tolerance(problem)
    colour = "green" if result.ok else "red"
    out.print(f"[{colour}]{result.summary()}[/] (tolerance: rtol {rtol:g}, atol {atol:.3g})", soft_wrap=True)
    errors = [d for d in diagnostics if d.severity == Severity.ERROR]
    for d in diagnostics:
        out.print(f"  [{'red' if d.severity == Severity.ERROR else 'yellow'}]{escape(str(d))}[/]", soft_wrap=True)
    if not result.ok or errors:
        if result.ok:
            out.print(f"[red]FAIL[/]: {len(errors)} error diagnostic(s)")
        raise typer.Exit(1)


# -- the search (issue 4) -----------------------------------------------------------------------------
StorageOpt = typer.Option(None, "--storage", help="Optuna storage URL (default: SQLite under $KERNSEARCH_HOME "
                          "or ~/.kernsearch; e.g. postgresql://... to share a study between machines)",
                          callback=not_empty)


def _pick_backend(backend: str, chip_name: str | None, verify: str = "finalists") -> tuple[str, Chip, str | None]:
    """``--backend auto``: metal on Apple GPUs, cuda on NVIDIA, else the model for --chip (or an M-series).

    A measurement belongs to the GPU it ran on, never to a named one (see ``backends.select_backend``).
    Returns (back-end name, Chip, a one-line note or None)."""
    from .backends import select_backend

    with _warnings_as_lines():  # an unknown detected chip warns on one line
        chosen = select_backend(backend, chip_name, verify=verify)
    if chosen.refusal:
        raise KernsearchError(chosen.refusal)
    return chosen.backend, chosen.chip, chosen.note


def _wide() -> Console:
    """Tables of configs are wide: in a pipe or file, do not squeeze them to 80 columns."""
    return out if out.is_terminal else Console(highlight=False, width=max(out.width, 200))


def _evidence_label(evidence: str, backend: str | None) -> str:
    """A replayed landscape was measured on the GPU that recorded it, never here: say so."""
    from .backends import evidence_label

    return evidence_label(evidence, backend)


def _fmt(value: Any, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def _top_table(rows: list[TrialSummary], evidence: str, winner: int | None, final: FinalRound | None = None,
               title: str = "top configs") -> Any:
    from .family._space import format_config

    checks = final.checks if final is not None else {}

    label = "time (predicted)" if evidence == Evidence.MODELED else "time"
    if _wide().width < 120:  # a narrow terminal: one block per config, the config wrapped between knobs
        from rich.console import Group
        from rich.padding import Padding
        from rich.text import Text

        blocks: list[Any] = [Text(title, style="italic")]
        for i, t in enumerate(rows, 1):
            err = _max_err(t, checks.get(t.number))
            blocks.append(Text(f"{i}{' *' if t.number == winner else ''}  trial {t.number}  {label} {t.time_ms:.4g} ms"
                               f"  spread {f'{t.spread:.1%}' if t.spread else '-'}  {_fmt(t.gflops, '.0f')} GFLOP/s"
                               f"  max err {_fmt(err, '.2g')}  {t.evidence}  verified: "
                               f"{_verified(t, final)}"))
            blocks.append(Padding(Text(format_config(t.config).replace(",", ", ")), (0, 0, 0, 4)))
        return Group(*blocks)
    table = Table("#", "trial", "config", f"{label} ms", "spread", "GFLOP/s", "% roofline", "max err",
                  "evidence", "verified", title=title, title_justify="left", box=None)
    for i, column in enumerate(table.columns):  # only the config wraps, and only between knobs
        column.no_wrap = i != 2
    table.columns[2].ratio = 1
    for i, t in enumerate(rows, 1):
        mark = " *" if t.number == winner else ""
        err = _max_err(t, checks.get(t.number))
        table.add_row(f"{i}{mark}", str(t.number), format_config(t.config).replace(",", ", "), f"{t.time_ms:.4g}",
                      f"{t.spread:.1%}" if t.spread else "-", _fmt(t.gflops, ".0f"), _fmt(t.peak_pct, ".1f"),
                      _fmt(err, ".2g"), t.evidence, _verified(t, final))
    return table


def _max_err(t: TrialSummary, check: FinalistCheck | None) -> float | None:
    """A row's error: the final round's interpreter check when it passed one, else the trial's own."""
    return check.max_abs_err if check is not None and check.max_abs_err is not None else t.max_abs_err


def _verified(t: TrialSummary, final: FinalRound | None) -> str:
    """Where a row was proven correct: in the final round (interpreter, or device at a ragged shape), else
    per trial."""
    return (final.verdict(t.number) if final is not None else None) or t.verified or "-"


def _finalist_line(number: int, check: FinalistCheck, final: FinalRound) -> str:
    """One finalist's verification: pass with its error, or FAIL with the reason and the detail's first line; the
    extra shapes the winner was also checked at."""
    detail = f": {escape(check.detail.splitlines()[0][:300])}" if check.detail else ""
    state = f"[green]pass[/] (max abs err {_fmt(check.max_abs_err, '.2g')})" if check.ok else \
        f"[red]FAIL ({check.reason})[/]{detail}"
    also = ""
    if check.also:
        sampled = check.threadgroups_checked
        also = " and " + ", ".join(check.also) + (f" ({sampled} threadgroups sampled at the tuned shape)"
                                                  if sampled else "")
    shape = check.shape or final.verify_shape or ()  # each finalist at the smallest shape valid for it
    return (f"trial {number} on the {final.verified_on or Verifier.INTERPRETER} at {'x'.join(map(str, shape))}"
            f"{escape(also)}: {state}")


def _final_lines(final: FinalRound | None, evidence: str) -> list[str]:
    lines: list[str] = []
    if final is not None and final.speedup is not None:
        beats = "" if final.beats_baseline else " [yellow](lead within the measured noise)[/]"
        spread = "" if final.modes else \
            f"range {_fmt(final.speedup_low, '.2f')}-{_fmt(final.speedup_high, '.2f')}; "
        lines.append(f"speedup over the baseline op: {final.speedup:.2f}x ({spread}baseline "
                     f"{_fmt(final.baseline_median_ms, '.4g')} ms){beats}")
        if final.modes:
            figures = {m: f.to_dict() for m, f in final.modes.items()}
            lines.append(f"as consumers call it: {modes_text(figures, tuple(final.modes))}")
    elif evidence == Evidence.MODELED:
        lines.append("speedup over the baseline op: not available (modeled times; the baseline is not modeled)")
    if final is None:
        return lines
    if final.lead_exceeds_noise is False:
        lines.append("[yellow]the winner's lead over the runner-up is within the measured noise[/]")
    lines += [_finalist_line(number, check, final) for number, check in final.checks.items()]
    if final.note:
        lines.append(final.note)
    return lines


@app.command()
def tune(family: str = typer.Argument(..., help=FAMILY_HELP), shape: str | None = ShapeOpt,
         dtype: str | None = DtypeOpt, chip_name: str | None = ChipOpt,
         trials: int | None = typer.Option(None, "--trials", help="configs the study should have evaluated "
                                              "(default: 150, or no limit with --time-budget)"),
         time_budget: str | None = typer.Option(None, "--time-budget", help="e.g. 90s, 10m, 1h"),
         patience: int | None = typer.Option(60, "--patience", help="stop after this many trials without "
                                                "a new best (0: never)"),
         backend: str = typer.Option("auto", "--backend", help="auto, metal, cuda, model or replay"),
         landscape: str | None = typer.Option(None, "--landscape", help="replay: a KernelTuner cache file"),
         sampler: SamplerChoice = typer.Option(
             SamplerChoice.default, "--sampler", help="default (auto when the chip's performance model ranks the "
             "family, else tpe), auto (valid configs only: the model's ranking, then a GP), forest (valid configs "
             "only: a tree surrogate; docs/search.md), hybrid (tpe, then forest), tpe, random or grid"),
         storage: str | None = StorageOpt,
         study: str | None = typer.Option(None, "--study", help="study name (default: family/chip/dtype/"
                                             "shape/backend)", callback=not_empty),
         seed: int = typer.Option(0, "--seed", help="sampler and input seed"),
         start: list[str] = typer.Option([], "--start", help="a config to evaluate first, e.g. PATH=h2,RT=2 (knobs "
                                         "not given keep the family default; repeatable)"),
         finalists: int = typer.Option(3, "--finalists", help="leaders re-measured (or verified) at the end"),
         verify_choice: VerifyChoice = typer.Option(
             VerifyChoice.finalists, "--verify", help="model back-end: verify all trials, the finalists or none on "
             "the CPU interpreter"),
         timeout: float = typer.Option(120.0, "--timeout", help="seconds per variant before it counts as hung"),
         publish: bool = typer.Option(False, "--publish", help="offer the winner to the artifact store "
                                      "(its regression gate decides)"),
         store: str | None = StoreOpt,
         margin: float = typer.Option(DEFAULT_MARGIN, "--margin", min=0.0, max=10.0,
                                      help="a measured winner beats the MLX op only if its speedup's lower bound "
                                      "exceeds 1 + margin"),
         as_json: bool = typer.Option(False, "--json", help="print a machine-readable result on stdout"),
         report: bool = typer.Option(False, "--report", help="write the study's HTML report at the end and "
                                     "print its path (see `kernsearch report`)")) -> None:
    """Search for the fastest correct variant of a family on a problem and chip."""
    from .studies._kernel import KernelVariants
    from .studies._storage import StudyKey

    trials = _tune_options(trials, time_budget, finalists, patience, timeout, seed)
    objective, note = _tune_objective(family, shape, dtype, chip_name, backend, landscape, seed, timeout,
                                      verify_choice.value)
    _refuse_before_searching(objective, storage, study, publish, store)
    if start:
        if not isinstance(objective, KernelVariants):
            raise KernsearchError("--start names configs of a family's variants; a replayed landscape has none")
        try:
            objective.start_with(start)
        except KernsearchError as exc:
            raise KernsearchError(f"--start: {exc}") from None
    if note:
        err.print(note, soft_wrap=True)
    key = StudyKey.of(objective.study_key)
    study, where = _study_place(objective, storage, study)
    err.print(f"tuning [bold]{key.family}[/] {key.shape} {key.dtype} on {key.chip} "
              f"({key.backend} back-end, {objective.evidence}){escape(where)}", soft_wrap=True)
    from ._progress import Display
    from ._steps import step
    from .studies._study import first_ctrl_c_stops

    with Display(err, quiet=as_json) as display, first_ctrl_c_stops() as ctrl_c:
        _say_if_the_model_cannot_rank(objective)  # ranking the space takes seconds: a step of the display
        result = _run_with_progress(display, objective, trials, time_budget, patience or None, sampler.value, seed,
                                    storage, study, finalists, ctrl_c.is_set)
        outcome = None
        if publish and isinstance(objective, KernelVariants) and result.best is not None \
                and not result.stop.reason.by_request:
            from .artifacts._artifacts import ArtifactStore

            with step("publishing the winner through the regression gate"):
                outcome = objective.publish(result, ArtifactStore(store), margin=margin)
    _print_tune(result, objective, margin, outcome, as_json)
    if report:
        from .studies._report import write_report

        with Display(err), step("writing the study's HTML report"):
            path = write_report(result.study_name, storage)
        err.print(f"report: {path}", soft_wrap=True, markup=False)
    if result.stop.reason.by_request:
        raise typer.Exit(130)
    if result.best is None or result.final is not None and result.final.winner is None:
        raise typer.Exit(1)  # the search ran, but no variant was correct: like a failed `verify`


def _tune_options(trials: int | None, time_budget: str | None, finalists: int, patience: int | None, timeout: float,
                  seed: int) -> int | None:
    """Every numeric option of `tune` checked (a bad one is one line, before anything starts); the trial budget
    (150 when neither it nor a time budget is given)."""
    from . import _options
    from .studies._study import parse_duration

    parse_duration(time_budget)
    if trials is None and time_budget is None:
        trials = 150
    _options.check(_options.Count, trials, "--trials")
    _options.check(_options.Count, finalists, "--finalists")
    _options.check(_options.Patience, patience, "--patience")
    _options.check(_options.Timeout, timeout, "--timeout")
    _options.check(_options.Seed, seed, "--seed")
    return trials


def _tune_objective(family: str, shape: str | None, dtype: str | None, chip_name: str | None, backend: str,
                    landscape: str | None, seed: int, timeout: float, verify: str) -> tuple[Objective, str | None]:
    """What `tune` searches (a family's variants on the chosen back-end and chip, or a replayed landscape) and the
    note it says first."""
    from .backends import replays
    from .studies._storage import StudyKey

    if replays(backend) or landscape:
        from .studies._replay import Replay

        if not landscape:
            raise KernsearchError("--backend replay needs --landscape PATH (a KernelTuner cache file)")
        replay = Replay(landscape, seed=seed).objective(family)
        chip = StudyKey.of(replay.study_key).chip
        return replay, f"replaying {landscape}: recorded times measured on {chip}, not here"
    from .family._space import make_problem
    from .family._spec import load_family
    from .studies._objective import KernelObjective

    name, c, note = _pick_backend(backend, chip_name, verify)
    problem = make_problem(load_family(family), shape, dtype, c)
    return KernelObjective(problem, c, name, seed=seed, timeout=timeout, verify=verify), note


def _study_place(objective: Objective, storage: str | None, study: str | None) -> tuple[str | None, str]:
    """The study this run works in (another one where the named study's family changed since: said in a line) and
    what the first line says of it: a resumed study, where it lives, and that ``--trials`` counts all its trials."""
    if storage == ":memory:":
        return study, ""
    from .studies._storage import default_storage, redact
    from .studies._study import study_for

    place = study_for(objective, storage, study)
    if place.changed:
        _warn_line(place.changed)
    url = redact(storage or default_storage())
    if place.trials:
        return place.name, (f"; resuming study {place.name!r} ({place.trials} trials, counted by --trials) in "
                            f"{url}")
    return place.name, f"; new study {place.name!r} in {url}"


def _refuse_before_searching(objective: Objective, storage: str | None, study: str | None, publish: bool,
                             store: str | None = None) -> None:
    """What would fail after the search, refused before it (one line, before the banner): a corrupted storage, a
    study made for another problem, a publish that could not happen."""
    from .studies._kernel import KernelVariants

    if publish and not isinstance(objective, KernelVariants):
        raise KernsearchError("--publish needs a kernel family: replayed landscapes have no kernel to publish")
    if storage != ":memory:":
        from .studies._storage import check_storage
        from .studies._study import check_study

        check_storage(storage)
        check_study(objective, storage, study)
    if publish and isinstance(objective, KernelVariants):
        from .artifacts._artifacts import ArtifactStore

        why = objective.unpublishable()
        if why:  # nothing this search finds could be published: say so now, not after the search
            raise KernsearchError(f"--publish: {why}")
        ArtifactStore(store).check_writable()  # so is a store no publish could write (not after the search)


def _print_tune(result: StudyResult, objective: Objective, margin: float, outcome: PublishOutcome | None,
                as_json: bool) -> None:
    """The search's result: tables and the verdict, or (``--json``) the machine-readable form."""
    import json

    from .studies._storage import StudyKey
    from .studies._tune import verdict

    family = getattr(objective, "family", None)
    judged = verdict(result, StudyKey.of(objective.study_key), family.baseline_name if family else "the MLX op",
                     margin, tuple(family.consumer_modes) if family else None)
    if as_json:
        data = result.to_dict()
        data["winner"] = asdict_or_none(result.best)
        data["beats_baseline"] = judged.beats
        data["verdict"] = judged.text
        if outcome is not None:
            data["publish"] = {"published": outcome.published, "version": outcome.version,
                               "reason": outcome.reason, "key": outcome.key,
                               "bounds": _bounds_text(result) if outcome.published else None}
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
        return
    _print_result(result)
    out.print(judged.text, soft_wrap=True, markup=False)
    if outcome is not None:
        state = f"published as {outcome.version}" if outcome.published else "not published"
        bounds = f"; bounds: {_bounds_text(result)}" if outcome.published else ""
        out.print(f"artifact {outcome.key}: {state} ({outcome.reason}){bounds}", soft_wrap=True)


def _bounds_text(result: StudyResult) -> str:
    """Exactly which out-of-bounds checks the published winner passed (``BoundsChecks.text``)."""
    final, best = result.final, result.best
    check = final.checks.get(best.number) if final is not None and best is not None else None
    if check is None or check.bounds is None:
        return "no record of checks (a final round stored before they were recorded)"
    return check.bounds.text()


def _say_if_the_model_cannot_rank(objective: Objective) -> None:
    """A family the performance model predicts flat: one warning line before the search (``model_note``)."""
    from .studies._kernel import KernelVariants

    text = objective.model_note() if isinstance(objective, KernelVariants) else None
    if text:
        _warn_line(text)


def asdict_or_none(obj: Any) -> dict[str, Any] | None:
    from dataclasses import asdict

    return None if obj is None else asdict(obj)


def _run_with_progress(display: Display, objective: Objective, trials: int | None, time_budget: str | None,
                       patience: int | None, sampler: str, seed: int | None, storage: str | None, study: str | None,
                       finalists: int, stop: Callable[[], bool] | None = None) -> StudyResult:
    """The search as a step of ``display``: a bar on a terminal; through a pipe, a whole line for every new best
    and at least every few seconds (never cut at 80 columns). Trial numbers are the study's, as in the tables."""
    from ._progress import LINE_EVERY, seconds
    from ._steps import step
    from .family._space import format_config
    from .studies._study import run_study

    state: dict[str, float | None] = {"best": None}
    of = trials if trials is not None else "-"
    with step("searching (configs evaluated)", total=trials) as search:
        def show(p: ProgressInfo) -> None:
            search.estimate(p.remaining_s)
            search.advance(p.done)
            best = (f"best trial {p.best.number}: {p.best.time_ms:.4g} ms {format_config(p.best.config)}" if p.best
                    else "no correct variant yet")
            fails = ", ".join(f"{k} {v}" for k, v in p.failures.most_common()) or "none"
            versus = f" ({p.speedup:.2f}x the baseline)" if p.speedup else ""
            display.status(search, f"{best}{versus} · failed: {fails}")
            better = p.best is not None and (state["best"] is None or p.best.time_ms < state["best"])
            if p.best is not None:
                state["best"] = p.best.time_ms
            if display.live or not (better or display.quiet_for() >= LINE_EVERY or p.done == trials):
                return
            left = f", ~{seconds(p.remaining_s)} left" if p.remaining_s is not None else ""
            display.line(f"{p.done}/{of} configs evaluated ({seconds(p.elapsed_s)}{left}): {best}{versus} · "
                         f"failed: {fails}")

        return run_study(objective, trials=trials, time_budget=time_budget, patience=patience, sampler=sampler,
                         seed=seed, storage=storage, study_name=study, finalists=finalists, progress=show, stop=stop)


def _print_result(result: StudyResult) -> None:
    from .family._space import format_config

    fails = ", ".join(f"{k} {v}" for k, v in result.failures.most_common()) or "none"
    out.print(f"study [bold]{result.study_name}[/] · {result.evaluated} configs evaluated · failed: {fails} · "
              f"{result.invalid} invalid proposals rejected before compiling · {result.elapsed_s:.1f} s · "
              f"{escape(result.stop_reason)}", soft_wrap=True)
    winner = result.final.winner if result.final is not None else result.best.number if result.best else None
    if result.top:
        _wide().print(_top_table(result.top, result.evidence, winner, result.final))
    for line in _final_lines(result.final, result.evidence):
        out.print(line, soft_wrap=True)
    if result.best is None or winner is None:
        out.print("[red]no correct variant found[/]")
        return
    out.print(f"winner: trial {result.best.number} [bold]{format_config(result.best.config)}[/] "
              f"{result.best.time_ms:.4g} ms ({_evidence_label(result.evidence, result.backend)})", soft_wrap=True)


@app.command()
def studies(storage: str | None = StorageOpt) -> None:
    """List the stored studies: name, configs evaluated (as `tune` counts), best time and its evidence kind."""
    import optuna

    from .studies._storage import check_storage
    from .studies._study import EVALUATED

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summaries = optuna.get_all_study_summaries(check_storage(storage))
    if not summaries:
        out.print("no studies stored yet (run `kernsearch tune FAMILY`)")
        return
    store = check_storage(storage)
    table = Table("study", "configs", "best ms", "evidence", "started", box=None)
    table.columns[0].no_wrap = True
    for s in sorted(summaries, key=lambda s: s.study_name):
        best = s.best_trial.value if s.best_trial is not None else None
        started = s.datetime_start.strftime("%Y-%m-%d %H:%M") if s.datetime_start else "-"
        trials = optuna.load_study(study_name=s.study_name, storage=store).get_trials(deepcopy=False)
        evaluated = sum(t.user_attrs.get("status") in EVALUATED for t in trials)  # as `tune` counts
        table.add_row(s.study_name, str(evaluated), _fmt(best, ".4g"),
                      _evidence_label(str(s.user_attrs.get("evidence", "?")), s.user_attrs.get("backend")),
                      started)
    _wide().print(table)


@app.command()
def show(study: str = typer.Argument(..., help="study name (see `kernsearch studies`)"),
         storage: str | None = StorageOpt, top: int = typer.Option(10, "--top", help="rows of the table"),
         as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """One study: what it tuned, trials by outcome, failures by reason, the top configs and the winner."""
    import json
    from collections import Counter

    import optuna

    from . import _options
    from .studies._storage import check_storage
    from .studies._study import _top

    _options.check(_options.Rows, top, "--top")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = check_storage(storage)
    names = [s.study_name for s in optuna.get_all_study_summaries(store)]
    if study not in names:
        raise KernsearchError(f"no study {study!r} in this storage (see `kernsearch studies`)")
    s = optuna.load_study(study_name=study, storage=store)
    trials = s.get_trials(deepcopy=False)
    status = Counter(str(t.user_attrs.get("status", TrialStatus.RUNNING)) for t in trials)
    reasons = Counter(t.user_attrs.get("failure", {}).get("reason", "?") for t in trials
                      if t.user_attrs.get("status") == TrialStatus.FAILED)
    rows = _top(s, top)
    attrs = s.user_attrs
    final = FinalRound.from_dict(attrs.get("final"))
    if as_json:
        from dataclasses import asdict

        sys.stdout.write(json.dumps({"study": study, **attrs, "status": dict(status), "failures": dict(reasons),
                                     "top": [asdict(r) for r in rows]}, indent=2, default=str) + "\n")
        return
    evidence = str(attrs.get("evidence", "?"))
    out.print(f"[bold]{study}[/]: {attrs.get('family')} {attrs.get('shape')} {attrs.get('dtype')} on "
              f"{attrs.get('chip')} ({attrs.get('backend')} back-end, "
              f"{_evidence_label(evidence, attrs.get('backend'))})", soft_wrap=True)
    out.print(_trial_counts(status, reasons), soft_wrap=True)
    if attrs.get("cannot_rank"):
        out.print(f"[yellow]{escape(str(attrs['cannot_rank']))}[/]", soft_wrap=True)
    if rows:
        _wide().print(_top_table(rows, evidence, final.winner if final is not None else None, final))
    for line in _final_lines(final, evidence):
        out.print(line, soft_wrap=True)


def _trial_counts(status: Any, reasons: Any) -> str:
    """Counted as `tune` counts: configs evaluated (ok + failed); proposals that ran nothing said apart."""
    ok, failed = status.get(TrialStatus.OK, 0), status.get(TrialStatus.FAILED, 0)
    text = f"configs evaluated: {ok + failed} ({ok} ok, {failed} failed"
    text += (": " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()) + ")") if reasons else ")"
    notrun = []
    if status.get(TrialStatus.KNOWN):
        notrun.append(f"{status[TrialStatus.KNOWN]} repeats of evaluated configs (answered from the study, not run "
                      "again)")
    if status.get(TrialStatus.INVALID):
        notrun.append(f"{status[TrialStatus.INVALID]} invalid (rejected by a constraint before compiling)")
    others = [f"{k} {v}" for k, v in status.most_common()
              if k not in (TrialStatus.OK, TrialStatus.FAILED, TrialStatus.KNOWN, TrialStatus.INVALID)]
    if notrun:
        text += " · proposals not run: " + ", ".join(notrun)
    if others:
        text += " · other trials: " + ", ".join(others)
    return text


@app.command("report")
def report_cmd(study: str = typer.Argument(..., help="study name (see `kernsearch studies`)"),
               storage: str | None = StorageOpt,
               out_file: str | None = typer.Option(None, "--out", "-o", help="HTML file to write (default: "
                                                      "reports/<study>.html under $KERNSEARCH_HOME or ~/.kernsearch)")
               ) -> None:
    """Write one study as a self-contained HTML page with plots (opens offline) and print its path."""
    from ._progress import Display
    from ._steps import step
    from .studies._history import load_history
    from .studies._report import report_path, write_report

    history = load_history(study, storage)  # a bad study, storage or --out is one line, before any progress
    report_path(study, out_file)
    with Display(err), step(f"writing the report of {study}"):
        path = write_report(study, storage, out_file, history=history)
    out.print(str(path), soft_wrap=True, markup=False)


@app.command()
def dashboard(storage: str | None = StorageOpt,
              host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
              port: int = typer.Option(8080, "--port", min=1, max=65535, help="port to listen on")) -> None:
    """Browse the stored studies in optuna-dashboard (history, importances, trials' attributes); Ctrl-C stops."""
    from .studies._storage import default_storage, make_storage, redact

    try:
        from optuna_dashboard import run_server  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise KernsearchError("optuna-dashboard is not installed: pip install optuna-dashboard") from None
    import os
    import signal

    def stop(signum: int, frame: Any) -> None:  # SIGTERM (a service manager, kill): stop at once
        # (an exception raised here mid-request is swallowed by wsgiref's handler and the server goes on);
        # the dashboard only reads and answers: nothing is left half-written.
        os._exit(0)

    store = make_storage(storage)
    _check_listen(host, port)  # before the banner: a bad address is one line, not the server's start-up and then it
    signal.signal(signal.SIGTERM, stop)
    err.print(f"optuna-dashboard on {redact(storage or default_storage())}: open http://{host}:{port}/ (Ctrl-C stops)",
              soft_wrap=True, markup=False)
    try:
        run_server(store, host=host, port=port)
    except OSError as exc:
        raise KernsearchError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        pass


def _check_listen(host: str, port: int) -> None:
    """One line if ``host:port`` cannot be listened on (unknown name, foreign address, port taken)."""
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
            probe.bind(address)
    except (OSError, ValueError, UnicodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise KernsearchError(f"cannot listen on {host}:{port}: {detail}") from None


@app.command()
def predict(family: str = typer.Argument(..., help=FAMILY_HELP),
            config: str | None = typer.Option(None, "--config", help="KNOB=VALUE,... (others: the default)"),
            shape: str | None = ShapeOpt, dtype: str | None = DtypeOpt,
            chip_name: str | None = typer.Option(None, "--chip", help="chip to predict for (default: the GPU "
                                                    "here, else M2 Max, as every command)", callback=not_empty),
            as_json: bool = typer.Option(False, "--json", help="print the breakdown as JSON")) -> None:
    """Predict one variant's time with the performance model: modeled, never a measurement."""
    import json

    from .backends import PREDICTOR, get_backend

    _, c, problem, sp = problem_and_space(family, shape, dtype, chip_name)
    cfg = sp.validate(sp.parse_config(config))
    b = get_backend(PREDICTOR, chip=c).breakdown(sp, cfg)
    if as_json:
        sys.stdout.write(json.dumps({"config": cfg, **b}) + "\n")
        return
    from .studies._kernel import roofline, roofline_pct

    pct, limit = roofline_pct(c, problem, b["time_ms"]), roofline(c, problem)[1]
    out.print(f"[bold]{problem.family.name}[/] {problem.shape_text} {problem.dtype} on {c.name}: "
              f"[bold]{b['time_ms']:.4g} ms modeled[/] (a prediction, not a measurement), "
              f"{b['predicted_tflops']:.3g} TFLOP/s, {_fmt(pct, '.0f')} % of the roofline ({limit}), "
              f"bound: {b['bound']}")
    for key, value in b.items():
        if key not in ("evidence", "chip", "time_ms", "bound"):
            out.print(f"  {key:<30}{value:.4g}" if isinstance(value, float) else f"  {key:<30}{value}")


def _error_line(message: str) -> None:
    """One line on stderr, whatever the message holds (newlines of user text are flattened; the password of a
    URL in it, e.g. a storage a driver names, is masked)."""
    from .studies._storage import mask_passwords

    err.print(f"[red]error:[/] {escape(mask_passwords(' '.join(str(message).split())))}", soft_wrap=True)


def _flag_value_hint(args: list[str] | None, message: str) -> str:
    """``--publish true``: the value is left over as an extra argument; say that flags take none."""
    words = list(sys.argv[1:] if args is None else args)
    if "unexpected extra argument" not in message:
        return ""
    for flag, value in zip(words, words[1:]):
        if flag.startswith("--") and "=" not in flag and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return f": {flag} is a flag and takes no value (give {flag} alone, or leave it out)"
    return ""


def main(args: list[str] | None = None) -> None:
    """Console-script entry point: usage and user errors → one line on stderr, exit 2."""
    import importlib

    try:  # typer >= 0.20 vendors its own click
        click: Any = importlib.import_module("typer._click")
    except ImportError:  # pragma: no cover
        click = importlib.import_module("click")

    try:
        rc = app(args=args, prog_name="kernsearch", standalone_mode=False)
    except getattr(click.exceptions, "NoArgsIsHelpError", ()) as exc:
        out.print(exc.ctx.get_help() if exc.ctx else "", soft_wrap=True, markup=False, highlight=False)
        sys.exit(0)
    except click.exceptions.UsageError as exc:
        command = f"{exc.ctx.command_path}: " if exc.ctx is not None else ""
        _error_line(f"{command}{exc.format_message()}{_flag_value_hint(args, exc.format_message())} (see --help)")
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        _error_line("interrupted")
        sys.exit(130)
    except click.exceptions.ClickException as exc:
        _error_line(exc.format_message())
        sys.exit(exc.exit_code or 2)
    except KernsearchError as exc:
        _error_line(str(exc))
        sys.exit(exc.exit_code)
    except RecursionError:
        _error_line("input nested too deeply")
        sys.exit(2)
    except Exception as exc:  # noqa: BLE001 - only storage failures are turned into a line; others stay bugs
        from .studies._storage import storage_errors

        if not isinstance(exc, storage_errors()):
            raise
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        _error_line(f"the study storage cannot be used ({type(exc).__name__}): {first}")
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
