"""Stack capture logic: the parsers against captured tool output, and the choice of method against fake
/proc trees and a fake py-spy that records how it was called."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from jobwarden.observations import Frame
from jobwarden.osapi.procfs import ProcFS
from jobwarden.osapi.tool import run_tool
from jobwarden.probes import faultdump, gdb, pyspy
from jobwarden.probes.pyhooks import read_advert
from jobwarden.probes.stackbase import Failure, ptrace_denied_help, read_tasks
from jobwarden.probes.stacks import Tools, capture_stacks
from tests.unit.test_procfs import add_process, stat_line

# --- py-spy --------------------------------------------------------------------------------------------

# `py-spy dump --pid N --json --native` of a Python 3.11 process, two of its threads, trimmed.
CAPTURED_PY_SPY = [
    {
        "pid": 428,
        "thread_id": 140154241566400,
        "thread_name": "spinner",
        "os_thread_id": 470,
        "active": True,
        "owns_gil": True,
        "frames": [
            {
                "name": "spin",
                "filename": "/tmp/stk/t.py",
                "module": None,
                "short_filename": "t.py",
                "line": 8,
            },
            {
                "name": "thread_run",
                "filename": "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0",
                "module": "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0",
                "short_filename": "libpython3.11.so.1.0",
                "line": 0,
            },
        ],
        "process_info": None,
    },
    {
        "pid": 428,
        "thread_id": 140154249959104,
        "thread_name": None,
        "os_thread_id": 428,
        "active": False,
        "owns_gil": False,
        "frames": [
            {
                "name": "clock_nanosleep",
                "filename": "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "module": "/usr/lib/x86_64-linux-gnu/libc.so.6",
                "short_filename": "libc.so.6",
                "line": 0,
            },
            {
                "name": "<module>",
                "filename": "/tmp/stk/t.py",
                "module": None,
                "short_filename": "t.py",
                "line": 11,
            },
        ],
        "process_info": None,
    },
]


def test_py_spy_json_becomes_thread_stacks() -> None:
    spinner, main = pyspy.parse_dump(CAPTURED_PY_SPY, {470: "R", 428: "S"})
    assert (spinner.tid, spinner.name, spinner.state, spinner.active) == (470, "spinner", "R", True)
    assert spinner.frames == (
        Frame("spin", "/tmp/stk/t.py", 8, native=False),
        Frame("thread_run", "/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0", None, native=True),
    )
    assert (main.tid, main.name, main.state, main.active) == (428, None, "S", False)
    assert [f.native for f in main.frames] == [True, False]


@pytest.mark.parametrize(
    ("stderr", "kind", "says"),
    [
        ("Permission Denied: Try running again with elevated permissions by going 'sudo env ...'",
         Failure.DENIED, "permission"),
        ("Error: Failed to find python version from target process\n\nStack backtrace:\n   0: anyhow",
         Failure.NOT_PYTHON, "not a Python process"),
        ("Error: Failed to get process executable name. Check that the process is running.\n\nCaused by:\n"
         "    0: No such file or directory (os error 2)", Failure.GONE, "exited"),
        ("Error: Failed to get stack traces\n\nCaused by:\n    0: Failed to suspend process\n"
         "    1: unexpected waitpid result PtraceEvent(Pid(570), SIGTTIN, 128) to 570",
         Failure.FAILED, "stopped by SIGTTIN"),
        ("Error: something new\nCaused by:\n  detail", Failure.FAILED, "something new"),
    ],
)  # fmt: skip
def test_py_spy_errors_are_classified(stderr: str, kind: Failure, says: str) -> None:
    err = pyspy.classify_error(stderr)
    assert err.kind == kind
    assert says in err.message
    assert "\n" not in err.message


def test_py_spy_is_found_beside_the_interpreter_first(tmp_path: Path) -> None:
    assert pyspy.find_py_spy({"PATH": ""}) == Path(sys.executable).parent / "py-spy"
    tool = tmp_path / "py-spy"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert pyspy.find_py_spy({pyspy.PY_SPY_ENV: str(tool)}) == tool
    assert pyspy.find_py_spy({pyspy.PY_SPY_ENV: str(tmp_path / "missing")}) is None
    assert "unset it" in pyspy.missing_message({pyspy.PY_SPY_ENV: "/x"})
    assert "pip install py-spy" in pyspy.missing_message({})


# --- faulthandler --------------------------------------------------------------------------------------

# faulthandler.register(SIGUSR2, all_threads=True) output, captured from CPython 3.8 and 3.13.
CAPTURED_FAULTHANDLER_38 = """\
Thread 0x00007f238d3506c0 (most recent call first):
  File "/root/.pyenv/versions/3.8.18/lib/python3.8/threading.py", line 302 in wait
  File "fh.py", line 7 in <lambda>

