"""`jobwarden top`, driven for real: textual's Pilot against a real store with real jobs, then one run in a
real terminal (tmux). Job-provided text must show verbatim, never read as markup."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CLONE, Jobwarden, make_fifo, read_fifo, venv_pip, wait_pid_gone
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration

MARKUP_NAME = "[bold]x[/bold]"  # as a name: rich would render a bold "x"
MARKUP_LINE = "step 1 [oom-kill] [bold]x[/bold]"  # as a log line: rich would drop "[oom-kill]"
# prints its line, reports its pid, then blocks on a FIFO nobody writes: runs until stopped
RUNNING = (
    "import os, sys\n"
    f"print({MARKUP_LINE!r}, flush=True)\n"
    "open(sys.argv[1], 'w').write(f'{os.getpid()}\\n')\n"
    "open(sys.argv[2]).read()\n"
)
DEADLINE_S = 60.0


def start_running(jw: Jobwarden, tmp: Path) -> int:
    ready, never = make_fifo(tmp / "ready"), make_fifo(tmp / "never")
    job = jw.start(sys.executable, "-c", RUNNING, str(ready), str(never), options=("--name", MARKUP_NAME))
    read_fifo(ready)
    return int(job["id"])


def start_failed(jw: Jobwarden) -> tuple[int, dict[str, Any]]:
    """A job that fails with a finding; returns its id and `explain --json`'s root cause."""
    job = jw.start(sys.executable, "-c", "raise ValueError('[red]boom[/red]')", options=("--name", "bad"))
    assert jw("wait", str(job["id"])).returncode == 1
    findings = jw.json("explain", str(job["id"]))["findings"]
    assert findings, "the failed job has no finding to show"
    return int(job["id"]), findings[0]


# --- textual's Pilot ---------------------------------------------------------------------------------


