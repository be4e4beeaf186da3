"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

Starts ``lld-monitor dashboard ROOT`` on a free local port, checks that the charts render, that
rows appended to the live run log appear, and that the drill-down shows the tokens (as text, not
markup). Screenshots go to ``test-artifacts/``. Skips when Chromium or Playwright is missing.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lld_monitor import columns as C
from lld_monitor.events import make_event
from lld_monitor.runlog import RunWriter

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright missing (test extra)")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: Page coordinates of the point of trace ``name`` at step ``x`` (plotly's axis mappings).
CLICK_TARGET_JS = """(g, [name, x]) => {
  const t = g._fullData.find(d => d.name === name);
  const xs = Array.from(t.x), ys = Array.from(t.y);
  const i = xs.indexOf(x);
  const xa = g._fullLayout[t.xaxis.replace('x', 'xaxis')];
  const ya = g._fullLayout[t.yaxis.replace('y', 'yaxis')];
  const box = g.getBoundingClientRect();
  return [box.left + xa._offset + xa.l2p(xs[i]), box.top + ya._offset + ya.l2p(ys[i])];
}"""
#: A token whose text would run script if it were inserted as markup.
EVIL = '<img src=x onerror="window.__lld_pwned=1">'


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _row(s: int) -> dict[str, float]:
    return {
        C.STEP: s,
        C.REWARD_MEAN: 0.2 + 0.01 * s,
        C.ACCURACY: 0.1 + 0.01 * s,
        C.LOGP_CORRECT: -0.5 - 0.01 * s,
        C.LOGP_INCORRECT: -0.9,
        C.FRAC_CORRECT_DISPLACED: 0.4,
        C.GRAD_NORM: 1.0 + 0.05 * s,
        C.ENTROPY: 0.8,
    }


@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[Path, RunWriter]]:
    """ROOT with one live run: 30 steps, an alert, token samples at step 20; writer left open."""
    root = tmp_path / "runs"
    w = RunWriter(root / "exp1", fsync_every_s=0)
    for s in range(30):
        w.log_step(_row(s))
    w.log_event(make_event("alert", 25, "stagnation", "logp of correct responses flat", "warning"))
    w.log_event(
        make_event(
            "intervention",
            26,
            "llds_enable",
            "LLDS switched on (lambda=0.2) by auto_llds on a stagnation alert at step 25",
            "info",
            {"enabled": 1, "lam": 0.2},
        )
    )
    tokens = [
        ("<search>", 0, 1, -0.6),
        ("capital", 0, 1, 0.3),
        (EVIL, -1, 0, math.nan),
        ("<answer>", 1, 1, -1.2),
    ]
    w.log_tokens(
        [
            {
                C.TOK_RESPONSE: 0,
                C.TOK_POSITION: i,
                C.TOK_TEXT: text,
                C.TOK_ACTION: action,
                C.TOK_GENERATED: gen,
                C.TOK_DELTA: delta,
                C.TOK_REWARD: 1.0,
                C.TOK_ADVANTAGE: 0.7,
            }
            for i, (text, action, gen, delta) in enumerate(tokens)
        ],
        step=20,
    )
    yield root, w
    w.close()


@contextlib.contextmanager
def _serve(root: Path) -> Iterator[str]:
    """The real CLI, ``lld-monitor dashboard ROOT --port P``, in its own process group."""
    with _serve_process(root) as (url, _):
        yield url


@contextlib.contextmanager
def _serve_process(root: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """``_serve``, with the server's process (the leader of its own session)."""
    port = _free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "lld_monitor.cli", "dashboard", str(root), "--port", str(port)]
    cmd += ["--refresh", "1"]
    out = open(ARTIFACTS / "dashboard-server.log", "wb")  # the server's output, kept for CI
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"dashboard exited with code {proc.returncode} before serving")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                pytest.fail("dashboard did not answer /_stcore/health within 90 s")
            time.sleep(0.5)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        out.close()


