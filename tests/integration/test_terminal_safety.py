"""No byte a job wrote reaches a user's terminal raw (issue 20, item 3): its output, name, command line, cwd,
exception text, stack frames' file names and group records carry OSC 52 (clipboard), a window title and
screen clears, and every frontend shows them without a single escape: `ps`, `status`, `explain`, `explain
--group`, `dump`, `logs` (colours kept in a terminal, byte-exact into a pipe), `metrics`, `orphans`, error
messages and `top` in a real terminal."""

from __future__ import annotations

import os
import pty
import select
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    CLI_TIMEOUT_S,
    Jobwarden,
    kill_shim,
    make_fifo,
    read_fifo,
    wait_pid_gone,
    write_fifo,
)
from tests.support import eventually, unavailable

pytestmark = pytest.mark.integration

# the clipboard (its payload "HELLO" in base64), the window title, a screen clear three ways (CSI, the C1
# CSI as a character, a terminal reset); SGR colours are the only escapes a terminal view may keep
CLIPBOARD, TITLE = "SEVMTE8=", "PWNED-TITLE"
HOSTILE = f"\x1b]52;c;{CLIPBOARD}\x07\x1b]0;{TITLE}\x1b\\\x1b[2J\x9b3J\x1bc"
RED = "\x1b[31mred\x1b[0m"
# prints the hostile text and a coloured word, says it is ready, waits, then dies of an exception whose
# message carries the hostile text again
SCRIPT = """
import sys
print("out:" + sys.argv[3] + " {red}", flush=True)
open(sys.argv[1], "w").write("ready\\n")
open(sys.argv[2]).read()
raise ValueError("boom " + sys.argv[3])
""".replace("{red}", RED)


def assert_clean(text: str, where: str, colours: bool = False, quoted: bool = False) -> None:
    """Nothing that drives a terminal: no escape, no C1 control, no BEL, no payload of a sequence (unless
    `quoted`: a reference quoted with its escapes spelt out, as repr() does, shows the payload as text)."""
    kept = text.replace("\x1b[31m", "").replace("\x1b[0m", "") if colours else text
    for bad in ("\x1b", "\x9b", "\x9d", "\x07", *(() if quoted else (CLIPBOARD, TITLE))):
        assert bad not in kept, f"{where}: {bad!r} came through:\n{text!r}"


class Hostile:
    def __init__(self, jw: Jobwarden, tmp: Path) -> None:
        # a script whose file name is hostile: every stack frame names it
        self.folder = tmp / f"cwd{HOSTILE}"
        self.folder.mkdir()
        script = self.folder / f"train{HOSTILE}.py"
        script.write_text(SCRIPT)
        self.ready, self.go = make_fifo(tmp / "ready"), make_fifo(tmp / "go")
        argument = f"line one\nline two {HOSTILE}"  # a multi-line command line
        job = jw.start(
            sys.executable,
            str(script),
            str(self.ready),
            str(self.go),
            argument,
            options=("--cwd", str(self.folder)),
        )
        self.id = str(job["id"])
        read_fifo(self.ready)
        # a name as an older store (or another tool writing the database) may hold it: `run` refuses one
        with sqlite3.connect(jw.home / "jobwarden.db") as db:
            db.execute("UPDATE jobs SET name = ? WHERE id = ?", (f"name{HOSTILE}", int(self.id)))
        db.close()

    def end(self, jw: Jobwarden) -> None:
        write_fifo(self.go)
        assert jw("wait", self.id).returncode == 1


@pytest.fixture
def hostile(jw: Jobwarden, tmp_path: Path) -> Iterator[Hostile]:
    job = Hostile(jw, tmp_path)
    yield job
    with_go = jw.status(job.id)["state"] == "running"
    if with_go:
        job.end(jw)


def clean_output(jw: Jobwarden, *args: str) -> str:
    result = jw(*args)
    assert result.returncode in (0, 1), f"{args}: {result.stderr}"
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        assert_clean(text, f"jobwarden {' '.join(args)} ({name})")
    return result.stdout


def test_the_cli_shows_a_hostile_job_without_escapes(jw: Jobwarden, hostile: Hostile) -> None:
    jw.env["COLUMNS"] = "1000"  # the whole command line
    listed = clean_output(jw, "ps")
    assert "line one line two" in listed  # a multi-line command on one line
    status = clean_output(jw, "status", hostile.id)
    assert "command      " in status and "line one line two" in status and "cwd          " in status
    assert "name" in status.splitlines()[0]
    dumped = clean_output(jw, "dump", hostile.id)
    assert "train" in dumped and ".py" in dumped  # the frames' file, named without its escapes
    clean_output(jw, "metrics", hostile.id)
    clean_output(jw, "explain", hostile.id)
    hostile.end(jw)
    explained = clean_output(jw, "explain", hostile.id)
    assert "ValueError" in explained and "boom" in explained
    clean_output(jw, "status", hostile.id)
    clean_output(jw, "ps", "--all")
    assert jw("logs", f"name{HOSTILE}").stdout == jw.output(hostile.id)  # by its name; a pipe: byte-exact
    missing = jw("status", f"missing{HOSTILE}")
    assert missing.returncode == 1 and "no job" in missing.stderr
    assert_clean(missing.stderr, "an error message quoting a job reference", quoted=True)


