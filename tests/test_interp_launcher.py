"""The launcher that forks the interpreter's kernel runs (``kernsearch.interp._launcher``): the caller never forks
itself while a launcher runs, a hang or a crash costs the run only, a launcher that dies is replaced, one that cannot
start leaves the caller forking itself, and a launcher never outlives its owner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernsearch import Geometry, KernelSource, get_backend
from kernsearch._errors import VariantFailure
from kernsearch.interp import _run

DOUBLE = "C[thread_position_in_grid.x] = 2.0f * A[thread_position_in_grid.x];"
SPIN = """
    uint t = thread_position_in_grid.x;
    float x = A[t];
    while (x < 1.0e9f) {
        x = x * 1.0f;
        C[t] = x;
    }
"""


def run(source: str, **kw: Any) -> np.ndarray:
    kernel = KernelSource(name="launched", target="metal", input_names=("A",), output_names=("C",),
                          header="#include <metal_stdlib>\nusing namespace metal;\n", source=source,
                          template=(("T", "float32"),))
    geo = Geometry(grid=(64, 1, 1), threadgroup=(64, 1, 1), output_shapes=((64,),), output_dtypes=("float32",))
    result = get_backend("cpu").run(kernel, geo, [np.arange(64, dtype=np.float64)], "float32", **kw)
    return np.asarray(result.outputs[0])


def in_a_thread(fn: Callable[[], Any]) -> Any:
    """``fn()`` in a new thread (a thread has its own launcher): its result, or its exception raised here."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def launcher_pid() -> int:
    launcher = _run._launcher_here()
    assert launcher is not None
    return int(launcher.proc.pid)


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_the_caller_never_forks_itself_while_its_launcher_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> int:
        raise AssertionError("the caller forked itself")

    monkeypatch.setattr(os, "fork", refuse)
    assert run(DOUBLE)[3] == 6.0
    assert run(DOUBLE, mode="check")[5] == 10.0


def test_a_hang_is_killed_and_the_same_launcher_runs_the_next_kernel() -> None:
    run(DOUBLE)
    pid = launcher_pid()
    start = time.monotonic()
    with pytest.raises(VariantFailure) as exc:
        run(SPIN, timeout=1.0)
    assert exc.value.reason == "timeout" and time.monotonic() - start < 10
    assert launcher_pid() == pid and children(pid) == []  # the spinning kernel is gone, reaped
    assert run(DOUBLE)[3] == 6.0


def test_a_crash_fails_the_run_only() -> None:
    run(DOUBLE)
    pid = launcher_pid()
    with pytest.raises(VariantFailure) as exc:
        run("device float* p = (device float*)16;\np[thread_position_in_grid.x] = A[0];\nC[0] = 1.0f;")
    assert exc.value.reason == "crash" and "SIGSEGV" in exc.value.detail
    assert launcher_pid() == pid and run(DOUBLE)[3] == 6.0


def test_a_launcher_killed_between_runs_is_replaced() -> None:
    run(DOUBLE)
    pid = launcher_pid()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.1)
    assert run(DOUBLE)[3] == 6.0 and launcher_pid() != pid


def test_a_launcher_killed_while_its_kernel_runs_fails_that_run_and_the_kernel_dies_with_it() -> None:
    run(DOUBLE)
    pid = launcher_pid()
    kernels: list[int] = []

    def kill_the_launcher() -> None:
        deadline = time.monotonic() + 20
        while not kernels and time.monotonic() < deadline:
            kernels.extend(children(pid))
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_launcher)
    killer.start()
    with pytest.raises(VariantFailure) as exc:
        run(SPIN, timeout=30.0)
    killer.join()
    assert exc.value.reason == "crash" and "launcher stopped" in exc.value.detail
    assert kernels and _gone(kernels[0]), "the spinning kernel outlived its launcher"
    assert run(DOUBLE)[3] == 6.0 and launcher_pid() != pid


def test_where_no_launcher_starts_the_caller_forks_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot_start(*args: Any, **kwargs: Any) -> None:
        raise OSError("no launcher here")

    monkeypatch.setattr(_run.Launcher, "__init__", cannot_start)
    forks: list[int] = []
    real_fork = os.fork

    def counted() -> int:
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(os, "fork", counted)
    outputs = in_a_thread(lambda: [run(DOUBLE), run(DOUBLE)])  # a fresh thread: no launcher of its own yet
    assert [o[3] for o in outputs] == [6.0, 6.0] and len(forks) == 2
    with pytest.raises(VariantFailure) as exc:
        in_a_thread(lambda: run(SPIN, timeout=1.0))
    assert exc.value.reason == "timeout"


