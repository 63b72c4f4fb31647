"""The pages as a user sees them (issue 21), in a real browser (Debian's chromium through selenium): what
was drawn is measured in the page itself, text extents against the canvas, not compared as pixels.
Set JOBWARDEN_SHOTS=DIR to keep a screenshot of each page looked at."""

from __future__ import annotations

import itertools
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Jobwarden
from tests.integration.test_web_browser import browser, text_of, wait_until
from tests.integration.webtools import Client, web_server

pytestmark = [pytest.mark.integration, pytest.mark.browser]
__all__ = ["browser"]  # the fixture, used by name

MIB = 1 << 20
# holds 80 MiB for a few seconds under a 300 MiB limit: samples to draw, a peak and a limit line
HOLDER = (
    "import time\nx = bytearray(80 << 20)\nfor i in range(len(x) // 4096): x[i * 4096] = 1\ntime.sleep(4)\n"
)
# what a training script's terminal output looks like: colours, a progress bar redrawn with \r, a title
COLOURED = (
    "import sys\n"
    "w = sys.stdout.write\n"
    "w('\\x1b[31mred words\\x1b[0m then plain\\n')\n"
    "w('\\x1b[1;32mbold green\\x1b[0m \\x1b[38;5;208morange\\x1b[0m \\x1b[38;2;10;20;30mtrue\\x1b[0m\\n')\n"
    "w('epoch 1:   0%|          |\\repoch 1:  50%|#####     |\\repoch 1: 100%|##########|\\n')\n"
    "w('\\x1b]0;a window title\\x07after the title\\x1b[K\\n')\n"
    "w('needle in the log\\n')\n"
    "for i in range(30): w(f'filler line {i}\\n')\n"
    "w('another needle\\n')\n"
)


