"""`jobwarden dump JOB [--json]` end to end: a real job, the real CLI, the real py-spy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import Jobwarden, make_fifo, read_fifo, start_time

pytestmark = pytest.mark.integration  # py-spy is a dependency: missing, these tests fail
TARGETS = str(Path(__file__).parent / "jobs" / "stack_targets.py")


def start_threads_job(jw: Jobwarden, tmp_path: Path, *options: str) -> tuple[int, int, int]:
    """A job whose main process runs three threads and has a Python child: (job id, main pid, child pid)."""
    report, control = make_fifo(tmp_path / "report"), make_fifo(tmp_path / "control")
    command = (sys.executable, TARGETS, "threads", str(report), str(control))
    job = jw.start(*command, options=("--name", "threads", *options))
    pids = dict(item.split("=") for item in read_fifo(report).split())
    assert int(pids["main"]) == job["pid"]
    return job["id"], int(pids["main"]), int(pids["child"])


def test_dump_text_and_json(jw: Jobwarden, tmp_path: Path) -> None:
    job, main, child = start_threads_job(jw, tmp_path)
    text = jw("dump", str(job), check=True).stdout
    lines = text.splitlines()
    assert lines[0].startswith(f"job {job} (threads), run 1 — running: stacks of 2 process(es)")
    assert f"process {main}  " in text and f"process {child}  " in text
    assert text.count("captured with py-spy --native") == 2
    assert "thread" in text and '"sleeper"  [sleeping, idle]' in text
    # innermost first: the C sleep, then nap, in the thread's block
    sleeper = lines.index(next(ln for ln in lines if '"sleeper"' in ln))
    block = lines[sleeper + 1 : sleeper + 4]
    assert "[native]" in block[0] and any(ln.strip().startswith(f"nap  ({TARGETS}:") for ln in block)

    stacks = jw.json("dump", str(job))
    assert [s["pid"] for s in stacks] == [main, child]  # the main process first
    by_name = {t["name"]: t for t in stacks[0]["threads"]}
    assert {"MainThread", "sleeper", "waiter"} <= set(by_name)
    assert by_name["sleeper"]["state"] == "S"
    assert next(f["function"] for f in by_name["sleeper"]["frames"] if not f["native"]) == "nap"
    assert stacks[1]["method"] == "py-spy --native" and stacks[1]["error"] is None

    jw("stop", str(job), check=True)
    # ended: the last stored dump, said as such
    ended = jw("dump", str(job))
    assert ended.returncode == 0
    assert "has no live process (stopped" in ended.stdout and "by dump" in ended.stdout
    assert f"process {main}  " in ended.stdout
    stored = jw("dump", str(job), "--json")
    assert [s["pid"] for s in json.loads(stored.stdout)] == [main, child]
    assert "no live process" in stored.stderr


def test_dump_python_frames_only(jw: Jobwarden, tmp_path: Path) -> None:
    job, _, _ = start_threads_job(jw, tmp_path)
    stacks = jw.json("dump", str(job), "--no-native")
    assert {s["method"] for s in stacks} == {"py-spy"}
    assert not any(f["native"] for s in stacks for t in s["threads"] for f in t["frames"])
    jw("stop", str(job), check=True)


def test_dump_falls_back_to_faulthandler_without_py_spy(jw: Jobwarden, tmp_path: Path) -> None:
    """py-spy made unavailable: jobwarden's Python hook has advertised a faulthandler in every Python
    process of the job, and each is asked to write its own stacks."""
    jw.env["JOBWARDEN_PY_SPY"] = "/nonexistent/py-spy"
    job, main, child = start_threads_job(jw, tmp_path)
    stacks = {s["pid"]: s for s in jw.json("dump", str(job))}
    assert stacks[main]["method"] == stacks[child]["method"] == "faulthandler"
    assert "py-spy not found at /nonexistent/py-spy" in stacks[main]["error"]
    firsts = {t["frames"][0]["function"] for t in stacks[main]["threads"] if t["frames"]}
    assert {"nap", "serve"} <= firsts
    assert [t["frames"][0]["function"] for t in stacks[child]["threads"]] == ["child_main"]
    text = jw("dump", str(job), check=True).stdout
    assert "captured with faulthandler" in text and "note: py-spy not found" in text
    assert jw.status(job)["state"] == "running"  # each handled the signal; nobody died of it
    jw("stop", str(job), check=True)


def test_dump_never_signals_a_process_without_the_hook(jw: Jobwarden, tmp_path: Path) -> None:
    """--no-py-hooks: no advert, so no faulthandler signal (its default action would kill)."""
    jw.env["JOBWARDEN_PY_SPY"] = "/nonexistent/py-spy"
    jw.env["JOBWARDEN_GDB"] = "/nonexistent/gdb"
    job, main, child = start_threads_job(jw, tmp_path, "--no-py-hooks")
    stacks = jw.json("dump", str(job))
    assert [s["pid"] for s in stacks] == [main, child]
    for s in stacks:
        assert s["method"] == "none" and s["threads"] == []
        assert "py-spy not found" in s["error"] and "gdb is not installed" in s["error"]
    assert jw.status(job)["state"] == "running"
    assert start_time(main) is not None and start_time(child) is not None
    jw("stop", str(job), check=True)


def test_dump_of_an_ended_job_without_stacks(jw: Jobwarden) -> None:
    job = jw("run", "--wait", "--", "true", check=True).stdout.split()[0]
    result = jw("dump", job)
    assert result.returncode == 1
    assert f"job {job} is succeeded" in result.stderr and "no stacks were taken" in result.stderr
    assert "jobwarden explain" in result.stderr


def test_dump_bad_input(jw: Jobwarden) -> None:
    missing = jw("dump", "nosuchjob")
    assert missing.returncode == 1 and "no job 'nosuchjob'" in missing.stderr
    zero = jw("dump", "1", "--timeout", "0")
    assert zero.returncode == 2 and "bad duration '0'" in zero.stderr
