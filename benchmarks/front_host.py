"""Host cost of the exported package's fronts (``_fronts._front4`` ... ``_front_residual``): the working tree's
against another revision's, per call, on a hit (the call's weights seen before, its activations' shapes planned).

Each front is built over the same dispatcher state (its mode cell, its table, its general path), the revision's
``_fronts.py`` loaded beside the working tree's; they are called in turn, shuffled every round, and each round's
per-call time is a sample: the median, the quartiles and the least are printed, and the median's difference from
the revision's. Two modes: ``planned`` (no kernel can run here: the op planned per shape, no opt-in read, dtypes
not filed) and ``kernels`` (the mode cell set so: the switch read, dtypes filed); two ops: ``stub`` (the plan
replaced by ``itertools.chain``, a C call of the same form: the front's own cost) and ``op`` (the planned MLX
op, building its graph on MLX's CPU back-end, nothing evaluated).

    .venv/bin/python benchmarks/front_host.py --before main [--rounds 100] [--calls 300]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

FAMILIES = ("qmatvec", "rmsnorm_qmatvec", "swiglu_qmatvec", "rmsnorm_swiglu_qmatvec", "qmatvec_residual")
SHAPE = (1, 256, 256, 32, 4)


def revision_fronts(rev: str, live: Any) -> Any:
    """``_fronts.py`` of ``rev`` as a module sharing the live one's modes and 'not given' marker."""
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:search/exporting/runtime/_fronts.py"],
                          check=True, capture_output=True, text=True).stdout
    mod = types.ModuleType(f"_fronts_{rev}")
    exec(compile(text, mod.__name__, "exec"), mod.__dict__)  # noqa: S102 - a revision of this repository
    for name in ("_OP", "_OP_PLANNED", "_KERNELS", "_NO", "_ENV", "_ENV_KEY"):
        setattr(mod, name, getattr(live, name))
    return mod


def cells(fn: Any) -> dict[str, Any]:
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))


def samples(fns: dict[str, Any], args: list[Any], rounds: int, calls: int) -> dict[str, list[float]]:
    """ns per call of each of ``fns`` (called with ``args``), a sample a round, the order shuffled every round."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    order, rng, loop = list(fns), random.Random(0), range(calls)
    for _ in range(rounds):
        rng.shuffle(order)
        for k in order:
            f = fns[k]
            t0 = time.perf_counter()
            for _ in loop:
                f(*args)
            out[k].append((time.perf_counter() - t0) / calls * 1e9)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="main", help="the revision whose fronts are compared (default main)")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--modes", default="planned,kernels")
    ap.add_argument("--ops", default="stub,op")
    a = ap.parse_args(argv)
    import mlx.core as mx
    from gpu_consumer import problem_arrays

    from kernsearch import ArtifactStore, export
    from kernsearch.exporting.runtime import _fronts, _runtime

    mx.set_default_device(mx.cpu)
    families = [f for f in a.families.split(",") if f]
    result = export(families, Path(tempfile.mkdtemp(prefix="front_host_")) / "export", ArtifactStore(ROOT / "artifacts"),
                    package="ks_front_host", version="0.0.1")
    before = revision_fronts(a.before, _fronts)
    print(f"# ns per call, {a.rounds} rounds of {a.calls} calls, shuffled every round: median [p25-p75] least; "
          f"delta: median minus {a.before}'s median", flush=True)
    for mode in a.modes.split(","):
        d = _runtime.Dispatcher(result.source_dir / "ks_front_host")
        for family in families:
            args = list(problem_arrays(family, SHAPE, "float32", 1)[0][0])
            if mode == "kernels":
                d._how_cell(family)[:] = [_fronts._KERNELS, None, ()]
            after = d.function(family)
            mx.eval(after(*args))  # planned and filed under the weights
            entry = next(iter(d._by_weights[family].values()))
            assert (entry[6] is None) == (mode == "planned")
            by_name = {make.__name__: k for k, make in _fronts._FRONTS.items()}
            c = cells(after)
            fns = {a.before: before._FRONTS[by_name[after.__qualname__.split(".")[0]]](
                c["how"], c["table"], c["general"], c["env"], c["env_key"]), "tree": after}
            plan = entry[2]
            for op in a.ops.split(","):
                entry[2] = itertools.chain if op == "stub" else plan
                if op == "stub":  # every front hits: the stub's result, not the general path's
                    assert all(isinstance(f(*args), itertools.chain) for f in fns.values())
                found = samples(fns, args, a.rounds, a.calls)
                base = statistics.median(found[a.before])
                for name, v in found.items():
                    q = statistics.quantiles(v, n=4)
                    m = statistics.median(v)
                    print(f"{mode:8s} {op:4s} {family:23s} {name:8s} {m:7.0f} [{q[0]:6.0f}-{q[2]:6.0f}] least "
                          f"{min(v):6.0f}  delta {m - base:+5.0f} ({(m - base) / base * 100:+.1f} %)", flush=True)
            entry[2] = plan
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
