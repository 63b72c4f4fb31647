"""A running tqdm job's progress where a user looks: the web list (a bar) and the job's page (a bar, the
step-rate and loss charts) in a real browser, and `top` in a real terminal (tmux)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Jobwarden, wait_pid_gone
from tests.integration.test_progress import Held, require, wait_progress
from tests.integration.test_top import capture_value, tmux, wait_for_screen  # noqa: F401 (a fixture)
from tests.integration.test_web_browser import browser, text_of, wait_until  # noqa: F401 (a fixture)
from tests.integration.webtools import Client, web_server

pytestmark = pytest.mark.integration


@pytest.fixture
def held_tqdm(jw: Jobwarden, tmp_path: Path) -> Iterator[Held]:
    """A tqdm job at 450/1000 of "Epoch 3", its loss in the postfix, holding until the test ends."""
    require("tqdm")
    job = Held(jw, tmp_path, "tqdm").wait_ready()
    wait_progress(jw, job.id, "at 450", lambda p: p.step == 450 and p.rate is not None)
    yield job
    job.go()
    jw("wait", str(job.id))


@pytest.mark.browser
def test_the_web_shows_the_bar_and_the_charts(
    jw: Jobwarden,
    held_tqdm: Held,
    browser: Any,  # noqa: F811 (the fixture of test_web_browser)
    tmp_path: Path,
) -> None:
    from selenium.webdriver.common.by import By

    job = held_tqdm.id
    with web_server(jw.home) as served:
        listed = next(j for j in Client(served).get("/api/v1/jobs").json() if j["id"] == job)
        assert (listed["progress"]["step"], listed["progress"]["total"]) == (450, 1000)
        assert listed["progress"]["metrics"]["loss"] == pytest.approx(1 / 450, rel=0.01)
        assert Client(served).get(f"/api/v1/jobs/{job}").json()["progress"]["label"] == "Epoch 3"
        browser.get(served.url)
        row = f'tr[data-job="{job}"] td.prog'
        wait_until(browser, lambda d: "45% 450/1000" in text_of(d, row), "the progress in the list")
        fill = browser.find_element(By.CSS_SELECTOR, f"{row} .bar .fill")
        assert fill.get_attribute("style") == "width: 45%;"
        assert browser.find_element(By.CSS_SELECTOR, f"{row} .bar").get_attribute("aria-valuenow") == "45"
        browser.get(f"{Client(served).origin}/jobs/{job}")
        wait_until(browser, lambda d: "45% 450/1000" in text_of(d, "#progress"), "the progress card")
        facts = text_of(browser, "#progress-facts")
        assert "Epoch 3" in facts and "loss 0.00222" in facts and "tqdm, read in-process" in facts
        for chart in ("step_rate", "loss"):
            wait_until(
                browser, lambda d, c=chart: d.find_elements(By.CSS_SELECTOR, f"#chart-{c} canvas"), chart
            )
            size = browser.find_element(By.CSS_SELECTOR, f"#chart-{chart} canvas").size
            assert size["width"] >= 280 and size["height"] >= 150, (chart, size)
        charts = [e.get_attribute("id") for e in browser.find_elements(By.CSS_SELECTOR, "#charts .chart")]
        assert charts[:3] == ["chart-step_rate", "chart-loss", "chart-cpu"]  # progress first
        browser.save_screenshot(str(tmp_path / "job-page.png"))
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert errors == []


@pytest.mark.browser
def test_a_job_without_progress_has_no_bar_and_no_progress_chart(
    jw: Jobwarden,
    tmp_path: Path,
    browser: Any,  # noqa: F811 (the fixture of test_web_browser)
) -> None:
    from selenium.webdriver.common.by import By

    job = Held(jw, tmp_path, "quiet").wait_ready()
    try:
        with web_server(jw.home) as served:
            browser.get(served.url.replace("/?token=", f"/jobs/{job.id}?token="))
            wait_until(
                browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-cpu canvas"), "the CPU chart"
            )
            assert browser.find_element(By.ID, "progress").get_attribute("hidden") is not None
            assert not browser.find_elements(By.CSS_SELECTOR, "#chart-step_rate, #chart-loss")
    finally:
        job.go()
        jw("wait", str(job.id))


def test_top_shows_the_progress(jw: Jobwarden, held_tqdm: Held, tmux: list[str], tmp_path: Path) -> None:  # noqa: F811
    env = {**jw.env, "TERM": "xterm-256color"}
    top = f"{sys.executable} -m jobwarden top --interval 1"
    session = [*tmux, "new-session", "-d", "-s", "top", "-x", "150", "-y", "32", top]
    subprocess.run(session, env=env, check=True, timeout=30)
    top_pid = int(capture_value(tmux, "#{pane_pid}"))
    screen = wait_for_screen(tmux, "PROGRESS", "45% 450/1000", "progress ", "steps/s", "loss")
    (tmp_path / "top.txt").write_text(screen)
    row = next(line for line in screen.splitlines() if "45% 450/1000" in line and "running" in line)
    assert row.split()[0] == str(held_tqdm.id)
    detail = next(line for line in screen.splitlines() if line.strip().startswith("progress "))
    assert "█████████" in detail and "Epoch 3" in detail and "loss 0.00222" in detail
    subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True, timeout=30)
    wait_pid_gone(top_pid)