def shoot(driver: Any, name: str) -> None:
    where = os.environ.get("JOBWARDEN_SHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(where) / f"{name}.png"))


def page(served: Any, path: str) -> str:
    return served.url.replace("/?token=", f"{path}?token=")


# Measures every chart as drawn: each y label's width in the axis's own font against the room the axis
# has; each x label's extent against the canvas and its neighbours; the x scale against the run's span.
MEASURE = """
const out = {};
for (const [id, {plot: u, box}] of Object.entries(window.jwPlots)) {
  const dpr = devicePixelRatio, y = u.axes[1], x = u.axes[0];
  u.ctx.font = y.font[0];
  const yWidths = y._values.map((v) => u.ctx.measureText(String(v)).width / dpr);
  u.ctx.font = x.font[0];
  const left = u.bbox.left / dpr;
  const xLabels = x._splits.map((t, i) => {
    const lines = String(x._values[i]).split("\\n");
    const w = Math.max(...lines.map((l) => u.ctx.measureText(l).width / dpr));
    const at = left + u.valToPos(t, "x");
    return {text: x._values[i], from: at - w / 2, to: at + w / 2};
  });
  const canvas = box.querySelector("canvas").getBoundingClientRect();
  const outer = box.getBoundingClientRect();
  const t = u.data[0];
  out[id] = {
    yWidest: Math.max(...yWidths), yRoom: y._size - y.ticks.size - y.gap, yLabels: y._values,
    xLabels, width: u.width, canvasLeft: canvas.left - outer.left, canvasRight: outer.right - canvas.right,
    boxWidth: outer.width, xMin: u.scales.x.min, xMax: u.scales.x.max, first: t[0], last: t[t.length - 1],
    series: u.series.slice(1).map((s) => s.label), data: u.data.slice(1),
  };
}
return out;
"""


def test_the_charts_span_the_run_with_every_label_inside(jw: Jobwarden, browser: Any) -> None:
    ran = jw("run", "--wait", "--mem-limit", "300M", "--name", "holder", "--", sys.executable, "-c", HOLDER)
    assert ran.returncode == 0, ran.stderr
    job_id = int(ran.stdout.split()[0])
    status = jw.status(job_id)
    with web_server(jw.home) as served:
        browser.get(page(served, f"/jobs/{job_id}"))
        drawn = "return Object.keys(window.jwPlots || {}).length >= 4"
        wait_until(browser, lambda d: d.execute_script(drawn), "the charts drawn")
        charts = browser.execute_script(MEASURE)
        shoot(browser, "job-page")
        browser.set_window_size(400, 900)  # a phone: the charts narrow, their labels still inside
        narrow = "return Object.values(window.jwPlots).every(({plot}) => plot.width < 400)"
        wait_until(browser, lambda d: d.execute_script(narrow), "the charts resized")
        phone = browser.execute_script(MEASURE)
        sideways = "return document.documentElement.scrollWidth - document.documentElement.clientWidth"
        assert browser.execute_script(sideways) <= 0, "the job page scrolls sideways at phone width"
        browser.execute_script("document.getElementById('charts').scrollIntoView()")
        shoot(browser, "job-page-phone")
    assert "gpu_util" not in charts and "gpu_mem" not in charts  # no GPU was measured: no GPU chart
    started = _epoch(status["started_at"])
    ended = _epoch(status["ended_at"])
    for name, c in [*charts.items(), *((f"{n} at 400 px", c) for n, c in phone.items())]:
        assert c["yWidest"] <= c["yRoom"], (name, c["yLabels"], c["yWidest"], c["yRoom"])  # never clipped
        labels = c["xLabels"]
        assert labels, name
        assert labels[0]["from"] >= 0 and labels[-1]["to"] <= c["width"], (name, labels, c["width"])
        for before, after in itertools.pairwise(labels):
            assert before["to"] + 4 <= after["from"], (name, before, after)  # no overlap
        texts = [label["text"].split("\n")[0] for label in labels]
        assert len(set(texts)) == len(texts), (name, texts)  # no time said twice
        for label in labels:
            assert "AM" not in label["text"] and "PM" not in label["text"]  # 24-hour
            assert re.match(r"^\d\d:\d\d(:\d\d)?(\n\d\d-\d\d)?$", label["text"]), label
        # the run's own span, not ±30 s around it
        assert abs(c["xMin"] - started) <= 1.0 and abs(c["xMax"] - ended) <= 1.0, (name, c, started, ended)
        assert c["canvasLeft"] >= 0 and c["canvasRight"] >= 0, (name, c)  # the canvas inside its box
        assert c["width"] >= c["boxWidth"] - 20, (name, c)  # the chart uses the box's width
    rss = charts["rss"]
    assert rss["series"] == ["RSS (mean)", "peak", "limit"]
    assert set(rss["data"][2]) == {300 * MIB}  # the --mem-limit, drawn as a line
    assert max(v for v in rss["data"][1] if v is not None) >= 80 * MIB  # the bytearray's 80 MiB held
    for mean, peak in zip(rss["data"][0], rss["data"][1], strict=True):
        assert mean is None or peak >= mean


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def test_the_log_shows_colours_and_last_frames_never_an_escape(jw: Jobwarden, browser: Any) -> None:
    ran = jw("run", "--wait", "--name", "colours", "--", sys.executable, "-c", COLOURED)
    assert ran.returncode == 0, ran.stderr
    job_id = int(ran.stdout.split()[0])
    assert "\x1b[31m" in jw.output(job_id)  # the raw bytes are in the log
    with web_server(jw.home) as served:
        for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/log"):
            browser.get(page(served, path))
            wait_until(browser, lambda d: "another needle" in text_of(d, "#log"), f"the log on {path}")
            html = browser.execute_script("return document.getElementById('log').innerHTML")
            text = text_of(browser, "#log")
            assert "\x1b" not in html and "\x07" not in html and "[31m" not in text, html
            red = browser.execute_script(
                "return [...document.querySelectorAll('#log span.ansi-fg-1')].map((s) => s.textContent)"
            )
            assert red == ["red words"]
            colour = browser.execute_script(
                "const s = document.querySelector('#log span.ansi-fg-1'); return getComputedStyle(s).color"
            )
            assert colour != browser.execute_script(
                "return getComputedStyle(document.getElementById('log')).color"
            )
            lines = text.splitlines()
            assert "epoch 1: 100%|##########|" in lines and not any("50%" in line for line in lines)
            assert "after the title" in lines and "a window title" not in text
            assert "bold green orange true" in lines
            search = browser.find_element("id", "log-search")
            search.clear()
            search.send_keys("NEEDLE\n")
            wait_until(browser, lambda d: text_of(d, "#log-hits") == "1 of 2 lines", "the first of 2 found")
            assert text_of(browser, "#log div.current") == "needle in the log"
            search.send_keys("\n")
            wait_until(browser, lambda d: text_of(d, "#log-hits") == "2 of 2 lines", "the second found")
            assert text_of(browser, "#log div.current") == "another needle"
            if path.endswith("/log"):
                shoot(browser, "full-log")
            download = browser.find_element("id", "download-log").get_attribute("href")
            got = browser.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "fetch(arguments[0]).then((r) => r.text()).then(done)",
                download,
            )
            log = jw.home / "jobs" / str(job_id) / "run-1" / "output.log"
            assert got == log.read_bytes().decode()  # the download is the log as the job wrote it


