"""Decode-time kernels on an NVIDIA GPU (issue 15): gemv and qmatvec against the MLX op, split-K GEMM.

One command on the GPU machine (MLX with its CUDA back-end; run from the repository root)::

    PYTHONPATH=/tmp/site:/tmp/site3 python3 benchmarks/gpu_decode.py --out $OUT [--budget 430]

In one run, within ``--budget`` seconds of wall time (each phase gets a share and says what it left out):

1. copy bandwidth of this GPU (a 16-byte-vector copy kernel and ``x + 0``, 1 GiB each way; the faster one);
2. per family (``gemv``, ``qmatvec`` when the family exists; the GEMM family's ``SPLIT_K`` configs when the
   knob exists): a landscape at one problem — every valid config (or a seeded sample of at most ``--landscape``)
   compiled by worker processes (NVRTC, in parallel), verified on a ragged problem and at full size against the
   float64 reference, then timed one at a time under a GPU lock; saved in KernelTuner cache format; the
   model's predicted times against these measured ones (Spearman rank correlation);
3. per problem M in {1, 4, 16} x (N, K) in {(4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096)}:
   candidates (the model's top picks and the landscape's best that are valid there) timed briefly, the best
   re-verified and timed interleaved with the MLX op (``mx.matmul`` / ``mx.quantized_matmul``) on the same
   inputs; GB/s of the problem's bytes and % of the copy bandwidth; published into ``$OUT/store`` through the
   gate (which refuses what does not beat the op beyond the noise);
4. split-K GEMM at 16x4096x4096 (float16) against ``mx.matmul`` on the same footing;
5. ``mx.quantized_matmul`` itself (4-bit, group 64, float16) at every problem, so its bandwidth is on record
   even without a qmatvec family;
6. which of the issue's goals are met, printed and in ``$OUT/decode.json``.

``--dry-run`` runs every step on this machine without a GPU: times come from the performance model (marked
``dry-run, modeled``, never measured), verification runs the Metal twin on the CPU interpreter at a tiny shape,
the CUDA sources are rendered but not compiled; what the store takes is recorded as modeled evidence, which is
never dispatched (only measured evidence that beats the op is).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

M_VALUES = (1, 4, 16)
NK = ((4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096))
LARGE_NK = ((11008, 4096), (14336, 4096))  # "the large shapes" of the qmatvec goal
DTYPE = "float16"
SMALL = {"gemv": "5,37,96", "qmatvec": "3,40,256,32,4", "gemm": "20,72,264"}  # ragged checks (a full wave of K splits)
LANDSCAPE_PROBLEM = {"gemv": "4,4096,4096", "qmatvec": "4,4096,4096,512,64", "gemm": "16,4096,4096"}


def quantized(shape: str, group: int = 64, bits: int = 4) -> str:
    """qmatvec's problem (M,N,K,KW,NG) for M,N,K at 4 bits, group 64 (the issue's mx.quantized_matmul setting)."""
    m, n, k = (int(v) for v in shape.split(","))
    return f"{m},{n},{k},{k * bits // 32},{k // group}"
SPLITK_SHAPE = "16,4096,4096"
#: The GEMM sub-space swept for split-K (every valid combination with these values).
SPLITK_SUBSPACE = {"BM": [16, 32], "BN": [32, 64, 128], "BK": [16, 32], "WM": [1, 2], "WN": [1, 2, 4],
                   "MMA": ["simdgroup", "scalar"], "STAGE": ["AB"], "VEC": [2, 4], "DOUBLE_BUFFER": [False, True],
                   "LAYOUT_B": ["t"], "PAD": [4], "TSCOPE": ["threadgroup"], "TACC": ["float32"],
                   "SPLIT_K": [1, 2, 4, 8, 16]}
QUICK_PLAN = dict(warmup=2, min_batch_ms=5.0, min_samples=10, max_samples=10, max_seconds=2.0)


def log(*parts: Any) -> None:
    print(*parts, flush=True)


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties)."""
    if len(a) < 3:
        return None

    def ranks(x: list[float]) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties share their mean rank
            idx = x == v
            if idx.sum() > 1:
                r[idx] = r[idx].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def stats(samples: list[float]) -> dict:
    p10, p50, p90 = np.percentile(samples, [10, 50, 90])
    return {"median_ms": float(p50), "p10_ms": float(p10), "p90_ms": float(p90),
            "spread": float((p90 - p10) / p50) if p50 else 0.0, "n": len(samples)}


# -- the device: real (MLX CUDA) or dry (model + interpreter) ----------------------------------------------

