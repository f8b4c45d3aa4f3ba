"""One chip rule (issue 42): the commands, the library's ``tune``, the flows and the exported package resolve a chip
by one function, ``_rules.choose_chip`` (shipped), through ``hardware.resolve_chip`` or the package's
``Dispatcher.running_chip``: each gives the same chip for the same name and refuses the same names (one line on
stderr and exit 2 in the commands), and none restates the rule."""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFUSED = "refused"
#: Names as users, job files and consumers give them, hostile ones included.
NAMES = ["M2 Max", "m2max", "Apple M2-Max", "  m2_max ", "M2-MAX", "H100", "h100", "h100\t", "H200", "cpu", "M5 Pro",
         "", "   ", "apple", "Apple", "M2 Max\n", "M2\x00Max", "M2 Max; rm -rf /", "../../etc/passwd", "\uff2d2 Max",
         "M9 Ultra", "x" * 100_000, "M2 Max" + " " * 100, "sm_90", "applegpu_g14c", "{'vendor': 'apple'}"]
#: What a few of them name (the others only have to be answered alike by every caller).
EXPECTED = {"M2 Max": "M2 Max", "Apple M2-Max": "M2 Max", "  m2_max ": "M2 Max", "h100": "H100", "cpu": "cpu",
            "": REFUSED, "apple": REFUSED, "M2\x00Max": REFUSED, "\uff2d2 Max": REFUSED, "M9 Ultra": REFUSED,
            "x" * 100_000: REFUSED, "M2 Max" + " " * 100: REFUSED, "sm_90": REFUSED}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An exported package's dispatch table with no family: the chips it ships are the registry's."""
    from kernsearch.exporting._export import _chips
    from kernsearch.exporting.runtime._runtime import FORMAT

    root = tmp_path_factory.mktemp("ks_chips")
    (root / "dispatch.json").write_text(json.dumps({"format": FORMAT, "families": {}, "chips": _chips()}))
    return root


def _name(ask: Any) -> str:
    from kernsearch import KernsearchError

    try:
        return str(ask())
    except (KernsearchError, ValueError):
        return REFUSED


def _cli_chip(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    """``kernsearch chip --chip NAME``, in this process: the name it shows, or refused (exit 2)."""
    from kernsearch.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["chip", "--chip", name])
    shown = capsys.readouterr().out
    return shown.split(" (", 1)[0] if stop.value.code == 0 else REFUSED


def _farm_worker(name: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The registry chip a farm worker declaring it (``KERNSEARCH_CHIP``) would run a run for ``name`` on, or refused."""
    from kernsearch.flows.nightly import refusal
    from kernsearch.hardware._chips import registry

    may = []
    for chip in registry():
        monkeypatch.setenv("KERNSEARCH_CHIP", chip)
        may += [chip] if _name(lambda: refusal(name)) == "None" else []
    return may[0] if len(may) == 1 else REFUSED if not may else f"several: {may}"


