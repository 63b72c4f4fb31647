"""`jobwarden profile JOB` end to end: real jobs (a spinning loop, a torch DataLoader with two workers), the
real CLI, the real py-spy; the stored profile served by the web API; the automatic profile the shim takes
when a speed finding is recorded."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jobwarden.model import Finding
from jobwarden.probes import pyspy
from jobwarden.shim.record.findings import LiveFindings
from jobwarden.shim.watch.autoprofile import AutoProfiler
from jobwarden.store import Store
from jobwarden.store import profiles as stored
from tests.conftest import Jobwarden, make_fifo, read_fifo
from tests.integration.test_web_browser import browser  # noqa: F401 (the fixture: chromium, selenium)
from tests.support import unavailable

pytestmark = [pytest.mark.integration]
TARGETS = str(Path(__file__).parent / "jobs" / "profile_targets.py")
CONTRACT = {"id", "run", "duration_s", "rate_hz", "samples", "processes", "top"}


@pytest.fixture(autouse=True)
def _needs_py_spy() -> None:
    if pyspy.find_py_spy() is None:
        why = "needs py-spy (the dev extra installs it)"
        unavailable(why)


def start_target(jw: Jobwarden, tmp_path: Path, *target: str) -> dict[str, Any]:
    ready = make_fifo(tmp_path / "ready")
    job = jw.start(sys.executable, TARGETS, target[0], str(ready), *target[1:])
    read_fifo(ready, timeout_s=120)
    return job


def entry(top: list[dict[str, Any]], function: str) -> dict[str, Any]:
    found = [e for e in top if e["function"] == function]
    assert found, f"{function} not in {[e['function'] for e in top]}"
    return found[0]


def test_a_spinning_job_is_found_in_its_spinning_function(jw: Jobwarden, tmp_path: Path) -> None:
    job = start_target(jw, tmp_path, "spin")
    try:
        done = jw("profile", str(job["id"]), "--duration", "2s")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith(f"job {job['id']} run 1: ") and "2s at " in lines[0]
        burn = next(ln for ln in lines if "burn_cpu" in ln)
        assert float(burn.split("%")[0]) >= 50.0  # most of the samples
        assert f"({TARGETS}:" in burn
        summary = jw.json("explain", str(job["id"]))["profile"]
        assert summary["hot"][0]["function"] == "burn_cpu"
    finally:
        jw("stop", str(job["id"]))
    folder = jw.home / "jobs" / str(job["id"]) / "run-1" / "profiles"
    files = sorted(p.name for p in folder.iterdir())
    assert len(files) == 2 and files[1].endswith("-cli.speedscope.json")
    for name in files:
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
    explained = jw("explain", str(job["id"])).stdout
    assert "profile (cli, " in explained.splitlines()[-1] and "burn_cpu" in explained.splitlines()[-1]


def test_profile_json_follows_the_contract(jw: Jobwarden, tmp_path: Path) -> None:
    job = start_target(jw, tmp_path, "spin", "3")
    try:
        got = jw.json("profile", str(job["id"]), "--duration", "1s")
    finally:
        jw("stop", str(job["id"]))
    assert set(got) >= CONTRACT
    assert (got["id"], got["run"], got["duration_s"]) == (job["id"], 1, 1)
    assert 1 <= got["rate_hz"] <= 100 and got["samples"] > 0
    assert [p["pid"] for p in got["processes"]] == [job["pid"]]
    fractions = [e["fraction"] for e in got["top"]]
    assert fractions == sorted(fractions, reverse=True) and 0 < fractions[0] <= 1
    for e in got["top"]:
        assert set(e) == {"function", "file", "line", "fraction"}
    assert entry(got["top"], "burn_cpu")["fraction"] >= 0.5
    # idle threads (waiting on an Event) are not samples: the spinning one is nearly all of them
    assert not any(e["function"] == "Event.wait" and e["fraction"] > 0.2 for e in got["top"])


def test_a_dataloader_jobs_workers_are_profiled_in_getitem(jw: Jobwarden, tmp_path: Path) -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        unavailable("needs torch")
    job = start_target(jw, tmp_path, "dataloader")
    try:
        got = jw.json("profile", str(job["id"]), "--duration", "3s")
    finally:
        jw("stop", str(job["id"]))
    assert len(got["processes"]) == 3, got["processes"]  # the loop and its two workers
    getitem = entry(got["top"], "dataloader.<locals>.Burning.__getitem__")  # py-spy's qualified name
    assert getitem["file"] == TARGETS and getitem["fraction"] > 0.2
    assert entry(got["top"], "_worker_loop")["fraction"] >= getitem["fraction"]
    # in the workers, not in the main process: the stored samples say which process each came from
    with Store(jw.home) as store:
        raw = stored.newest(store.layout, job["id"], 1)
    assert raw is not None
    speedscope = json.loads(raw.speedscope_bytes() or b"{}")
    frames = speedscope["shared"]["frames"]
    in_getitem = {
        int(p["name"].split()[1])
        for p in speedscope["profiles"]
        if any(frames[i]["name"].endswith("Burning.__getitem__") for s in p["samples"] for i in s)
    }
    assert in_getitem and job["pid"] not in in_getitem
    assert len(in_getitem) == 2  # both workers


DSTATE_C = """
#include <unistd.h>
#include <sys/syscall.h>
int park_in_vfork(void) { pid_t p = vfork(); if (p == 0) { syscall(SYS_pause); _exit(0); } return p; }
"""


def test_a_thread_in_d_state_is_waiting_on_io_not_idle(jw: Jobwarden, tmp_path: Path) -> None:
    """py-spy calls a thread in D state idle and drops it; the profile counts it as waiting on I/O, with
    the kernel function it waits in, and reads the job without pausing it (a pause would hang on it)."""
    import shutil
    import subprocess

    gcc = shutil.which("gcc")
    if gcc is None:
        unavailable("needs gcc")
    (tmp_path / "dstate.c").write_text(DSTATE_C)
    library = tmp_path / "libdstate.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(library), str(tmp_path / "dstate.c")], check=True)
    job = start_target(jw, tmp_path, "dstate", str(library))
    try:
        got = jw.json("profile", str(job["id"]), "--duration", "2s")
    finally:
        jw("stop", str(job["id"]))
    io = entry(got["top"], "(waiting on I/O)")
    assert io["file"].startswith("kernel") and io["fraction"] >= 0.2, io
    assert got["io_wait_fraction"] == pytest.approx(io["fraction"], abs=0.01)
    assert entry(got["top"], "burn_cpu")["fraction"] >= 0.3  # the other thread went on running


def test_an_ended_job_is_a_clear_error(jw: Jobwarden) -> None:
    job = jw.start(sys.executable, "-c", "pass")
    jw("wait", str(job["id"]), check=True)
    done = jw("profile", str(job["id"]))
    assert done.returncode == 1
    assert done.stderr.startswith(f"jobwarden: job {job['id']} is succeeded: there is no process of it left")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_bad_options_and_a_missing_py_spy_are_one_clear_line(jw: Jobwarden, tmp_path: Path) -> None:
    for args, says in (
        (("--duration", "ten"), "--duration: bad duration 'ten'"),
        (("--duration", "1h"), "--duration: '1h' is longer than"),
        (("--rate", "0"), "--rate: 0 is not within 1..100 Hz"),
        (("--rate", "fast"), "--rate: bad rate 'fast'"),
    ):
        done = jw("profile", "1", *args)
        assert done.returncode == 2 and done.stderr.startswith(f"jobwarden: {says}"), done.stderr
    job = start_target(jw, tmp_path, "spin")
    try:
        jw.env["JOBWARDEN_PY_SPY"] = str(tmp_path / "no-py-spy")
        done = jw("profile", str(job["id"]), "--duration", "1s")
        assert done.returncode == 1
        assert done.stderr.startswith("jobwarden: py-spy not found at ") and "Traceback" not in done.stderr
    finally:
        del jw.env["JOBWARDEN_PY_SPY"]
        jw("stop", str(job["id"]))


def test_a_job_without_python_is_a_clear_error(jw: Jobwarden, tmp_path: Path) -> None:
    ready = make_fifo(tmp_path / "ready")
    job = jw.start("sh", "-c", f'echo up > "{ready}"; exec sleep 600')
    read_fifo(ready)
    try:
        done = jw("profile", str(job["id"]), "--duration", "1s")
    finally:
        jw("stop", str(job["id"]))
    assert done.returncode == 1, done.stderr
    assert f"jobwarden: job {job['id']} runs no Python process" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_api_serves_the_newest_profile_with_the_token_only(jw: Jobwarden, tmp_path: Path) -> None:
    from tests.integration.webtools import Client, web_server

    job = start_target(jw, tmp_path, "spin")
    try:
        with web_server(jw.home) as served:
            client = Client(served)
            path = f"/api/v1/jobs/{job['id']}/profile"
            none = client.get(path)  # the job page asks every few seconds: none yet is no error
            assert none.status == 200 and none.json() is None
            missing = client.get(f"{path}?format=speedscope")
            assert missing.status == 404
            assert missing.json()["error"] == f"job {job['id']} run 1 has no profile"
            jw("profile", str(job["id"]), "--duration", "1s", check=True)
            assert client.request("GET", path).status == 401
            assert client.request("GET", f"{path}?format=speedscope").status == 401
            summary = client.get(path)
            assert summary.status == 200 and set(summary.json()) >= CONTRACT
            assert entry(summary.json()["top"], "burn_cpu")["fraction"] >= 0.5
            speedscope = client.get(f"{path}?format=speedscope")
            assert speedscope.status == 200 and speedscope.headers["Content-Type"] == "application/json"
            data = speedscope.json()
            assert data["$schema"].startswith("https://www.speedscope.app/")
            assert any(f["name"] == "burn_cpu" for f in data["shared"]["frames"])
            assert client.get(f"{path}?format=svg").status == 400
    finally:
        jw("stop", str(job["id"]))


def test_a_speed_finding_takes_one_profile_in_a_child(jw: Jobwarden, tmp_path: Path) -> None:
    """The shim's path: LiveFindings records a new finding, its listener (the AutoProfiler the shim
    attaches) starts `jobwarden profile --trigger auto` as a child; a second finding within the interval
    starts none."""
    job = start_target(jw, tmp_path, "spin")
    logged: list[str] = []
    with Store(jw.home) as store:
        live = LiveFindings(store, lambda method, *args: method(job["id"], 1, *args) or True)
        auto = AutoProfiler(jw.home, job["id"], 1, time.monotonic, logged.append)
        live.listeners.append(auto.on_findings)
        try:
            live.record([Finding("no-progress", "hung", "quiet", "error")], time.time())
            assert auto.child is None  # not a speed rule
            live.record([Finding("cpu-throttled", "throttled", "quota", "warning")], time.time())
            assert auto.child is not None and auto.helper_pids() == {auto.child[0]}
            child_fd = auto.child[1]
            live.record([Finding("gil-bound", "GIL", "two threads", "warning")], time.time())
            assert auto.taken == 1  # one at a time, at most one per interval
            os.waitid(os.P_PIDFD, child_fd, os.WEXITED | os.WNOWAIT)  # the child's end, no sleeping
            auto.poll()
            assert auto.child is None
            assert auto.start("slowed-down") is False  # still within the interval
        finally:
            auto.close()
            jw("stop", str(job["id"]))
        found = stored.listed(store.layout, job["id"], 1)
    assert [p.trigger for p in found] == ["auto"], logged
    summary = found[0].summary()
    assert summary is not None and summary["duration_s"] == 5
    assert entry(summary["top"], "burn_cpu")["fraction"] >= 0.5


SHOTS = Path("/tmp/shots-profile")


@pytest.mark.browser
def test_the_job_page_draws_the_flame_graph(jw: Jobwarden, tmp_path: Path, browser: Any) -> None:  # noqa: F811
    from selenium.webdriver.common.by import By

    from tests.integration.test_web_browser import wait_until
    from tests.integration.webtools import web_server

    driver = browser
    job = start_target(jw, tmp_path, "dataloader")
    try:
        jw("profile", str(job["id"]), "--duration", "3s", check=True)
        with web_server(jw.home) as served:
            driver.get(served.url.replace("/?token=", f"/jobs/{job['id']}?token="))
            frame = '#flame svg g.frame[data-function="dataloader.<locals>.Burning.__getitem__"]'
            wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, frame), "__getitem__ drawn")
            drawn = driver.find_elements(By.CSS_SELECTOR, "#flame svg g.frame")
            names = {g.get_attribute("data-function") for g in drawn}
            assert "_worker_loop" in names and any(n.startswith("pid ") for n in names)
            # a box in each worker (more where a worker's samples reach it by two paths, e.g. through a
            # comprehension's frame): together they hold a good part of the samples
            boxes = driver.find_elements(By.CSS_SELECTOR, frame)
            assert len(boxes) >= 2
            share = sum(float(b.get_attribute("data-share")) for b in boxes)
            assert 0.2 < share <= 1.0
            labels = " ".join(t.text for t in driver.find_elements(By.CSS_SELECTOR, "#flame svg text"))
            assert "_worker_loop" in labels  # wide enough to be labelled
            caption = driver.find_element(By.CSS_SELECTOR, "#flame p").text
            assert "samples of 3 process(es)" in caption
            assert re.search(r"jobwarden profile, \d{4}-\d\d-\d\d \d\d:\d\d:\d\d: ", caption), caption
            SHOTS.mkdir(parents=True, exist_ok=True)
            driver.find_element(By.CSS_SELECTOR, "#flame").location_once_scrolled_into_view  # noqa: B018
            driver.save_screenshot(str(SHOTS / "job-page-flame.png"))
            driver.find_element(By.CSS_SELECTOR, frame).click()  # zoom into the frame
            wait_until(
                driver,
                lambda d: (
                    float(d.find_element(By.CSS_SELECTOR, "#flame svg g.frame").get_attribute("data-share"))
                    < 0.999
                ),
                "zoomed into __getitem__",
            )
            driver.save_screenshot(str(SHOTS / "job-page-flame-zoomed.png"))
    finally:
        jw("stop", str(job["id"]))


def test_the_shim_wires_its_findings_to_the_automatic_profile(tmp_path: Path) -> None:
    """In the supervisor itself: a speed finding recorded by its diagnosis starts the profile's child,
    which the tree counts among the shim's helpers, never among the job's processes."""
    from jobwarden.shim.watch.diagnosis import Diagnoser
    from tests.unit.test_supervisor_loop import Rig

    rig = Rig(tmp_path)
    rig.fake.diagnoser = lambda store, job, run, procfs, tree, window, now, claimed: Diagnoser(  # type: ignore[method-assign]
        store, job, run, procfs, tree, window, now
    )
    try:
        rig.sup.starting._start_diagnosis(None)
        rig.sup.state.diag.live.record(
            [Finding("io-bound", "waits on storage", "D state", "warning")], time.time()
        )
        auto = rig.sup.state.autoprofile
        assert auto.taken == 1 and auto.child is not None
        assert auto.child[0] in rig.sup.state.tree.helpers()
        # no process of the job runs (a fake OS): the child says so and ends by itself
        os.waitid(os.P_PIDFD, auto.child[1], os.WEXITED | os.WNOWAIT)
    finally:
        rig.sup.close()
        rig.store.close()
    assert rig.sup.state.autoprofile.child is None
