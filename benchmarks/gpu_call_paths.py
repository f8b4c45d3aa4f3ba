"""Issue 38: which call path separates the gate's figure for a decode artifact from `bench decode`'s — the four
pairings of the two kernel calls and the two op calls, timed in one process, as the gate's chain times them (32
dependent calls, the output fed as the next X and R, the gate's rotating copies of the weights):

- ``gate``: the kernel as the final round times it (``consumer_kernel``): until the thirteenth session the package's
  planned kernel call (``_runtime.kernel_call``) alone, since then that call behind the package's own bound front;
- ``bound``: the exported package's bound family (``FAMILY.bind(W, S, Bq)(X, R)``), what `bench decode` and a
  consumer call;
- ``judge``: the op as the gate writes it (``judge_op``: the spec's baseline expression, its constants bound; since
  the thirteenth session written out as one function of its calls);
- ``direct``: the op as `bench decode` writes it (``R + mx.quantized_matmul(X, W, S, Bq, transpose=True,
  group_size=G, bits=B)``).

    python3 benchmarks/gpu_call_paths.py --store /tmp/store --out $OUT [--family qmatvec_residual] [--m 1]

Prints µs a call (median of the rounds) for each and the four ratios op / kernel.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _paths(mx: Any, cuda: Any, pkg: Any, art: Any, chip: Any, rounds: int, n_calls: int) -> dict[str, Any]:
    """The four calls of one artifact timed in turn, each round a chain of ``n_calls``; µs a call and the ratios."""
    from kernsearch import load_family, make_problem
    from kernsearch.evaluation._chain import chained
    from kernsearch.evaluation._consumer import chain, input_sets

    fam = load_family(art.key.family)
    problem = make_problem(fam, ",".join(map(str, art.key.shape)), art.key.dtype, chip)
    sets = input_sets(problem, fam, chip, cuda, 7)
    link = cuda.consumer_link(fam)
    arrays = cuda._consumer_arrays(fam, problem, sets)
    names = [t.name for t in fam.inputs]
    iw, i_s, ib = names.index("W"), names.index("S"), names.index("Bq")
    binds = {id(row[iw]): getattr(pkg, art.key.family).bind(row[iw], row[i_s], row[ib]) for row in arrays}
    _, _, k, kw, ng = art.key.shape[:5]  # qmatvec_residual's dims: M, N, K, KW, NG
    group, bits = k // ng, 32 * kw // k

    def bound(*row: Any) -> Any:
        return binds[id(row[iw])](row[0], row[-1])

    def direct(*row: Any) -> Any:
        return row[-1] + mx.quantized_matmul(row[0], row[iw], row[i_s], row[ib], transpose=True, group_size=group,
                                             bits=bits)

    calls = {"gate": cuda.consumer_kernel(art.kernel, art.geometry, fam, problem, sets),
             "bound": chained(bound, arrays, link), "judge": cuda.consumer_op(fam, problem, sets),
             "direct": chained(direct, arrays, link)}
    for c in calls.values():
        mx.eval(chain(c, 0, n_calls))
    times: dict[str, list[float]] = {n: [] for n in calls}
    turn = 0
    for r in range(rounds):
        for n in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
            mx.synchronize()
            t0 = time.perf_counter()
            mx.eval(chain(calls[n], turn, n_calls))
            mx.synchronize()
            times[n].append((time.perf_counter() - t0) * 1e6 / n_calls)
            turn += n_calls
    med = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
    ratios = {f"{o}/{kk}": med[o] / med[kk] for o in ("judge", "direct") for kk in ("gate", "bound")}
    return {"family": art.key.family, "shape": list(art.key.shape), "sets": len(sets), "us": med, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--family", default="qmatvec_residual", choices=["qmatvec_residual"])
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=32)
    a = ap.parse_args(argv)
    import mlx.core as mx

    from kernsearch import ArtifactStore, get_backend
    from kernsearch.bench._run import import_package
    from kernsearch.hardware._chips import detect_chip

    chip = detect_chip()
    cuda = get_backend("cuda")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pkg = import_package(ArtifactStore(a.store), [a.family], Path(tmp))
        for art in ArtifactStore(a.store).current_artifacts():
            if art.key.family == a.family and art.key.shape[0] == a.m:
                rows.append(_paths(mx, cuda, pkg, art, chip, a.rounds, a.calls))
                print(json.dumps(rows[-1]), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"gpu_call_paths_{a.family}_m{a.m}.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
