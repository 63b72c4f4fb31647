"""The dashboard in a real browser (Debian's chromium, driven by selenium through chromedriver): the
pages draw real jobs, the log follows without a reload, the stop button stops, and a page of another
origin cannot stop anything."""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import Jobwarden, make_fifo, read_fifo, write_fifo
from tests.integration.test_lifecycle import fake_gpus
from tests.integration.test_web_http import finish, start_ticker
from tests.integration.webprocess import WebProcess, get
from tests.integration.webtools import Client, web_server
from tests.support import eventually, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.browser]
WEB_JOB = str(Path(__file__).parent / "jobs" / "web_job.py")
WAIT_S = 60  # a loaded 2-core machine: generous, and a deadline all the same


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        chromium = None
    if not (chromium and chromedriver):
        why = "needs chromium, chromium-driver (apt) and selenium (the dev extra); scripts/test installs them"
        unavailable(why)
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager: no download, no usage statistics
    monkeypatch.setenv("SE_AVOID_STATS", "true")
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1300,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        yield driver
    finally:
        driver.quit()  # ends chromium and reaps chromedriver


def wait_until(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # the pages re-render every few seconds: an element found a moment before may be gone; look again
    wait = WebDriverWait(driver, WAIT_S, 0.1, ignored_exceptions=(StaleElementReferenceException,))
    return wait.until(condition, f"never: {what}")


def text_of(driver: Any, css: str) -> str:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    for _ in range(10):  # the page redrew it between finding and reading: find it again
        found = driver.find_elements(By.CSS_SELECTOR, css)
        try:
            return str(found[0].text) if found else ""
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} is redrawn faster than it can be read")


def test_the_list_shows_a_running_job(jw: Jobwarden, tmp_path: Path, browser: Any) -> None:
    job_id, go = start_ticker(jw, tmp_path, 1, "--name", "<b>not bold</b>")
    try:
        with web_server(jw.home) as served:
            browser.get(served.url)
            row = f'tr[data-job="{job_id}"][data-state="running"]'
            wait_until(browser, lambda d: text_of(d, row), "the running job listed")
            assert "token" not in browser.current_url  # it went to the cookie
            assert "<b>not bold</b>" in text_of(browser, row)  # job text is text, never markup
    finally:
        finish(jw, job_id, go)