class Device:
    """Everything that touches the GPU, so the dry run exercises the same plan."""

    dry = False
    evidence = "measured"

    def __init__(self) -> None:
        from gpu_gemm import device_chip  # noqa: E402 - same folder

        from kernsearch import get_backend

        self.chip, self.info = device_chip()
        self.cuda = get_backend("cuda")

    def verify(self, fam, space, cfg: dict, seed: int, data: tuple | None = None):  # noqa: ANN001, ANN201
        """``data``: (inputs, references) kept across variants of one problem (the float64 reference is costly)."""
        from kernsearch import geometry, render
        from kernsearch.evaluation._verify import verify_kernel

        kernel = render(fam, cfg, space.problem.dtype, "cuda")
        check, _ = verify_kernel(self.cuda, kernel, geometry(space, cfg), space.problem, seed=seed, data=data)
        return check

    def time_one(self, fam, space, cfg: dict, logical: dict) -> list[float]:  # noqa: ANN001
        from kernsearch import geometry, render
        from kernsearch.evaluation._measure import TimingPlan, measure
        from kernsearch.evaluation._verify import kernel_inputs

        kernel, geo = render(fam, cfg, space.problem.dtype, "cuda"), geometry(space, cfg)
        launch, sync = self.cuda.launcher(kernel, geo, kernel_inputs(space.problem, logical, geo), space.problem.dtype)
        return measure(launch, sync, plan=TimingPlan(**QUICK_PLAN))

    def interleaved(self, fam, space, configs: dict[str, dict], logical: dict, rounds: int) -> dict[str, list[float]]:  # noqa: ANN001
        from kernsearch import geometry, render
        from kernsearch.evaluation._measure import TimingPlan, interleaved
        from kernsearch.evaluation._verify import kernel_inputs

        p = space.problem
        sets = self.cuda.input_sets(list(logical.values()), p.dtype)
        cands = {}
        for label, cfg in configs.items():
            kernel, geo = render(fam, cfg, p.dtype, "cuda"), geometry(space, cfg)
            cands[label] = self.cuda.launcher(kernel, geo, kernel_inputs(p, logical, geo), p.dtype, sets=sets)
        cands["op"] = self.cuda.baseline_launcher(fam, p, logical, sets=sets)
        return interleaved(cands, rounds=rounds, plan=TimingPlan(min_batch_ms=10.0))

    def copy_bandwidth(self) -> dict:
        import mlx.core as mx

        from kernsearch.backends._mlx_base import separate_launches
        from kernsearch.evaluation._measure import TimingPlan, measure

        n = 1 << 29  # float16 elements: 1 GiB
        x = mx.zeros((n,), dtype=mx.float16)
        mx.eval(x)
        kernel = mx.fast.cuda_kernel(
            name="ks_copy16", input_names=["X"], output_names=["Y"], ensure_row_contiguous=True,
            source="""
    const size_t n = X_shape[0] / 8;
    const uint4* s = reinterpret_cast<const uint4*>(X);
    uint4* d = reinterpret_cast<uint4*>(Y);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        d[i] = s[i];
    }
""")
        sms = int(self.info.get("multi_processor_count", self.info.get("num_sms", 132)) or 132)

        def copy(arrs: list) -> list:
            return kernel(inputs=arrs, template=[], grid=(sms * 8 * 256, 1, 1), threadgroup=(256, 1, 1),
                          output_shapes=[(n,)], output_dtypes=[mx.float16])

        out = {}
        for label, fn in (("uint4 copy kernel", copy), ("x + 0 (mx.add)", lambda a: [a[0] + 0])):
            launch, sync = separate_launches(fn, [[x]])
            # every launch's 1 GiB output stays alive until the batch's sync: at most 8 per batch (OOM at ~75)
            ms = float(np.median(measure(launch, sync, plan=TimingPlan(warmup=2, min_batch_ms=5.0, max_batch=8,
                                                                          min_samples=7, max_samples=10,
                                                                          max_seconds=4.0))))
            out[label] = 2 * n * 2 / (ms * 1e-3) / 1e9
        out["copy_GBps"] = max(out.values())
        return out

    def quantized_op(self, m: int, n: int, k: int) -> dict:
        import mlx.core as mx

        from kernsearch.backends._mlx_base import separate_launches
        from kernsearch.evaluation._measure import TimingPlan, measure

        rng = np.random.default_rng(0)
        w = mx.array(rng.uniform(-1, 1, (n, k)).astype(np.float16))
        wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
        copies = []
        for s in range(4):  # rotated against the L2
            x = mx.array(np.random.default_rng(s).uniform(-1, 1, (m, k)).astype(np.float16))
            copies.append([x, mx.array(wq), mx.array(scales), mx.array(biases)])
        mx.eval(copies)
        launch, sync = separate_launches(
            lambda a: [mx.quantized_matmul(a[0], a[1], a[2], a[3], transpose=True, group_size=64, bits=4)], copies)
        ms = float(np.median(measure(launch, sync, plan=TimingPlan(**QUICK_PLAN))))
        nbytes = n * k // 2 + 2 * (n * k // 64) * 2 + (m * k + m * n) * 2
        return {"median_ms": ms, "GBps": nbytes / (ms * 1e-3) / 1e9, "bytes": nbytes}