@contextlib.contextmanager
def _chromium_page(
    url: str, viewport: dict[str, int] | None = None, wait_until: str = "domcontentloaded"
) -> Iterator[Any]:
    """Headless Chromium (Debian's) on ``url``: its page, the browser closed afterwards."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(**({"viewport": viewport} if viewport else {}))
            page.goto(url, wait_until=wait_until)
            yield page
        finally:
            browser.close()


@pytest.fixture
def server(live_run: tuple[Path, RunWriter]) -> Iterator[str]:
    root, _ = live_run
    with _serve(root) as url:
        yield url


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (make browser)")
def test_dashboard_in_chromium(server: str, live_run: tuple[Path, RunWriter]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    _, writer = live_run
    with _chromium_page(server, viewport={"width": 1400, "height": 1800}) as page:
        # the header of the run, then the plotly figure with its traces drawn
        page.get_by_text("30 rows, last step 29").wait_for(timeout=60_000)
        plot = page.locator(".js-plotly-plot").first
        plot.wait_for(timeout=60_000)
        page.wait_for_function(
            "() => { const g = document.querySelector('.js-plotly-plot');"
            " return g && g._fullLayout && g.data && g.data.length > 0; }",
            timeout=60_000,
        )
        names = plot.evaluate("g => g.data.map(t => t.name)")
        assert f"exp1 · {C.REWARD_MEAN}" in names
        # a viewer's toolbar (--client.toolbarMode viewer): no Deploy button on a local monitor
        assert page.get_by_role("button", name="Deploy").count() == 0
        assert "exp1 · events" in names
        assert page.locator(".js-plotly-plot .main-svg").count() > 0
        # the run's story: automatic LLDS's switch, told under the header (issue 50)
        page.get_by_text("The run's story").click()
        page.get_by_text("step 26: intervention llds_enable: LLDS switched on").wait_for(
            timeout=30_000
        )
        page.get_by_text("ending: not closed").wait_for(timeout=30_000)  # (the writer is open)
        # the worst alert: its headline, what to do under it
        page.get_by_text("What to do now").click()
        page.get_by_text("switch LLDS on at lambda 0.2", exact=False).first.wait_for(timeout=30_000)

        # appending rows to the run log: the new step appears without reloading the page
        for s in range(30, 36):
            writer.log_step(_row(s))
        page.get_by_text("36 rows, last step 35").wait_for(timeout=30_000)
        page.wait_for_function(
            "() => { const g = document.querySelector('.js-plotly-plot');"
            # _fullData: plotly's decoded traces (g.data keeps the base64 typed arrays)
            " const t = g && g._fullData.find(d => d.name === 'exp1 · reward_mean (raw)');"
            " return t && Math.max(...Array.from(t.x)) === 35; }",
            timeout=30_000,
        )
        page.screenshot(path=str(ARTIFACTS / "dashboard-charts.png"), full_page=True)

        # click-through: a click on the reward curve at step 20 opens that step's tokens
        page.get_by_text("Click a point of the chart").wait_for(timeout=30_000)
        x, y = plot.evaluate(CLICK_TARGET_JS, [f"exp1 · {C.REWARD_MEAN} (raw)", 20])
        page.mouse.move(x, y)
        page.mouse.click(x, y)
        page.get_by_text("Tokens of step 20 · exp1").wait_for(timeout=30_000)
        page.locator(".lld-tok").first.wait_for(timeout=30_000)
        assert page.locator(".lld-tok").all_inner_texts()[:2] == ["<search>", "capital"]
        page.screenshot(path=str(ARTIFACTS / "dashboard-click-through.png"), full_page=True)

        # the Drill-down tab (the chart's tokens hide with their tab): step 20, coloured,
        # tool feedback as plain text
        page.get_by_role("tab", name="Drill-down").click()
        token = page.locator(".lld-tok:visible").first
        token.wait_for(timeout=30_000)
        texts = page.locator(".lld-tok:visible").all_inner_texts()
        assert texts[:2] == ["<search>", "capital"]
        assert EVIL in texts  # shown as text
        assert page.evaluate("() => window.__lld_pwned === undefined")
        assert page.locator(".lld-action:visible").count() == 2
        page.screenshot(path=str(ARTIFACTS / "dashboard-drilldown.png"), full_page=True)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (make browser)")
def test_report_page_draws_sparse_probe_columns_in_chromium(tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd

    from lld_monitor.analysis import analyze_run
    from lld_monitor.report import write_report

    s = np.arange(1, 65)
    probed = s % 8 == 0  # the probe's columns exist on every 8th step only
    df = pd.DataFrame(
        {
            C.STEP: s,
            C.REWARD_MEAN: 0.2 + 0.005 * s,
            C.LOGP_CORRECT: np.where(probed, -0.5 - 0.01 * s, np.nan),
            C.DELTA_CORRECT: np.where(probed, -0.02 * s, np.nan),
            C.FRAC_CORRECT_DISPLACED: np.where(probed, 0.3 + 0.004 * s, np.nan),
        }
    )
    out = write_report(df, analyze_run(df), tmp_path / "report.html")
    ARTIFACTS.mkdir(exist_ok=True)
    with _chromium_page(
        out.as_uri(), viewport={"width": 1400, "height": 1800}, wait_until="load"
    ) as page:
        page.wait_for_function(
            "() => { const g = document.querySelector('.js-plotly-plot');"
            " return g && g._fullData && g._fullData.length > 0; }",
            timeout=60_000,
        )
        for col in (C.LOGP_CORRECT, C.DELTA_CORRECT, C.FRAC_CORRECT_DISPLACED):
            drawn = page.evaluate(
                """(suffix) => {
                  const g = document.querySelector('.js-plotly-plot');
                  const i = g._fullData.findIndex(d => d.name.endsWith(suffix));
                  const t = g._fullData[i];
                  // what plotly drew for the trace: its line and its point markers
                  const layer = g.querySelectorAll('.scatterlayer .trace')[
                    g.calcdata.findIndex(c => c[0].trace.index === i)
                  ];
                  const line = layer.querySelector('path.js-line');
                  return [
                    Array.from(t.x),
                    line ? line.getAttribute('d') : '',
                    layer.querySelectorAll('.points path').length,
                  ];
                }""",
                f"· {col}",
            )
            xs, d, n_points = drawn
            assert xs == [8, 16, 24, 32, 40, 48, 56, 64], col
            assert n_points == 8, col  # every logged point drawn
            # joined by one line from the first to the last point (a NaN-broken line of
            # isolated points draws no segment at all)
            assert d.startswith("M") and "L" in d, (col, d)
        page.screenshot(path=str(ARTIFACTS / "report.png"), full_page=True)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (make browser)")
def test_run_picker_shows_triage_badges_worst_first_in_chromium(tmp_path: Path) -> None:
    """``lld-monitor dashboard ROOT``: the picker's options carry the verdicts of
    ``lld-monitor analyze ROOT`` as badges, worst first, and the worst run is the one shown."""
    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    root = tmp_path / "runs"
    write_sim(make_run("healthy", 200, seed=0), root / "a-healthy")
    write_sim(make_run("collapse", 260, seed=0), root / "b-collapse")
    with _serve(root) as url, _chromium_page(url, viewport={"width": 1400, "height": 1200}) as page:
        # the chosen run (a chip in the picker): the worst one, with its badge
        chip = page.get_by_text("✖ b-collapse · collapsed", exact=False).first
        chip.wait_for(timeout=60_000)
        # open the picker: the other run is listed with its own badge
        page.locator('[data-testid="stMultiSelect"] input').first.click()
        option = page.get_by_role("option").first
        option.wait_for(timeout=30_000)
        listed = page.get_by_role("option").all_inner_texts()
        assert listed == ["✓ a-healthy · healthy"], listed
        page.screenshot(path=str(ARTIFACTS / "dashboard-run-picker.png"), full_page=True)
        option.click()  # both chosen now: worst first, as in the triage table
        page.get_by_text("✓ a-healthy · healthy").first.wait_for(timeout=30_000)


def _chart_run(root: Path, name: str = "main") -> Path:
    """200 steps: noisy reward with a dead tail (exactly 0 from step 171), grad norm 0 there,
    lambda 0 then exactly 0.2 from step 120, logp_correct missing at steps 100-199 (nothing
    correct sampled), a critical collapse alert at 73 and a later warning, tokens at 60 and 150."""
    import numpy as np

    rng = np.random.default_rng(1)
    w = RunWriter(root / name, fsync_every_s=0)
    for s in range(1, 201):
        dead = s > 170
        row = {
            C.STEP: s,
            C.REWARD_MEAN: 0.0 if dead else float(0.3 + 0.05 * rng.standard_normal()),
            C.GRAD_NORM: 0.0 if dead else float(1.0 + rng.random()),
            C.LLDS_LAMBDA: 0.2 if s >= 120 else 0.0,
            C.LLDS_ENABLED: 1.0 if s >= 120 else 0.0,
            C.ENTROPY: 0.8,
        }
        if not 100 <= s <= 199:
            row[C.LOGP_CORRECT] = -0.3 - 0.001 * s
        w.log_step(row)
    w.log_event(make_event("alert", 73, "collapse", "reward fell to zero", "critical"))
    w.log_event(make_event("alert", 162, "mode_collapse", "identical groups", "warning"))
    for step in (60, 150):
        w.log_tokens(
            [
                {
                    C.TOK_RESPONSE: 0,
                    C.TOK_POSITION: i,
                    C.TOK_TEXT: text,
                    C.TOK_ACTION: 0,
                    C.TOK_GENERATED: 1,
                    C.TOK_DELTA: delta,
                    C.TOK_REWARD: 1.0,
                    C.TOK_CORRECT: 1,
                    C.TOK_ADVANTAGE: 0.5,
                }
                for i, (text, delta) in enumerate([(f"tok{step}", -0.4), ("next", 0.1)])
            ],
            step=step,
        )
    w.close()
    return root / name


def _full_trace(page, name: str) -> dict:
    """plotly's decoded trace ``name`` of the page's chart (x, y as plain lists, line shape)."""
    return page.evaluate(
        """(name) => {
          const g = document.querySelector('.js-plotly-plot');
          const t = g._fullData.find(d => d.name === name);
          if (!t) return null;
          return {x: Array.from(t.x), y: Array.from(t.y, v => (v === null ? NaN : v)),
                  shape: t.line ? t.line.shape : null};
        }""",
        name,
    )


def _wait_chart(page) -> None:
    page.wait_for_function(
        "() => { const g = document.querySelector('.js-plotly-plot');"
        " return g && g._fullData && g._fullData.length > 0; }",
        timeout=60_000,
    )


def _value_at(trace: dict, step: float) -> float:
    """What the drawn line shows at ``step`` (hv: the last point's value; else linear)."""
    xs, ys = trace["x"], trace["y"]
    for i, x in enumerate(xs):
        if x == step:
            return ys[i]
        if x > step:
            if trace["shape"] == "hv":
                return ys[i - 1]
            a, b = ys[i - 1], ys[i]
            return a + (b - a) * (step - xs[i - 1]) / (x - xs[i - 1])
    return ys[-1]


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (make browser)")
def test_charts_draw_the_truth_in_chromium(tmp_path: Path) -> None:
    """Issue 33's checks in a real browser: lambda 0.2 drawn at 0.2 and its switch as a step (in
    the dashboard and in the HTML report), a dead tail drawn at 0, a 100-step gap drawn as a
    gap, the header naming the critical alert, a click on a dense reward curve opening that
    step's tokens, four runs' lanes with their full names, and a root holding a broken run and a
    1e18-step run still rendering the others."""
    import math as m
    import urllib.parse

    from lld_monitor.analysis import analyze_run
    from lld_monitor.importers import load_table
    from lld_monitor.report import write_report

    root = tmp_path / "runs"
    main = _chart_run(root)
    long_names = [f"lane-{i}-a-rather-long-run-name-for-the-strip-seed{i}" for i in range(4)]
    for n in long_names:
        w = RunWriter(root / n, fsync_every_s=0)
        for s in range(1, 21):
            w.log_step(_row(s))
        w.close()
    bad = root / "zz-bad-meta"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    (bad / "steps.jsonl").write_text('{"step": 1, "reward_mean": 0.1}\n')
    huge = RunWriter(root / "zz-huge-steps", fsync_every_s=0)
    for s in (1, 2, 10**18):
        huge.log_step({C.STEP: s, C.REWARD_MEAN: 0.1})
    huge.close()
    report = write_report(load_table(main), analyze_run(main), tmp_path / "main.html")

    def url_for(base: str, *runs: str) -> str:
        return base + "/?" + urllib.parse.urlencode([("run", r) for r in runs])

    with (
        _serve(root) as base,
        _chromium_page(url_for(base, "main"), viewport={"width": 1400, "height": 2400}) as page,
    ):
        # the header's worst alert is a critical collapse (the first sighting of the critical
        # ones, as the picker says: triage.worst_alert), not the later warning
        page.get_by_text("Worst alert").first.wait_for(timeout=60_000)
        page.get_by_text("collapse (critical) at step").first.wait_for(timeout=60_000)
        assert page.get_by_text("mode_collapse (warning) at step 162:").count() == 0
        _wait_chart(page)
        lam = _full_trace(page, f"main · {C.LLDS_LAMBDA}")
        assert lam["shape"] == "hv"
        assert _value_at(lam, 119) == 0.0 and _value_at(lam, 120) == 0.2
        assert all(v == 0.2 for x, v in zip(lam["x"], lam["y"]) if x >= 120)
        reward = _full_trace(page, f"main · {C.REWARD_MEAN}")  # the smoothed line
        assert [_value_at(reward, s) for s in (171, 185, 200)] == [0.0, 0.0, 0.0]
        for name in (f"main · {C.LOGP_CORRECT}", f"main · {C.LOGP_CORRECT} (raw)"):
            logp = _full_trace(page, name)
            inside = [v for x, v in zip(logp["x"], logp["y"]) if 99 < x < 200]
            assert inside and all(m.isnan(v) for v in inside), name  # a break, no line
        page.screenshot(path=str(ARTIFACTS / "dashboard-truth-one-run.png"), full_page=True)

        # a click on the dense reward curve (200 points) at step 150 opens its tokens
        plot = page.locator(".js-plotly-plot").first
        x, y = plot.evaluate(CLICK_TARGET_JS, [f"main · {C.REWARD_MEAN} (raw)", 150])
        page.mouse.move(x, y)
        page.mouse.click(x, y)
        page.get_by_text("Tokens of step 150 · main").wait_for(timeout=30_000)
        assert "tok150" in page.locator(".lld-tok").all_inner_texts()
        # the drill-down opens on the step with displaced correct responses, marked
        page.get_by_role("tab", name="Drill-down").click()
        picker = page.locator('[data-testid="stSelectbox"] input').first
        picker.wait_for(timeout=30_000)
        assert picker.input_value() == "step 150 · 1 correct, 1 displaced (of 1 sampled) ▼"

        # four runs: each lane carries its full name
        page.goto(url_for(base, *long_names), wait_until="domcontentloaded")
        _wait_chart(page)
        page.wait_for_function(
            "(n) => { const g = document.querySelector('.js-plotly-plot');"
            " return g && g.layout.yaxis.ticktext && g.layout.yaxis.ticktext.length === n; }",
            arg=len(long_names),
            timeout=60_000,
        )
        ticks = page.evaluate(
            "() => document.querySelector('.js-plotly-plot').layout.yaxis.ticktext"
        )
        assert [t.replace("<br>", "") for t in ticks] == long_names
        page.screenshot(path=str(ARTIFACTS / "dashboard-truth-four-runs.png"), full_page=True)

        # a broken run and a 1e18-step run beside a good one: the good one still renders
        page.goto(url_for(base, "zz-bad-meta", "zz-huge-steps", "main"))
        page.get_by_text("cannot be shown").first.wait_for(timeout=60_000)
        _wait_chart(page)
        assert _full_trace(page, f"main · {C.LLDS_LAMBDA}") is not None
        assert page.get_by_text("Traceback").count() == 0

        # the HTML report draws the same: lambda as a step at exactly 0.2
        page.goto(report.as_uri(), wait_until="load")
        _wait_chart(page)
        lam = _full_trace(page, f"main · {C.LLDS_LAMBDA}")
        assert lam["shape"] == "hv" and _value_at(lam, 150) == 0.2
        assert _value_at(lam, 100) == 0.0


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (make browser)")
def test_long_run_draws_first_and_its_verdict_follows_in_chromium(tmp_path: Path) -> None:
    """A run past ``service.BACKGROUND_BYTES`` (25k rows, about 10 MB): the page shows its
    charts while the picker says "analysing", then, with no click, the verdict of the worker's
    analysis (the one ``lld-monitor analyze`` gives) replaces it and the note goes."""
    from lld_monitor.analysis.triage import triage_one
    from lld_monitor.report.dashboard import service, sources
    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    root = tmp_path / "runs"
    write_sim(make_run("collapse", 25_000, seed=0), root / "long")
    size = sum(p.stat().st_size for p in (root / "long").rglob("*") if p.is_file())
    assert size >= service.BACKGROUND_BYTES, size
    expected = triage_one(root / "long", root)  # what `lld-monitor analyze ROOT` says
    label = f"{sources.VERDICT_BADGE[expected.verdict]} long · {expected.verdict}"
    with _serve(root) as url, _chromium_page(url, viewport={"width": 1400, "height": 1200}) as page:
        page.get_by_text("… long · analysing").first.wait_for(timeout=60_000)
        page.get_by_text("in the background").first.wait_for(timeout=10_000)
        page.wait_for_function(
            "() => { const g = document.querySelector('.js-plotly-plot');"
            " return g && g._fullData && g._fullData.length > 0; }",
            timeout=60_000,
        )
        try:
            page.get_by_text(label, exact=False).first.wait_for(timeout=90_000)
        except Exception:  # what the page showed instead, for the report
            page.screenshot(path=str(ARTIFACTS / "dashboard-long-run-failed.png"))
            (ARTIFACTS / "dashboard-long-run-failed.txt").write_text(page.inner_text("body"))
            raise
        page.get_by_text("in the background").first.wait_for(state="detached", timeout=30_000)
        assert page.get_by_text("… long · analysing").count() == 0
        page.screenshot(path=str(ARTIFACTS / "dashboard-long-run.png"), full_page=True)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed (make browser)")
def test_server_stopped_during_a_background_analysis_leaves_no_process(tmp_path: Path) -> None:
    """SIGTERM to the server alone while its worker analyses a long run: the server exits within
    seconds (it does not wait for the analysis) and no process of its session is left."""
    from lld_monitor.testing import make_run
    from lld_monitor.testing import write_run as write_sim

    root = tmp_path / "runs"
    write_sim(make_run("collapse", 300_000, seed=0), root / "long")  # 7-10 s of analysis
    with _serve_process(root) as (url, proc):
        with _chromium_page(url) as page:
            page.get_by_text("in the background").first.wait_for(timeout=60_000)
            time.sleep(1.0)  # the worker is busy with the run now
            t0 = time.monotonic()
            os.kill(proc.pid, signal.SIGTERM)  # the server alone, not its group
            proc.wait(timeout=30)
            assert time.monotonic() - t0 < 5
        time.sleep(1.0)
        ps = ["ps", "-o", "pid=,stat=,args=", "-s", str(proc.pid)]
        lines = subprocess.run(ps, capture_output=True, text=True).stdout.splitlines()
        running = [line for line in lines if line.split()[1][0] != "Z"]  # (zombies: exited)
        assert running == [], "processes of the server's session still running:\n" + "\n".join(
            running
        )
