"""Shared checks of the row families (rmsnorm, layernorm, softmax, swiglu): interpreter sweeps over configs
and ragged shapes, and the CUDA twins through nvcc, wrapped as mx.fast.cuda_kernel wraps them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from nvcc import NVCC, nvcc

from kernsearch import Space, geometry, get_backend, get_chip, make_problem, render
from kernsearch.evaluation._verify import verify_kernel

M2 = get_chip("M2 Max")
H100 = get_chip("H100")
DTYPES = ("float16", "bfloat16", "float32")

_CTYPE = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "uint32": "uint32_t",
          "int32": "int32_t"}


def valid(fam: Any, shape: str, chip: Any = M2, dtype: str = "float16") -> list[dict]:
    return Space(make_problem(fam, shape, dtype, chip), chip).enumerate().valid


def covering_sample(fam: Any, shapes: tuple[str, ...], per_shape: int, seed: int = 5) -> list[tuple[dict, str, str]]:
    """(config, dtype, shape): at each shape, every knob value valid there at least once, then random
    others up to ``per_shape``; dtypes rotate (a config invalid for its dtype takes the next valid one)."""
    rng = random.Random(seed)
    plan: list[tuple[dict, str, str]] = []
    for shape in shapes:
        pool = valid(fam, shape)
        rng.shuffle(pool)
        chosen: list[dict] = []
        for name, knob in fam.knobs.items():
            for value in knob.values:
                if any(c[name] == value for c in chosen):
                    continue
                hit = next((c for c in pool if c[name] == value and c not in chosen), None)
                if hit is not None:
                    chosen.append(hit)
        chosen += [c for c in pool if c not in chosen][: max(0, per_shape - len(chosen))]
        for i, cfg in enumerate(chosen):
            for k in range(3):
                dtype = DTYPES[(i + k) % 3]
                if Space(make_problem(fam, shape, dtype, M2), M2).is_valid(cfg):
                    plan.append((cfg, dtype, shape))
                    break
    return plan


def run_all(fam: Any, plan: list[tuple[dict, str, str]], mode: str) -> tuple[int, list[str]]:
    """Verify each planned variant on the interpreter; the failures, described."""
    cpu = get_backend("cpu", mode=mode)
    failures, runs = [], 0
    for cfg, dtype, shape in plan:
        problem = make_problem(fam, shape, dtype, M2)
        space = Space(problem, M2)
        check, diags = verify_kernel(cpu, render(fam, cfg, dtype), geometry(space, cfg), problem, seed=runs,
                                     chip=M2)
        runs += 1
        if not check.ok or any(d.severity == "error" for d in diags):
            failures.append(f"{shape} {dtype} {cfg}: {check.summary()} {[d.message for d in diags][:2]}")
    return runs, failures


def cuda_unit(fam: Any, kernels: list[Any]) -> str:
    """Rendered CUDA bodies wrapped as MLX's cuda_kernel wraps them (typed inputs with shapes, outputs)."""
    parts = ["#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n#include <cstdint>\n"]
    for i, k in enumerate(kernels):
        dtype = k.template[0][1]
        in_types = [_CTYPE[d] for d in fam.kernel_input_dtypes(dtype)]
        out_types = [_CTYPE[d] for d in fam.output_dtypes(dtype)]
        args = ", ".join([f"const {t}* {n}, const int* {n}_shape" for t, n in zip(in_types, k.input_names)]
                         + [f"{t}* {n}" for t, n in zip(out_types, k.output_names)])
        parts.append(f"namespace v{i} {{\n{k.header}\ntemplate <typename T> __global__ void kernel({args}) {{\n"
                     f"{k.source}}}\ntemplate __global__ void kernel<{_CTYPE[dtype]}>("
                     + ", ".join([f"const {t}*, const int*" for t in in_types] + [f"{t}*" for t in out_types])
                     + ");\n}\n")
    return "".join(parts)


def nvcc_compiles(fam: Any, configs: list[tuple[dict, str]], tmp: Path) -> str:
    """'' if every (config, dtype) renders to CUDA that nvcc compiles for sm_90, else nvcc's errors."""
    assert NVCC is not None
    kernels = [render(fam, c, d, "cuda") for c, d in configs]
    done = nvcc(["--ptx", "-arch=sm_90"], cuda_unit(fam, kernels))
    return "" if done.returncode == 0 else done.stderr[:3000]
