"""Issue 17: `kernsearch report` — the study as one self-contained HTML page, checked in a real browser.

The browser test loads the page in headless Chromium (Debian's package, driven by Playwright), checks that every
plot rendered (a non-empty SVG), that nothing was fetched from the network and that the console stayed clean,
and saves a screenshot under $KERNSEARCH_TEST_ARTIFACTS (default: test-artifacts/) for people to look at.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import kernsearch_in_process

KERNSEARCH = [sys.executable, "-m", "kernsearch"]
REPO = Path(__file__).resolve().parents[1]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(KERNSEARCH + list(args), capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A small modeled GEMM study, tuned with --report (the interpreter verifies the finalists)."""
    home = tmp_path_factory.mktemp("report-home")
    env = {"KERNSEARCH_HOME": str(home)}
    r = _run("tune", "gemm", "--shape", "128,128,128", "--trials", "30", "--report", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    path = re.search(r"^report: (.+\.html)$", r.stderr, re.MULTILINE)
    assert path, r.stderr[-2000:]
    return {"home": str(home), "report": path.group(1), "study": "gemm/M2 Max/float16/128x128x128/model"}


@pytest.mark.slow
def test_tune_report_writes_a_self_contained_page(tuned: dict[str, str]) -> None:
    page = Path(tuned["report"]).read_text()
    assert Path(tuned["report"]).parent == Path(tuned["home"]) / "reports"
    head, body = page.split("</script></head>", 1)
    assert "<script type='text/javascript'>/**" in head and "plotly.js" in head[:3000]  # Plotly inlined
    assert "<script src=" not in body and "https://" not in body  # nothing to fetch: opens offline
    assert page.count("MODELED (predicted by the performance model, not measured)") >= 4  # on every figure
    assert "MEASURED on a real GPU" not in page
    for section in ("Convergence", "Parameter importances", "Top configs", "Knob BM"):
        assert section in page
    assert "not available (modeled times" in page  # no made-up speedup for a modeled study


@pytest.mark.slow
def test_report_command_out_and_errors(tuned: dict[str, str], tmp_path: Path) -> None:
    env = {"KERNSEARCH_HOME": tuned["home"]}
    r = _run("report", tuned["study"], "--out", str(tmp_path / "r.html"), env=env)
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "r.html"), r.stderr
    assert (tmp_path / "r.html").stat().st_size > 1_000_000
    # the refusals through the entry point in this process (the process's exit and stderr: the command above)
    missing = kernsearch_in_process("report", "nope/nope", env=env)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no study 'nope/nope'" in missing.stderr
    folder = kernsearch_in_process("report", tuned["study"], "--out", str(tmp_path), env=env)
    assert folder.returncode == 2 and "is a folder" in folder.stderr and folder.stderr.count("\n") == 1


def test_report_escapes_hostile_names(tmp_path: Path) -> None:
    import optuna

    from kernsearch.studies._history import load_history
    from kernsearch.studies._report import render_report

    url = f"sqlite:///{tmp_path / 's.db'}"
    evil = "<script>alert(1)</script>"
    s = optuna.create_study(study_name=evil, storage=url)
    s.set_user_attr("family", evil)
    s.set_user_attr("evidence", "measured")
    for i in range(5):
        t = s.ask({"BM": optuna.distributions.CategoricalDistribution([evil, "b"])})
        t.set_user_attr("config", {"BM": t.params["BM"]})
        t.set_user_attr("status", "ok" if i % 2 else "failed")
        t.set_user_attr("failure", {"reason": evil})
        s.tell(t, 1.0 + i if i % 2 else None, state=None if i % 2 else optuna.trial.TrialState.FAIL)
    page = render_report(load_history(evil, url))
    body = page.split("</script></head>", 1)[1]  # after the inlined Plotly library
    assert "<script>alert" not in body


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.slow
def test_report_renders_in_a_real_browser(tuned: dict[str, str]) -> None:
    from ci import IN_CI

    if IN_CI:  # a broken install fails here, not a skip
        import playwright.sync_api as playwright
    else:
        playwright = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    browser_path = _chromium()
    if browser_path is None and IN_CI:
        pytest.fail("CI must have Chromium (apt-get install chromium; .ci/run does)")
    if browser_path is None:
        pytest.skip("no Chromium here (apt-get install chromium)")
    shots = Path(os.environ.get("KERNSEARCH_TEST_ARTIFACTS", REPO / "test-artifacts"))
    shots.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    requests: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in
                    ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(Path(tuned["report"]).as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length > 0 && "
                                   "[...document.querySelectorAll('.js-plotly-plot')].every(d => d._fullLayout)",
                                   timeout=30_000)
            plots = page.evaluate("""() => [...document.querySelectorAll('.figure')].map(f => ({
                title: f.dataset.title,
                svgs: f.querySelectorAll('svg.main-svg').length,
                marks: f.querySelectorAll('.scatterlayer .point, .barlayer .point, .boxlayer path.box').length,
                height: f.getBoundingClientRect().height}))""")
            page.screenshot(path=str(shots / "report.png"), full_page=True)
            # issue 24: at 1400 px the top-configs table (14-knob GEMM configs) fits: its last columns are on screen
            wide = browser.new_page(viewport={"width": 1400, "height": 900})
            wide.goto(Path(tuned["report"]).as_uri())
            layout = wide.evaluate("""() => {
                const table = document.querySelector('table');
                const last = [...table.querySelectorAll('tr')].map(r => r.lastElementChild.getBoundingClientRect());
                return {page: document.documentElement.scrollWidth, view: window.innerWidth,
                        right: Math.max(...last.map(b => b.right)), header: table.querySelector('th:last-child')
                        .textContent, rows: last.length};
            }""")
            wide.screenshot(path=str(shots / "report-1400.png"), full_page=True)
        finally:
            browser.close()
    assert layout["header"] == "verified" and layout["rows"] > 1, layout
    assert layout["right"] <= layout["view"] and layout["page"] <= layout["view"], layout
    assert not problems, problems
    assert all(u.startswith(("file:", "data:", "about:")) for u in requests), requests  # no network
    titles = [p["title"] for p in plots]
    assert titles[:2] == ["Convergence", "Parameter importances"] and any(t.startswith("Knob ") for t in titles)
    for plot in plots:  # every figure drew something: an SVG with marks, not an empty frame
        assert plot["svgs"] > 0 and plot["marks"] > 0 and plot["height"] > 200, plot
    assert (shots / "report.png").stat().st_size > 20_000


