"""Issue 27's minor points: each bad input is one line on stderr and exit 2 (never a silent default, a
shadowed module, "no artifacts", a file named with a newline, a dropped character, a file libpq reads, a
FAIL, a late refusal or "best nan ms")."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from .conftest import CANARY, GEMM_DIR, KEY, candidate, set_key
from .test_cli_fuzz import run_cli


def _one_line(result: tuple[int, str, str], *needles: str) -> None:
    code, stdout, stderr = result
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, (code, stdout[-1000:], stderr[-2000:])
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("args", [["space", "gemm", "--chip", ""], ["space", "gemm", "--dtype", " "],
                                  ["studies", "--storage", ""], ["artifacts", "list", "--store", ""],
                                  ["tune", "gemm", "--backend", "model", "--study", "", "--storage", ":memory:"],
                                  ["chip", "--chip", ""], ["predict", "gemm", "--chip", ""]])
def test_an_empty_option_is_refused_not_taken_for_the_default(args: list[str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNSEARCH_HOME", str(tmp_path / "home"))
    flag = next(a for a in args if a.startswith("--") and args[args.index(a) + 1].strip() == "")
    _one_line(run_cli(args, tmp_path), flag, "empty value")


@pytest.mark.parametrize("name", ["os", "sys", "json", "kernsearch", "mlx", "numpy"])
def test_export_refuses_a_package_name_that_shadows_a_module(name: str, tmp_path: Path) -> None:
    _one_line(run_cli(["export", "gemm", "--name", name, "--store", str(tmp_path / "store"), "--out",
                       str(tmp_path / "dist")], tmp_path), "shadow")
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("kind", ["file", "fifo", "device"])
@pytest.mark.parametrize("command", ["list", "verify", "show", "migrate"])
def test_a_store_path_that_is_not_a_folder_is_refused(tmp_path: Path, kind: str, command: str) -> None:
    path = tmp_path / "store"
    if kind == "file":
        path.write_text("not a store")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        try:  # a private copy of /dev/null inside the test's folder, never the machine's own
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs root")
    args = ["artifacts", command, *([KEY] if command == "show" else []), "--store", str(path)]
    _one_line(run_cli(args, tmp_path), "not a folder")


def test_a_newline_in_a_sqlite_url_is_refused_and_makes_no_file(tmp_path: Path) -> None:
    _one_line(run_cli(["studies", "--storage", f"sqlite:///{tmp_path}/a\nb.db"], tmp_path), "control character")
    _one_line(run_cli(["tune", "gemm", "--backend", "model", "--trials", "1", "--storage",
                       f"sqlite:///{tmp_path}/c\rd.db"], tmp_path), "control character")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_invisible_character_in_an_artifact_key_is_refused_not_dropped(tmp_path: Path) -> None:
    from kernsearch import ArtifactStore

    store = tmp_path / "store"
    assert ArtifactStore(store).publish(candidate(median=1.0)).published
    code, stdout, _ = run_cli(["artifacts", "show", KEY, "--store", str(store)], tmp_path)
    assert code == 0 and KEY in stdout
    rtl = KEY.replace("M2-Max", "M2-Max\u200f")
    _one_line(run_cli(["artifacts", "show", rtl, "--store", str(store)], tmp_path), "U+200F")
    _one_line(run_cli(["artifacts", "show", KEY.replace("64x64x64", "64x64x6_4"), "--store", str(store)],
                      tmp_path), "not like 64x64x64")


@pytest.mark.parametrize("param", ["passfile", "sslkey", "sslrootcert", "service", "servicefile"])
def test_a_postgresql_url_cannot_make_libpq_read_a_file(param: str, tmp_path: Path) -> None:
    secret = CANARY / f"secret-{param}"
    secret.write_text("*:*:*:*:hunter2\n")
    url = f"postgresql://kernsearch@127.0.0.1:1/studies?connect_timeout=1&{param}={secret}"
    _one_line(run_cli(["studies", "--storage", url], tmp_path), repr(param), "not allowed")
    secret.unlink()


def test_a_reference_of_the_wrong_shape_is_a_spec_error(hostile_family, tmp_path: Path) -> None:
    folder = hostile_family(toml=lambda t: set_key(t, "reference", '"matmul(A, B).T"'), name="transposed")
    _one_line(run_cli(["verify", str(folder), "--shape", "64,32,16", "--dtype", "float32", "--chip", "M2 Max"],
                      tmp_path), "reference", "(32, 64)", "(64, 32)")
    folder = hostile_family(toml=lambda t: set_key(t, "reference", '"[matmul(A, B), matmul(A, B)]"'), name="two")
    _one_line(run_cli(["verify", str(folder), "--shape", "64,32,16", "--dtype", "float32", "--chip", "M2 Max"],
                      tmp_path), "2 value(s) for 1 output(s)")


@pytest.mark.parametrize("expr", ['"matmul(A.T.T.T.ctypes, B)"', '"matmul(A, B.base)"'])
@pytest.mark.parametrize("field", ["baseline", "reference"])
def test_an_array_attribute_outside_the_language_is_refused_at_load(hostile_family, tmp_path: Path, field: str,
                                                                     expr: str) -> None:
    folder = hostile_family(toml=lambda t: set_key(t, field, expr), name=f"attr-{field}")
    _one_line(run_cli(["space", str(folder)], tmp_path), field, "arrays offer only")


@pytest.mark.parametrize("time", ["NaN", "Infinity", "-1.0", "0"])
def test_a_landscape_with_a_time_that_is_not_a_time_is_refused(tmp_path: Path, time: str) -> None:
    cache = {str(a): {"a": a, "time": 1.0 + a, "times": [1.0 + a] * 3} for a in (1, 2, 3)}
    text = json.dumps({"device_name": "NVIDIA H100", "tune_params_keys": ["a"], "tune_params": {"a": [1, 2, 3]},
                       "cache": {**cache, "2": {"a": 2, "time": "__T__", "times": [1.0]}}}).replace('"__T__"', time)
    land = tmp_path / "land.json"
    land.write_text(text)
    _one_line(run_cli(["tune", "land", "--landscape", str(land), "--trials", "3", "--storage", ":memory:"],
                      tmp_path), "cache entry '2'", "positive finite")


def test_the_family_fixture_still_loads(tmp_path: Path) -> None:
    """The control for the spec tests above: the unedited copy is a valid family."""
    code, _, stderr = run_cli(["render", str(GEMM_DIR), "--chip", "M2 Max"], tmp_path)
    assert code == 0, stderr