def test_the_list_at_phone_width_shows_state_and_finding(jw: Jobwarden, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    jw("run", "--wait", "--name", "fine", "--", "true", check=True)
    bad = jw.start(sys.executable, "-c", "raise ValueError('bad shard 7')", options=("--name", "bad"))
    assert jw("wait", str(bad["id"])).returncode == 1
    root = jw.json("explain", str(bad["id"]))["findings"][0]
    with web_server(jw.home) as served:
        browser.get(served.url)
        row = f'tr[data-job="{bad["id"]}"]'
        wait_until(browser, lambda d: text_of(d, row), "the failed job listed")
        heads = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#jobs th") if h.is_displayed()]
        assert heads[:7] == ["ID", "name", "state", "finding", "progress", "ran", "ended"], heads
        assert text_of(browser, f"{row} td.ago").endswith(" ago")
        shoot(browser, "list")
        browser.set_window_size(400, 800)
        shoot(browser, "list-phone")
        width = browser.execute_script("return document.documentElement.clientWidth")
        assert width <= 400
        for css in (f"{row} .state", f"{row} td.verdict .ftitle", f"{row} td.name a"):
            found = browser.find_element(By.CSS_SELECTOR, css)
            box = browser.execute_script("return arguments[0].getBoundingClientRect().toJSON()", found)
            assert found.is_displayed() and box["left"] >= 0 and box["right"] <= width, (css, box, width)
        assert text_of(browser, f"{row} .state") == "failed"
        assert root["title"] in text_of(browser, f"{row} td.verdict")
        verdict = browser.find_element(By.CSS_SELECTOR, f"{row} td.verdict")
        assert "sev-error" in str(verdict.get_attribute("class"))
        assert not browser.find_element(By.CSS_SELECTOR, f"{row} td.cmd").is_displayed()  # room kept
        scrolls = browser.execute_script("return document.documentElement.scrollWidth")
        assert scrolls <= width, "the page scrolls sideways at phone width"
        # the state filter and the name search
        from selenium.webdriver.support.ui import Select

        Select(browser.find_element(By.ID, "state-filter")).select_by_value("failed")
        wait_until(
            browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#jobs tbody tr")) == 1, "failed only"
        )
        Select(browser.find_element(By.ID, "state-filter")).select_by_value("all")
        browser.find_element(By.ID, "name-filter").send_keys("fin")
        wait_until(browser, lambda d: text_of(d, "#jobs tbody") and "fine" in text_of(d, "#jobs tbody")
                   and "bad" not in text_of(d, "#jobs tbody"), "the name search")  # fmt: skip
        icon = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "const href = document.querySelector('link[rel=icon]').href;"
            "fetch(href).then((r) => done([href, r.status, r.headers.get('content-type')]))"
        )
        assert icon[0].startswith(Client(served).origin) and icon[1:] == [200, "image/svg+xml"]