def test_logs_keep_the_jobs_bytes_in_a_pipe_and_only_colours_in_a_terminal(
    jw: Jobwarden, hostile: Hostile
) -> None:
    hostile.end(jw)
    exact = jw.output(hostile.id)
    piped = subprocess.run(
        [sys.executable, "-m", "jobwarden", "logs", hostile.id],
        env=jw.env,
        capture_output=True,
        timeout=CLI_TIMEOUT_S,
    )
    assert piped.stdout.decode() == exact  # a pipe gets every byte: `logs > file` is the job's output
    env = {**jw.env}
    env.pop("NO_COLOR")
    for args in (
        ("logs", hostile.id),
        ("logs", "-n", "50", hostile.id),
        ("logs", "--since", "1d", hostile.id),
    ):
        shown = in_a_terminal(env, *args)
        assert_clean(shown, f"jobwarden {' '.join(args)} in a terminal", colours=True)
        assert RED in shown and "boom" in shown


def in_a_terminal(env: dict[str, str], *args: str) -> str:
    """The CLI's output with a pseudo-terminal as its stdout (what a user's terminal receives)."""
    main, sub = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobwarden", *args], env=env, stdin=subprocess.DEVNULL, stdout=sub, stderr=sub
    )
    os.close(sub)
    data = b""
    deadline = time.monotonic() + CLI_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if not select.select([main], [], [], deadline - time.monotonic())[0]:
                break
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(main)
        proc.wait(timeout=CLI_TIMEOUT_S)
    return data.decode("utf-8", "replace")


def test_orphans_lists_and_ends_a_hostile_command_without_escapes(jw: Jobwarden, hostile: Hostile) -> None:
    jw.env["COLUMNS"] = "1000"
    pid = jw.status(hostile.id)["pid"]
    kill_shim(jw, int(hostile.id))  # the job runs on unsupervised: `orphans` lists its processes
    listed = clean_output(jw, "orphans")
    assert str(pid) in listed and "line one line two" in listed
    ended = clean_output(jw, "orphans", "--kill", "--grace", "5s")
    assert str(pid) in ended
    wait_pid_gone(pid)


def test_explain_group_shows_a_hostile_exception_without_escapes(jw: Jobwarden, tmp_path: Path) -> None:
    group = ["--engine", "none", "--group", "G", "--group-dir", str(tmp_path / "shared"), "--rank", "0"]
    code = f"print({HOSTILE!r}, flush=True)\nraise ValueError({HOSTILE!r})"
    assert jw("run", "--wait", *group, "--", sys.executable, "-c", code).returncode == 1
    shown = clean_output(jw, "explain", "--group", "G", "--group-dir", str(tmp_path / "shared"))
    assert "rank 0" in shown and "ValueError" in shown


# --- top, in a real terminal -------------------------------------------------------------------------


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[list[str]]:
    if subprocess.run(["which", "tmux"], capture_output=True).returncode != 0:
        unavailable("tmux is not installed (scripts/test installs it)")
    command = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    yield command
    listed = [*command, "list-panes", "-a", "-F", "#{pid} #{pane_pid}"]
    pids = subprocess.run(listed, capture_output=True, text=True, timeout=30).stdout.split()
    subprocess.run([*command, "kill-server"], capture_output=True, timeout=30)
    for pid in pids:
        wait_pid_gone(int(pid))


def _screen(tmux: list[str], *texts: str) -> str:
    def showing() -> str | None:
        screen = subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "top"], capture_output=True, text=True, timeout=30
        ).stdout
        return screen if all(t in screen for t in texts) else None

    return eventually(f"the terminal showing {texts}", showing, 60, every_s=0.05)


def test_top_shows_a_hostile_job_without_escapes(
    jw: Jobwarden, hostile: Hostile, tmux: list[str], tmp_path: Path
) -> None:
    env = {**jw.env, "TERM": "xterm-256color"}
    raw = tmp_path / "raw-output"
    top = f"{sys.executable} -m jobwarden top --all --interval 1"
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "top", "-x", "160", "-y", "40", "sleep 600"], env=env, check=True
    )
    subprocess.run([*tmux, "set-option", "-g", "set-clipboard", "on"], check=True, timeout=30)
    # every byte top writes to its terminal, as the terminal receives it
    subprocess.run([*tmux, "pipe-pane", "-t", "top", "-O", f"cat > {raw}"], check=True, timeout=30)
    subprocess.run([*tmux, "respawn-pane", "-k", "-t", "top", top], env=env, check=True, timeout=30)
    title_before = _value(tmux, "#{pane_title}")
    _screen(tmux, "name — running", "out:line one", "line two  red")  # the detail pane, its log tail
    subprocess.run([*tmux, "send-keys", "-t", "top", "l"], check=True, timeout=30)
    _screen(tmux, "log of job", "red")  # the log view
    subprocess.run([*tmux, "send-keys", "-t", "top", "q", "e"], check=True, timeout=30)
    _screen(tmux, f"explain {hostile.id}")
    subprocess.run([*tmux, "send-keys", "-t", "top", "q"], check=True, timeout=30)
    hostile.end(jw)
    _screen(tmux, "ValueError")  # the detail pane's root cause: the exception
    subprocess.run([*tmux, "send-keys", "-t", "top", "e"], check=True, timeout=30)
    _screen(tmux, "root cause", "boom")
    subprocess.run([*tmux, "send-keys", "-t", "top", "q", "q"], check=True, timeout=30)
    output = raw.read_bytes().decode("utf-8", "replace")
    assert output, "nothing captured"
    for payload in (CLIPBOARD, TITLE, "\x1bc", "\x9b3J", "\x1b]52", "\x1b]0;"):
        assert payload not in output, f"top wrote {payload!r} to the terminal"
    assert _value(tmux, "#{pane_title}") == title_before
    buffers = subprocess.run([*tmux, "list-buffers"], capture_output=True, text=True, timeout=30).stdout
    assert buffers == "", f"the clipboard was written: {buffers}"


def _value(tmux: list[str], variable: str) -> str:
    return subprocess.run(
        [*tmux, "display-message", "-p", "-t", "top", variable], capture_output=True, text=True, timeout=30
    ).stdout.strip()