Thread 0x00007f238db516c0 (most recent call first):
  File "fh.py", line 5 in worker

Current thread 0x00007f238e410b80 (most recent call first):
  File "fh.py", line 8 in <module>
"""
CAPTURED_FAULTHANDLER_313 = """\
Thread 0x00007f85becdb6c0 (most recent call first):
  File "/root/.pyenv/versions/3.13.0/lib/python3.13/threading.py", line 359 in wait
  File "/tmp/stk/fh.py", line 7 in <lambda>

Current thread 0x00007f85c0074b80 (most recent call first):
  File "/tmp/stk/fh.py", line 8 in <module>
"""


def test_faulthandler_text_becomes_thread_stacks() -> None:
    waiter, worker, current = faultdump.parse_faulthandler(CAPTURED_FAULTHANDLER_38)
    assert (waiter.tid, waiter.name) == (None, "0x00007f238d3506c0")
    assert waiter.frames == (
        Frame("wait", "/root/.pyenv/versions/3.8.18/lib/python3.8/threading.py", 302),
        Frame("<lambda>", "fh.py", 7),
    )
    assert worker.frames == (Frame("worker", "fh.py", 5),)
    assert current.frames == (Frame("<module>", "fh.py", 8),)
    assert len(faultdump.parse_faulthandler(CAPTURED_FAULTHANDLER_313)) == 2


def test_faulthandler_odd_lines_and_a_second_dump() -> None:
    text = (
        "Thread 0x00007f0000000001 [worker-1] (most recent call first):\n"
        '  File "x.py", line ??? in f\n'
        "  ...\n"
        "\n"
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        "  <no Python frame>\n"
        "\n" + CAPTURED_FAULTHANDLER_38.replace("0x00007f238d3506c0", "0x00007f0000000001")
    )
    named, bare = faultdump.parse_faulthandler(text)  # the second dump (same thread again) is not read
    assert named.name == "worker-1" and named.frames == (Frame("f", "x.py", None),)
    assert bare.frames == ()
    (single,) = faultdump.parse_faulthandler('Stack (most recent call first):\n  File "a.py", line 1 in g\n')
    assert single.frames == (Frame("g", "a.py", 1),)
    assert (
        faultdump.parse_faulthandler('Fatal Python error: Segmentation fault\n  File "x", line 1 in f\n')
        == ()
    )


def advert(pid: int, **changes: Any) -> dict[str, Any]:
    d = {
        "pid": pid,
        "start_time": 56071,
        "python": "3.11.7",
        "executable": "/usr/bin/python3",
        "fault_signal": int(signal.SIGUSR2),
        "fault_file": "/tmp/f.fault",
        "ptracer": True,
        "mp_start": None,
        "exe": [2049, 131],
        "fault_fd": 4,
        "fault_file_id": [2049, 132],
    }
    return {**d, **changes}


def test_adverts_are_read_strictly(tmp_path: Path) -> None:
    (tmp_path / "10.json").write_text(json.dumps(advert(10)))
    (tmp_path / "11.json").write_text(json.dumps(advert(99)))  # another pid's advert under this name
    (tmp_path / "12.json").write_text("{not json")
    (tmp_path / "13.json").write_text(json.dumps(advert(13, fault_signal=0)))
    (tmp_path / "14.json").write_text(json.dumps({"pid": 14}))
    (tmp_path / "16.json").write_text(json.dumps({k: v for k, v in advert(16).items() if k != "exe"}))
    got = read_advert(tmp_path, 10)
    assert got is not None and (got.start_time, got.fault_signal, got.ptracer) == (56071, 12, True)
    assert (got.fault_file, got.program, got.dumps_on_signal) == (Path("/tmp/f.fault"), (2049, 131), True)
    for pid in (11, 12, 14, 15):
        assert read_advert(tmp_path, pid) is None
    assert read_advert(None, 10) is None
    no_handler, older_hooks = read_advert(tmp_path, 13), read_advert(tmp_path, 16)
    assert no_handler is not None and not no_handler.dumps_on_signal
    # hooks that did not say which interpreter they ran in: an exec() since could not be told, so no signal
    assert older_hooks is not None and older_hooks.program is None and not older_hooks.dumps_on_signal


# --- gdb -----------------------------------------------------------------------------------------------

# `gdb -batch -p N -ex "thread apply all bt"` of a Python 3.11 process, two threads, trimmed.
CAPTURED_GDB = """\
[New LWP 13615]
0x00007f37628ed545 in __GI___clock_nanosleep (clock_id=clock_id@entry=1) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48

