# ruff: noqa  (a design probe kept exactly as it ran on the GPU, with its output beside it)
"""Probe 2 (issue 28): v2 (persistent balanced tiles, X in shared memory, register ring) against v1 and the op.

``PYTHONPATH=/tmp/site python3 benchmarks/probe/gpu_qmv_probe2.py --out $OUT``; every call through mx.compile
(as the package will call kernels); graph mode, cold weights; correctness first. Writes $OUT/probe2.json.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gpu_qmv_probe import L2, Probe, log, pct  # noqa: E402
from qmv_body2 import body2  # noqa: E402

SMEM = 100 * 1024
SHAPES = [(1, 4096, 4096), (1, 11008, 4096), (1, 14336, 4096), (1, 4096, 11008), (4, 11008, 4096),
          (4, 14336, 4096), (16, 4096, 4096), (1, 12288, 4096), (3, 4100, 4160)]
V2 = [dict(KS=ks, PF=pf, BPS=b) for ks, pf, b in itertools.product((4, 8, 16), (2, 4), (1, 2))]
V1 = [dict(TW=1, KS=4, RT=2, UNROLL=4), dict(TW=1, KS=4, RT=2, UNROLL=2), dict(TW=4, KS=1, RT=2, UNROLL=4)]


class Probe2(Probe):
    def __init__(self):
        super().__init__()
        mx = self.mx
        hdr = (HERE / "qmv_header.cuh").read_text()
        self.v2 = {n: mx.fast.cuda_kernel(name=f"ks_qmv2_{n}", input_names=["X", "W", "S", "Bq", "Wu", "Su", "Bu"][:1 + 3 * n],
                                          output_names=["Y"], source=body2(n), header=hdr, ensure_row_contiguous=True,
                                          shared_memory=SMEM) for n in (1, 2)}

    def smem_needed(self, cfg, m, n, k, nmat=1):
        mt = 1 if m <= 8 else 2
        b = self.sms * cfg["BPS"]
        tiles = math.ceil(math.ceil(n / 16) / b)
        return m * k * 2 + tiles * cfg["KS"] * 32 * nmat * mt * 16

    def call2(self, cfg, x, wq, s, b, extra=()):
        m, k = x.shape
        n = wq.shape[0]
        nmat = 1 + len(extra) // 3
        threads = 32 * cfg["KS"]
        blocks = self.sms * cfg["BPS"]
        return self.v2[nmat](inputs=[x, wq, s, b, *extra],
                             template=[("T", x.dtype), ("QB", 4), ("KS", cfg["KS"]), ("PF", cfg["PF"]), ("MT", 1 if m <= 8 else 2)],
                             grid=(blocks * threads, 1, 1), threadgroup=(threads, 1, 1), output_shapes=[(m, n)],
                             output_dtypes=[x.dtype])[0]


def reference(mx, x, sets):
    xf = np.array(x.astype(mx.float32), dtype=np.float64)
    outs = []
    for wq, s, b in sets:
        wd = np.array(mx.dequantize(wq, s, b, group_size=64, bits=4).astype(mx.float32), dtype=np.float64)
        outs.append(xf @ wd.T)
    if len(outs) == 2:
        g, u = outs
        return g / (1 + np.exp(-g)) * u
    return outs[0]


def ok_close(got, ref, k):
    err = np.abs(got - ref)
    return bool(np.all(np.isfinite(got)) and np.all(err <= 2e-3 * math.sqrt(k) + 2e-3 * np.abs(ref))), float(err.max())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/probe_out")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    p = Probe2()
    mx = p.mx
    res = {"device": p.info, "rows": [], "checks": [], "host_us": {}, "swiglu": [], "eager": []}
    log("device", p.info.get("device_name"), "SMs", p.sms)
    compiled = {}

    def cfn(kind, cfg, nmat=1):
        key = (kind, json.dumps(cfg), nmat)
        if key not in compiled:
            if kind == "v2":
                def raw(x, w, s, b, *e):
                    return (p.call2(cfg, x, w, s, b, e))
            else:
                def raw(x, w, s, b, *e):
                    return (p.call(cfg, x, w, s, b, 1 + len(e) // 3, e))
            compiled[key] = mx.compile(raw)
        return compiled[key]

    # correctness: every v2 config, ragged and real shapes, raw and compiled; swiglu too
    bad = set()
    for cfg in V2:
        for (m, n, k) in ((3, 4100, 4160), (16, 4096, 4096), (9, 200, 256), (1, 14336, 4096)):
            if p.smem_needed(cfg, m, n, k) > SMEM:
                continue
            rng = np.random.default_rng(m + n + k)
            x = mx.array(rng.uniform(-1, 1, (m, k)).astype(np.float16))
            ws = [p.weights(n, k, 1)]
            ref = reference(mx, x, ws)
            for label, fn in (("raw", lambda *a: p.call2(cfg, *a)), ("compiled", cfn("v2", cfg))):
                got = np.array(fn(x, *ws[0]).astype(mx.float32), dtype=np.float64)
                ok, err = ok_close(got, ref, k)
                res["checks"].append({"cfg": cfg, "shape": [m, n, k], "how": label, "ok": ok, "err": err})
                if not ok:
                    bad.add(json.dumps(cfg))
        m, n, k = 3, 600, 512
        x = mx.array(np.random.default_rng(5).uniform(-1, 1, (m, k)).astype(np.float16))
        ws = [p.weights(n, k, 1), p.weights(n, k, 2)]
        got = np.array(p.call2(cfg, x, *ws[0], extra=ws[1]).astype(mx.float32), dtype=np.float64)
        ok, err = ok_close(got, reference(mx, x, ws), k)
        res["checks"].append({"cfg": cfg, "shape": [m, n, k], "how": "swiglu", "ok": ok, "err": err})
        if not ok:
            bad.add(json.dumps(cfg) + "swiglu")
    log("v2 checks:", len(res["checks"]), "bad:", sorted(bad))
    for (m, n, k) in SHAPES:
        nbytes = n * k // 2 + 2 * n * (k // 64) * 2
        sets_n = max(2, math.ceil(2.5 * L2 / nbytes) + 1)
        sets = []
        for i in range(sets_n):
            wq, s, b = p.weights(n, k, 100 + i)
            x = mx.array(np.random.default_rng(i).uniform(-1, 1, (m, k)).astype(np.float16))
            sets.append((x, wq, s, b))
        flat = [(mx.zeros((nbytes // 4,), dtype=mx.uint32) + i,) for i in range(sets_n)]
        mx.eval(flat)
        fns = {}
        for cfg in V2:
            if json.dumps(cfg) not in bad and p.smem_needed(cfg, m, n, k) <= SMEM:
                fns["v2 " + json.dumps(cfg)] = cfn("v2", cfg)
        for cfg in V1:
            fns["v1 " + json.dumps(cfg)] = cfn("v1", cfg)
        pre = p.graph_times(fns, sets, rounds=4)
        top = sorted(pre, key=lambda nm: np.median(pre[nm]))[:3]
        final = {nm: fns[nm] for nm in top}
        final["op"] = lambda x, w, s, b: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)
        tm = p.graph_times(final, sets, rounds=15)
        stt = p.graph_times({"stream": mx.compile(p.stream_call)}, flat, rounds=15)["stream"]
        best, op, kb = top[0], tm["op"], tm[top[0]]
        row = {"M": m, "N": n, "K": k, "sets": sets_n, "bytes": nbytes, "best": best,
               "kernel_ms": pct(kb, 50), "op_ms": pct(op, 50), "stream_ms": pct(stt, 50),
               "speedup": pct(op, 50) / pct(kb, 50), "low": pct(op, 10) / pct(kb, 90), "high": pct(op, 90) / pct(kb, 10),
               "pct_of_stream": 100 * pct(stt, 50) / pct(kb, 50), "stream_GBps": nbytes / pct(stt, 50) / 1e6,
               "top3": {nm: pct(tm[nm], 50) for nm in top}, "prescreen": {nm: pct(pre[nm], 50) for nm in pre}}
        res["rows"].append(row)
        log(f"{m}x{n}x{k}: kernel {row['kernel_ms']*1e3:.1f} us op {row['op_ms']*1e3:.1f} stream {row['stream_ms']*1e3:.1f} "
            f"x{row['speedup']:.2f} ({row['low']:.2f}-{row['high']:.2f}) %stream {row['pct_of_stream']:.0f} best {best}")
        if (m, n, k) in ((1, 14336, 4096), (4, 14336, 4096), (1, 4096, 4096)):
            e = p.eager_times({"k": fns[best], "op": final["op"]}, sets, rounds=10)
            res["eager"].append({"shape": [m, n, k], "kernel_ms": pct(e["k"], 50), "op_ms": pct(e["op"], 50),
                                 "low": pct(e["op"], 10) / pct(e["k"], 90)})
            log("  eager: kernel", round(pct(e["k"], 50) * 1e3, 1), "op", round(pct(e["op"], 50) * 1e3, 1))
        if (m, n, k) == (1, 4096, 4096):
            x, w, s, b = sets[0]
            def opf(x, w, s, b):
                return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4)
            cfg = json.loads(best[3:])
            raw = (lambda x, w, s, b: p.call2(cfg, x, w, s, b)) if best.startswith("v2") else \
                (lambda x, w, s, b: p.call(cfg, x, w, s, b))
            for name, fn in (("op", opf), ("kernel_raw", raw), ("kernel_compiled", fns[best]),
                             ("op_compiled", mx.compile(opf)), ("op_again", opf)):
                res["host_us"][name] = min(p.host_us(fn, (x, w, s, b)) for _ in range(3))
            log("host us:", {k_: round(v, 2) for k_, v in res["host_us"].items()})
        del sets, flat
    for (m, n, k) in ((1, 11008, 4096), (4, 11008, 4096), (1, 14336, 4096)):
        nbytes = 2 * (n * k // 2 + 2 * n * (k // 64) * 2)
        sets_n = max(2, math.ceil(2.5 * L2 / nbytes) + 1)
        sets = []
        for i in range(sets_n):
            x = mx.array(np.random.default_rng(i).uniform(-1, 1, (m, k)).astype(np.float16))
            sets.append((x, *p.weights(n, k, 300 + i), *p.weights(n, k, 400 + i)))
        chain = mx.compile(lambda x, w, s, b, wu, su, bu: (lambda g: g * mx.sigmoid(g))(
            mx.quantized_matmul(x, w, s, b, transpose=True, group_size=64, bits=4))
            * mx.quantized_matmul(x, wu, su, bu, transpose=True, group_size=64, bits=4))
        fns = {"v2 " + json.dumps(c): cfn("v2", c, 2) for c in V2
               if json.dumps(c) + "swiglu" not in bad and json.dumps(c) not in bad and p.smem_needed(c, m, n, k, 2) <= SMEM}
        pre = p.graph_times(fns, sets, rounds=4)
        top = sorted(pre, key=lambda nm: np.median(pre[nm]))[:2]
        tm = p.graph_times({**{nm: fns[nm] for nm in top}, "chain": chain}, sets, rounds=15)
        best = top[0]
        row = {"M": m, "N": n, "K": k, "kernel_ms": pct(tm[best], 50), "chain_ms": pct(tm["chain"], 50),
               "speedup": pct(tm["chain"], 50) / pct(tm[best], 50), "low": pct(tm["chain"], 10) / pct(tm[best], 90),
               "best": best}
        res["swiglu"].append(row)
        log(f"swiglu {m}x{n}x{k}: kernel {row['kernel_ms']*1e3:.1f} us chain {row['chain_ms']*1e3:.1f} us "
            f"x{row['speedup']:.2f} low {row['low']:.2f} best {best}")
        del sets
    (out / "probe2.json").write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