def test_rerun_starts_the_same_job_again_and_is_refused_without_the_token(
    jw: Jobwarden, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    ran = jw("run", "--wait", "--name", "again", "--env", "SECRET_TOKEN=hunter2", "--timeout", "1h",
             "--", sys.executable, "-c", "print('hello')")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    job_id = int(ran.stdout.split()[0])
    with web_server(jw.home) as served:
        browser.get(page(served, f"/jobs/{job_id}"))
        wait_until(browser, lambda d: text_of(d, "#state") == "succeeded", "the job page")
        facts = text_of(browser, "#facts")
        assert "SECRET_TOKEN" in facts and "hunter2" not in browser.page_source  # the key, never its value
        assert "timeout 1h00m" in facts
        assert browser.find_element(By.ID, "dump").get_attribute("disabled")  # nothing to dump: ended
        rerun = f"{Client(served).origin}/api/v1/jobs/{job_id}/rerun"
        statuses = browser.execute_async_script(
            """const done = arguments[arguments.length - 1];
            Promise.all([
              fetch(arguments[0], {method: "POST", credentials: "omit", headers: {"X-Jobwarden": "1"}}),
              fetch(arguments[0], {method: "POST", credentials: "same-origin"}),
            ]).then((rs) => done(rs.map((r) => r.status)));""",
            rerun,
        )
        assert statuses == [401, 403]  # no token, or no header only our page sends: refused
        assert [j["id"] for j in jw.json("ps", "--all")] == [job_id]  # nothing started
        button = browser.find_element(By.ID, "rerun")
        button.click()  # the first click only arms it: a new job is a second click away, as Stop
        wait_until(browser, lambda d: "armed" in str(button.get_attribute("class")), "the button armed")
        assert "Click again" in button.text and len(jw.json("ps", "--all")) == 1
        button.click()
        wait_until(browser, lambda d: d.find_elements(By.ID, "rerun-link"), "the rerun's result")
        shoot(browser, "job-page-rerun")
        result = text_of(browser, "#action-result")
    jobs = jw.json("ps", "--all")
    assert len(jobs) == 2
    new = max(j["id"] for j in jobs)
    assert f"started job {new}" in result and f"rerun of job {job_id}" in result
    assert jw("wait", str(new)).returncode == 0
    status = jw.status(new)
    assert status["rerun_of"] == job_id and status["command"] == jw.status(job_id)["command"]
    assert jw.output(new) == "hello\n"


def test_a_peak_between_points_is_kept_and_gpu_charts_come_with_gpu_samples(
    jw: Jobwarden, browser: Any
) -> None:
    """1,200 readings in the run's span, thinned to 600 points for the page: one 200 MiB spike among
    100 MiB readings must still reach 200 MiB (a mean would show 150)."""
    from jobwarden.store import Store
    from jobwarden.store.rollup import Reading

    ran = jw("run", "--wait", "--", sys.executable, "-c", "import time; time.sleep(2)")
    assert ran.returncode == 0, ran.stderr
    job_id = int(ran.stdout.split()[0])
    status = jw.status(job_id)
    start, end = _epoch(status["started_at"]), _epoch(status["ended_at"])
    step = (end - start) / 1300
    readings = [
        Reading(
            start + (i + 50) * step,
            1,
            5.0,
            (200 if i == 601 else 100) * MIB,
            gpu_util=40.0,
            gpu_memory_bytes=2 << 30,
        )
        for i in range(1200)
    ]
    with Store(jw.home) as store:
        store.add_samples(job_id, 1, readings)
    with web_server(jw.home) as served:
        browser.get(page(served, f"/jobs/{job_id}"))
        wait_until(
            browser, lambda d: d.execute_script("return !!(window.jwPlots || {}).gpu_mem"), "GPU charts"
        )
        charts = browser.execute_script(MEASURE)
    mean, peak = charts["rss"]["data"][0], charts["rss"]["data"][1]
    assert len(mean) <= 600
    assert max(v for v in peak if v is not None) == 200 * MIB
    assert max(v for v in mean if v is not None) < 200 * MIB  # thinned: the spike's point is a mean
    assert max(v for v in charts["gpu_mem"]["data"][0] if v is not None) == 2 << 30
    for name in ("gpu_util", "gpu_mem"):
        assert charts[name]["yWidest"] <= charts[name]["yRoom"], name


def test_the_list_pages_through_a_thousand_jobs(jw: Jobwarden, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    from jobwarden.model import JobSpec, JobState
    from jobwarden.store import Store

    count = 1050
    with Store(jw.home) as store:
        for i in range(1, count + 1):
            job_id, n = store.create_job(JobSpec(("true",), str(jw.tmp), f"exp{i}", {}), {}, 1e9 + i)
            state = JobState.FAILED if i % 3 == 0 else JobState.SUCCEEDED
            store.update_run(
                job_id, n, state=state, started_at=1e9 + i, ended_at=1e9 + i + 60, exit_code=i % 3
            )
    rows = "#jobs tbody tr"
    with web_server(jw.home) as served:
        browser.get(served.url)
        wait_until(browser, lambda d: text_of(d, "#page-info") == f"1–100 of {count}", "the first page")
        assert len(browser.find_elements(By.CSS_SELECTOR, rows)) == 100
        assert text_of(browser, f"{rows}:first-child td.id") == str(count)  # the newest first
        assert text_of(browser, f"{rows}:first-child td.dur") == "1m00s"
        browser.find_element(By.ID, "next").click()
        wait_until(browser, lambda d: text_of(d, "#page-info") == f"101–200 of {count}", "the second page")
        assert text_of(browser, f"{rows}:first-child td.id") == str(count - 100)
        from selenium.webdriver.support.ui import Select

        Select(browser.find_element(By.ID, "state-filter")).select_by_value("failed")
        wait_until(browser, lambda d: text_of(d, "#page-info") == f"1–100 of {count // 3}", "failed only")
        assert {r.get_attribute("data-state") for r in browser.find_elements(By.CSS_SELECTOR, rows)} == {
            "failed"
        }
        browser.find_element(By.ID, "name-filter").send_keys("exp999")
        wait_until(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, rows)) == 1, "one job found")
        assert browser.find_element(By.ID, "pager").get_attribute("hidden") is not None  # one page: no pager