def test_a_launcher_that_cannot_run_here_is_started_once_and_the_caller_forks_itself(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_run, "LAUNCHER", tmp_path / "missing.py")  # as a launcher that dies at its start
    starts: list[int] = []
    real_start = _run.Launcher.__init__

    def counted(self: _run.Launcher) -> None:
        starts.append(1)
        real_start(self)

    monkeypatch.setattr(_run.Launcher, "__init__", counted)
    outputs = in_a_thread(lambda: [run(DOUBLE) for _ in range(3)])
    assert [o[3] for o in outputs] == [6.0] * 3 and len(starts) == 1


def test_each_thread_has_its_own_launcher_and_it_ends_with_the_thread() -> None:
    run(DOUBLE)
    mine = launcher_pid()

    def theirs() -> int:
        run(DOUBLE)
        return launcher_pid()

    other = in_a_thread(theirs)
    assert other != mine and _gone(other) and alive(mine)


def test_a_launcher_and_its_running_kernel_never_outlive_their_owner() -> None:
    script = textwrap.dedent(f"""
        import os, queue, signal, sys, threading, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_interp_launcher import DOUBLE, SPIN, children, launcher_pid, run
        started = queue.Queue()

        def spin():
            run(DOUBLE)
            started.put(launcher_pid())
            run(SPIN, timeout=60.0)

        threading.Thread(target=spin, daemon=True).start()
        pid = started.get(timeout=60)
        while not children(pid):
            time.sleep(0.02)
        print(pid, children(pid)[0], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    launcher, kernel = map(int, proc.stdout.split())
    assert _gone(launcher), "the launcher outlived the process that started it"
    assert _gone(kernel), "a spinning kernel outlived the process that started it"


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_a_library_whose_loading_hangs_is_a_timeout_and_the_next_run_gets_a_new_launcher(tmp_path: Path) -> None:
    source = tmp_path / "spin.cpp"
    source.write_text("__attribute__((constructor)) static void spin() { for (volatile int i = 0;; i = i + 1) {} }\n")
    lib = tmp_path / "spin.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O0", str(source), "-o", str(lib)], check=True, timeout=120)
    run(DOUBLE)
    pid = launcher_pid()
    start = time.monotonic()
    with pytest.raises(VariantFailure) as exc:
        _run.run_forked(lib, [np.zeros(4, dtype=np.float32)], [0], (1, 1, 1), (1, 1, 1), 32768, 64, 1.0)
    assert exc.value.reason == "timeout" and "loading the kernel" in exc.value.detail
    assert time.monotonic() - start < 10 and _gone(pid)
    assert run(DOUBLE)[3] == 6.0 and launcher_pid() != pid


class _Recorder:
    """Stands for a kernel library: records the set-up calls ``configure`` makes, by name."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args: self.calls.append(name)


def test_a_launch_read_back_asks_the_interpreter_for_what_it_asked_only() -> None:
    """The launch crosses to the kernel's process as bytes in the run's region: read back (read_launch), it is the
    launch (tuples, not JSON's lists: a schedule of (0, 0, 0) is no schedule), and configure asks the library only for
    what it holds: detection and lane sync in lockstep builds, the resident pool, an order, sampled threadgroups (their
    buffer returned, held by the caller while the kernel runs)."""
    import mmap

    from kernsearch.interp._launcher import HEAD, Launch, configure, read_launch

    plain = Launch("k.so", (64, 1, 1), (32, 1, 1), 4, 256, offsets=(64, 128))
    full = Launch("k.so", (64, 2, 1), (32, 1, 1), 4, 256, threadgroups=((0, 0, 0), (1, 1, 0)), schedule=(1, 2, 7),
                  detect=True, sync_all=True, persistent=True, offsets=(64,))
    for launch in (plain, full):
        data = launch.encode()
        region = mmap.mmap(-1, 4096)
        HEAD.pack_into(region, 0, 0, 0, 0, 512, len(data))
        region[512:512 + len(data)] = data
        assert read_launch(region) == launch
    lib = _Recorder()
    assert configure(lib, read_launch_of(plain)) is None and lib.calls == []
    selection = configure(lib, read_launch_of(full))
    assert lib.calls == ["ks_detect", "ks_sync_all", "ks_pool", "ks_order", "ks_select"]
    assert list(selection) == [0, 0, 0, 1, 1, 0]


def read_launch_of(launch: Any) -> Any:
    """``launch`` through its bytes, as the kernel's process reads it."""
    from kernsearch.interp._launcher import Launch

    return Launch.decode(launch.encode())
