"""`top`'s views (issue 21) in a real terminal (tmux) at 80×24 and 200×50, and driven by textual's Pilot:
columns that fit, the selected job's processes with their roles, an explanation wrapped whole, a log
that shows a progress bar's last frame, sort and filter, q and Esc alike. Set JOBWARDEN_SHOTS=DIR to
keep each screen as text."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import Jobwarden, make_fifo, read_fifo, wait_pid_gone
from tests.integration.test_top import (
    capture_value,
    screen_text,
    shows,
    start_failed,
    tmux,
    top_app,
    until,
    wait_for_screen,
)

__all__ = ["tmux"]  # the fixture, used by name

# a main process with a rank 1 process and a plain worker under it, a progress bar redrawn with \r
FAMILY = """
import os, subprocess, sys
print("epoch 1:  50%|#####     |\\repoch 1: 100%|##########|", flush=True)
ready, never = sys.argv[1], sys.argv[2]
hold = [sys.executable, "-c", "import sys; open(sys.argv[1]).read()", never]
kids = [subprocess.Popen(hold, env={**os.environ, "RANK": "1"}), subprocess.Popen(hold)]
open(ready, "w").write(" ".join(str(k.pid) for k in kids) + "\\n")
open(never).read()
"""


def start_family(jw: Jobwarden, tmp: Path) -> tuple[int, int, int, int]:
    """The job's id, its main pid, its rank 1 pid and its worker pid."""
    ready, never = make_fifo(tmp / "ready"), make_fifo(tmp / "never")
    job = jw.start(sys.executable, "-c", FAMILY, str(ready), str(never), options=("--name", "family"))
    rank, worker = (int(p) for p in read_fifo(ready).split())
    return int(job["id"]), int(job["pid"]), rank, worker