# the bytes that make escape sequences, and a few that do not
_PIECES = [*"\x1b[]\x07\\\r\x9b\x9c\x90\x9dm0138;:52PX_K? aé\t\x00\x7f\x85€", "<b>"]


def test_the_page_shows_a_line_as_the_terminal_sanitiser_does(jw: Jobwarden, browser: Any) -> None:
    """ansi.js is a second parser of the job's bytes: for any line it must show exactly the text that
    jobwarden.text.sanitize leaves of it (what `logs` and `top` show), as text nodes and spans only."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from jobwarden.text.sanitize import last_frame, terminal_text

    jw("run", "--wait", "--", "true", check=True)
    with web_server(jw.home) as served:
        browser.get(page(served, "/jobs/1/log"))
        wait_until(browser, lambda d: d.execute_script("return typeof ansi === 'object'"), "ansi.js loaded")

        @settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=200)
        @given(
            st.lists(st.lists(st.sampled_from(_PIECES), max_size=40).map("".join), min_size=1, max_size=20)
        )
        def same_text(lines: list[str]) -> None:
            shown = browser.execute_script(
                """const box = document.createElement("div");
                return arguments[0].map((line) => {
                  box.replaceChildren(...ansi.render(line, ansi.fresh()));
                  const tags = [...box.querySelectorAll("*")].map((e) => e.tagName);
                  return [box.textContent, tags.every((t) => t === "SPAN")];
                });""",
                lines,
            )
            assert [s[0] for s in shown] == [terminal_text(last_frame(line)) for line in lines]
            assert all(s[1] for s in shown)

        same_text()


def test_each_attempt_shows_its_own_findings(jw: Jobwarden, browser: Any) -> None:
    crash = "import sys; raise ValueError(f'bad shard {sys.argv[1]}')"
    options = ("--restart", "on-failure", "--max-restarts", "1", "--restart-delay", "0.1s")
    ran = jw("run", "--wait", *options, "--", sys.executable, "-c", crash, "7")
    assert ran.returncode == 1, ran.stderr
    job_id = int(ran.stdout.split()[0])
    titles = [jw.json("explain", str(job_id), "--run", str(n))["findings"][0]["title"] for n in (1, 2)]
    with web_server(jw.home) as served:
        browser.get(page(served, f"/jobs/{job_id}"))
        for n, title in zip((1, 2), titles, strict=True):
            cell = f'#attempts tr[data-run="{n}"] td.attempt-findings'
            wait_until(browser, lambda d, cell=cell: text_of(d, cell), f"run {n}'s findings")
            assert title in text_of(browser, cell)
            assert "sev-error" in str(
                browser.find_element("css selector", f"{cell} div").get_attribute("class")
            )


def test_the_processes_say_their_roles(jw: Jobwarden, tmp_path: Path, browser: Any) -> None:
    from tests.integration.test_top_views import start_family

    job_id, main, rank, worker = start_family(jw, tmp_path)
    try:
        with web_server(jw.home) as served:
            browser.get(page(served, f"/jobs/{job_id}"))
            for pid, role in ((main, "main"), (rank, "rank"), (worker, "worker")):
                cell = f'#processes tr[data-pid="{pid}"] td.role'
                wait_until(browser, lambda d, cell=cell: text_of(d, cell), f"process {pid} listed")
                assert text_of(browser, cell) == role
    finally:
        jw("stop", str(job_id))