Thread 2 (Thread 0x7f37622786c0 (LWP 13615) "python3"):
#0  0x00007f37628ed545 in __GI___clock_nanosleep (clock_id=clock_id@entry=1, flags=flags@entry=1) at ../sysdeps/unix/sysv/linux/clock_nanosleep.c:48
#1  0x00007f3762d15ada in pysleep (timeout=<optimized out>) at ./Modules/timemodule.c:2159
#2  time_sleep (self=<optimized out>, timeout_obj=<optimized out>) at ./Modules/timemodule.c:383
#3  0x00005636168c33f2 in ?? ()
#4  <signal handler called>
#5  0x00007f37629278ec in clone3 () from /lib/x86_64-linux-gnu/libc.so.6

Thread 1 (Thread 0x7f3762fddb80 (LWP 13573) "my (odd) name"):
#0  main () at x.c:3
"""  # noqa: E501


def test_gdb_backtrace_becomes_thread_stacks() -> None:
    worker, main = gdb.parse_backtrace(CAPTURED_GDB, {13615: "S"})
    assert (worker.tid, worker.name, worker.state) == (13615, "python3", "S")
    assert worker.frames == (
        Frame("__GI___clock_nanosleep", "../sysdeps/unix/sysv/linux/clock_nanosleep.c", 48, native=True),
        Frame("pysleep", "./Modules/timemodule.c", 2159, native=True),
        Frame("time_sleep", "./Modules/timemodule.c", 383, native=True),
        Frame("??", "", None, native=True),
        Frame("<signal handler called>", "", None, native=True),
        Frame("clone3", "/lib/x86_64-linux-gnu/libc.so.6", None, native=True),
    )
    assert (main.tid, main.name, main.state) == (13573, "my (odd) name", None)
    assert main.frames == (Frame("main", "x.c", 3, native=True),)


def test_gdb_backtrace_without_thread_headers_is_one_thread() -> None:
    (only,) = gdb.parse_backtrace("#0  0x0000 in pause () from /lib/libc.so.6\n#1  0x0001 in main ()\n")
    assert [f.function for f in only.frames] == ["pause", "main"]


# --- /proc: the states that decide how a process may be read -------------------------------------------

PID, SPINNER, BLOCKED = 4242, 4243, 4244
START = 56071


def python_process(root: Path, pid: int = PID, thread_states: dict[int, str] | None = None) -> None:
    states = thread_states or {pid: "S"}
    threads = {tid: stat_line(tid, "python3", s, f22=START) for tid, s in states.items()}
    main_state = states.get(pid, "S")
    add_process(
        root,
        pid,
        stat_line(pid, "python3", main_state, f22=START),
        cmdline=b"python\0train.py\0",
        threads=threads,
    )
    (root / str(pid) / "task" / str(BLOCKED)).mkdir(exist_ok=True)
    (root / str(pid) / "task" / str(BLOCKED) / "wchan").write_text("nfs_wait_on_request")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    (root / "sys" / "kernel").mkdir(parents=True)
    return root


def test_tasks_tell_what_may_be_paused(proc: Path) -> None:
    python_process(proc, thread_states={PID: "S", SPINNER: "R", BLOCKED: "D"})
    tasks = read_tasks(ProcFS(proc), PID)
    assert tasks.states == {PID: "S", SPINNER: "R", BLOCKED: "D"}
    assert tasks.in_d_state == [BLOCKED] and not tasks.may_block


@pytest.mark.parametrize(
    ("states", "may_block"),
    [({PID: "S", SPINNER: "R"}, True), ({PID: "T", SPINNER: "T"}, False), ({PID: "S", SPINNER: "t"}, False)],
)
def test_stopped_or_traced_threads_may_not_be_paused(
    proc: Path, states: dict[int, str], may_block: bool
) -> None:
    python_process(proc, thread_states=states)
    assert read_tasks(ProcFS(proc), PID).may_block is may_block


@pytest.mark.parametrize(
    ("scope", "says"),
    [
        (None, "another user or you lack CAP_SYS_PTRACE"),
        ("1", "ptrace_scope=1"),
        ("2", "ptrace_scope=2"),
        ("3", "until reboot"),
    ],
)
def test_ptrace_denied_names_the_setting_and_the_fix(proc: Path, scope: str | None, says: str) -> None:
    if scope is not None:
        (proc / "sys" / "kernel" / "yama").mkdir()
        (proc / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(scope + "\n")
    text = ptrace_denied_help(ProcFS(proc), PID)
    assert says in text and f"process {PID}" in text
    if scope in ("1", "2"):
        assert "kernel.yama.ptrace_scope=0" in text and "CAP_SYS_PTRACE" in text


# --- the choice of method, with a fake py-spy ----------------------------------------------------------


NATIVE_THREAD = 4245


def fake_answer() -> str:
    """CAPTURED_PY_SPY as if taken from the fake process: its main thread and its spinner."""
    tids = {428: PID, 470: SPINNER}
    return json.dumps([{**t, "os_thread_id": tids[t["os_thread_id"]]} for t in CAPTURED_PY_SPY])


def fake_tool(
    tmp_path: Path, name: str, *, answer: str = "", fail_native: str = "", fail_all: str = ""
) -> Path:
    """A tool that logs its arguments to <name>.log and answers `answer`, or fails as told."""
    log = tmp_path / f"{name}.log"
    tool = tmp_path / name
    tool.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"if {fail_all!r}: sys.stderr.write({fail_all!r}); sys.exit(1)\n"
        f"if '--native' in sys.argv and {fail_native!r}: sys.stderr.write({fail_native!r}); sys.exit(1)\n"
        f"print({answer!r})\n"
    )
    tool.chmod(0o755)
    return tool


def fake_py_spy(tmp_path: Path, *, fail_native: str = "", fail_all: str = "") -> tuple[Path, Path]:
    tool = fake_tool(tmp_path, "py-spy", answer=fake_answer(), fail_native=fail_native, fail_all=fail_all)
    return tool, tmp_path / "py-spy.log"


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_healthy_process_is_paused_for_native_frames(proc: Path, tmp_path: Path) -> None:
    python_process(proc, thread_states={PID: "S", SPINNER: "R", NATIVE_THREAD: "S"})
    tool, log = fake_py_spy(tmp_path)
    (stack,) = capture_stacks([PID], procfs=ProcFS(proc), tools=Tools(tool, None))
    assert calls(log) == [f"dump --pid {PID} --json --native"]
    assert (stack.method, stack.error, stack.cmdline) == ("py-spy --native", None, "python train.py")
    # py-spy's threads get their kernel state; a thread py-spy does not list is kept, without frames
    assert [(t.tid, t.name, t.state, len(t.frames)) for t in stack.threads] == [
        (SPINNER, "spinner", "R", 2),
        (PID, None, "S", 2),
        (NATIVE_THREAD, "python3", "S", 0),
    ]


@pytest.mark.parametrize("blocked_state", ["D", "T"])
def test_a_process_that_must_not_be_paused_is_read_without_pausing(
    proc: Path, tmp_path: Path, blocked_state: str
) -> None:
    python_process(proc, thread_states={PID: "S", BLOCKED: blocked_state})
    tool, log = fake_py_spy(tmp_path)
    (stack,) = capture_stacks([PID], procfs=ProcFS(proc), tools=Tools(tool, None))
    assert calls(log) == [f"dump --pid {PID} --json --nonblocking"]
    assert stack.method == "py-spy --nonblocking"
    if blocked_state == "D":
        assert f"thread {BLOCKED} (in nfs_wait_on_request) in uninterruptible sleep (D)" in (
            stack.error or ""
        )
    else:
        assert "stopped" in (stack.error or "")


def test_a_failed_native_dump_falls_back_to_python_frames(proc: Path, tmp_path: Path) -> None:
    python_process(proc)
    tool, log = fake_py_spy(tmp_path, fail_native="Error: Failed to unwind native stack\n")
    (stack,) = capture_stacks([PID], procfs=ProcFS(proc), tools=Tools(tool, None))
    assert calls(log) == [f"dump --pid {PID} --json --native", f"dump --pid {PID} --json"]
    assert stack.method == "py-spy"
    assert "py-spy --native" in (stack.error or "") and "Failed to unwind" in (stack.error or "")


def test_native_false_never_asks_for_native_frames(proc: Path, tmp_path: Path) -> None:
    python_process(proc)
    tool, log = fake_py_spy(tmp_path)
    capture_stacks([PID], procfs=ProcFS(proc), native=False, tools=Tools(tool, None))
    assert calls(log) == [f"dump --pid {PID} --json"]


def test_ptrace_denied_is_explained_and_nothing_else_attaches(proc: Path, tmp_path: Path) -> None:
    python_process(proc)
    tool, log = fake_py_spy(
        tmp_path, fail_all="Permission Denied: Try running again with elevated permissions"
    )
    fake_gdb = fake_tool(tmp_path, "gdb", answer="#0  main () at x.c:1")
    (stack,) = capture_stacks([PID], procfs=ProcFS(proc), tools=Tools(tool, fake_gdb))
    assert len(calls(log)) == 1
    assert calls(tmp_path / "gdb.log") == []
    assert stack.method == "none"
    assert "ptrace of process" in (stack.error or "") and "gdb not tried" in (stack.error or "")


def test_not_python_goes_to_gdb(proc: Path, tmp_path: Path) -> None:
    python_process(proc)
    tool, _ = fake_py_spy(tmp_path, fail_all="Error: Failed to find python version from target process")
    fake_gdb = fake_tool(tmp_path, "gdb", answer="Thread 1 (LWP 4242):\n#0  main () at x.c:1")
    (stack,) = capture_stacks([PID], procfs=ProcFS(proc), tools=Tools(tool, fake_gdb))
    assert (stack.method, stack.error) == ("gdb", None)
    assert stack.threads[0].frames == (Frame("main", "x.c", 1, native=True),)
    assert stack.threads[0].state == "S"
    assert f"-p {PID}" in calls(tmp_path / "gdb.log")[0]


def test_a_stale_advert_is_not_signalled(proc: Path, tmp_path: Path) -> None:
    """The advert's start time differs from the live process: the pid was reused, nothing is sent (the
    pid here does not exist on the real machine either, so a bug could not signal anyone)."""
    pid = 99_999_999
    python_process(proc, pid=pid)
    py_dir = tmp_path / "py"
    py_dir.mkdir()
    (py_dir / f"{pid}.json").write_text(json.dumps(advert(pid, start_time=START + 1)))
    (stack,) = capture_stacks([pid], procfs=ProcFS(proc), py_dir=py_dir, tools=Tools(None, None, "no py-spy"))
    assert stack.method == "none"
    assert "earlier process" in (stack.error or "") and "no py-spy" in (stack.error or "")


def test_a_vanished_process_and_an_empty_list(proc: Path) -> None:
    (stack,) = capture_stacks([PID], procfs=ProcFS(proc), tools=Tools(None, None))
    assert (stack.method, stack.error) == ("none", "exited before its stack could be taken")
    assert capture_stacks([], procfs=ProcFS(proc)) == []


# --- the tool runner -----------------------------------------------------------------------------------


def test_a_tool_that_overruns_is_killed_and_reaped() -> None:
    result = run_tool([sys.executable, "-c", "import time; print('x', flush=True); time.sleep(60)"], 1.0)
    assert result.timed_out and result.returncode is None
    assert result.stdout == b"x\n"
    assert result.elapsed_s < 10
