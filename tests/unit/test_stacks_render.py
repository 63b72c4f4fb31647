"""The text of `jobwarden dump`: per process what it is and how it was read, each thread innermost first,
idle look-alikes folded, frameless threads on one line."""

from __future__ import annotations

from jobwarden.clock import shown_time
from jobwarden.control.dump import DumpResult
from jobwarden.joboptions import JobOptions
from jobwarden.model import JobState
from jobwarden.observations import Frame, ProcessStack, ThreadStack
from jobwarden.store import JobRecord, RunRecord
from jobwarden.text.render import dump_report, process_stack_lines

AT = 1_700_000_000.0
JOB = JobRecord(7, "train", ("python", "train.py"), "/srv", AT - 60, JobOptions(), {})
LIB = "/usr/lib/python3.11/threading.py"
IDLE_WORKER = (
    Frame("clock_nanosleep", "/usr/lib/x86_64-linux-gnu/libc.so.6", None, native=True),
    Frame("Condition.wait", LIB, 327),
    Frame("worker", "/srv/train.py", 40),
)


def run(state: JobState, **fields: object) -> RunRecord:
    base: dict[str, object] = {
        "job_id": 7,
        "n": 2,
        "state": state,
        "shim_pid": 1,
        "shim_start": 1,
        "pid": 100,
        "pid_start": 1,
        "started_at": AT - 50,
        "ended_at": None,
        "exit_code": None,
        "signal": None,
        "wait_status": None,
        "end_reason": None,
        "error": None,
        "stop_requested_at": None,
        "stop_grace": None,
        "containment": None,
        "orphans_left": [],
        "survivors": [],
    }
    return RunRecord(**{**base, **fields})  # type: ignore[arg-type]


def python_process() -> ProcessStack:
    threads = (
        ThreadStack(101, "loader-1", IDLE_WORKER, "S", False),
        ThreadStack(100, "MainThread", (Frame("step", "/srv/train.py", 12),), "R", True),
        ThreadStack(102, "loader-2", IDLE_WORKER, "S", False),
        ThreadStack(103, "loader-3", IDLE_WORKER, "S", False),
        ThreadStack(104, "cuda", (), "S", None),
        ThreadStack(105, "nccl", (), "D", None),
    )
    return ProcessStack(100, "py-spy --native", threads, None, "python train.py --lr 0.1")


def test_a_process_reads_like_a_report() -> None:
    lines = list(process_stack_lines(python_process()))
    assert lines == [
        "process 100  python train.py --lr 0.1",
        "  captured with py-spy --native",
        '  thread 100 "MainThread"  [running, active]',
        "      step  (/srv/train.py:12)",
        '  thread 101 "loader-1"  [sleeping, idle]',
        "      clock_nanosleep  (libc.so.6)  [native]",
        "      Condition.wait  (threading.py:327)",
        "      worker  (/srv/train.py:40)",
        '    + 2 more idle threads with this stack: 102 "loader-2", 103 "loader-3"',
        '  2 threads without Python frames: 104 "cuda" S, 105 "nccl" D',
    ]


def test_failures_and_notes_are_said() -> None:
    failed = ProcessStack(5, "none", (), "not a Python process, and gdb is not installed", "sleep 9")
    assert list(process_stack_lines(failed)) == [
        "process 5  sleep 9",
        "  no stack: not a Python process, and gdb is not installed",
    ]
    partial = ProcessStack(
        6, "faulthandler", (ThreadStack(None, "0x00007f01", IDLE_WORKER[1:]),), "no py-spy", "x"
    )
    assert list(process_stack_lines(partial))[1:4] == [
        "  captured with faulthandler",
        "  note: no py-spy",
        '  thread "0x00007f01"',
    ]


def test_a_live_dump_and_a_stored_one() -> None:
    live = DumpResult(JOB, run(JobState.RUNNING), AT, "dump", (python_process(),), live=True, elapsed_s=0.4)
    text = list(dump_report(live))
    assert (
        text[0] == f"job 7 (train), run 2 — running: stacks of 1 process(es), taken {shown_time(AT)} in 0.40s"
    )
    assert text[1] == "" and text[2].startswith("process 100")
    ended = run(JobState.FAILED, signal="SIGKILL", ended_at=AT + 5)
    stored = DumpResult(JOB, ended, AT, "hang", (python_process(),), live=False)
    assert next(iter(dump_report(stored))) == (
        "job 7 (train), run 2 has no live process (failed: killed by SIGKILL); these are the last stacks "
        f"taken while it ran: {shown_time(AT)}, by hang"
    )
    empty = DumpResult(JOB, run(JobState.RUNNING), AT, "dump", (), live=True, elapsed_s=0.0)
    assert list(dump_report(empty))[1] == "  no live process"


def test_json_is_a_list_of_process_stacks() -> None:
    live = DumpResult(JOB, run(JobState.RUNNING), AT, "dump", (python_process(),), live=True)
    (data,) = live.to_json()
    assert ProcessStack.from_json(data) == python_process()