class DryDevice(Device):
    """No GPU: modeled times (with noise, so rankings are not trivially exact), CPU-interpreter checks."""

    dry = True
    evidence = "modeled"

    def __init__(self) -> None:
        from kernsearch import get_backend, get_chip

        self.chip, self.info = get_chip("H100"), {"device_name": "dry run (no GPU)"}
        self.model = get_backend("model")
        self.cpu = get_backend("cpu")
        self.rng = random.Random(0)

    def _ms(self, space, cfg: dict) -> float:  # noqa: ANN001
        return self.model.predict_ms(space, cfg)

    def verify(self, fam, space, cfg: dict, seed: int, data: tuple | None = None):  # noqa: ANN001, ANN201
        """The Metal twin on the interpreter at the family's small ragged shape (the CUDA source is rendered)."""
        from kernsearch import Space, geometry, make_problem, render
        from kernsearch.evaluation._verify import verify_kernel

        render(fam, cfg, space.problem.dtype, "cuda")
        from kernsearch import get_chip

        m2 = get_chip("M2 Max")
        small = Space(make_problem(fam, SMALL[fam.name], space.problem.dtype, m2), m2)
        if not small.is_valid(cfg):  # e.g. split-K, NVIDIA only: nothing here can run it
            from kernsearch.evaluation._verify import Check

            return Check(True, "", detail="dry run: not verifiable without the GPU (no Metal equivalent)")
        check, _ = verify_kernel(self.cpu, render(fam, cfg, space.problem.dtype, "metal"), geometry(small, cfg),
                                 small.problem, seed=seed)
        return check

    def time_one(self, fam, space, cfg: dict, logical: dict) -> list[float]:  # noqa: ANN001
        ms = self._ms(space, cfg)
        return [ms * (1 + self.rng.gauss(0, 0.03)) for _ in range(10)]

    def interleaved(self, fam, space, configs: dict[str, dict], logical: dict, rounds: int) -> dict[str, list[float]]:  # noqa: ANN001
        out = {label: self.time_one(fam, space, cfg, logical) for label, cfg in configs.items()}
        best = min(float(np.median(s)) for s in out.values())
        out["op"] = [best * 1.1 * (1 + self.rng.gauss(0, 0.03)) for _ in range(rounds)]  # a stand-in op
        return out

    def copy_bandwidth(self) -> dict:
        return {"copy_GBps": self.chip.memory_bandwidth_gbs * 0.85, "note": "dry run: 85% of the registry figure"}

    def quantized_op(self, m: int, n: int, k: int) -> dict:
        nbytes = n * k // 2 + 2 * (n * k // 64) * 2 + (m * k + m * n) * 2
        ms = nbytes / (self.chip.memory_bandwidth_gbs * 0.2e9) * 1e3
        return {"median_ms": ms, "GBps": nbytes / (ms * 1e-3) / 1e9, "bytes": nbytes, "note": "dry run: made up"}


# -- landscape workers (real device only) ------------------------------------------------------------------

_W: dict = {}


def _worker_init(lock, family: str, shape: str, chip_name: str) -> None:  # noqa: ANN001
    _W.update(lock=lock, family=family, shape=shape, chip_name=chip_name)


def _worker_eval(cfg: dict) -> tuple[dict, dict]:
    """Compile + small ragged check (parallel), then full-size check and timing under the GPU lock."""
    from kernsearch import render
    from kernsearch._errors import VariantFailure

    if "device" not in _W:
        from kernsearch import Space, get_chip, load_family, make_problem
        from kernsearch.evaluation._verify import make_inputs

        fam = load_family(_W["family"])
        dev = Device()
        chip = get_chip(_W["chip_name"]) if dev.chip.name != _W["chip_name"] else dev.chip
        full = Space(make_problem(fam, _W["shape"], DTYPE, chip), chip)
        small = Space(make_problem(fam, SMALL[fam.name], DTYPE, chip), chip)
        from kernsearch.evaluation._verify import reference

        logical = make_inputs(full.problem, 0)
        _W.update(device=dev, fam=fam, full=full, small=small, logical=logical,
                  data=(make_inputs(full.problem, 6), None))
        _W["data"] = (_W["data"][0], reference(full.problem, _W["data"][0]))
    dev, fam, full, small = _W["device"], _W["fam"], _W["full"], _W["small"]
    kernel = render(fam, cfg, DTYPE, "cuda")
    try:
        if small.is_valid(cfg):
            check = dev.verify(fam, small, cfg, seed=5)
            if not check.ok:
                return cfg, {"failure": "WrongResultConfig", "failure_detail": f"small: {check.summary()}"[:500]}
    except VariantFailure as exc:
        kind = "CompileFailedConfig" if exc.reason == "compile" else "RuntimeFailedConfig"
        return cfg, {"failure": kind, "failure_detail": f"{exc.reason}: {exc.detail}"[:500]}
    extra = {"compile_time": dev.cuda.compile_seconds.get(kernel.sha256, 0.0) * 1e3}
    with _W["lock"]:
        try:
            check = dev.verify(fam, full, cfg, seed=6, data=_W["data"])
            if not check.ok:
                return cfg, {"failure": "WrongResultConfig", "failure_detail": check.summary()[:500], **extra}
            times = dev.time_one(fam, full, cfg, _W["logical"])
        except Exception as exc:  # noqa: BLE001 - one variant's failure is recorded, never fatal
            return cfg, {"failure": "RuntimeFailedConfig", "failure_detail": str(exc)[:500], **extra}
    return cfg, {"times": times, "max_abs_err": check.max_abs_err, **extra}


