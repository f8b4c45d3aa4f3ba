"""Issue 38: does `bench decode`'s link between calls decide its kernel rows? Each call of the step (M rows) timed
as `bench decode` times it (a chain over the 32 layers' weights, the package's bound call against the op), with the
next call's X made two ways in one process, rounds interleaved: ``view`` (the output flattened, its first M·K values,
reshaped: three view primitives a call, what `bench decode` did until the twelfth session) and ``self`` (the output
itself where it has X's shape, as the gate's link and a decode's residual stream feed it; else as ``view``).

    python3 benchmarks/gpu_link_ab.py --store /tmp/store --out $OUT [--m 1] [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def view_derive(mx: Any, y: Any, k: int) -> Any:
    """The link before the twelfth session: always a view (or the output repeated where it is too short)."""
    m, n = y.shape
    if n >= k:
        return y.reshape(-1)[: m * k].reshape(m, k)
    return mx.concatenate([y] * math.ceil(k / n), axis=1)[:, :k]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="a 2-layer 256/512 step (a check on the CPU)")
    a = ap.parse_args(argv)
    import mlx.core as mx

    from kernsearch import ArtifactStore
    from kernsearch.bench import _decode
    from kernsearch.bench._decode import KernelChains, interleaved, median
    from kernsearch.bench._run import fused_families, import_package
    from kernsearch.bench._step import StepShape, bind_layer, build_layers

    shape = StepShape(hidden=256, ffn=512, layers=2, dtype="float32") if a.small else StepShape()
    families = fused_families(shape)
    self_derive = _decode.derive
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        pkg = import_package(ArtifactStore(a.store), list(families), Path(tmp))
        layers = build_layers(mx, shape, 0, lambda s: None)
        bound = [bind_layer(pkg, families, lay, shape.all_calls()) for lay in layers]
        chains = KernelChains(mx, shape, layers, bound, None, None, None)
        for call in shape.all_calls():
            base = chains.forms(call, a.m)

            def with_link(fn: Any, link: Any) -> Any:
                def run() -> Any:
                    _decode.derive = link
                    try:
                        return fn()
                    finally:
                        _decode.derive = self_derive
                return run

            forms = {f"{name}_{tag}": with_link(base[name], link) for tag, link in (("view", view_derive),
                                                                                   ("self", self_derive))
                     for name in ("op", "package")}
            t = interleaved(mx, forms, a.rounds)
            us = {k: 1000.0 * median(v) / len(layers) for k, v in t.items()}
            ratio = {tag: [o / p for o, p in zip(t[f"op_{tag}"], t[f"package_{tag}"])] for tag in ("view", "self")}
            row = {"role": call.role, "family": call.family, "m": a.m, "us": us,
                   "speedup": {tag: sorted(r)[len(r) // 2] for tag, r in ratio.items()}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"gpu_link_ab_m{a.m}.json").write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