def test_measured_study_shows_the_speedup_with_its_range(tmp_path: Path) -> None:
    import optuna

    from kernsearch.studies._history import load_history
    from kernsearch.studies._report import render_report

    url = f"sqlite:///{tmp_path / 's.db'}"
    s = optuna.create_study(study_name="gemm/H100/float16/64x64x64/cuda", storage=url)
    for k, v in {"family": "gemm", "chip": "H100", "dtype": "float16", "shape": "64x64x64", "backend": "cuda",
                 "evidence": "measured", "knobs": {"BM": [32, 64]}}.items():
        s.set_user_attr(k, v)
    for i, bm in enumerate([32, 64, 32, 64, 64]):
        t = s.ask({"BM": optuna.distributions.CategoricalDistribution([32, 64])})
        t.set_user_attr("config", {"BM": bm})
        t.set_user_attr("status", "ok")
        t.set_user_attr("record", {"evidence": "measured", "time_ms": 1.0 + i})
        s.tell(t, 1.0 + i)
    s.set_user_attr("final", {"winner": 0, "finalists": {"0": {"median_ms": 1.0}}, "speedup": 1.25,
                              "speedup_low": 1.2, "speedup_high": 1.3,
                              "baseline_median_ms": 1.25, "beats_baseline": True})
    page = render_report(load_history(s.study_name, url)).split("</script></head>", 1)[1]
    assert "MEASURED on a real GPU" in page and "MODELED" not in page
    assert "1.25x (1.20-1.30)" in page and "Speedup over the baseline op: 1.25x (range 1.20-1.30" in page
    s.set_user_attr("final", {"winner": 0, "finalists": {"0": {"median_ms": 1.0}}, "speedup": 1.01,
                              "speedup_low": 0.97, "speedup_high": 1.05,
                              "baseline_median_ms": 1.01, "beats_baseline": False})
    page = render_report(load_history(s.study_name, url))
    assert "within the measured noise: not a win, the MLX op runs" in page


def test_failures_are_marked_by_reason_and_a_replay_is_not_called_measured_here(tmp_path: Path) -> None:
    import optuna

    from kernsearch.studies._history import load_history
    from kernsearch.studies._report import convergence_figure, render_report

    url = f"sqlite:///{tmp_path / 's.db'}"
    s = optuna.create_study(study_name="pnpoly/RTX 3090/unknown-dtype/20000000/replay", storage=url)
    s.set_user_attr("evidence", "measured, replayed")
    s.set_user_attr("knobs", {"BX": [32, 64, 128, 256, 512, 1024, 2048]})
    reasons = ["compile", "timeout", "compile", None, None, None, "wrong result"]
    for i, reason in enumerate(reasons):
        t = s.ask({"BX": optuna.distributions.CategoricalDistribution([32, 64, 128, 256, 512, 1024, 2048])})
        t.set_user_attr("config", {"BX": t.params["BX"]})
        t.set_user_attr("status", "failed" if reason else "ok")
        if reason:
            t.set_user_attr("failure", {"reason": reason})
            s.tell(t, state=optuna.trial.TrialState.FAIL)
        else:
            t.set_user_attr("record", {"evidence": "measured", "time_ms": 1.0 + i})
            s.tell(t, 1.0 + i)
    h = load_history(s.study_name, url)
    fig = convergence_figure(h)
    failed = {tr.name: list(tr.x) for tr in fig.data if tr.name.startswith("failed")}
    assert failed == {"failed: compile (2)": [0, 2], "failed: timeout (1)": [1], "failed: wrong result (1)": [6]}
    page = render_report(h).split("</script></head>", 1)[1]
    figures = page.split("<div class='figure'")[1:]
    assert len(figures) == 2  # convergence, the knob's effect (too few trials for importances)
    assert all("MEASURED, REPLAYED (recorded on another GPU, not here)" in f for f in figures)  # on every figure
    assert "MEASURED on a real GPU" not in page and "MODELED" not in page