def _compile_one(job: tuple[str, str, str, dict]) -> bool:
    """In a worker: build one variant (NVRTC) and run it once on a small problem; MLX keeps the binary in its
    on-disk cache, so the main process loads it instead of compiling serially."""
    from kernsearch import Space, get_chip, load_family, make_problem

    family, small, chip_name, cfg = job
    try:
        if "device" not in _W:
            _W["device"] = Device()
        fam = load_family(family)
        chip = get_chip(chip_name) if _W["device"].chip.name != chip_name else _W["device"].chip
        space = Space(make_problem(fam, small, DTYPE, chip), chip)
        return bool(space.is_valid(cfg) and _W["device"].verify(fam, space, cfg, seed=4).ok)
    except Exception:  # noqa: BLE001 - a failure shows again (and is reported) when the main process runs it
        return False


def precompile(dev: Device, fam, problems: list[str], ranked: list[dict], jobs: int, deadline: float) -> list[list[dict]]:  # noqa: ANN001
    """The candidates of every problem (landscape's best valid there, then the model's top), compiled in parallel."""
    from kernsearch import Space, get_backend, make_problem
    from kernsearch.backends._model_columns import predict_many

    model = get_backend("model")
    per_problem = []
    for shape in problems:
        space = Space(make_problem(fam, shape, DTYPE, dev.chip), dev.chip)
        valid = space.enumerate().valid
        times = [p.time_ms for p in predict_many(model, space, valid)]  # the whole space at once (predict_ms's)
        by_model = [valid[i] for i in sorted(range(len(valid)), key=times.__getitem__)[:6]]
        cands: list[dict] = []
        for c in [c for c in ranked if space.is_valid(c)][:6] + by_model:
            if c not in cands:
                cands.append(c)
        per_problem.append(cands)
    if dev.dry:
        return per_problem
    unique: dict[str, dict] = {}
    for cands in per_problem:
        for c in cands:
            unique.setdefault(json.dumps(c, sort_keys=True), c)
    small = SMALL[fam.name]
    jobs_ = [(fam.name, small, dev.chip.name, c) for c in unique.values()]
    ctx = mp.get_context("spawn")
    with ctx.Pool(jobs) as pool:
        results = pool.imap_unordered(_compile_one, jobs_, chunksize=1)
        done = 0
        while done < len(jobs_):
            try:
                results.next(timeout=max(1.0, deadline - time.monotonic()))
            except (mp.TimeoutError, StopIteration):
                break
            done += 1
        pool.terminate()
    log(f"  precompiled {done} of {len(jobs_)} candidate variants for {len(problems)} problems")
    return per_problem


