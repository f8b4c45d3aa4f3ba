"""Every command driven with generated hostile arguments: exit 0, 1 or 2 only; on 2 exactly one stderr
line; never a traceback; every example finishes within a bound. Files are only written under the
example's own folder (the canary test checks the rest of the tree)."""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernsearch.cli import main

BOUND_S = 60
#: Commands whose honest work is long get a longer bound (a hang still fails): `space` enumerates up to ~10^5
#: configs (~22 s of CPU for M5 Max's GEMM space, over 60 s of wall time on a busy 2-core machine).
SLOW_BOUND_S = 180
_TMP = Path(os.environ.get("KS_FUZZ_DIR", "/tmp")) / f"ks-fuzz-{os.getpid()}"


_JOB = """[[jobs]]
name = "fuzz"
family = "gemm"
shapes = ["64,64,64"]
dtypes = ["float32"]
chips = ["M2 Max"]
trials = 2
backend = "model"
"""
#: Job files for the flows commands: all hostile but ``valid.toml`` (a job for M2 Max only, which the fuzz
#: runs only where a bad schedule or a missing Prefect server must stop it first: it never serves or runs).
JOB_FILES = {
    "valid.toml": _JOB,
    "deep.toml": "x = " + "[" * 6000 + "]" * 6000 + "\n",
    "seed.toml": "[defaults]\nseed = -1\n" + _JOB,
    "timeout.toml": "[defaults]\ntimeout = inf\n" + _JOB,
    "trials.toml": _JOB.replace("trials = 2", "trials = 100000000000000000000"),
    "traversal.toml": _JOB.replace('family = "gemm"', 'family = "../../x"'),
    "name.toml": _JOB.replace('name = "fuzz"', 'name = "../../../tmp/x"'),
    "template.toml": _JOB.replace('family = "gemm"', 'family = "{{7*7}}"'),
    "jobs.toml": 'jobs = "x"\n',
    "empty.toml": "",
    "bad.toml": "[[jobs]\nname = 1\n",
    "bomb.yaml": "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                 "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
                 "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
                 "jobs: [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n",
    "jobs.txt": _JOB,
}


