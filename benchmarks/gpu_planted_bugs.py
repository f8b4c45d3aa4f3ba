"""A search measured on the GPU refuses an off-by-one at the ragged edge (issue 36): ``kernsearch tune COPY --backend
cuda --publish`` on copies of the built-in gemv, each with one bug planted in its CUDA template.

On the GPU machine (MLX with its CUDA back-end; from the repository root)::

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu_planted_bugs.py --out $OUT    # ~3-5 minutes on an H200
    python benchmarks/gpu_planted_bugs.py --dry-run                                 # here: checks the script

Cases (each a fresh copy, a fresh store under a temporary folder, never the repository's ``artifacts/``):

* ``clean``: the winner passes; its record (``tune --json --publish``) names the checks it passed, and where the
  store's gate publishes it the line says exactly those (``bounds: guard zones checked on the device; out-of-bounds
  reads and threadgroup order of this cuda kernel: not checked (...); its metal twin checked on the interpreter``);
* ``write_off_by_one``: both layouts' write guards ``< N`` made ``<= N`` (the last row's last thread writes one
  element past Y's end at a shape off the tiles): refused, a ``FAIL (device_bounds)`` line naming the write past
  the end of Y seen in its guard zone on the device, nothing published;
* ``read_off_by_one``: the nk layout's load guard alone made ``<= N`` (a row past W's end is read, never written):
  the GPU cannot see a read outside a buffer, and the Metal twin is clean, so this one passes every check (and is
  published where the gate takes it), its line saying that this CUDA kernel's out-of-bounds reads were not checked.
  Recorded so the limit is seen, not hidden.

``--dry-run`` runs the same commands on ``benchmarks/interpreted_gpu.py`` (the metal back-end's verification runs,
kernels on the CPU interpreter, timings simulated) with the bugs planted in the Metal template, for the M2 Max:
measured evidence needs a detected GPU, so nothing is published there; the clean case is judged by the checks its
winner records (``--json``), and the read past the end is refused by the interpreter's sanitizer (the twin *is* the
kernel there, so a dry run cannot show the GPU's blind spot). Nothing it prints is a measurement. Exit status 1 when any case does not behave as stated; the
log and a JSON summary go to ``--out`` (``gpu_planted_bugs[_dry-run].{log,json}``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: (old, new) per template target: the write guards of both layouts, the load guard of the nk layout.
PLANTS = {
    "write_off_by_one": {
        "cuda": [("m0 + i < M && n0 + r < N", "m0 + i < M && n0 + r <= N"),
                 ("m0 + i < M && c0 + e < N", "m0 + i < M && c0 + e <= N")],
        "metal": [("m0 + i < M && n0 + r < N", "m0 + i < M && n0 + r <= N"),
                  ("m0 + i < M && c0 + e < N", "m0 + i < M && c0 + e <= N")]},
    "read_off_by_one": {
        "cuda": [("            if (n0 + r < N) {", "            if (n0 + r <= N) {")],
        "metal": [("            if (n0 + r < N) {", "            if (n0 + r <= N) {")]},
}


@dataclass
class Case:
    name: str
    rc: int
    published: bool
    fails: list[str]
    publish_line: str
    bounds: dict[str, object] | None
    ok: bool
    why: str


def plant(folder: Path, case: str, target: str) -> None:
    from kernsearch.family._spec import builtin_families_dir

    shutil.copytree(builtin_families_dir() / "gemv", folder)
    template = folder / f"gemv.{'cu' if target == 'cuda' else 'metal'}.j2"
    text = template.read_text()
    for old, new in PLANTS.get(case, {}).get(target, []):
        if old not in text:
            raise SystemExit(f"{template.name}: {old!r} not found: the plant no longer applies")
        text = text.replace(old, new)
    template.write_text(text)


def as_json(name: str, dry: bool) -> bool:
    """Cases judged by the winner's record (``tune --json``): the clean one, and on the GPU the read past the end
    (whether the store's gate then publishes depends on the speed, not on the checks). The write past the end is
    run as a user runs it, its FAIL lines printed."""
    return name == "clean" or (name == "read_off_by_one" and not dry)


def tune(folder: Path, store: Path, dry: bool, shape: str, trials: int, json_out: bool
         ) -> subprocess.CompletedProcess[str]:
    backend = ["--backend", "interpreted_gpu:InterpretedGPU", "--chip", "M2 Max"] if dry else ["--backend", "cuda"]
    publish = [] if dry and json_out else ["--publish"]  # a dry run's winner cannot be published (not measured)
    cmd = [sys.executable, "-m", "kernsearch", "tune", str(folder), *backend, "--shape", shape, "--trials", str(trials),
           "--storage", ":memory:", *publish, *(["--json"] if json_out else [])]
    path = os.pathsep.join([str(REPO / "benchmarks"), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "KERNSEARCH_ARTIFACTS": str(store), "COLUMNS": "200", "PYTHONPATH": path}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=folder.parent, timeout=1800, check=False)


def judge(name: str, done: subprocess.CompletedProcess[str], store: Path, dry: bool) -> Case:
    out = done.stdout + done.stderr
    lines = out.splitlines()
    fails = [line for line in lines if line.startswith("trial ") and "FAIL (" in line]
    publish_line = next((line for line in lines if line.startswith("artifact ")), "")
    published = "published as" in out or bool(list(store.rglob("manifest.json")))
    bounds = None
    if as_json(name, dry):
        try:
            data = json.loads(done.stdout)
            final = data["final"]
            winner = final["checks"][str(final["winner"])]
            bounds = {**winner.get("bounds", {}), "passed": winner.get("ok")}
            publish = data.get("publish") or {}
            published = bool(publish.get("published"))
            publish_line = f"publish: {publish}" if publish else ""
        except (ValueError, KeyError, TypeError):
            bounds = None
    ok, why = expected(name, dry, published, fails, publish_line, bounds)
    return Case(name, done.returncode, published, fails, publish_line, bounds, ok, why)


def expected(name: str, dry: bool, published: bool, fails: list[str], line: str,
             bounds: dict[str, object] | None) -> tuple[bool, str]:
    """Whether a case behaved as the module docstring states, and what was looked for."""
    if name == "clean" or (name == "read_off_by_one" and not dry):
        recorded = bool(bounds and bounds.get("passed") and bounds.get("device"))
        said = not published or "guard zones checked on the device" in line
        if name == "clean":
            return recorded and said, "the winner passed, its record naming the device's guard zones (and the " \
                "interpreter's checks or why they did not run); if the gate published it, its line says so"
        return recorded and (not published or "reads and threadgroup order of this cuda kernel: not checked" in line), \
            "not caught (a read outside a buffer is invisible on the GPU; the Metal twin is clean): the winner " \
            "passed, and if published its line says this kernel's reads were not checked"
    refused = not published and any("FAIL (device_bounds)" in f for f in fails)
    if name == "write_off_by_one":
        return refused and any("past the end of output Y on the device" in f for f in fails), \
            "refused: FAIL (device_bounds), a write past the end of Y in its guard zone on the device"
    return refused and any("outside a device buffer" in f for f in fails), \
        "refused: FAIL (device_bounds), the interpreter's sanitizer names the read past W's end (dry run: the twin " \
        "is the kernel)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="the interpreted GPU here, bugs in the Metal template")
    parser.add_argument("--out", default=None, help="folder for the log and the JSON summary")
    parser.add_argument("--shape", default=None, help="default 4,4096,4096 on the GPU, 3,256,256 in a dry run")
    parser.add_argument("--trials", type=int, default=None, help="default 12 on the GPU, 6 in a dry run")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    dry = args.dry_run
    shape = args.shape or ("3,256,256" if dry else "4,4096,4096")
    trials = args.trials or (6 if dry else 12)
    target = "metal" if dry else "cuda"
    log: list[str] = []
    cases: list[Case] = []
    with tempfile.TemporaryDirectory(prefix="kernsearch-planted-") as tmp:
        for name in ("clean", "write_off_by_one", "read_off_by_one"):
            folder, store = Path(tmp) / name / "gemv", Path(tmp) / name / "store"
            folder.parent.mkdir(parents=True)
            plant(folder, name, target)
            done = tune(folder, store, dry, shape, trials, as_json(name, dry))
            case = judge(name, done, store, dry)
            cases.append(case)
            log += [f"== {name} ({'dry run, ' if dry else ''}{target} template, {shape}, {trials} trials): rc "
                    f"{done.returncode}", done.stdout, done.stderr,
                    f"-> {'as stated' if case.ok else 'NOT AS STATED'}: {case.why}", ""]
            print(f"{name}: {'ok' if case.ok else 'NOT AS STATED'} ({case.why})", flush=True)
            for line in case.fails[:3] + ([case.publish_line] if case.publish_line else []):
                print(f"    {line[:400]}")
            if case.bounds is not None:
                print(f"    the winner's check: {case.bounds}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = "gpu_planted_bugs" + ("_dry-run" if dry else "")
        (out / f"{stem}.log").write_text("\n".join(log))
        (out / f"{stem}.json").write_text(json.dumps([asdict(c) for c in cases], indent=2) + "\n")
    sys.exit(0 if all(c.ok for c in cases) else 1)


if __name__ == "__main__":
    main()
