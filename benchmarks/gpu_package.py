"""The exported package against ``mx.matmul``, as a consumer gets it: export, install, call, time.

One command on a GPU machine (MLX with its CUDA back-end and NumPy; no package index needed; run from the
repository root)::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_package.py --out OUTDIR

exports the wheel of ``artifacts/`` (``kernsearch export``), installs it with ``pip install --no-deps
--no-index --target`` into a fresh folder (falling back to unpacking the wheel, which is what pip does for a
pure wheel, where this Python has no pip), imports it from there, and for each row of the sweep (shape and
dtype, at least the seven calls of issue 11) prints what the package chose (``gemm.explain``), checks the
package's result against ``mx.matmul``, then times the package call and ``mx.matmul`` on the same inputs,
interleaved round by round. The table gives the package's speed as a percentage of ``mx.matmul`` (median
ratio) with its noise range (op p10 / package p90 .. op p90 / package p10); a row whose whole range lies
below 100 % is slower than the op beyond the measured noise and is marked ``SLOWER``. The script exits 1 if
any row is. ``OUTDIR/gpu_package.json`` keeps every row, its timings and the package's reasons.

``--dry-run`` runs the same export, install and import here (no GPU needed; MLX may be missing), prints
what the package would choose on ``--chip`` (default H100) for every row, and times the call path on
small CPU shapes only to exercise it (no figure from it is a GPU figure).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout: PYTHONPATH may also hold an installed kernsearch

PACKAGE = "kernsearch_kernels"
#: (M, N, K, dtype): the seven calls of issue 11's table first, then neighbours that probe the shape bound.
ROWS: list[tuple[int, int, int, str]] = [
    (4096, 4096, 4096, "float16"),
    (16, 4096, 4096, "float16"),
    (2048, 2048, 2048, "float16"),
    (3000, 5000, 2000, "float16"),
    (8192, 8192, 8192, "float16"),
    (1, 4096, 4096, "float16"),
    (4096, 4096, 4096, "bfloat16"),
    (1024, 1024, 1024, "float32"),
    (8, 4096, 4096, "float16"),
    (32, 4096, 4096, "float16"),
    (4096, 4096, 4096, "float32"),
    (512, 512, 512, "float16"),
]
DRY_SHAPE = (64, 48, 32)
#: The control row's shape: the smallest GPU time in the sweep, where noise is largest.
CONTROL = (8, 4096, 4096)


@dataclass
class Row:
    shape: str
    dtype: str
    level: str
    chose: str
    why: list[str]
    max_rel_error: float | None = None
    package_ms: float | None = None
    op_ms: float | None = None
    percent: float | None = None
    percent_low: float | None = None
    percent_high: float | None = None
    slower_beyond_noise: bool = False
    samples_package_ms: list[float] = field(default_factory=list)
    samples_op_ms: list[float] = field(default_factory=list)


# -- export and install ----------------------------------------------------------------------------------

def export_wheel(store_root: Path, work: Path) -> Path:
    from kernsearch import ArtifactStore, export

    result = export(["gemm"], work / "export", ArtifactStore(store_root), package=PACKAGE, version="0.0.1")
    print(f"exported {result.wheel.name}: {len(result.artifacts)} artifact(s) "
          f"({', '.join(result.artifacts) or 'none'})")
    for note in result.notes:
        print(f"  note: {note}")
    return Path(result.wheel)


def install(wheel: Path, target: Path) -> str:
    """Install the wheel into ``target`` the way a consumer would; returns how."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
           str(wheel)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        proc = None
        err = str(exc)
    else:
        err = (proc.stderr or proc.stdout).strip().splitlines()[-1:] if proc.returncode else ""
    if proc is not None and proc.returncode == 0:
        return "pip install --no-deps --no-index --target"
    print(f"  pip could not install the wheel ({err or 'no pip'}); unpacking it (a pure wheel's install)")
    shutil.rmtree(target, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    return "wheel unpacked (no pip)"


def import_installed(target: Path) -> Any:
    sys.path.insert(0, str(target))
    pkg = importlib.import_module(PACKAGE)
    where = Path(pkg.__file__).resolve()
    if target.resolve() not in where.parents:
        raise SystemExit(f"imported {PACKAGE} from {where}, not from the install folder {target}")
    return pkg


# -- timing ----------------------------------------------------------------------------------------------

def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def interleaved(fns: list[Any], rounds: int, min_batch_ms: float) -> list[list[float]]:
    """Per-call times (ms) of each function, one batch each per round, in turn, on the same inputs."""
    import mlx.core as mx

    def batch(fn: Any, reps: int) -> float:
        mx.synchronize()
        t0 = time.perf_counter()
        outs = [fn() for _ in range(reps)]
        mx.eval(*outs)
        mx.synchronize()
        return (time.perf_counter() - t0) * 1e3

    ones = []
    for fn in fns:  # warm up (compiles), then size a batch to at least min_batch_ms
        batch(fn, 2)
        ones.append(max(batch(fn, 1), 1e-3))
    # One batch size for every function: the fixed cost of a batch (eval, synchronize) is then spread over
    # the same number of calls, so it cannot favour one side.
    reps = [max(1, min(1000, int(min_batch_ms / min(ones)) + 1))] * len(fns)
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        order = range(len(fns)) if r % 2 == 0 else reversed(range(len(fns)))  # neither always goes first
        for i in order:
            times[i].append(batch(fns[i], reps[i]) / reps[i])
    return times


def measure_row(pkg: Any, m: int, n: int, k: int, dtype: str, rounds: int, min_batch_ms: float,
                chip: str | None, time_it: bool, run_shape: tuple[int, int, int] | None = None) -> Row:
    import mlx.core as mx

    decision = pkg.gemm.explain(_Shaped((m, k), dtype), _Shaped((k, n), dtype), chip=chip)
    chose = decision.artifact or ("default config" if decision.entry else "plain MLX op")
    row = Row(f"{m}x{n}x{k}", dtype, decision.level, chose, list(decision.why))
    if not time_it:
        return row
    rm, rn, rk = run_shape or (m, n, k)
    dt = getattr(mx, dtype)
    mx.random.seed(7)
    a = (mx.random.normal((rm, rk)) / rk ** 0.5).astype(dt)
    b = mx.random.normal((rk, rn)).astype(dt)
    got, want = pkg.gemm(a, b).astype(mx.float32), mx.matmul(a, b).astype(mx.float32)
    scale = float(mx.max(mx.abs(want)).item()) or 1.0
    row.max_rel_error = float(mx.max(mx.abs(got - want)).item()) / scale
    pk, op = interleaved([lambda: pkg.gemm(a, b), lambda: mx.matmul(a, b)], rounds, min_batch_ms)
    _judge(row, pk, op)
    return row


def _judge(row: Row, pk: list[float], op: list[float]) -> None:
    row.samples_package_ms, row.samples_op_ms = pk, op
    row.package_ms, row.op_ms = percentile(pk, 0.5), percentile(op, 0.5)
    row.percent = 100 * row.op_ms / row.package_ms
    row.percent_low = 100 * percentile(op, 0.1) / percentile(pk, 0.9)
    row.percent_high = 100 * percentile(op, 0.9) / percentile(pk, 0.1)
    row.slower_beyond_noise = row.percent_high < 100


def measure_control(m: int, n: int, k: int, rounds: int, min_batch_ms: float) -> Row:
    """``mx.matmul`` against itself, timed like a package row: how far from 100 % the method alone reads."""
    import mlx.core as mx

    mx.random.seed(7)
    a = mx.random.normal((m, k)).astype(mx.float16)
    b = mx.random.normal((k, n)).astype(mx.float16)
    row = Row(f"{m}x{n}x{k}", "float16", "control", "mx.matmul", [])
    first, second = interleaved([lambda: mx.matmul(a, b), lambda: mx.matmul(a, b)], rounds, min_batch_ms)
    _judge(row, first, second)
    return row


def host_call_us(pkg: Any, calls: int = 20000) -> dict[str, float]:
    """Microseconds per call spent on the host building the graph (nothing evaluated): what the package's
    dispatch adds to every call, best of 7."""
    import timeit

    import mlx.core as mx

    a, b = mx.ones((1, 64), dtype=mx.float16), mx.ones((64, 64), dtype=mx.float16)
    pkg.gemm(a, b)  # planned once
    cost = {name: min(timeit.repeat(lambda f=f: f(a, b), number=calls, repeat=7)) / calls * 1e6  # type: ignore[misc]
            for name, f in (("package", pkg.gemm), ("op", mx.matmul))}
    return cost


@dataclass
class _Shaped:
    """Shape and dtype of an array, for ``explain`` without building the array."""

    shape: tuple[int, int]
    dtype: str


# -- main ------------------------------------------------------------------------------------------------

def table(rows: list[Row], timed: bool) -> str:
    head = "| call | package chose | % of `mx.matmul` speed (noise range) | max rel. error |"
    lines = [head, "|---|---|---|---|"]
    for r in rows:
        what = f"{r.level}: {r.chose}" if r.chose not in ("plain MLX op",) else "plain MLX op"
        if timed and r.percent is not None:
            pct = f"{r.percent:.0f} % ({r.percent_low:.0f}-{r.percent_high:.0f})" + (
                " **SLOWER**" if r.slower_beyond_noise else "")
            err = f"{r.max_rel_error:.1e}"
        else:
            pct, err = "not timed", "-"
        lines.append(f"| gemm {r.shape} {r.dtype} | {what} | {pct} | {err} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu_package.json")
    ap.add_argument("--store", type=Path, default=ROOT / "artifacts", help="artifact store to export")
    ap.add_argument("--rounds", type=int, default=41, help="interleaved rounds per row")
    ap.add_argument("--min-batch-ms", type=float, default=20.0, help="each timed batch lasts at least this")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: decisions for --chip, CPU call path only")
    ap.add_argument("--chip", default=None, help="chip the decisions are made for (dry run: H100)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    chip = args.chip or ("H100" if args.dry_run else None)

    with tempfile.TemporaryDirectory(prefix="gpu_package_") as tmp:
        work = Path(tmp)
        wheel = export_wheel(args.store, work)
        how = install(wheel, work / "site")
        pkg = import_installed(work / "site")
        print(f"installed with {how}; imported {PACKAGE} {pkg.__version__} from {Path(pkg.__file__).parent}")
        env: dict[str, Any] = {"python": platform.python_version(), "dry_run": args.dry_run, "install": how}
        try:
            import mlx.core as mx

            env["mlx"] = mx.__version__
            env["device"] = str(mx.default_device())
            env["device_info"] = {k: str(v) for k, v in dict(mx.device_info()).items()}
            have_mlx = True
        except Exception as exc:  # noqa: BLE001 - the dry run works without MLX
            env["mlx"] = f"unavailable: {exc}"
            have_mlx = False
        if not args.dry_run and (not have_mlx or "gpu" not in env["device"].lower()):
            print(f"no MLX GPU here ({env.get('device', env['mlx'])}): run with --dry-run", file=sys.stderr)
            return 2
        rounds = 3 if args.dry_run else args.rounds
        print(f"MLX {env['mlx']} on {env.get('device', '-')}; rounds={rounds}; decisions for "
              f"{chip or 'the running chip'}")

        rows = []
        for m, n, k, dtype in ROWS:
            row = measure_row(pkg, m, n, k, dtype, rounds, args.min_batch_ms,
                              chip, time_it=have_mlx, run_shape=DRY_SHAPE if args.dry_run else None)
            rows.append(row)
            timing = (f"{row.percent:.0f} % of mx.matmul ({row.percent_low:.0f}-{row.percent_high:.0f}), "
                      f"package {row.package_ms:.3f} ms, op {row.op_ms:.3f} ms, err {row.max_rel_error:.1e}"
                      if row.percent is not None else "not timed")
            if args.dry_run and row.percent is not None:
                timing += f" [CPU, at {'x'.join(map(str, DRY_SHAPE))}: exercises the path, not a GPU figure]"
            print(f"gemm {row.shape} {row.dtype}: {row.level} -> {row.chose}; {timing}")
            for line in row.why:
                print(f"    {line}")

        timed = have_mlx and not args.dry_run
        if have_mlx:
            env["host_call_us"] = host_call_us(pkg)
            print(f"host cost per call, graph building only (no eval), 1x64x64 float16 on "
                  f"{env.get('device', '-')}: package {env['host_call_us']['package']:.2f} us, "
                  f"mx.matmul {env['host_call_us']['op']:.2f} us")
        if timed:  # the method's own noise: mx.matmul timed against itself, as the package rows are
            m, n, k = CONTROL
            control = measure_control(m, n, k, rounds, args.min_batch_ms)
            env["control"] = asdict(control)
            print(f"control, mx.matmul against itself at {control.shape} float16: {control.percent:.0f} % "
                  f"({control.percent_low:.0f}-{control.percent_high:.0f})"
                  + (" **SLOWER**: the method itself reports a slowdown" if control.slower_beyond_noise else ""))
    print()
    print(table(rows, timed))
    slower = [r for r in rows if r.slower_beyond_noise]
    if timed:
        print()
        print(f"{len(slower)} of {len(rows)} rows slower than mx.matmul beyond the measured noise"
              + (": " + ", ".join(f"{r.shape} {r.dtype}" for r in slower) if slower else ""))
    out = {"when": datetime.now(UTC).isoformat(timespec="seconds"), "env": env, "chip": chip,
           "rows": [asdict(r) for r in rows], "seconds": round(time.monotonic() - t0, 1)}
    (args.out / "gpu_package.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out / 'gpu_package.json'} in {out['seconds']} s")
    return 1 if timed and slower else 0


if __name__ == "__main__":
    sys.exit(main())
