"""The child that memcheck watches: ``python -m kernsearch.backends._memcheck_child JOB SHA256``.

It reads the job (:class:`._memcheck.Job`, at most :data:`JOB_BYTES`), renders the family's kernel again and runs
nothing unless its hash is ``SHA256`` (given by the parent on the command line) and the job's own; then, per shape,
it makes the verification inputs from the job's seed, places each input at the end of its own allocation
(:func:`tail_placed`), prints a mark (so the parent tells a report's shape) and makes one guarded launch (every
output with its guard zone, filled with the poison, or zeros where the family accumulates). It writes
``result.json`` beside the job: the shapes launched, each input's allocation size, a changed guard zone, or why it
stopped. Bad input: one line on stderr, exit status 2; no device: the result says so, exit status 3.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from ._memcheck import ChildResult, Job
from ._memcheck_report import MARK

JOB_BYTES = 64 * 1024
#: Inputs start on this boundary (vector loads stay aligned); an input's end lies within this of its allocation's.
ALIGN = 256
#: An allocation of a multiple of this is taken at its size by MLX's CUDA allocator: it rounds a smaller one up to a
#: power of two and a larger one to a multiple of its page (16 KiB in MLX 0.2x-0.3x); 2 MiB is a multiple of any
#: page it may take.
PAGE = 2 * 1024 * 1024
_HOST = {"float16": np.float16, "bfloat16": np.float32, "float32": np.float32, "uint32": np.uint32,
         "int32": np.int32}
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "uint32": 4, "int32": 4}


class Refused(Exception):
    """The job cannot run (one line)."""


def read_job(path: Path, sha256: str) -> Job:
    """The job at ``path`` (bounded read, validated), refused unless it names the hash the parent gave."""
    try:
        with open(path, "rb") as f:
            data = f.read(JOB_BYTES + 1)
    except OSError as exc:
        raise Refused(f"cannot read the job {path}: {exc.strerror}") from None
    if len(data) > JOB_BYTES:
        raise Refused(f"the job {path} is over {JOB_BYTES} bytes")
    try:
        job = Job.model_validate_json(data)
    except ValueError as exc:
        raise Refused(f"the job {path} is not a memcheck job: {str(exc).splitlines()[0][:200]}") from None
    if job.sha256 != sha256:
        raise Refused(f"the job names kernel {job.sha256[:12]}, the parent proved {sha256[:12]}")
    return job


def prepared(job: Job) -> tuple[Any, Any, Any]:
    """(family, its kernel source, chip), refused unless the source renders now to the job's hash."""
    from ..family._render import render
    from ..family._spec import load_family
    from ..hardware._chips import get_chip

    family = load_family(job.family)
    kernel = render(family, dict(job.config), job.dtype, job.target)
    if kernel.sha256 != job.sha256:
        raise Refused(f"{job.family} renders now to kernel {kernel.sha256[:12]}, not the proven {job.sha256[:12]}: "
                      "the family changed")
    return family, kernel, get_chip(job.chip)


def placement(nbytes: int) -> tuple[int, int]:
    """(allocation bytes, bytes before the data) for ``nbytes`` of data ending within :data:`ALIGN` bytes of the
    allocation's end, starting on an ``ALIGN`` boundary."""
    span = -(-max(nbytes, 1) // ALIGN) * ALIGN
    allocation = -(-span // PAGE) * PAGE
    return allocation, allocation - span


def tail_placed(x: np.ndarray, dtype: str) -> tuple[Any, int]:
    """(``x`` on the device, the bytes of its allocation): ``x`` is the tail of a flat array whose size MLX keeps
    (a multiple of :data:`PAGE`), starting on an :data:`ALIGN` boundary, so it ends within ``ALIGN`` bytes of its
    allocation's end. MLX passes a view's own address to a kernel (a contiguous slice and reshape copy nothing)."""
    from ._mlx_base import mx_core, to_mx

    mx = mx_core()
    item = _ITEMSIZE.get(dtype, 4)
    allocation, before = placement(x.size * item)
    lead = before // item
    flat = np.zeros(allocation // item, dtype=_HOST.get(dtype, np.float32))
    flat[lead:lead + x.size] = np.asarray(x).reshape(-1)
    placed = to_mx(flat, dtype)[lead:lead + x.size].reshape(x.shape)
    mx.eval(placed)
    getattr(mx, "clear_cache", lambda: None)()  # no freed buffer (a conversion's) is reused for the next input
    return placed, allocation


def launch_at(backend: Any, job: Job, family: Any, kernel: Any, chip: Any, shape: tuple[int, ...],
              allocations: dict[str, int]) -> str:
    """One guarded launch of ``kernel`` at ``shape`` on ``backend`` (an MLX back-end): the first changed guard
    zone's message, or ''."""
    from ..evaluation._verify import kernel_inputs, make_inputs
    from ..family._render import geometry
    from ..family._space import Space, make_problem
    from ._guard import POISON, guarded_run
    from ._mlx_base import mx_core, to_numpy

    getattr(mx_core(), "clear_cache", lambda: None)()  # no buffer of the last shape's is reused for an input
    problem = make_problem(family, shape, job.dtype, chip)
    space = Space(problem, chip)
    geo = geometry(space, dict(job.config))
    inputs = kernel_inputs(problem, make_inputs(problem, job.seed), geo)
    arrays = []
    for i, (name, x) in enumerate(zip(kernel.input_names, inputs)):
        placed, allocations[f"{name} at {'x'.join(map(str, shape))}"] = tail_placed(x, geo.input_dtype(i, job.dtype))
        arrays.append(placed)

    def launch(guarded: Any, init: float | None) -> list[np.ndarray]:
        outs, _ = backend._first(kernel, guarded, arrays, init)
        return [to_numpy(o) for o in outs]

    print(f"{MARK}{'x'.join(map(str, shape))}", flush=True)
    init = 0.0 if geo.zero_outputs else POISON
    _, found = guarded_run(launch, geo, init, tuple(kernel.output_names))
    return found[0].message if found else ""


def run(job: Job, backend: Any = None) -> ChildResult:
    """Every shape of ``job`` launched once (``backend``: default the job's target's MLX back-end, which must find
    its device here)."""
    from .._errors import KernsearchError, VariantFailure
    from . import get_backend

    launched: list[str] = []
    allocations: dict[str, int] = {}
    try:
        family, kernel, chip = prepared(job)
        if backend is None:
            backend = get_backend(job.target)
            backend.check_available()
        for shape in job.shapes:
            guard = launch_at(backend, job, family, kernel, chip, tuple(shape), allocations)
            launched.append("x".join(map(str, shape)))
            if guard:
                return ChildResult(launched=launched, allocations=allocations, guard=guard[:600])
    except VariantFailure as exc:
        return ChildResult(launched=launched, allocations=allocations, error=f"{exc.reason}: {exc.detail}"[:600])
    except KernsearchError as exc:
        return ChildResult(launched=launched, allocations=allocations, error=str(exc).splitlines()[0][:600])
    return ChildResult(launched=launched, allocations=allocations)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kernsearch.backends._memcheck_child JOB SHA256", file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        result = run(read_job(path, args[1]))
    except Refused as exc:
        print(f"memcheck child: {exc}", file=sys.stderr)
        result = ChildResult(error=str(exc)[:600])
        code = 2
    else:
        code = 3 if result.error else 0
    try:
        (path.parent / "result.json").write_text(result.model_dump_json(), encoding="utf-8")
    except OSError as exc:
        print(f"memcheck child: cannot write its result: {exc.strerror}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
