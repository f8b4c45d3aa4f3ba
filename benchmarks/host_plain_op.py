"""Host time of one call of the judge's op (graph building only, nothing evaluated), on MLX's CPU back-end: the op as
the final round writes it (``judge_op``: the plan written out as one function), the plan walked by a loop (the op
before the thirteenth session, kept here as it was), and the same line written by hand. Each a function of the
family's input arrays, called many times in turn; the best of several repeats, µs a call.

    python3 benchmarks/host_plain_op.py [--family qmatvec_residual] [--shape 1,4096,4096,512,64]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def looped(planner: Any) -> Callable[..., Any]:
    """The plan walked as the op did until the thirteenth session: a slot list, a loop over the steps, constants
    bound with ``functools.partial``."""
    steps = []
    for fn, args, named in planner.steps:
        if any(not slot for slot, _ in args):
            raise SystemExit("a constant among the positional arguments: not covered by this probe")
        bound = functools.partial(fn, **{k: v for k, (_, v) in named}) if named else fn
        steps.append((bound, tuple(v for _, v in args)))

    def run(*arrays: Any) -> Any:
        slots = list(arrays)
        get = slots.__getitem__
        for fn, at in steps:
            slots.append(fn(*map(get, at)))
        value = slots[-1]
        return tuple(value) if isinstance(value, list) else value

    return run


def best(fn: Callable[..., Any], arrays: list[Any], n: int = 20000, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*arrays)
        times.append((time.perf_counter() - t0) / n * 1e6)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="qmatvec_residual", choices=["qmatvec_residual"])
    ap.add_argument("--shape", default="1,4096,4096,512,64")
    a = ap.parse_args(argv)
    import mlx.core as mx

    from kernsearch import load_family, make_problem
    from kernsearch.backends._mlx_base import _TRAILING, judge_op, mlx_namespace
    from kernsearch.evaluation._plain_op import _Planner
    from kernsearch.evaluation._verify import make_inputs
    from kernsearch.family._tree import expr_tree

    fam = load_family(a.family)
    problem = make_problem(fam, a.shape, "float16")
    inputs = make_inputs(problem, 1)
    arrays = [mx.array(inputs[t.name]).astype(getattr(mx, t.resolved_dtype("float16"))) for t in fam.inputs]
    planner = _Planner([t.name for t in fam.inputs], {**problem.dims, **fam.param_values},
                       {**mlx_namespace(), "quantized_matmul": mx.quantized_matmul}, _TRAILING)
    planner.source(expr_tree(fam.judged_baseline))
    _, _, k, kw, ng = problem.dims.values()

    def by_hand(X: Any, W: Any, S: Any, Bq: Any, R: Any) -> Any:  # noqa: N803 - the family's input names
        return R + mx.quantized_matmul(X, W, S, Bq, transpose=True, group_size=k // ng, bits=32 * kw // k)

    forms = {"written (judge_op)": judge_op(fam, problem), "looped (before)": looped(planner), "by hand": by_hand}
    for f in forms.values():
        mx.eval(f(*arrays))
    for turn in range(3):
        print(f"round {turn + 1}: " + ", ".join(f"{name} {best(f, arrays):.2f} us" for name, f in forms.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
