"""Issue 24 must hold: every code block of README.md and docs/*.md that is a command or a script is executed by a test.

:data:`COVERAGE` names, for every command line of a shell block and for every script (Python, a job file), the test
that runs it: one here (:class:`Here`), or one elsewhere that already runs it as written (:class:`Elsewhere`:
this file checks that the test exists and runs those arguments), and for every block that is not a command (a
folder listing, a program's output) why (:class:`NotACommand`); a listing and an output are still compared with
what the program really makes or prints. A block added to the docs without an entry fails
:func:`test_every_command_and_script_of_the_docs_is_run_by_a_test`.

What a test cannot run as written it runs in the nearest form that proves the command works, and says so here:
`sudo -u postgres` becomes the test cluster's superuser over TCP (tests/pgserver.py), host names and ports become
the test servers' (PostgreSQL, a Prefect server), `make test` is a dry run (the suite cannot run itself), a 4096³
GEMM tuned on a shared PostgreSQL study evaluates three configs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
KERNSEARCH = [sys.executable, "-m", "kernsearch"]
PREFECT = [sys.executable, "-m", "prefect"]
TELEMETRY_OFF = {"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


# -- the blocks -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    file: str
    lang: str
    text: str

    @property
    def first(self) -> str:
        """The first line, its comment or trailing description left out."""
        return next(_command(line) for line in self.text.splitlines() if line.strip())

    def keys(self) -> list[str]:
        """What COVERAGE is keyed by: the whole block (a script, a listing, an output), or each command line."""
        whole = f"{self.file}: {self.lang or 'block'}: {self.first}"
        if self.lang not in ("", "sh") or whole in COVERAGE:
            return [whole]
        return [f"{self.file}: {command}" for command in commands(self.text)]


def _command(line: str) -> str:
    return re.split(r"\s{2,}|\s#\s", line.strip())[0].strip()


def commands(text: str) -> list[str]:
    """The command lines of a shell block: comments and trailing descriptions (after two spaces) left out."""
    return [c for c in map(_command, text.splitlines()) if c and not c.startswith("#")]


def blocks() -> list[Block]:
    """Fenced blocks (at any indent, e.g. inside a list) and indented (4-space) blocks of every doc."""
    found = []
    for path in DOCS:
        text = path.read_text()
        name = str(path.relative_to(REPO))
        for m in re.finditer(r"^( *)```(\w*)\n(.*?)^\1```", text, re.S | re.M):
            found.append(Block(name, m.group(2), m.group(3)))
        outside = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
        for m in re.finditer(r"(?:\A|\n\n)((?:    \S.*\n|\n(?=    \S))+)", outside):
            found.append(Block(name, "", "\n".join(line[4:] for line in m.group(1).splitlines())))
    return found


@dataclass(frozen=True)
class Here:
    """Run by this test of this file."""

    test: str


@dataclass(frozen=True)
class Elsewhere:
    """Run by ``test`` (``tests/FILE.py::NAME``), whose source holds each of ``runs`` (its arguments as written)."""

    test: str
    runs: tuple[str, ...]


@dataclass(frozen=True)
class NotACommand:
    why: str
    test: str  # what still compares it with the real thing


FLOWS_SERVER = "tests/test_flows.py::test_real_server_serves_the_cron_deployment_and_runs_it_by_name"
FARM = "tests/test_farm_prefect.py::test_three_workers_two_chips_one_study_per_chip_one_store"
PG = "test_farm_and_prefect_commands_on_a_real_postgresql"
MODEL_DOC = "tests/test_model_ranking.py::test_the_worked_model_in_the_docs_is_the_fixtures_and_its_figures_hold"
COVERAGE: dict[str, Here | Elsewhere | NotACommand] = {
    # docs/architecture.md: drawings, checked against the code
    "docs/architecture.md: text: 11": Elsewhere(
        "tests/test_imports.py::test_the_architecture_page_draws_every_floor_where_the_imports_put_it",
        ('drawn_floors((ROOT / "docs" / "architecture.md")',)),
    "docs/architecture.md: text: family.toml + *.j2 ──load_family──▶ Family ──make_problem──▶ Problem ──Space──▶ "
    "configs": Elsewhere("tests/test_imports.py::test_the_data_path_names_only_what_exists",
                         ('page.split("```text\\n")[2]',)),
    # README.md
    "README.md: make tune": Elsewhere("tests/test_ux.py::test_make_tune_through_a_pipe_prints_a_line_every_few_"
                                      "seconds_and_a_verified_winner", ('"make", "-s", "tune"',)),
    "README.md: make test": Here("test_make_test_is_the_suite_on_three_workers"),
    # docs/api.md
    "docs/api.md: python: import tempfile": Elsewhere("tests/test_api.py::test_the_documented_example_runs",
                                                      ('"docs" / "api.md"', '"example.py"')),
    "docs/api.md: python: import numpy as np": Elsewhere(
        "tests/test_api.py::test_the_documented_variant_run_example_runs",
        ('"docs" / "api.md"', "## Example: check a variant against your own NumPy", '[sys.executable, "-c", block]',
         '"(3, 256) interpreted True"')),
    # docs/artifacts.md
    "docs/artifacts.md: block: artifacts/index.jsonl": NotACommand(
        "the store's folder layout", "test_artifacts_docs_publish_list_show_verify_export_and_call"),
    "docs/artifacts.md: python: import tempfile": Here("test_artifacts_docs_publish_list_show_verify_export_and_call"),
    "docs/artifacts.md: kernsearch artifacts list [--family F] [--all]": Here(
        "test_artifacts_docs_publish_list_show_verify_export_and_call"),
    "docs/artifacts.md: kernsearch artifacts show gemm/H100/float16/4096x4096x4096[/v1] [--source] [--json]": Here(
        "test_artifacts_docs_publish_list_show_verify_export_and_call"),
    "docs/artifacts.md: kernsearch artifacts verify [--repair]": Elsewhere(
        "tests/adversarial/test_store_index.py::test_current_edited_to_bring_back_an_invalidated_version",
        ('["artifacts", "verify", "--store"', '["artifacts", "verify", "--repair", "--store"')),
    "docs/artifacts.md: kernsearch artifacts migrate [--family FOLDER]": Elsewhere(
        "tests/adversarial/test_store_index.py::test_migrate_indexes_a_version_only_against_the_family_it_was_"
        "rendered_from", ('["artifacts", "migrate", "--store"', '"--family", str(older)]')),
    "docs/artifacts.md: kernsearch export [FAMILY...] --out DIR [--name kernsearch_kernels] [--version 1.0.0]": Here(
        "test_artifacts_docs_publish_list_show_verify_export_and_call"),
    "docs/artifacts.md: python: import mlx.core as mx": Here(
        "test_artifacts_docs_publish_list_show_verify_export_and_call"),
    "docs/artifacts.md: python: from kernsearch_kernels import qmatvec": Here(
        "test_artifacts_docs_publish_list_show_verify_export_and_call"),
    "docs/artifacts.md: block: gemm 4096x4096x4096 float16 on H100: mlx op -> plain MLX op": NotACommand(
        "`kernsearch explain gemm --chip H100`'s output", "test_explain_prints_what_the_docs_show"),
    # docs/flows.md
    "docs/flows.md: toml: artifacts = \"~/.kernsearch/artifacts\"": Here("test_flows_docs_job_file_and_run_here"),
    "docs/flows.md: export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false": Here(
        "test_flows_docs_job_file_and_run_here"),
    "docs/flows.md: kernsearch flows run flows/jobs/example.toml": Here("test_flows_docs_job_file_and_run_here"),
    "docs/flows.md: kernsearch flows run flows/jobs/example.toml --chip \"M2 Max\"": Elsewhere(
        FLOWS_SERVER, ('["flows", "run"', '"--chip", "M2 Max"')),
    "docs/flows.md: kernsearch flows serve flows/jobs/example.toml --cron \"0 2 * * *\" --timezone Europe/Paris": Elsewhere(
        FLOWS_SERVER, ('["flows", "serve"', '"--cron", "0 2 * * *", "--timezone", "Europe/Paris"')),
    "docs/flows.md: prefect server start --host 0.0.0.0 --port 4200": Elsewhere(
        FLOWS_SERVER, ('"server", "start", "--host"', '"--port"')),
    "docs/flows.md: prefect config set PREFECT_API_DATABASE_CONNECTION_URL="
    "\"postgresql+asyncpg://prefect:SECRET@db.lan:5432/prefect\"": Here(PG),
    "docs/flows.md: prefect server start --host 0.0.0.0": Here(PG),
    "docs/flows.md: prefect config set PREFECT_API_URL=\"http://server.lan:4200/api\"": Here(PG),
    "docs/flows.md: prefect config set PREFECT_SERVER_ANALYTICS_ENABLED=false": Here(PG),
    "docs/flows.md: kernsearch flows deploy flows/jobs/example.toml --cron \"0 2 * * *\" --timezone Europe/Paris": Elsewhere(
        FLOWS_SERVER, ('"flows", "deploy"', '"--cron", "0 2 * * *",\n', '"--timezone", "Europe/Paris"]')),
    "docs/flows.md: prefect worker start --pool kernsearch-m3-max --limit 1": Elsewhere(
        FLOWS_SERVER, ('"worker", "start", "--pool"', '"--limit", "1"')),
    # docs/farm.md
    "docs/farm.md: sudo -u postgres createuser --pwprompt kernsearch": Here(PG),
    "docs/farm.md: sudo -u postgres createdb --owner kernsearch kernsearch": Here(PG),
    "docs/farm.md: kernsearch tune gemm --shape 4096,4096,4096 --storage "
    "postgresql://kernsearch:PW@db.farm:5432/kernsearch": Here(PG),
    "docs/farm.md: kernsearch flows deploy flows/jobs/example.toml": Elsewhere(FARM, ('["flows", "deploy"',)),
    "docs/farm.md: KERNSEARCH_CHIP=\"M2 Max\" KERNSEARCH_MACHINE=mini-07 prefect worker start --pool kernsearch-m2-max":
        Elsewhere(FARM, ('"worker", "start", "--pool"', '{"KERNSEARCH_CHIP": chip, "KERNSEARCH_MACHINE": machine}')),
    # docs/decode.md
    "docs/decode.md: python: import mlx.core as mx": Elsewhere(
        "tests/test_bench_decode.py::test_the_decode_docs_layer_runs_through_the_exported_package_and_matches_plain_"
        "mlx", ("_docs_block()",)),
    "docs/decode.md: kernsearch bench decode --job decode.toml --chip H200": Elsewhere(
        "tests/test_bench_decode.py::test_bench_decode_job_writes_the_file_flows_run_takes",
        ('"bench", "decode", "--job"', '"--chip", "H200"')),
    "docs/decode.md: kernsearch bench decode --json": Elsewhere(
        "tests/test_bench_decode.py::test_bench_decode_on_the_cpu_checks_the_package_against_plain_mlx",
        ('"bench", "decode"', '"--json"')),
    # docs/model.md, docs/msl-subset.md
    "docs/model.md: python: from kernsearch import Space, get_backend, get_chip, load_family, make_problem": Here(
        "test_model_docs_example_runs"),
    # the worked [model] is the fixture family's table word for word; the predict commands below evaluate it
    "docs/model.md: toml: [model]": Elsewhere(
        MODEL_DOC, (r'"## A worked `\[model\]`.*?```toml\n(.*?)```"', "== table", r'spec.index("\n[model]\n")')),
    "docs/model.md: kernsearch predict tests/families/residual_rmsnorm --shape 64,4096 --config TG=256,VEC=4":
        Elsewhere(MODEL_DOC, (r'r"What it predicts.*?```sh\n(.*?)```"', '[sys.executable, "-m", *line.split()]',
                              '"0.01026"')),
    "docs/model.md: kernsearch predict tests/families/residual_rmsnorm --shape 64,4096 --config TG=32,VEC=1":
        Elsewhere(MODEL_DOC, (r'r"What it predicts.*?```sh\n(.*?)```"', '[sys.executable, "-m", *line.split()]',
                              '"0.1205"')),
    "docs/msl-subset.md: block: $ kernsearch verify /tmp/gemm_bug --config MMA=scalar --shape 32,32,16 --dtype "
    "float32 --check": Here("test_msl_subset_transcript_is_what_verify_prints"),
    # docs/mlx-lm.md
    "docs/mlx-lm.md: python: from mlx_lm import generate, load": Elsewhere(
        "tests/test_mlx_lm_patch.py::test_the_docs_example_loads_patches_explains_and_generates_what_mlx_lm_generates",
        ('"docs" / "mlx-lm.md"', '[sys.executable, "-c", text]')),
}


def _test_source(ref: str) -> str:
    path, _, name = ref.partition("::")
    tree = ast.parse((REPO / path).read_text())
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert node is not None, f"{ref} does not exist"
    return ast.get_source_segment((REPO / path).read_text(), node) or ""


def test_every_command_and_script_of_the_docs_is_run_by_a_test() -> None:
    keyed = [(block, key) for block in blocks() for key in block.keys()]
    found = [key for _, key in keyed]
    whole = [key for block, key in keyed if key.startswith(f"{block.file}: {block.lang or 'block'}: ")]
    alike = sorted({key for key in whole if whole.count(key) > 1})
    assert not alike, f"scripts or listings that start alike (one entry would cover them all): {alike}"
    missing = [key for key in found if key not in COVERAGE]
    assert not missing, f"no test runs these (add each to COVERAGE in tests/test_docs.py): {missing}"
    stale = sorted(set(COVERAGE) - set(found))
    assert not stale, f"COVERAGE names blocks the docs no longer have: {stale}"
    here = {name for name, value in globals().items() if name.startswith("test_") and callable(value)}
    for key, how in COVERAGE.items():
        if isinstance(how, Elsewhere):
            source = _test_source(how.test)
            for args in how.runs:
                assert args in source, f"{key}: {how.test} no longer runs {args}"
        else:
            assert how.test in here, f"{key}: no test {how.test} in tests/test_docs.py"


# -- run here ----------------------------------------------------------------------------------------------------

def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:  # noqa: ANN003
    kwargs.setdefault("timeout", 300)
    return subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)


def _block(file: str, first: str, holding: str = "") -> str:
    """The block of ``file`` whose first line (comment left out) is ``first`` (and that holds ``holding``)."""
    return next(b.text for b in blocks() if b.file == file and b.first == first and holding in b.text)


def test_make_test_is_the_suite_on_three_workers(tmp_path: Path) -> None:
    """`make test` runs this very suite, so it is run dry: the recipe make would run, through a set-up venv."""
    (tmp_path / "bin").mkdir()
    (tmp_path / ".installed").touch()  # not older than pyproject.toml: make would not set the venv up again
    r = _run(["make", "--no-print-directory", "-n", "test", f"VENV={tmp_path}"], cwd=REPO)  # make may call us
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f'{tmp_path}/bin/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder '
                                '--durations=30 -m "not e2e"'), r.stdout


def _store_is_the_listing(store: Path, key: Path) -> None:
    """docs/artifacts.md's store layout, line by line, against a store one publish made: its key
    (…/4096x4096x4096) is ``key``, its second version is left out (one publish makes one)."""
    for line in _block("docs/artifacts.md", "artifacts/index.jsonl").splitlines():
        name, *description = re.split(r"\s{2,}", line.strip())
        if line.startswith("artifacts/"):  # a path from the store's root
            path = name.removeprefix("artifacts/")
            path = path.replace("gemm/M2-Max/float16/4096x4096x4096", str(key.relative_to(store)))
            if "<sha256>" in path:  # the family kept with the version, named by its files' hash
                (kept,) = (store / ".families").iterdir()
                assert re.fullmatch("[0-9a-f]{64}", kept.name) and {"family.toml", "gemm.metal.j2"} <= {
                    p.name for p in kept.iterdir()}, sorted(os.listdir(kept))
            else:
                assert (store / path).exists(), f"the listing shows {path}, the store has {sorted(os.listdir(store))}"
        elif re.match(r"    \S", line):  # in the key's folder
            names = name.split()
            if names[0] == "v2/":
                continue
            where = key / "v1" if names[0] == "v1/" else key
            for shown in names[1:] if names[0] == "v1/" else names[:1]:
                assert (where / shown).exists(), f"the listing shows {shown}, {where} has {sorted(os.listdir(where))}"
            if names[0] == "CURRENT":  # its fields, as the listing shows them
                fields = re.search(r"\{.*\}", description[0]).group(0).replace('"..."', '""')
                assert sorted(json.loads(fields)) == sorted(json.loads((key / "CURRENT").read_text())), line
        else:
            assert line.startswith(" " * 20) and not description, line  # a description carried to the next line


@pytest.mark.slow
def test_artifacts_docs_publish_list_show_verify_export_and_call(tmp_path: Path) -> None:
    """docs/artifacts.md: the Python API publishes a version (into the layout its listing shows), the command-line
    synopsis runs on that store (each option given; verify --repair and migrate: COVERAGE), and the exported
    package's examples run on the export (on this machine, MLX's CPU: the package runs the MLX op)."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # the example's tempfile.mkdtemp() lands here
    (tmp_path / "publish.py").write_text(_block("docs/artifacts.md", "import tempfile"))
    r = _run([sys.executable, "publish.py"], cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout.split() == ["True", "v1", "modeled"], r.stdout + r.stderr[-3000:]
    (store,) = tmp_path.glob("*/artifacts")
    work = store.parent  # `./artifacts`, as the commands take it by default
    _store_is_the_listing(store, store / "gemm" / "M2-Max" / "float16" / "256x256x256")
    synopsis = {c.split()[2] if c.split()[1] == "artifacts" else c.split()[1]: c for c in
                commands(_block("docs/artifacts.md", "kernsearch artifacts list [--family F] [--all]"))}
    assert sorted(synopsis) == ["export", "list", "migrate", "show", "verify"]
    listed = _run(KERNSEARCH + ["artifacts", "list", "--family", "gemm", "--all"], cwd=work)
    assert listed.returncode == 0 and "gemm/M2-Max/float16/256x256x256" in listed.stdout, listed.stdout
    for extra in (["--source"], ["--json"]):
        shown = _run(KERNSEARCH + ["artifacts", "show", "gemm/M2-Max/float16/256x256x256/v1", *extra], cwd=work)
        assert shown.returncode == 0 and ("// ---- source ----" in shown.stdout if extra == ["--source"] else
                                          '"evidence": "modeled"' in shown.stdout), shown.stdout[-2000:]
    verified = _run(KERNSEARCH + ["artifacts", "verify"], cwd=work)
    assert verified.returncode == 0 and "1 version(s) verified" in verified.stdout, verified.stdout
    exported = _run(KERNSEARCH + ["export", "gemm", "qmatvec", "--out", "dist", "--name", "kernsearch_kernels",
                                 "--version", "1.0.0"], cwd=work)
    assert exported.returncode == 0, exported.stderr
    (package,) = {p.parent.parent for p in (work / "dist").rglob("kernsearch_kernels/__init__.py")}
    (work / "call.py").write_text(_block("docs/artifacts.md", "import mlx.core as mx"))
    called = _run([sys.executable, "call.py"], cwd=work, env={**env, "PYTHONPATH": str(package)})
    assert called.returncode == 0, called.stderr[-3000:]
    decisions = [line for line in called.stdout.splitlines() if not line.startswith("  ")]
    assert decisions[0].startswith("gemm 512x384x256 float16 on ") and decisions[1].startswith(
        "gemm 512x384x256 float16 on M2 Pro: "), called.stdout
    (work / "bind.py").write_text(_block("docs/artifacts.md", "from kernsearch_kernels import qmatvec"))
    bound = _run([sys.executable, "bind.py"], cwd=work, env={**env, "PYTHONPATH": str(package)})
    assert bound.returncode == 0, bound.stderr[-3000:]
    shape, decision = bound.stdout.splitlines()[:2]
    assert shape == "(1, 4096) mlx.core.float16" and decision.startswith(
        "qmatvec 1x4096x4096x512x64 float16 on ") and decision.endswith("-> plain MLX op"), bound.stdout


@pytest.mark.slow
def test_explain_prints_what_the_docs_show() -> None:
    """The dispatcher's explanation in docs/artifacts.md is `kernsearch explain gemm --chip H100` on this
    repository's store, word for word (issue 24: explain was no CLI command)."""
    shown = _block("docs/artifacts.md", "gemm 4096x4096x4096 float16 on H100: mlx op -> plain MLX op")
    r = _run(KERNSEARCH + ["explain", "gemm", "--chip", "H100"], cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert r.stdout == shown


@pytest.mark.slow
def test_flows_docs_job_file_and_run_here(tmp_path: Path) -> None:
    """The job file of docs/flows.md loads as written; its first commands run here, a machine without a GPU, as
    written: the detected chip (the CPU) has no job, which `flows run` says in one line before starting Prefect."""
    from kernsearch.flows._jobs import load_jobs

    (tmp_path / "jobs.toml").write_text(_block("docs/flows.md", 'artifacts = "~/.kernsearch/artifacts"'))
    jobs = load_jobs(tmp_path / "jobs.toml")
    units = jobs.units("M2 Max")
    assert len(units) == 4 and {u.dtype for u in units} == {"float16", "bfloat16"} and jobs.storage is None
    # the example publishes under the user's home, never into the checked-in store (issue 36)
    assert jobs.artifacts == Path.home() / ".kernsearch" / "artifacts" and REPO not in jobs.artifacts.parents
    shipped = load_jobs(REPO / "flows" / "jobs" / "example.toml")
    assert shipped.artifacts is not None and REPO not in shipped.artifacts.parents
    lines = commands(_block("docs/flows.md", "export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false",
                            holding="kernsearch flows run"))[:2]
    assert lines == ["export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false",
                     "kernsearch flows run flows/jobs/example.toml"]
    script = "; ".join(lines) + '; rc=$?; echo "DO_NOT_TRACK=$DO_NOT_TRACK" >&2; exit $rc'
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    r = _run(["bash", "-c", script], cwd=REPO, env={**os.environ, "PATH": path, "PREFECT_API_URL": ""},
             timeout=120)  # from the clone, as written: the job file it names exists there
    assert r.returncode == 2 and r.stderr.splitlines()[0].startswith(
        "error: flows/jobs/example.toml: no job is for cpu"), r.stderr
    assert r.stderr.splitlines()[-1] == "DO_NOT_TRACK=1" and "Starting temporary server" not in r.stdout


@pytest.mark.slow
def test_model_docs_example_runs(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(_block(
        "docs/model.md", "from kernsearch import Space, get_backend, get_chip, load_family, make_problem"))
    r = _run([sys.executable, "model.py"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ms, breakdown = r.stdout.splitlines()
    assert float(ms) > 0 and "'evidence': 'modeled'" in breakdown


@pytest.mark.slow
def test_msl_subset_transcript_is_what_verify_prints(tmp_path: Path) -> None:
    """docs/msl-subset.md's example, on the copy of the GEMM template it describes (the barrier after the tile loads
    deleted): each line it shows is a line `kernsearch verify` prints (``...``: anything)."""
    shown = _block("docs/msl-subset.md", "$ kernsearch verify /tmp/gemm_bug --config MMA=scalar --shape 32,32,16 "
                                         "--dtype float32 --check").splitlines()
    bug = tmp_path / "gemm_bug"
    shutil.copytree(REPO / "templates" / "gemm", bug)
    template = bug / "gemm.metal.j2"
    loads = '{{ load_tiles("", "k0") | indent(8) }}\n'
    text = template.read_text()
    assert text.count(loads + "        threadgroup_barrier(mem_flags::mem_threadgroup);\n") == 1
    template.write_text(text.replace(loads + "        threadgroup_barrier(mem_flags::mem_threadgroup);\n", loads))
    args = shown[0].removeprefix("$ ").replace("/tmp/gemm_bug", str(bug)).split()
    assert args[0] == "kernsearch"
    r = _run(KERNSEARCH + args[1:], cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    printed = r.stdout.splitlines()
    for line in shown[1:]:
        if line.strip() == "...":
            continue
        pattern = ".*".join(map(re.escape, line.split("...")))
        assert any(re.fullmatch(pattern, p) for p in printed), f"{line!r} not printed:\n{r.stdout}"


# -- PostgreSQL and Prefect on it (docs/farm.md, docs/flows.md) ---------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.e2e
def test_farm_and_prefect_commands_on_a_real_postgresql(tmp_path: Path) -> None:
    """docs/farm.md's database set-up and shared-study command, and docs/flows.md's Prefect server on PostgreSQL,
    on a real PostgreSQL cluster (tests/pgserver.py): the role and database made as written (``sudo -u postgres``:
    the cluster's superuser over TCP), `kernsearch tune` on the shared study with the password masked wherever the
    URL is printed (issue 24), `kernsearch dashboard` on it likewise, then a Prefect server on its own database."""
    from ci import IN_CI
    from pgserver import PostgresServer, pg_bin

    if pg_bin() is None:
        if IN_CI:
            pytest.fail("CI must have PostgreSQL (apt-get install postgresql; .ci/run does)")
        pytest.skip("PostgreSQL is not installed")
    farm = commands(_block("docs/farm.md", "sudo -u postgres createuser --pwprompt kernsearch"))
    assert farm == ["sudo -u postgres createuser --pwprompt kernsearch",
                    "sudo -u postgres createdb --owner kernsearch kernsearch"]
    with PostgresServer(tmp_path / "pg", database=None, superuser="postgres") as pg:
        connect = ["-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres"]
        as_postgres = {**os.environ, "PGPASSWORD": "farm-secret"}
        for line in farm:  # createuser prompts for the new role's password twice: given on its standard input
            args = line.split()[3:]
            r = _run([str(pg.bin / args[0]), *connect, *args[1:]], env=as_postgres, input="s3cret-PW\ns3cret-PW\n",
                     start_new_session=True)  # no terminal: the prompt reads standard input
            assert r.returncode == 0, r.stderr
        (tune,) = commands(_block("docs/farm.md", "kernsearch tune gemm --shape 4096,4096,4096 --storage "
                                                  "postgresql://kernsearch:PW@db.farm:5432/kernsearch"))
        url = f"postgresql://kernsearch:s3cret-PW@127.0.0.1:{pg.port}/kernsearch"
        args = tune.replace("postgresql://kernsearch:PW@db.farm:5432/kernsearch", url).split()[1:]
        # three configs, unverified, without ranking 2.5 million configs: the storage is what is tested here
        r = _run(KERNSEARCH + args + ["--trials", "3", "--sampler", "random", "--verify", "none", "--json"])
        assert r.returncode == 0, r.stderr[-3000:]
        assert "s3cret-PW" not in r.stdout + r.stderr
        assert '"storage": "postgresql://kernsearch:***@127.0.0.1:' in r.stdout and '"evaluated": 3' in r.stdout
        port = _free_port()
        dashboard = subprocess.Popen(KERNSEARCH + ["dashboard", "--storage", url, "--port", str(port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while dashboard.poll() is None and time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.3)
        finally:
            os.killpg(dashboard.pid, 15)
            out, err = dashboard.communicate(timeout=30)
        assert f"optuna-dashboard on postgresql://kernsearch:***@127.0.0.1:{pg.port}/kernsearch: open" in err, err
        assert "s3cret-PW" not in out + err
        bad = _run(KERNSEARCH + ["studies", "--storage", url.replace(str(pg.port), str(_free_port()))], timeout=120)
        assert bad.returncode == 2 and "kernsearch:***@" in bad.stderr and "s3cret-PW" not in bad.stderr, bad.stderr
        _prefect_on_postgresql(pg, tmp_path)


def _prefect_on_postgresql(pg, tmp_path: Path) -> None:  # noqa: ANN001
    """docs/flows.md's server on PostgreSQL (its own role and database), then a machine's profile pointed at it."""
    import httpx

    as_postgres = {**os.environ, "PGPASSWORD": "farm-secret"}
    connect = ["-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres"]
    assert _run([str(pg.bin / "createuser"), *connect, "--pwprompt", "prefect"], env=as_postgres,
                input="SECRET\nSECRET\n", start_new_session=True).returncode == 0
    assert _run([str(pg.bin / "createdb"), *connect, "--owner", "prefect", "prefect"], env=as_postgres).returncode == 0
    server_block = commands(_block("docs/flows.md", 'prefect config set PREFECT_API_DATABASE_CONNECTION_URL="postgresql'
                                                    '+asyncpg://prefect:SECRET@db.lan:5432/prefect"'))
    client_block = commands(_block("docs/flows.md", 'prefect config set PREFECT_API_URL="http://server.lan:4200/api"'))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | TELEMETRY_OFF | {
        "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_SERVER_UI_ENABLED": "false"}

    def shell(line: str, **extra: str) -> list[str]:
        line = line.replace("db.lan:5432", f"127.0.0.1:{pg.port}").replace("server.lan:4200", f"127.0.0.1:{port}")
        return [*PREFECT, *shlex_split(line)[1:]] + [f"--{k}={v}" for k, v in extra.items()]

    r = _run(shell(server_block[0]), env=env)  # prefect config set PREFECT_API_DATABASE_CONNECTION_URL=...
    assert r.returncode == 0, r.stdout + r.stderr
    assert server_block[1] == "prefect server start --host 0.0.0.0"
    log = open(tmp_path / "prefect-server.log", "w")  # noqa: SIM115
    server = subprocess.Popen(shell("prefect server start --host 127.0.0.1") + ["--port", str(port)], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, (tmp_path / "prefect-server.log").read_text()[-3000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the Prefect server on PostgreSQL did not start in 240 s"
            time.sleep(0.5)
        for line in client_block:  # a farm machine's profile: the server's URL, telemetry off
            r = _run(shell(line), env=env)
            assert r.returncode == 0, r.stdout + r.stderr
        pools = _run([*PREFECT, "work-pool", "ls"], env=env)  # the profile's URL reaches the server on PostgreSQL
        assert pools.returncode == 0, pools.stdout + pools.stderr
        tables = _run([str(pg.bin / "psql"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "prefect", "-d", "prefect",
                       "-tAc", "select count(*) from information_schema.tables where table_name = 'flow_run'"],
                      env={**os.environ, "PGPASSWORD": "SECRET"})
        assert tables.stdout.strip() == "1", tables.stdout + tables.stderr  # Prefect's tables live in PostgreSQL
    finally:
        os.killpg(server.pid, 15)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, 9)
            server.wait(timeout=10)
        log.close()


def shlex_split(line: str) -> list[str]:
    import shlex

    return shlex.split(line)