def keep(name: str, screen: str) -> None:
    where = os.environ.get("JOBWARDEN_SHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"{name}.txt").write_text(screen)


def process_row(screen: str, pid: int) -> list[str]:
    for line in screen.splitlines():
        words = line.split()
        if words and words[0] == str(pid):
            return words
    return []


def run_top(jw: Jobwarden, tmux: list[str], width: int, height: int) -> int:
    env = {**jw.env, "TERM": "xterm-256color"}
    top = f"{sys.executable} -m jobwarden top --all --interval 1"
    session = [*tmux, "new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), top]
    subprocess.run(session, env=env, check=True, timeout=30)
    return int(capture_value(tmux, "#{pane_pid}"))


def keys(tmux: list[str], *pressed: str) -> None:
    subprocess.run([*tmux, "send-keys", "-t", "top", *pressed], check=True, timeout=30)


def test_top_at_80_by_24_fits_and_shows_the_processes_and_views(
    jw: Jobwarden, tmp_path: Path, tmux: list[str]
) -> None:
    failed, root = start_failed(jw)
    job_id, main, rank, worker = start_family(jw, tmp_path)
    try:
        top_pid = run_top(jw, tmux, 80, 24)
        # what runs comes first, so the family is selected: its three processes and their roles
        screen = wait_for_screen(tmux, f"job {job_id} family", "ROLE", f"{main} ", f"{rank} ", f"{worker} ")
        keep("top-80x24", screen)
        header = next(line for line in screen.splitlines() if " NAME " in line)
        assert header.split() == ["ID", "NAME", "STATE", "TIME", "CPU", "MEM", "PROG", "FINDING"]
        failed_row = next(line for line in screen.splitlines() if line.split()[:2] == [str(failed), "bad"])
        assert f"[{root['rule']}]" in failed_row  # the finding column is not cut off at 80
        assert process_row(screen, main)[1:3] == ["-", "main"]
        assert process_row(screen, rank)[1:3] == ["1", "rank"]
        assert process_row(screen, worker)[1:3] == ["-", "worker"]
        # the log view: the progress bar's last frame only
        keys(tmux, "l")
        screen = wait_for_screen(tmux, f"log of job {job_id}", "q/esc: back", "epoch 1: 100%")
        assert "50%" not in screen
        keys(tmux, "Escape")
        wait_for_screen(tmux, "ROLE")
        # the failed job's explanation, wrapped: its remedy read whole at 80 columns
        keys(tmux, "Down")
        wait_for_screen(tmux, f"job {failed} bad")
        keys(tmux, "e")
        screen = wait_for_screen(tmux, f"explain {failed}", "q/esc: back", "root cause:", root["title"])
        keep("top-80x24-explain", screen)
        flat = " ".join(screen.split())
        assert " ".join(root["remedy"].split()) in flat, (root["remedy"], screen)
        keys(tmux, "q")
        wait_for_screen(tmux, f"job {failed} bad", "no live process")  # back to the list
        keys(tmux, "q")
        wait_pid_gone(top_pid)
    finally:
        jw("stop", str(job_id))


def test_top_at_200_by_50_shows_every_column_and_titles(
    jw: Jobwarden, tmp_path: Path, tmux: list[str]
) -> None:
    failed, root = start_failed(jw)
    job_id, main, rank, worker = start_family(jw, tmp_path)
    try:
        top_pid = run_top(jw, tmux, 200, 50)
        wait_for_screen(tmux, "family", root["title"])  # the family runs: first, and selected
        screen = wait_for_screen(tmux, f"job {job_id} family", f"{main} ", f"{rank} ", f"{worker} ")
        keep("top-200x50", screen)
        header = next(line for line in screen.splitlines() if " NAME " in line)
        assert header.split() == [
            "ID", "NAME", "STATE", "RUN", "PID", "TIME", "CPU", "MEM", "GPU", "PROGRESS", "FINDING"
        ]  # fmt: skip
        assert "PID RANK ROLE CPU RSS GPU MEM COMMAND" in " ".join(screen.split())
        failed_row = next(line for line in screen.splitlines() if line.split()[:2] == [str(failed), "bad"])
        assert f"[{root['rule']}] {root['title']}" in failed_row  # room for the finding's title
        keys(tmux, "q")
        wait_pid_gone(top_pid)
    finally:
        jw("stop", str(job_id))


def test_top_sorts_and_filters_and_esc_clears_the_filter(jw: Jobwarden, tmp_path: Path) -> None:
    start_failed(jw)
    jw("run", "--wait", "--name", "good", "--", "true", check=True)
    app = top_app(jw)

    def listed(app: Any) -> list[str]:
        return [
            line.split()[1] for line in screen_text(app).splitlines() if line.split()[:1] in (["1"], ["2"])
        ]

    async def drive() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, "both jobs", shows(app, "bad", "good"))
            await pilot.press("slash", "b", "a", "d")
            await until(
                pilot, "the filter", lambda: "filter: bad" in screen_text(app) and listed(app) == ["bad"]
            )
            await pilot.press("enter")  # kept; the keys are the list's again
            await pilot.press("o")
            await until(pilot, "sorted by cpu", shows(app, "by cpu", "filter: bad"))
            await pilot.press("escape")
            await until(pilot, "the filter cleared", lambda: sorted(listed(app)) == ["bad", "good"])
            assert "filter:" not in screen_text(app)
            await pilot.press("question_mark")
            await until(pilot, "the help", shows(app, "help — q/esc: back", "/        filter"))
            await pilot.press("escape")
            await until(pilot, "back", shows(app, "ID  NAME"))

    asyncio.run(drive())


def test_top_all_lists_what_runs_first_then_the_newest(jw: Jobwarden, tmp_path: Path) -> None:
    ready, never = make_fifo(tmp_path / "ready"), make_fifo(tmp_path / "never")
    code = "import sys; open(sys.argv[1], 'w').write('up\\n'); open(sys.argv[2]).read()"
    live = jw.start(sys.executable, "-c", code, str(ready), str(never), options=("--name", "live"))
    read_fifo(ready)
    for name in ("older", "newer"):
        jw("run", "--wait", "--name", name, "--", "true", check=True)
    app = top_app(jw)

    def listed() -> list[str]:
        rows = [line.split() for line in screen_text(app).splitlines()]
        return [words[1] for words in rows if words[:1] in (["1"], ["2"], ["3"])]

    async def drive() -> None:
        async with app.run_test(size=(100, 24)) as pilot:
            await until(
                pilot, "the live job, then the newest ended", lambda: listed() == ["live", "newer", "older"]
            )

    try:
        asyncio.run(drive())
    finally:
        jw("stop", str(live["id"]))