def _pool() -> dict[str, str]:
    """Hostile files every example may name: special files, links, junk, deep JSON, huge sizes."""
    root = _TMP
    if (root / ".ready").exists():
        return json.loads((root / ".ready").read_text())
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    fifo = root / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    paths["fifo"] = str(fifo)
    (root / "dir").mkdir(exist_ok=True)
    paths["dir"] = str(root / "dir")
    (root / "junk.db").write_bytes(os.urandom(8192))
    paths["junk"] = str(root / "junk.db")
    (root / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    paths["deep"] = str(root / "deep.json")
    (root / "bad-utf8.toml").write_bytes(b"\xff\xfe name = 1")
    paths["badutf8"] = str(root / "bad-utf8.toml")
    link = root / "link"
    if not link.is_symlink():
        link.symlink_to("/etc/passwd")
    paths["link"] = str(link)
    store = root / "store" / "gemm" / "M2-Max" / "float16" / "64x64x64"
    (store / "v1").mkdir(parents=True, exist_ok=True)
    if not (store / "CURRENT").exists():
        os.mkfifo(store / "CURRENT")
    (store / "v1" / "manifest.json").write_text("[" * 10_000)
    paths["store"] = str(root / "store")
    for name, text in JOB_FILES.items():
        (root / name).write_text(text)
        paths[f"job:{name}"] = str(root / name)
    (root / ".ready").write_text(json.dumps(paths))
    return paths


POOL = _pool()
atexit.register(shutil.rmtree, _TMP, True)
PATHS = st.sampled_from(sorted(POOL.values()) + ["", "/nonexistent", "..", "./", "~", "\x00", "a" * 5000])
TEXT = st.text(max_size=40) | st.sampled_from(
    ["nan", "inf", "-inf", "1e309", "-1", "0", str(2**32), str(2**70), "2**32", "1_000", "0x10", " ", "--",
     "--help", "gemm", "../../x", "{{7*7}}", "{% for %}", "'; import os", "BM=7", "BM=64,BN=", "=,=",
     "M2 Max", "H100", "cpu", "64,64,64", "0,0,0", "1,1", "99999999999,1,1", "64x64x64x", "float8"])
NUMBER = st.sampled_from(["nan", "inf", "-inf", "1e309", "-1", "0", "0.0001", "3", str(2**31), str(2**64),
                          "1e-320", "x", "", "1.5"]) | st.integers(-10, 10**12).map(str)
FAMILY = st.sampled_from(["gemm", "./gemm", "nosuch", POOL["dir"], POOL["fifo"], POOL["link"], POOL["badutf8"],
                          "", "../../etc", "templates/gemm"]) | TEXT
STORAGE = st.sampled_from([":memory:", f"sqlite:///{POOL['junk']}", f"sqlite:///{POOL['fifo']}",
                           f"sqlite:///{POOL['dir']}", "sqlite:///", "nosuch://x", "", "sqlite:////proc/x"])
STORE = st.sampled_from([POOL["store"], POOL["fifo"], POOL["junk"], POOL["dir"], "/nonexistent"])
SMALL_SHAPE = st.sampled_from(["16,16,16", "17,9,33", "0,1,1", "-1,4,4", "a,b,c", "1", "", "4,4,4,4",
                               "99999999999,1,1", "100000,100000,100000"])


STUDY = "fuzz-study"  # made by the report test before its examples: a study the report can be written for
#: The tune that makes it: the sampler is not what these tests are about, and ``random`` skips the model's ranking
#: of every valid config (the ``auto`` start: ~9 s of CPU for GEMM at 64^3).
SETUP_TUNE = ["tune", "gemm", "--backend", "model", "--verify", "none", "--chip", "M2 Max", "--shape", "64,64,64",
              "--sampler", "random", "--study", STUDY]
OUT_FILE = st.sampled_from(["r.html", "sub/dir/r.html", ".", "", "\x00", "a" * 5000, "/proc/nosuch/r.html",
                            "/proc/version", "r.html/"]) | TEXT
BAD_STORAGE = st.sampled_from([f"sqlite:///{POOL['junk']}", f"sqlite:///{POOL['fifo']}", f"sqlite:///{POOL['dir']}",
                               "nosuch://x", "sqlite:////proc/x", f"sqlite:///{POOL['link']}",
                               "postgresql://u:pw@127.0.0.1:9/x"])
BAD_PORT = st.sampled_from(["0", "-1", "65536", "x", "nan", "", str(2**70), "1e3"])
BAD_HOST = st.sampled_from(["256.256.256.256", "\x00", "nosuch.invalid", "::::", "a" * 300, "203.0.113.7"])
BAD_CRON = st.sampled_from(["", "* * *", "61 * * * *", "nan", "{{7*7}}", "a b c d e", "0 25 * * *", "\x00"])
BAD_JOB = st.sampled_from(sorted(v for k, v in POOL.items() if k.startswith("job:") and k != "job:valid.toml")
                          + [POOL["fifo"], POOL["dir"], POOL["link"], POOL["badutf8"], POOL["deep"], POOL["junk"],
                             "", "/nonexistent.toml", "\x00"])


def _opt(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), values.map(lambda v: [flag, v]))


def _cmd(head: list[str], *parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda ps: head + [a for p in ps for a in p])