def landscape(dev: Device, fam, shape: str, configs: list[dict], knobs: dict, out: Path, deadline: float,  # noqa: ANN001
              jobs: int, mlx_version: str) -> dict:
    """Measure ``configs`` at ``shape``; KernelTuner cache file; model-vs-measured Spearman."""
    from kernsearch import Space, make_problem
    from kernsearch.evaluation._verify import make_inputs
    from kernsearch.studies._landscape import NOT_MEASURED, LandscapeWriter

    space = Space(make_problem(fam, shape, DTYPE, dev.chip), dev.chip)
    name = f"{fam.name}_{dev.chip.name}_{DTYPE}_{space.problem.shape_text}.json".replace(" ", "")
    writer = LandscapeWriter(out / "landscapes" / name, knobs, device_name=str(dev.info.get("device_name")),
                             kernel_name=f"kernsearch {fam.name} (cuda)", problem_size=list(space.problem.shape),
                             chip=dev.chip.name, dtype=DTYPE, mlx_version=mlx_version,
                             evidence="dry-run, modeled (not measured)" if dev.dry else "measured",
                             method="benchmarks/gpu_decode.py (docstring)",
                             date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    pending = {json.dumps(c, sort_keys=True): c for c in configs}
    if dev.dry:
        logical = make_inputs(space.problem, 0)
        for i, cfg in enumerate(configs):
            if time.monotonic() > deadline:
                break
            if i < 3:  # the interpreter is slow: a few real checks, the rest modeled only
                check = dev.verify(fam, space, cfg, seed=i)
                if not check.ok:
                    writer.add(cfg, failure="WrongResultConfig", failure_detail=check.summary()[:500])
                    pending.pop(json.dumps(cfg, sort_keys=True))
                    continue
            writer.add(cfg, times=dev.time_one(fam, space, cfg, logical))
            pending.pop(json.dumps(cfg, sort_keys=True))
    else:
        ctx = mp.get_context("spawn")
        with ctx.Pool(jobs, initializer=_worker_init, initargs=(ctx.Lock(), fam.name, shape, dev.chip.name)) as pool:
            results = pool.imap_unordered(_worker_eval, configs, chunksize=1)
            while pending:
                try:
                    cfg, res = results.next(timeout=max(1.0, deadline - time.monotonic()))
                except (mp.TimeoutError, StopIteration):
                    break
                pending.pop(json.dumps(cfg, sort_keys=True), None)
                if "times" in res:
                    writer.add(cfg, times=res.pop("times"), **res)
                else:
                    writer.add(cfg, failure=res.pop("failure"), **res)
                if len(writer.cache) % 50 == 0:
                    writer.save()
                    log(f"    {len(writer.cache)}/{len(configs)} configs done")
            pool.terminate()
    for cfg in pending.values():
        writer.add(cfg, failure=NOT_MEASURED, failure_detail="time share of this landscape used up")
    path = writer.save()
    ok = [e for e in writer.cache.values() if not isinstance(e["time"], str)]
    failed: dict[str, int] = {}
    for e in writer.cache.values():
        if isinstance(e["time"], str):
            failed[e["time"]] = failed.get(e["time"], 0) + 1
    from kernsearch import get_backend

    model = get_backend("model")
    measured_cfgs = [{k: e[k] for k in knobs} for e in ok]
    full_cfgs = [{**dict(fam.default), **c} for c in measured_cfgs]
    predicted = [model.predict_ms(space, c) for c in full_cfgs]
    medians = [float(np.median(e["times"])) for e in ok]
    rho = spearman(predicted, medians)
    best = int(np.argmin(medians)) if medians else None
    summary = {"file": str(path.relative_to(out)), "problem": space.problem.shape_text, "configs": len(configs),
               "measured": len(ok), "failed": failed, "spearman_model_vs_measured": rho,
               "best_ms": medians[best] if best is not None else None,
               "best_config": full_cfgs[best] if best is not None else None,
               "ranked": [c for _, c in sorted(zip(medians, full_cfgs), key=lambda t: t[0])]}
    log(f"  landscape {fam.name} {space.problem.shape_text}: {len(ok)} measured of {len(configs)} "
        f"({failed or 'no failures'}); best {summary['best_ms']} ms; Spearman(model, measured) = "
        f"{'n/a' if rho is None else f'{rho:.3f}'}")
    return summary


# -- per-problem tables ----------------------------------------------------------------------------------

def tune_problem(dev: Device, fam, shape: str, cands: list[dict], copy_gbps: float, store, rounds: int,  # noqa: ANN001
                 per_problem_s: float, extra: dict[str, dict] | None = None) -> dict:
    """Candidates (landscape's best valid here + the model's top) timed; the best vs the op, interleaved."""
    from kernsearch import Space, make_problem
    from kernsearch.evaluation._verify import make_inputs
    from kernsearch.family._space import format_config

    started = time.monotonic()
    space = Space(make_problem(fam, shape, DTYPE, dev.chip), dev.chip)
    from kernsearch.evaluation._verify import reference

    logical = make_inputs(space.problem, 1)
    checked = make_inputs(space.problem, 2)
    data = (checked, None if dev.dry else reference(space.problem, checked))
    timed = []
    for cfg in cands:
        if time.monotonic() - started > per_problem_s and timed:
            break
        try:
            check = dev.verify(fam, space, cfg, seed=2, data=data)
            if not check.ok:
                continue
            timed.append((float(np.median(dev.time_one(fam, space, cfg, logical))), cfg))
        except Exception as exc:  # noqa: BLE001 - a failing candidate is skipped, reported
            log(f"    candidate {format_config(cfg)} failed: {str(exc)[:200]}")
    if not timed:
        return {"problem": space.problem.shape_text, "error": "no candidate passed verification"}
    best_cfg = min(timed, key=lambda t: t[0])[1]
    others = {label: cfg for label, cfg in (extra or {}).items() if cfg != best_cfg and dev.verify(fam, space, cfg, 3).ok}
    samples = dev.interleaved(fam, space, {"tuned": best_cfg, **others}, logical, rounds)
    nbytes = space.problem.bytes()
    row, op = stats(samples["tuned"]), stats(samples["op"])
    from kernsearch.evaluation._measure import speedup

    sp = speedup(samples["tuned"], samples["op"])
    result = {"problem": space.problem.shape_text, "config": format_config(best_cfg), "candidates": len(cands),
              "timed": len(timed), "tuned": row, "op": op, "bytes": nbytes,
              "tuned_GBps": nbytes / (row["median_ms"] * 1e-3) / 1e9, "op_GBps": nbytes / (op["median_ms"] * 1e-3) / 1e9,
              "speedup": sp.median, "speedup_low": sp.low, "speedup_high": sp.high,
              "evidence": "dry-run, modeled (not measured)" if dev.dry else "measured"}
    result["tuned_pct_copy"] = 100 * result["tuned_GBps"] / copy_gbps
    result["op_pct_copy"] = 100 * result["op_GBps"] / copy_gbps
    result["also_timed"] = {label: {"config": format_config(others[label]), **stats(samples[label]),
                                    "speedup": speedup(samples[label], samples["op"]).median} for label in others}
    for label, r in result["also_timed"].items():
        log(f"    also timed, interleaved: {label}: {r['median_ms']:.4f} ms, {r['speedup']:.2f}x the op ({r['config']})")
    result["publish"] = publish(dev, fam, space, best_cfg, samples, store)
    return result


def publish(dev: Device, fam, space, cfg: dict, samples: dict, store) -> dict:  # noqa: ANN001
    from kernsearch import Candidate
    from kernsearch.artifacts._manifest import Correctness, Measurements
    from kernsearch.evaluation._measure import speedup

    checks = [(space.problem.shape_text, dev.verify(fam, space, cfg, seed=s)) for s in (21, 22)]
    row, op = stats(samples["tuned"]), stats(samples["op"])
    sp = speedup(samples["tuned"], samples["op"])
    measurements = Measurements(median_ms=row["median_ms"], spread=row["spread"], samples_ms=samples["tuned"],
                                baseline_median_ms=op["median_ms"], baseline_spread=op["spread"],
                                speedup=sp.median, speedup_low=sp.low, speedup_high=sp.high)
    try:
        cand = Candidate.for_config(space, cfg, target="cuda", evidence=dev.evidence, measurements=measurements,
                                    correctness=Correctness.from_checks("interpreter" if dev.dry else "device", checks),
                                    study="benchmarks/gpu_decode.py")
        outcome = store.publish(cand)
    except Exception as exc:  # noqa: BLE001 - the gate's refusal or a store error is reported, not fatal
        return {"published": False, "reason": str(exc)[:300]}
    return {"published": outcome.published, "version": outcome.version, "reason": outcome.reason}


def print_rows(title: str, rows: list[dict], op_name: str) -> None:
    log(f"\n{title}")
    log(f"  {'problem':<16} {'tuned ms':>9} {'GB/s':>7} {'%copy':>6} | {op_name + ' ms':>22} {'GB/s':>7} {'%copy':>6} | "
        f"{'speedup (range)':>20}  published  config")
    for r in rows:
        if "error" in r:
            log(f"  {r['problem']:<16} {r['error']}")
            continue
        log(f"  {r['problem']:<16} {r['tuned']['median_ms']:>9.4f} {r['tuned_GBps']:>7.0f} {r['tuned_pct_copy']:>5.1f}% | "
            f"{r['op']['median_ms']:>22.4f} {r['op_GBps']:>7.0f} {r['op_pct_copy']:>5.1f}% | "
            f"{r['speedup']:>6.2f}x ({r['speedup_low']:.2f}-{r['speedup_high']:.2f})  "
            f"{('yes' if r['publish'].get('published') else 'no '):<9}  {r['config']}")


# -- main --------------------------------------------------------------------------------------------------

def family_or_none(name: str):  # noqa: ANN201
    from kernsearch import KernsearchError, load_family

    try:
        return load_family(name)
    except KernsearchError:
        return None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--budget", type=float, default=430.0, help="seconds of wall time for the whole run")
    parser.add_argument("--landscape", type=int, default=400, help="at most this many configs per landscape")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds against the op")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: modeled times, interpreter checks")
    parser.add_argument("--problems", default="", help="restrict, e.g. '1,4096,4096;16,4096,4096' (testing)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    out = Path(args.out)
    (out / "landscapes").mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
    os.environ.setdefault("OMP_NUM_THREADS", "2")

    from kernsearch import ArtifactStore, Space, make_problem

    dev: Device = DryDevice() if args.dry_run else Device()
    mlx_version = "none"
    if not args.dry_run:
        import mlx.core as mx

        mlx_version = mx.__version__
    store = ArtifactStore(out / "store")
    report: dict = {"device": dev.info, "chip": dev.chip.name, "mlx": mlx_version, "dry_run": args.dry_run,
                    "budget_s": args.budget, "families": {}, "left_out": []}
    log(f"device {dev.info.get('device_name')} ({dev.chip.name}); MLX {mlx_version}; budget {args.budget:.0f} s"
        + ("; DRY RUN: modeled times, nothing here is measured" if args.dry_run else ""))

    def left() -> float:
        return args.budget - (time.monotonic() - started)

    report["copy"] = dev.copy_bandwidth()
    copy_gbps = report["copy"]["copy_GBps"]
    log(f"copy bandwidth: {copy_gbps:.0f} GB/s  {report['copy']}")

    problems = [f"{m},{n},{k}" for m in M_VALUES for n, k in NK]
    if args.problems:
        problems = [p.strip() for p in args.problems.split(";") if p.strip()]
    families = [f for f in (family_or_none("gemv"), family_or_none("qmatvec")) if f is not None]
    gemm = family_or_none("gemm")
    splitk = gemm is not None and "SPLIT_K" in gemm.knobs
    if not any(f.name == "qmatvec" for f in families):
        report["left_out"].append("qmatvec: no such family in this checkout")
    if not splitk:
        report["left_out"].append("split-K: the gemm family has no SPLIT_K knob in this checkout")
    shares = len(families) + (1 if splitk else 0)
    for fam in families:
        share = left() / max(1, shares)
        shares -= 1
        t0 = time.monotonic()
        space = Space(make_problem(fam, LANDSCAPE_PROBLEM[fam.name], DTYPE, dev.chip), dev.chip)
        valid = space.enumerate().valid
        configs = random.Random(0).sample(valid, min(len(valid), args.landscape))
        if len(configs) < len(valid):
            report["left_out"].append(f"{fam.name} landscape: a seeded sample of {len(configs)} of {len(valid)} valid")
        log(f"\n{fam.name}: landscape at {LANDSCAPE_PROBLEM[fam.name]} ({len(configs)} configs)")
        land = landscape(dev, fam, LANDSCAPE_PROBLEM[fam.name], configs, {k: v.values for k, v in fam.knobs.items()},
                         out, t0 + 0.5 * share, args.jobs, mlx_version)
        rows = []
        fam_problems = [quantized(shape) if fam.name == "qmatvec" else shape for shape in problems]
        candidates = precompile(dev, fam, fam_problems, land["ranked"], args.jobs,
                                t0 + 0.5 * share + 0.5 * (share - (time.monotonic() - t0)))
        per_problem = max(2.0, (share - (time.monotonic() - t0)) / max(1, len(problems)) - 4.0)
        for shape, cands in zip(fam_problems, candidates):
            if time.monotonic() - t0 > share:
                report["left_out"].append(f"{fam.name} {shape}: out of time")
                continue
            rows.append(tune_problem(dev, fam, shape, cands, copy_gbps, store, args.rounds, per_problem))
        land.pop("ranked")
        report["families"][fam.name] = {"landscape": land, "rows": rows}
        print_rows(f"{fam.name} (float16) tuned vs {'mx.matmul' if fam.name == 'gemv' else 'mx.quantized_matmul'}",
                   rows, "mx.matmul" if fam.name == "gemv" else "mx.quantized_matmul")
        (out / "decode.json").write_text(json.dumps(report, indent=1, default=str))

    if splitk:
        assert gemm is not None
        share = left() - 30
        t0 = time.monotonic()
        space = Space(make_problem(gemm, SPLITK_SHAPE, DTYPE, dev.chip), dev.chip)
        import itertools

        names = list(gemm.knobs)
        sub = [dict(zip(names, v)) for v in itertools.product(*(SPLITK_SUBSPACE.get(n, [gemm.default[n]]) for n in names))]
        valid = [c for c in sub if space.is_valid(c)]
        configs = random.Random(0).sample(valid, min(len(valid), args.landscape))
        log(f"\nsplit-K GEMM: landscape at {SPLITK_SHAPE} ({len(configs)} of {len(valid)} valid sub-space configs)")
        land = landscape(dev, gemm, SPLITK_SHAPE, configs, {n: SPLITK_SUBSPACE.get(n, [gemm.default[n]]) for n in names},
                         out, t0 + 0.6 * share, args.jobs, mlx_version)
        ranked = land.pop("ranked")
        best_by_split = {}
        for c in ranked:
            best_by_split.setdefault(c["SPLIT_K"], c)
        if len(configs) < len(valid):
            report["left_out"].append(f"split-K landscape: a seeded sample of {len(configs)} of {len(valid)} valid")
        extra = {"best SPLIT_K=1": best_by_split[1]} if 1 in best_by_split else {}
        cands = precompile(dev, gemm, [SPLITK_SHAPE], ranked, args.jobs, time.monotonic() + 60)[0]
        rows = [tune_problem(dev, gemm, SPLITK_SHAPE, cands, copy_gbps, store, args.rounds, 20.0, extra)]
        report["families"]["gemm_splitk"] = {"landscape": land, "rows": rows,
                                             "best_per_split_k": {str(k): v for k, v in best_by_split.items()}}
        print_rows("split-K GEMM 16x4096x4096 float16 vs mx.matmul", rows, "mx.matmul")

    log("\nmx.quantized_matmul (4-bit, group 64, float16), the op qmatvec must beat:")
    report["quantized_op"] = {}
    for shape in problems:
        if left() < 5:
            report["left_out"].append("quantized_matmul rows: out of time")
            break
        m, n, k = (int(v) for v in shape.split(","))
        q = dev.quantized_op(m, n, k)
        q["pct_copy"] = 100 * q["GBps"] / copy_gbps
        report["quantized_op"][shape] = q
        log(f"  {shape:<16} {q['median_ms']:.4f} ms  {q['GBps']:.0f} GB/s  {q['pct_copy']:.1f}% of copy")

    report["goals"] = goals(report)
    report["elapsed_s"] = time.monotonic() - started
    log("\ngoals (issue 15):" + ("  [DRY RUN: modeled, says nothing about a GPU]" if args.dry_run else ""))
    for g in report["goals"]:
        log(f"  [{'met' if g['met'] else 'NOT met' if g['met'] is False else 'n/a'}] {g['goal']}: {g['evidence']}")
    if report["left_out"]:
        log("left out: " + "; ".join(report["left_out"]))
    log(f"elapsed {report['elapsed_s']:.0f} s; results in {out / 'decode.json'}, landscapes in {out / 'landscapes'}, "
        f"store in {out / 'store'}")
    (out / "decode.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def goals(report: dict) -> list[dict]:
    def rows(fam: str) -> dict[str, dict]:  # keyed by MxNxK (qmatvec's group and bits dropped)
        return {"x".join(r["problem"].split("x")[:3]): r
                for r in report["families"].get(fam, {}).get("rows", []) if "error" not in r}

    out = []
    q = rows("qmatvec")
    large1 = [q.get(f"1x{n}x{k}") for n, k in LARGE_NK]
    if q and all(large1):
        met = all(r["speedup"] >= 2.0 and r["tuned_pct_copy"] >= 80 for r in large1)  # type: ignore[index]
        ev = ", ".join(f"{r['problem']}: {r['speedup']:.2f}x, {r['tuned_pct_copy']:.0f}% copy" for r in large1)  # type: ignore[index]
    else:
        met, ev = None, "qmatvec not measured at the large M=1 shapes"
    out.append({"goal": "qmatvec >= 2x mx.quantized_matmul and >= 80% of copy at M=1, large shapes", "met": met,
                "evidence": ev})
    m416 = [r for p, r in q.items() if p.split("x")[0] in ("4", "16")]
    out.append({"goal": "qmatvec >= 1.5x mx.quantized_matmul at M=4 and 16",
                "met": (all(r["speedup"] >= 1.5 for r in m416) if m416 else None),
                "evidence": ", ".join(f"{r['problem']}: {r['speedup']:.2f}x" for r in m416) or "not measured"})
    g1 = [r for p, r in rows("gemv").items() if p.split("x")[0] == "1"]
    out.append({"goal": "gemv >= 1.0x mx.matmul at M=1", "met": (all(r["speedup"] >= 1.0 for r in g1) if g1 else None),
                "evidence": ", ".join(f"{r['problem']}: {r['speedup']:.2f}x (low {r['speedup_low']:.2f})" for r in g1)
                or "not measured"})
    s = rows("gemm_splitk").get("16x4096x4096")
    out.append({"goal": "split-K GEMM >= 0.8x mx.matmul at 16x4096x4096", "met": (s["speedup"] >= 0.8 if s else None),
                "evidence": f"{s['speedup']:.2f}x ({s['config']})" if s else "not measured"})
    for fam in ("gemv", "qmatvec", "gemm_splitk"):
        land = report["families"].get(fam, {}).get("landscape")
        if land:
            out.append({"goal": f"{fam}: landscape >= 300 configs measured, Spearman reported",
                        "met": land["measured"] >= 300,
                        "evidence": f"{land['measured']} measured, Spearman {land['spearman_model_vs_measured']}"})
    return out


if __name__ == "__main__":
    main()