def answers(name: str, package: Path, capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The chip each caller resolves ``name`` to (its registry name), or ``refused``."""
    from kernsearch.backends import select_backend
    from kernsearch.exporting.runtime._runtime import Dispatcher
    from kernsearch.hardware._chips import get_chip, resolve_chip

    runtime = Dispatcher(package)
    return {
        "get_chip": _name(lambda: get_chip(name).name),
        "resolve_chip": _name(lambda: resolve_chip(name).name),
        "the commands' chip (space, render, predict)": _name(lambda: resolve_chip(name, default=True).name),
        "tune --backend model, tune()": _name(lambda: select_backend("model", name).chip.name),
        "tune --backend auto, no GPU here": _name(lambda: select_backend("auto", name).chip.name),
        "the exported package": _name(lambda: runtime.running_chip(name)[0]["name"]),
        "a farm worker's chip check": _farm_worker(name, monkeypatch),
        "kernsearch chip --chip": _cli_chip(name, capsys),
    }


@pytest.mark.parametrize("name", NAMES, ids=lambda n: repr(n)[:24])
def test_every_caller_resolves_a_chip_name_alike(name: str, package: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from kernsearch.hardware import _chips

    monkeypatch.setattr(_chips, "detect_chip", lambda: _chips.get_chip("cpu"))  # no GPU here, whatever this host has
    got = answers(name, package, capsys, monkeypatch)
    assert len(set(got.values())) == 1, got
    if name in EXPECTED:
        assert got["get_chip"] == EXPECTED[name], got


@pytest.mark.parametrize("info", [{"architecture": "applegpu_g14s", "device_name": "Apple M2 Max"},
                                  {"architecture": "sm_90", "device_name": "NVIDIA H100 80GB HBM3"},
                                  {"architecture": "sm_120", "device_name": "NVIDIA RTX 9090"},
                                  {"architecture": "applegpu_g99c", "device_name": "Apple M99 Max"}, {}],
                         ids=["m2max", "h100", "unknown-nvidia", "unknown-apple", "no-gpu"])
def test_kernsearch_and_the_package_take_the_same_chip_here(info: dict[str, str], package: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """With no chip named, the chip here: the same record in kernsearch and in the package, for a known GPU, an
    unknown one (a stand-in) and none; the commands' default applies the rule's fallback to the same chip."""
    import warnings

    from kernsearch.exporting.runtime import _runtime
    from kernsearch.hardware import _chips

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unknown GPU warns: said elsewhere
        here = _chips.chip_from_device_info(info)
    monkeypatch.setattr(_chips, "detect_chip", lambda: here)
    monkeypatch.setattr(_runtime, "_gpu_available", lambda: bool(info))
    record, _ = _runtime.Dispatcher(package, device_info=info).running_chip()
    assert _chips.resolve_chip().name == record["name"] == here.name
    assert _chips.resolve_chip(measures=True, default=True).name == here.name  # a measurement: the GPU here
    commands = _chips.resolve_chip(default=True).name
    assert commands == (here.name if info else _chips.default_apple_chip().name)


@functools.lru_cache(maxsize=1)
def _sources() -> dict[str, str]:
    """Every product module (search/, flows/) by path."""
    return {str(f.relative_to(ROOT)): f.read_text(encoding="utf-8")
            for root in ("search", "flows") for f in sorted((ROOT / root).rglob("*.py"))}


def _calls(name: str, defines: bool = False) -> set[str]:
    """The product files that call ``name`` (a plain or attribute call), or with ``defines`` that call or define it
    (only files naming it are parsed)."""
    found = set()
    for path, text in _sources().items():
        if name in text:
            for node in ast.walk(ast.parse(text)):
                called = isinstance(node, ast.Call) and name in (getattr(node.func, "id", None),
                                                                 getattr(node.func, "attr", None))
                if called or defines and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                    found.add(path)
    return found


def test_no_caller_restates_the_chip_rule() -> None:
    """The helpers that each resolved a chip their own way are gone, names are normalised in the shipped rules only,
    and only the two entry points (kernsearch's ``resolve_chip``, the package's ``running_chip``) apply the rule."""
    gone = ("target_chip", "chip_for", "machine_chip", "_machine", "_verifier", "_normalise")
    assert not {name: _calls(name, defines=True) for name in gone if _calls(name, defines=True)}
    normalising = [path for path, text in _sources().items() if r"[\s_\-]+" in text or 'removeprefix("apple")' in text]
    assert normalising == ["search/_rules_chips.py"]
    entries = {"search/hardware/_chips.py", "search/exporting/runtime/_runtime.py"}
    assert _calls("choose_chip") == entries and _calls("named_chip") <= entries and _calls("identify") == entries
    assert _calls("detect_chip") == {"search/hardware/_chips.py"}
    # The default M-series chip is the rule's fallback; elsewhere it is only "an Apple chip" (a CUDA config's Metal
    # twin is checked on one), never a chip results are for.
    assert _calls("default_apple_chip") <= {"search/hardware/_chips.py", "search/studies/_measured.py"}


BAD = ["M9 Ultra", "x" * 5000, "M2 Max\x00", "../../etc/passwd"]
COMMANDS = [["chip"], ["space", "gemm"], ["render", "gemm"], ["predict", "gemm"], ["verify", "softmax"],
            ["tune", "softmax", "--storage", ":memory:"], ["tune", "softmax", "--backend", "model"],
            ["explain", "gemm"], ["bench", "decode"]]


@pytest.mark.parametrize("bad", BAD, ids=["unknown", "long", "nul", "path"])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_an_unknown_chip_is_one_line_and_exit_2(command: list[str], bad: str, capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernsearch.cli import main

    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path))
    monkeypatch.setenv("KERNSEARCH_ARTIFACTS", str(tmp_path / "store"))
    with pytest.raises(SystemExit) as stop:
        main([*command, "--chip", bad])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert stop.value.code == 2 and len(lines) == 1, captured.err[-2000:]
    assert lines[0].startswith("error: unknown chip") and len(lines[0]) < 400, lines[0][:500]
    assert "Traceback" not in captured.err and not captured.out


@pytest.mark.slow
def test_flows_refuse_an_unknown_chip_in_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from kernsearch.cli import main

    jobs = tmp_path / "jobs.toml"
    jobs.write_text('[[jobs]]\nfamily = "softmax"\nshapes = ["8,64"]\ndtypes = ["float32"]\nchips = ["M2 Max"]\n')
    for command in (["flows", "run", str(jobs)], ["flows", "serve", str(jobs)]):
        with pytest.raises(SystemExit) as stop:
            main([*command, "--chip", "M9 Ultra"])
        lines = capsys.readouterr().err.strip().splitlines()
        assert stop.value.code == 2 and len(lines) == 1 and "unknown chip 'M9 Ultra'" in lines[0], lines


def test_the_exported_package_refuses_an_unknown_chip_in_one_line(package: Path) -> None:
    from kernsearch.exporting.runtime._runtime import Dispatcher

    for bad in BAD + [123, ["M2 Max"]]:
        with pytest.raises(ValueError) as refused:
            Dispatcher(package).running_chip(bad)
        text = str(refused.value)
        assert text.startswith("unknown chip") and "\n" not in text and len(text) < 400, text[:500]
