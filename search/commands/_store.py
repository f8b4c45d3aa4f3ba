"""``artifacts list|show|verify|migrate|rejudge``, ``export`` and ``explain``: the versioned store and the package built
from it."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from .._console import out
from .._errors import not_empty
from .._rules import DEFAULT_MARGIN
from ._app import (
    FAMILY_HELP,
    DtypeOpt,
    ShapeOpt,
    StoreOpt,
    _warn_line,
    app,
    resolve_chip,
)

if TYPE_CHECKING:
    from ..artifacts._artifacts import ArtifactStore
    from ..artifacts._candidate import ArtifactKey
    from ..artifacts._manifest import Manifest


artifacts_app = typer.Typer(no_args_is_help=True, help="Published kernel versions and their evidence.")


app.add_typer(artifacts_app, name="artifacts")


KeyArg = typer.Argument(..., help="FAMILY/CHIP/DTYPE/SHAPE or FAMILY/CHIP/DTYPE/SHAPE/vN, as "
                                  "`kernsearch artifacts list` prints it")


@artifacts_app.command("list")
def artifacts_list(store: str | None = StoreOpt,
                   family: str | None = typer.Option(None, "--family", help="only this family"),
                   all_versions: bool = typer.Option(False, "--all", help="every version, not only the current"),
                   ) -> None:
    """Keys of the store with their current version, evidence and speed."""
    from ..artifacts._artifacts import ArtifactStore

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
    from ..artifacts._manifest import ArtifactError

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
    from ..artifacts._manifest import ArtifactError

    try:
        exists = st.root.exists() or st.root.is_symlink()
    except (OSError, ValueError):
        raise ArtifactError(f"--store {str(st.root)[:200]!r}: not a usable path") from None
    if exists and not st.root.is_dir():
        raise ArtifactError(f"--store {st.root}: not a folder (an artifact store is a folder)")


def _readable_pointer(st: ArtifactStore, key: ArtifactKey) -> bool:
    from ..artifacts._manifest import ArtifactError

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
    from ..artifacts._artifacts import ArtifactStore
    from ..artifacts._candidate import ArtifactKey

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
    from ..artifacts._artifacts import ArtifactStore
    from ..artifacts._manifest import ArtifactError

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
    from ..artifacts._artifacts import ArtifactStore
    from ..family._spec import load_family

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
    from ..artifacts._artifacts import ArtifactStore

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
    from ..artifacts._artifacts import ArtifactStore
    from ..exporting._export import export as build

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

    from ..artifacts._artifacts import ArtifactStore
    from ..exporting._export import export as build
    from ..exporting.runtime._runtime import Dispatcher
    from ..family._space import make_problem
    from ..family._spec import load_family

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