def test_the_list_shows_each_runs_verdict_with_its_title_on_hover(jw: Jobwarden, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    job = jw.start(sys.executable, "-c", "raise ValueError('bad shard 7')", options=("--name", "bad"))
    assert jw("wait", str(job["id"])).returncode == 1
    root = jw.json("explain", str(job["id"]))["findings"][0]
    with web_server(jw.home) as served:
        browser.get(served.url)
        cell = f'tr[data-job="{job["id"]}"] td.verdict'
        wait_until(browser, lambda d: text_of(d, cell), "the verdict listed")
        assert text_of(browser, cell) == f"{root['title']} [{root['rule']}]"  # title, then rule
        assert browser.find_element(By.CSS_SELECTOR, cell).get_attribute("title") == root["title"]


def test_the_job_page_shows_a_resolved_finding_only_as_history(jw: Jobwarden, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    corpus = str(Path(__file__).parent / "jobs" / "corpus.py")
    ran = jw(
        "run",
        "--wait",
        "--hang-timeout",
        "2s",
        "--",
        sys.executable,
        corpus,
        "quiet-then-talk",
        "--quiet-s",
        "5",
    )
    assert ran.returncode == 0, ran.stderr
    job_id = int(ran.stdout.split()[0])
    (hung,) = jw.json("explain", str(job_id))["findings"]
    assert hung["rule"] == "no-progress" and hung["resolved_at"]
    with web_server(jw.home) as served:
        browser.get(served.url.replace("/?token=", f"/jobs/{job_id}?token="))
        history = '#findings p.resolved[data-rule="no-progress"]'
        wait_until(browser, lambda d: text_of(d, history), "the resolved finding as history")
        assert text_of(browser, history).startswith(f"resolved: {hung['title']} [no-progress]")
        assert browser.find_elements(By.CSS_SELECTOR, "#findings article") == []  # no card: not current
        assert "nothing now" in text_of(browser, "#findings")


def test_the_job_page_says_what_changed_since_the_last_success(
    jw: Jobwarden, tmp_path: Path, browser: Any
) -> None:
    from tests.integration.test_diff import run

    work = tmp_path / "work"
    work.mkdir()
    first = run(jw, work)
    second = run(jw, work, "--env", "WANDB_MODE=offline")
    with web_server(jw.home) as served:
        browser.get(served.url.replace("/?token=", f"/jobs/{second}?token="))
        item = '#changes li[data-what="env key WANDB_MODE"]'
        wait_until(browser, lambda d: text_of(d, item), "the change listed")
        assert text_of(browser, item) == "env key WANDB_MODE added"
        assert text_of(browser, "#changes").startswith(f"since run 1 of job {first} succeeded")
        browser.get(served.url.replace("/?token=", f"/jobs/{first}?token="))
        wait_until(
            browser, lambda d: "succeeded before run 1" in text_of(d, "#changes"), "nothing to compare"
        )


def test_a_queued_job_says_who_holds_the_gpus(jw: Jobwarden, tmp_path: Path, browser: Any) -> None:
    nvml = tmp_path / "nvml.json"
    fake_gpus(nvml, {i: [os.getpid()] for i in range(4)})  # every GPU busy, held by this test
    jw.env["JOBWARDEN_FAKE_NVML"] = str(nvml)
    job_id = jw.start("true", options=("--gpu-ids", "1"))["id"]
    try:
        with web_server(jw.home) as served:
            browser.get(served.url)
            row = f'tr[data-job="{job_id}"][data-state="queued"]'
            wait_until(browser, lambda d: f"pid {os.getpid()}" in text_of(d, row), "the reason in the list")
            browser.get(f"{Client(served).origin}/jobs/{job_id}")
            wait_until(browser, lambda d: text_of(d, "#queued"), "the reason on the job page")
            assert text_of(browser, "#queued").startswith("Waiting: ")
            assert f"pid {os.getpid()}" in text_of(browser, "#queued")
    finally:
        jw("stop", str(job_id), check=True)


def test_the_job_page_follows_the_log_and_shows_the_findings(
    jw: Jobwarden, tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    job_id = jw.start(sys.executable, WEB_JOB, str(ready), str(go))["id"]
    read_fifo(ready)
    with web_server(jw.home) as served:
        browser.get(served.url.replace("/?token=", f"/jobs/{job_id}?token="))
        wait_until(browser, lambda d: "line before" in text_of(d, "#log"), "the output so far")
        assert text_of(browser, "#state") == "running"
        browser.execute_script("window.notReloaded = true")
        write_fifo(go, "print line after the page opened\n")
        read_fifo(ready)
        wait_until(browser, lambda d: "line after the page opened" in text_of(d, "#log"), "the new line")
        assert browser.execute_script("return window.notReloaded") is True
        write_fifo(go, "raise\n")
        wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#log[data-ended]"), "the end event")
        wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#findings article"), "a finding")
        assert text_of(browser, "#state") == "failed"
        finding = text_of(browser, "#findings article")
        assert jw.json("explain", str(job_id))["findings"][0]["title"] in finding
        assert "What to do" in finding
        assert text_of(browser, "#log").splitlines()[-1] == "ValueError: boom from the web test"
        wait_until(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-cpu canvas"), "the CPU chart")
        for chart in ("cpu", "rss", "nprocs", "io"):  # GPU charts only where GPUs were measured
            if browser.find_element(By.CSS_SELECTOR, f"#chart-{chart} .empty").is_displayed():
                continue  # nothing sampled in a short run: it says so, with no empty axes
            size = browser.find_element(By.CSS_SELECTOR, f"#chart-{chart} canvas").size
            assert size["width"] >= 280 and size["height"] >= 150, (chart, size)
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []


def test_the_stop_button_stops_the_job(jw: Jobwarden, tmp_path: Path, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    job_id, _ = start_ticker(jw, tmp_path, 1)  # ended by the button
    with web_server(jw.home) as served:
        browser.get(served.url.replace("/?token=", f"/jobs/{job_id}?token="))
        wait_until(browser, lambda d: text_of(d, "#state") == "running", "the job running")
        button = browser.find_element(By.ID, "stop")
        button.click()  # the first click only arms it
        wait_until(browser, lambda d: "armed" in str(button.get_attribute("class")), "the button armed")
        assert jw.status(job_id)["state"] == "running"
        button.click()
        wait_until(browser, lambda d: text_of(d, "#state") == "stopped", "the job stopped")
        assert "stopped" in text_of(browser, "#action-result")
    assert jw.status(job_id)["state"] == "stopped"


class _AttackerPage(BaseHTTPRequestHandler):
    """Another local port's page: a form that posts to the dashboard's stop address, as CSRF would."""

    target = ""

    def do_GET(self) -> None:
        body = (
            f'<form id="f" method="POST" action="{self.target}"><input name="x" value="1"></form>'
            "<p id='ready'>ready</p>"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_a_stop_without_the_token_or_from_another_origin_is_refused(
    jw: Jobwarden, tmp_path: Path, browser: Any
) -> None:
    job_id, go = start_ticker(jw, tmp_path, 1)
    attacker = ThreadingHTTPServer(("127.0.0.1", 0), _AttackerPage)
    serving = threading.Thread(target=attacker.serve_forever, daemon=True)
    serving.start()
    try:
        with web_server(jw.home) as served:
            stop = f"{Client(served).origin}/api/v1/jobs/{job_id}/stop"
            browser.get(served.url.replace("/?token=", f"/jobs/{job_id}?token="))
            wait_until(browser, lambda d: text_of(d, "#state") == "running", "the job page")
            statuses = browser.execute_async_script(
                """const done = arguments[arguments.length - 1];
                Promise.all([
                  fetch(arguments[0], {method: "POST", credentials: "omit", headers: {"X-Jobwarden": "1"}}),
                  fetch(arguments[0], {method: "POST", credentials: "same-origin"}),
                ]).then((rs) => done(rs.map((r) => r.status)));""",
                stop,
            )
            assert statuses == [401, 403]
            _AttackerPage.target = stop
            browser.get(f"http://127.0.0.1:{attacker.server_address[1]}/")
            sent = browser.execute_async_script(
                """const done = arguments[arguments.length - 1];
                fetch(arguments[0], {method: "POST", credentials: "include", headers: {"X-Jobwarden": "1"}})
                  .then((r) => done("answered " + r.status), () => done("blocked"));""",
                stop,
            )
            assert sent == "blocked"  # the custom header needs a CORS preflight, which we never grant
            browser.execute_script("document.getElementById('f').submit()")
            wait_until(browser, lambda d: "X-Jobwarden" in d.page_source, "the form's refusal")
            assert browser.current_url == stop  # it arrived (with the cookie: same site) and was refused
            assert jw.status(job_id)["state"] == "running"
    finally:
        attacker.shutdown()
        attacker.server_close()
        serving.join(10)
        finish(jw, job_id, go)


# --- sessions in a real browser (issue 20, item 5): each of these failed before its fix --------------------


class _OtherApp(BaseHTTPRequestHandler):
    """Another local web app on another port of the same host: it receives every cookie of the host (ports
    do not separate cookies) and may set its own, odd ones included."""

    set_cookies: ClassVar[list[str]] = []
    received: ClassVar[list[str]] = []  # each request's Cookie header (the page, then its favicon)

    def do_GET(self) -> None:
        _OtherApp.received.append(self.headers.get("Cookie", ""))
        body = b"<p id='ready'>another app</p>"
        self.send_response(200)
        for cookie in self.set_cookies:
            self.send_header("Set-Cookie", cookie)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def other_app(set_cookies: list[str]) -> Iterator[str]:
    _OtherApp.set_cookies, _OtherApp.received = set_cookies, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OtherApp)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        serving.join(10)


def listed(browser: Any, name: str) -> None:
    """Wait until the job list shows the job called `name`: its data came, the session worked."""
    wait_until(browser, lambda d: name in text_of(d, "#jobs tbody"), f"job {name} listed")


def test_two_dashboards_in_one_browser_keep_their_sessions(
    jw: Jobwarden, tmp_path: Path, browser: Any
) -> None:
    other = Jobwarden(tmp_path / "other-home", tmp_path)
    jw("run", "--wait", "--name", "first-box", "--", "true", check=True)
    other("run", "--wait", "--name", "second-box", "--", "true", check=True)
    with WebProcess(jw, "--port", "0") as first, WebProcess(other, "--port", "0") as second:
        browser.get(first.url)
        listed(browser, "first-box")
        browser.get(second.url)
        listed(browser, "second-box")
        browser.get(f"{first.path_base}/")  # back to the first, without its token: its cookie is intact
        listed(browser, "first-box")
        names = [c["name"] for c in browser.get_cookies()]
        assert len(names) == 2 and len(set(names)) == 2, names


def test_the_printed_address_beats_a_stale_cookie_and_another_apps_odd_one(
    jw: Jobwarden, tmp_path: Path, browser: Any
) -> None:
    jw("run", "--wait", "--name", "mine", "--", "true", check=True)
    with WebProcess(jw, "--port", "0") as web:
        browser.get(web.url)
        listed(browser, "mine")
        (ours,) = browser.get_cookies()
        odd = "other_app[pref]=dark mode; Path=/"  # a name and a value http.cookies cannot parse
        with other_app([f"{ours['name']}=stale-from-an-earlier-token; Path=/", odd]) as elsewhere:
            browser.get(elsewhere)
            wait_until(browser, lambda d: text_of(d, "#ready"), "the other app's page")
        values = {c["name"]: c["value"] for c in browser.get_cookies()}
        assert values[ours["name"]].startswith("stale") and "other_app[pref]" in values, values
        browser.get(web.url)  # the address `jobwarden web` printed wins over the stale cookie
        listed(browser, "mine")
        browser.get(f"{web.path_base}/jobs/1")  # and the odd cookie beside ours does not lock us out
        wait_until(browser, lambda d: text_of(d, "#state") == "succeeded", "the job page")


def test_the_cookie_another_port_receives_opens_nothing(jw: Jobwarden, tmp_path: Path, browser: Any) -> None:
    jw("run", "--wait", "--name", "mine", "--", "true", check=True)
    with WebProcess(jw, "--port", "0") as web:
        browser.get(web.url)
        listed(browser, "mine")
        with other_app([]) as elsewhere:
            browser.get(elsewhere)
            wait_until(browser, lambda d: text_of(d, "#ready"), "the other app's page")
        header = _OtherApp.received[0]
        assert header and web.token not in header  # it got our cookie: a session, not the token
        for _, _, value in (piece.strip().partition("=") for piece in header.split(";")):
            assert get(web, "/api/v1/jobs", {"Authorization": f"Bearer {value}"}).status == 401


@pytest.mark.parametrize("host", ["0", "::"])
def test_the_printed_address_opens_in_the_browser(jw: Jobwarden, browser: Any, host: str) -> None:
    jw("run", "--wait", "--name", "mine", "--", "true", check=True)
    with WebProcess(jw, "--host", host, "--port", "0") as web:
        browser.get(web.url)
        listed(browser, "mine")


def test_the_charts_legends_show_the_newest_values_before_any_hover(
    jw: Jobwarden, tmp_path: Path, browser: Any
) -> None:
    """uPlot's legend shows the values under the cursor: with no cursor on a chart it read "–" for every
    series until hovered; it shows the newest sample instead."""
    from selenium.webdriver.common.by import By

    ready, go = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "go")
    code = "import sys; open(sys.argv[1], 'w').write('up\\n'); open(sys.argv[2]).read()"
    job = jw.start(sys.executable, "-c", code, str(ready), str(go))
    read_fifo(ready)
    # samples to chart: the shim's own pace
    eventually("2 samples", lambda: len(jw.json("metrics", str(job["id"]))) >= 2, WAIT_S, every_s=0.2)
    write_fifo(go, "end\n")
    assert jw("wait", str(job["id"])).returncode == 0
    with web_server(jw.home) as served:
        browser.get(served.url.replace("/?token=", f"/jobs/{job['id']}?token="))
        wait_until(
            browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-cpu .u-legend"), "the CPU chart"
        )

        def legend_values(d: Any) -> list[str]:
            cells = d.find_elements(By.CSS_SELECTOR, "#chart-nprocs .u-legend .u-value")
            return [str(c.text) for c in cells]

        shown = wait_until(browser, lambda d: [v for v in legend_values(d) if v not in ("", "--")], "values")
        assert "–" not in shown, shown  # the time and the process count: the newest sample's


def test_at_1400_px_names_stay_on_one_line_and_the_command_takes_the_room_left(
    jw: Jobwarden, browser: Any
) -> None:
    """A name wrapped onto two lines while the command was cut at a fixed 420 px: names stay whole on
    one line, the command takes what the other columns leave (whole when short) and never pushes the
    table past the window; its full text is its title."""
    name = "resnet50-imagenet-lr3e-4-bs512-warmup"
    long_command = "echo training with a command line of a usual length --epochs 90 --lr 3e-4 --seed 1"
    for command in (("true",), ("sh", "-c", long_command)):
        job = jw.start(*command, options=("--name", name))
        assert jw("wait", str(job["id"])).returncode == 0
    browser.set_window_size(1400, 900)
    with web_server(jw.home) as served:
        browser.get(served.url)
        wait_until(browser, lambda d: name in text_of(d, "#jobs td.name"), "the jobs' rows")
        cells = browser.execute_script(
            "return [...document.querySelectorAll('#jobs tbody tr')].map((tr) => {"
            " const n = tr.querySelector('td.name'), c = tr.querySelector('td.cmd');"
            " const line = parseFloat(getComputedStyle(n).lineHeight);"
            " return {name: n.getBoundingClientRect().height, line: line,"
            " cut: c.scrollWidth > c.clientWidth, title: c.title, text: c.textContent}; })"
        )
        width = browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= 1400, width  # no sideways scrolling
    for row in cells:
        assert row["name"] < 2 * row["line"], row  # one line
        assert row["title"] == row["text"]  # the whole command on hover
    short = next(row for row in cells if row["text"] == "true")
    assert not short["cut"], short


def test_the_job_page_shows_one_row_per_rank(jw: Jobwarden, browser: Any) -> None:
    # DESIGN.md "Ranks": the web page shows each rank, never only the job's averages
    from selenium.webdriver.common.by import By

    from tests.integration.test_speed_ranks import ranks_of, start_ranks

    job_id = start_ranks(jw, "balanced")
    try:
        rows = eventually(
            "both ranks in status", lambda: len(ranks_of(jw, job_id)) == 2 and ranks_of(jw, job_id)
        )
        with web_server(jw.home) as served:
            browser.get(served.url.replace("/?token=", f"/jobs/{job_id}?token="))
            shown = wait_until(
                browser,
                lambda d: (
                    len(cells := d.find_elements(By.CSS_SELECTOR, "#rank-rows tbody tr")) == 2 and cells
                ),
                "a row for each rank",
            )
            assert [row.get_attribute("data-rank") for row in shown] == ["0", "1"]
            pids = {int(row.find_elements(By.TAG_NAME, "td")[1].text) for row in shown}
            assert pids == {r["pid"] for r in rows}
            assert browser.find_element(By.CSS_SELECTOR, "#ranks").is_displayed()

            # each rank's newest collective, once its flight recorder answered a poll (every 10 s)
            def calls(d: Any) -> list[str] | None:
                found = [c.text for c in d.find_elements(By.CSS_SELECTOR, "#rank-rows tbody td.collective")]
                named = len(found) == 2 and all(re.fullmatch(r"#\d+ all_reduce", c) for c in found)
                return found if named else None

            wait_until(browser, calls, "each rank's newest collective")
    finally:
        jw("stop", str(job_id), check=True)