def screen_text(app: Any) -> str:
    """What the terminal would show now: the composed screen, one line per row."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def until(pilot: Any, what: str, predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S}s: {what}\n{screen_text(pilot.app)}")
        await pilot.pause(0.05)


def shows(app: Any, *texts: str) -> Callable[[], bool]:
    return lambda: all(t in screen_text(app) for t in texts)


def top_app(jw: Jobwarden, **options: Any) -> Any:
    from jobwarden.tui.app import TopApp

    settings = {"interval": 0.5, "include_ended": True, "read_only": False, **options}
    return TopApp(jw.home, **settings)


def test_top_lists_jobs_explains_and_stops(jw: Jobwarden, tmp_path: Path) -> None:
    running = start_running(jw, tmp_path)
    failed, root = start_failed(jw)
    app = top_app(jw)

    async def drive() -> None:
        async with app.run_test(size=(120, 30)) as pilot:
            # the table, and the first job's detail: its log line shown verbatim
            table = shows(app, f" {running}   {MARKUP_NAME}  running", f" {failed}   bad", "failed (1)")
            await until(pilot, "the table", table)
            detail = shows(app, f"job {running} {MARKUP_NAME} — running", MARKUP_LINE, "1 process(es) alive")
            await until(pilot, "the running job's detail and log tail", detail)
            # the failed job's detail: its root cause, rule id verbatim with its brackets
            await pilot.press("down")
            await until(pilot, "the failed job's detail", shows(app, f"job {failed} bad — failed"))
            await until(pilot, "the root cause", shows(app, f"[{root['rule']}] {root['title']}"))
            await pilot.press("e")
            await until(pilot, "explain", shows(app, f"explain {failed}", "root cause:", root["title"]))
            await pilot.press("q")
            await until(pilot, "back to the list", shows(app, "ID  NAME"))
            await pilot.press("d")  # nothing left to dump of an ended job: dump says so
            await until(pilot, "dump", shows(app, f"dump {failed}", "no process of it is left"))
            await pilot.press("escape")
            await until(pilot, "back to the list", shows(app, "ID  NAME"))
            # stop the running job: a question naming it, then y
            await pilot.press("up")
            await until(pilot, "the running job selected", shows(app, f"job {running} {MARKUP_NAME}"))
            await pilot.press("s")
            await until(pilot, "the question", shows(app, f"Stop job {running} ({MARKUP_NAME})?"))
            await pilot.press("y")
            await until(pilot, "the stopped job", shows(app, "stopped (SIGTERM)"))

    asyncio.run(drive())
    assert jw.status(running)["state"] == "stopped"


def test_each_row_shows_its_verdict_and_a_wide_screen_its_title(jw: Jobwarden) -> None:
    failed, root = start_failed(jw)

    def row(app: Any) -> str:
        lines = screen_text(app).splitlines()
        return next((line for line in lines if line.startswith(f" {failed}   bad")), "")

    async def drive(width: int) -> str:
        app = top_app(jw)
        async with app.run_test(size=(width, 30)) as pilot:
            await until(pilot, "the verdict in the row", lambda: f"[{root['rule']}]" in row(app))
            return row(app)

    assert root["title"] not in asyncio.run(drive(120))
    assert f"[{root['rule']}] {root['title']}" in asyncio.run(drive(200))


def test_top_asks_before_stopping_and_no_keeps_the_job(jw: Jobwarden, tmp_path: Path) -> None:
    running = start_running(jw, tmp_path)
    app = top_app(jw, include_ended=False)

    async def drive() -> None:
        async with app.run_test(size=(120, 30)) as pilot:
            await until(pilot, "the job", shows(app, MARKUP_NAME))
            await pilot.press("s")
            await until(pilot, "the question", shows(app, f"Stop job {running}"))
            await pilot.press("n")
            await until(pilot, "the question gone", lambda: "Stop job" not in screen_text(app))

    asyncio.run(drive())
    assert jw.status(running)["state"] == "running"
    assert jw("stop", str(running)).returncode == 0


def test_read_only_has_no_stop_or_dump(jw: Jobwarden) -> None:
    failed, _ = start_failed(jw)
    app = top_app(jw, read_only=True)

    async def drive() -> None:
        async with app.run_test(size=(120, 30)) as pilot:
            await until(pilot, "the job and the keys", shows(app, f"job {failed} bad", "Explain", "Quit"))
            footer = next(line for line in screen_text(app).splitlines() if "Quit" in line)
            assert "Explain" in footer and "Stop" not in footer and "Dump" not in footer
            await pilot.press("s", "d")
            await pilot.pause(0.2)
            assert "Stop job" not in screen_text(app) and "dump" not in screen_text(app)
            await pilot.press("l")  # reading is allowed: the full log
            await until(pilot, "the log", shows(app, f"log of job {failed}", "ValueError: [red]boom[/red]"))
            await pilot.press("q", "a")  # back, then active jobs only: the failed one leaves the list
            await until(pilot, "active only", shows(app, "0 jobs (active; a: all)", "no jobs"))

    asyncio.run(drive())


def colours(app: Any) -> set[tuple[int, int, int]]:
    found = set()
    for strip in app.screen._compositor.render_strips():
        for segment in strip:
            style = segment.style
            for colour in (style.color, style.bgcolor) if style else ():
                if colour is not None:
                    found.add(colour.get_truecolor())
    return found


def test_no_color_makes_the_screen_monochrome(jw: Jobwarden, monkeypatch: pytest.MonkeyPatch) -> None:
    start_failed(jw)
    monkeypatch.delenv("NO_COLOR", raising=False)

    async def palette() -> set[tuple[int, int, int]]:
        app = top_app(jw)
        async with app.run_test(size=(120, 30)) as pilot:
            await until(pilot, "the job", shows(app, "failed (1)"))
            return colours(app)

    coloured = asyncio.run(palette())
    assert any(len(set(c)) > 1 for c in coloured)  # a real colour: not only greys
    monkeypatch.setenv("NO_COLOR", "1")
    plain = asyncio.run(palette())
    assert plain and all(r == g == b for r, g, b in plain)


def test_a_store_that_cannot_be_read_is_said_on_screen(jw: Jobwarden) -> None:
    jw.home.mkdir(parents=True)
    (jw.home / "jobwarden.db").write_bytes(b"this is not sqlite" * 100)
    app = top_app(jw)

    async def drive() -> None:
        async with app.run_test(size=(120, 30)) as pilot:
            await until(pilot, "the error", shows(app, "jobwarden top: ", "corrupt"))
            await pilot.press("q")

    asyncio.run(drive())


# --- the command ---------------------------------------------------------------------------------------


def test_without_textual_top_says_how_to_install_it(jw: Jobwarden, tmp_path: Path) -> None:
    broken = tmp_path / "no-textual"
    (broken / "textual").mkdir(parents=True)
    (broken / "textual" / "__init__.py").write_text("raise ImportError('textual is not installed')\n")
    jw.env["PYTHONPATH"] = str(broken)
    result = jw("top", cwd=CLONE)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "jobwarden: jobwarden top needs the textual library, which is not installed",
        f"  {venv_pip()} install -e '.[tui]'",  # this clone's own venv, not a pip from PATH nor the index
    ]


def test_top_without_a_terminal_prints_the_list_once(jw: Jobwarden) -> None:
    failed, _ = start_failed(jw)
    result = jw("top", "--all")
    assert result.returncode == 0
    assert result.stdout.splitlines()[0].split()[:3] == ["ID", "NAME", "STATE"]
    assert f"{failed}   bad" in result.stdout
    assert "not a terminal" in result.stderr


BAD_INTERVALS = [("soon", "bad duration 'soon'"), ("10ms", "'10ms' is too short")]


@pytest.mark.parametrize(("interval", "said"), BAD_INTERVALS)
def test_top_bad_interval_names_the_option(jw: Jobwarden, interval: str, said: str) -> None:
    result = jw("top", "--interval", interval)
    assert result.returncode == 2
    assert result.stderr.startswith(f"jobwarden: --interval: {said}")
    assert "Traceback" not in result.stderr


def test_run_never_imports_the_terminal_ui() -> None:
    code = (
        "import sys\n"
        "from jobwarden.cli import main\n"
        "import jobwarden.cli.commands.run, jobwarden.cli.commands.top\n"
        "import jobwarden.control.launch\n"
        "main.build_parser('run'); main.build_parser()\n"
        "loaded = [m for m in ('textual', 'rich', 'jobwarden.tui') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# --- a real terminal -----------------------------------------------------------------------------------


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[list[str]]:
    if shutil.which("tmux") is None:
        unavailable("tmux is not installed (scripts/test installs it)")
    command = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    yield command
    subprocess.run([*command, "kill-server"], capture_output=True, timeout=30)


def capture(tmux: list[str]) -> str:
    return subprocess.run(
        [*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=30
    ).stdout


def capture_value(tmux: list[str], variable: str) -> str:
    return subprocess.run(
        [*tmux, "display-message", "-p", "-t", "top", variable], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def wait_for_screen(tmux: list[str], *texts: str) -> str:
    def showing() -> str | None:
        screen = capture(tmux)
        return screen if all(t in screen for t in texts) else None

    return eventually(f"the terminal showing {texts}", showing, DEADLINE_S, every_s=0.05)


def test_top_in_a_real_terminal(jw: Jobwarden, tmp_path: Path, tmux: list[str]) -> None:
    running = start_running(jw, tmp_path)
    env = {**jw.env, "TERM": "xterm-256color"}
    env.pop("NO_COLOR")
    top = f"{sys.executable} -m jobwarden top --interval 1"
    session = [*tmux, "new-session", "-d", "-s", "top", "-x", "120", "-y", "30", top]
    subprocess.run(session, env=env, check=True, timeout=30)
    top_pid = int(capture_value(tmux, "#{pane_pid}"))
    screen = wait_for_screen(tmux, MARKUP_NAME, "running", MARKUP_LINE)
    (tmp_path / "top.txt").write_text(screen)
    assert f"job {running} {MARKUP_NAME} — running" in screen
    subprocess.run([*tmux, "send-keys", "-t", "top", "s"], check=True, timeout=30)
    wait_for_screen(tmux, f"Stop job {running} ({MARKUP_NAME})?")
    subprocess.run([*tmux, "send-keys", "-t", "top", "y"], check=True, timeout=30)
    wait_for_screen(tmux, "no jobs")  # active jobs only: the stopped job leaves the list
    assert jw.status(running)["state"] == "stopped"
    subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True, timeout=30)
    wait_pid_gone(top_pid)  # q quits


def test_the_detail_shows_a_line_per_rank(jw: Jobwarden) -> None:
    # DESIGN.md "Ranks": top shows each rank, never only the job's averages
    from tests.integration.test_speed_ranks import ranks_of, start_ranks

    job = start_ranks(jw, "balanced")
    try:
        rows = eventually("both ranks in status", lambda: r if len(r := ranks_of(jw, job)) == 2 else None)
        app = top_app(jw)

        async def drive() -> None:
            async with app.run_test(size=(140, 40)) as pilot:
                lines = [f"rank {r['rank']}  pid {r['pid']}  step" for r in rows]
                await until(pilot, "a line per rank in the detail", shows(app, f"job {job} ", *lines))

        asyncio.run(drive())
    finally:
        jw("stop", str(job), check=True)