COMMANDS = {
    "families": _cmd(["families"], _opt("--bogus", TEXT)),
    "chip": _cmd(["chip"], _opt("--chip", TEXT)),
    "space": _cmd(["space"], FAMILY.map(lambda f: [f]), _opt("--shape", TEXT), _opt("--dtype", TEXT),
                  _opt("--chip", TEXT)),
    "render": _cmd(["render"], FAMILY.map(lambda f: [f]), _opt("--config", TEXT), _opt("--shape", TEXT),
                   _opt("--target", TEXT), _opt("--chip", TEXT)),
    "predict": _cmd(["predict"], FAMILY.map(lambda f: [f]), _opt("--config", TEXT), _opt("--shape", TEXT),
                    _opt("--chip", TEXT)),
    "verify": _cmd(["verify"], FAMILY.map(lambda f: [f]), _opt("--config", TEXT), _opt("--shape", SMALL_SHAPE),
                   _opt("--seed", NUMBER), _opt("--timeout", NUMBER), _opt("--backend", TEXT),
                   st.just(["--chip", "M2 Max"])),
    "tune": _cmd(["tune"], FAMILY.map(lambda f: [f]), st.just(["--backend", "model", "--verify", "none"]),
                 _opt("--trials", st.sampled_from(["1", "2", "0", "-1", "nan", "x", str(2**70)])),
                 _opt("--seed", NUMBER), _opt("--timeout", NUMBER), _opt("--patience", NUMBER),
                 _opt("--time-budget", TEXT), _opt("--sampler", TEXT), _opt("--shape", SMALL_SHAPE),
                 _opt("--finalists", st.sampled_from(["1", "0", str(2**70)])), _opt("--study", TEXT),
                 STORAGE.map(lambda s: ["--storage", s]), st.just(["--chip", "M2 Max", "--trials", "2"])),
    "studies": _cmd(["studies"], STORAGE.map(lambda s: ["--storage", s])),
    "show": _cmd(["show"], TEXT.map(lambda t: [t]), STORAGE.map(lambda s: ["--storage", s]), _opt("--top", NUMBER)),
    "artifacts list": _cmd(["artifacts", "list"], STORE.map(lambda s: ["--store", s]), _opt("--family", TEXT)),
    "artifacts show": _cmd(["artifacts", "show"], TEXT.map(lambda t: [t]), STORE.map(lambda s: ["--store", s])),
    "artifacts verify": _cmd(["artifacts", "verify"], STORE.map(lambda s: ["--store", s])),
    "export": _cmd(["export"], st.lists(FAMILY, max_size=2), STORE.map(lambda s: ["--store", s]),
                   _opt("--name", TEXT), _opt("--version", TEXT),
                   st.sampled_from(["dist", "", "\x00", "a" * 5000, "/proc/version", "/proc/nosuch/dist",
                                    POOL["fifo"], POOL["link"]]).map(lambda o: ["--out", o])),
    "explain": _cmd(["explain"], FAMILY.map(lambda f: [f]), _opt("--shape", TEXT), _opt("--dtype", TEXT),
                    _opt("--chip", TEXT), STORE.map(lambda s: ["--store", s])),
    "artifacts migrate": _cmd(["artifacts", "migrate"], STORE.map(lambda s: ["--store", s])),
    "artifacts rejudge": _cmd(["artifacts", "rejudge"], STORE.map(lambda s: ["--store", s]),
                              _opt("--margin", NUMBER)),
    "report": st.one_of(_cmd(["report", STUDY], OUT_FILE.map(lambda o: ["--out", o])),
                        _cmd(["report"], TEXT.map(lambda t: [t]), STORAGE.map(lambda s: ["--storage", s]),
                             _opt("--out", OUT_FILE))),
    # Each example has at least one hostile part, so none of them starts serving (which would block).
    "dashboard": st.one_of(
        _cmd(["dashboard"], BAD_STORAGE.map(lambda s: ["--storage", s]), _opt("--port", NUMBER)),
        _cmd(["dashboard", "--storage", ":memory:"], BAD_PORT.map(lambda p: ["--port", p]), _opt("--host", TEXT)),
        _cmd(["dashboard", "--storage", ":memory:", "--port", "18089"], BAD_HOST.map(lambda h: ["--host", h]))),
    "flows run": _cmd(["flows", "run"], BAD_JOB.map(lambda j: [j]), _opt("--chip", TEXT)),
    "flows serve": st.one_of(
        _cmd(["flows", "serve"], BAD_JOB.map(lambda j: [j]), _opt("--chip", TEXT), _opt("--cron", TEXT),
             _opt("--timezone", TEXT), _opt("--name", TEXT)),
        _cmd(["flows", "serve", POOL["job:valid.toml"], "--chip", "M2 Max"],
             st.one_of(BAD_CRON.map(lambda c: ["--cron", c]),
                       _opt("--cron", st.just("0 2 * * *")).map(lambda c: c + ["--timezone", "Mars/Olympus"])),
             _opt("--name", TEXT))),
    "flows deploy": _cmd(["flows", "deploy"], (BAD_JOB | st.just(POOL["job:valid.toml"])).map(lambda j: [j]),
                         _opt("--chip", TEXT), _opt("--cron", TEXT), _opt("--timezone", TEXT)),
}


class _Timeout(BaseException):
    pass


def run_cli(args: list[str], cwd: Path, bound: int = BOUND_S) -> tuple[int, str, str]:
    """``kernsearch ARGS`` in this process (fast enough to run hundreds): (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()

    def expire(signum, frame):  # noqa: ANN001, ANN202
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expire)
    old = os.getcwd()
    os.chdir(cwd)
    signal.alarm(bound)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except _Timeout:
                code = -1
            except BaseException as exc:  # noqa: BLE001 - recorded as a failure of the property
                import traceback

                err.write("Traceback (most recent call last):\n" + "".join(traceback.format_exception(exc)))
                code = 99
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def _check(args: list[str], code: int, stderr: str, bound: int = BOUND_S) -> None:
    assert code != -1, f"{args}: no answer within {bound} s"
    assert code in (0, 1, 2), f"{args}: exit {code}\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, f"{args}:\n{stderr[-3000:]}"
    if code == 2:
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1, f"{args}: {len(lines)} stderr lines:\n{stderr[-3000:]}"


#: Commands whose honest work takes seconds per example (space enumerates ~10^5 configs, verify compiles, explain
#: exports the family).
SLOW = {"space", "verify", "explain"}


@pytest.mark.parametrize("command", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c
                                     for c in sorted(COMMANDS)])
@pytest.mark.slow
def test_hostile_arguments(command: str, tmp_path_factory: pytest.TempPathFactory,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path_factory.mktemp("fuzz")
    monkeypatch.setenv("KERNSEARCH_HOME", str(work / "home"))
    monkeypatch.setenv("KERNSEARCH_ARTIFACTS", str(work / "artifacts"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # deploy must stop at "no server", not reach one
    monkeypatch.setenv("PREFECT_HOME", str(work / "prefect"))
    if command == "report":
        code, _, stderr = run_cli(SETUP_TUNE + ["--trials", "3"], work)
        assert code == 0, stderr

    @settings(max_examples=6 if command in ("verify", "explain") else 12, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(COMMANDS[command])
    def run(args: list[str]) -> None:
        bound = SLOW_BOUND_S if command in SLOW else BOUND_S
        code, _, stderr = run_cli(args, work, bound)
        _check(args, code, stderr, bound)

    run()


@pytest.fixture(scope="module")
def studied_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose studies hold :data:`STUDY` (one tune for the module's examples, which only read it)."""
    work = tmp_path_factory.mktemp("studied")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNSEARCH_HOME", str(work / "home"))
        mp.setenv("KERNSEARCH_ARTIFACTS", str(work / "artifacts"))
        code, _, stderr = run_cli(SETUP_TUNE + ["--trials", "2"], work)
    assert code == 0, stderr
    return work / "home"


@pytest.mark.slow
@pytest.mark.parametrize("out", ["a\x00b", "a" * 5000, "/proc/version/x"])
def test_output_paths_no_file_can_have_are_one_line(out: str, tmp_path: Path, studied_home: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a command writes (report, export), a name no file can have (a NUL byte, too long, under a
    file) is one line and exit 2 (found by the suite above, kept here as fixed examples)."""
    monkeypatch.setenv("KERNSEARCH_HOME", str(studied_home))
    monkeypatch.setenv("KERNSEARCH_ARTIFACTS", str(tmp_path / "artifacts"))
    for args in (["report", STUDY, "--out", out], ["export", "gemm", "--out", out]):
        code, _, stderr = run_cli(args, tmp_path)
        _check(args, code, stderr)
        assert code == 2 and ("cannot write" in stderr or "too long" in stderr), stderr
