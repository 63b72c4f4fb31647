"""Processes whose stacks the dump tests capture. Each reports on a FIFO once it is in the state to be
captured, then serves "ping" lines from a control FIFO (answering "pong" on the report FIFO) for ever.

usage: stack_targets.py MODE REPORT_FIFO CONTROL_FIFO [N]

    threads   main thread + "sleeper" (in nap) + "waiter" (in wait_forever) + a Python child
    deadlock  threads "left" and "right" deadlocked on two locks, each in its acquire
    tree      N-1 Python children (a tree of N processes), each ready before the report
    dstate    after the report, thread "spawner" blocks in D state until someone opens FIFO N for writing
    plain     the main thread only

The report is "main=PID [child=PID ...]". With STACK_TARGET_PY_DIR set, the process registers faulthandler
on SIGUSR2 and advertises it in $STACK_TARGET_PY_DIR/<pid>.json, as jobwarden's Python hook does.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading
import time

FAULT_SIGNAL = signal.SIGUSR2


def advertise(py_dir: str) -> None:
    """Register faulthandler on a signal and say so in <py_dir>/<pid>.json (written atomically)."""
    pid = os.getpid()
    fault_file = os.path.join(py_dir, f"{pid}.fault")
    fh = open(fault_file, "a")  # noqa: SIM115 - must stay open for the life of the process
    faulthandler.register(FAULT_SIGNAL, file=fh, all_threads=True, chain=False)
    with open(f"/proc/{pid}/stat") as stat:
        start_time = int(stat.read().rpartition(")")[2].split()[19])
    advert = {
        "pid": pid,
        "start_time": start_time,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "fault_signal": int(FAULT_SIGNAL),
        "fault_file": fault_file,
        "ptracer": False,
        "mp_start": None,
        "exe": [os.stat("/proc/self/exe").st_dev, os.stat("/proc/self/exe").st_ino],
        "fault_fd": fh.fileno(),  # the shim signals only while this descriptor is still the file
        "fault_file_id": [os.fstat(fh.fileno()).st_dev, os.fstat(fh.fileno()).st_ino],
    }
    tmp = os.path.join(py_dir, f".{pid}.json.tmp")
    with open(tmp, "w") as out:
        json.dump(advert, out)
    os.rename(tmp, os.path.join(py_dir, f"{pid}.json"))


def nap() -> None:
    while True:
        time.sleep(3600)


def wait_forever() -> None:
    threading.Event().wait()


def start_threads() -> None:
    threading.Thread(target=nap, name="sleeper", daemon=True).start()
    threading.Thread(target=wait_forever, name="waiter", daemon=True).start()


LEFT, RIGHT = threading.Lock(), threading.Lock()
BOTH_HELD = threading.Barrier(2)


def take_left_then_right() -> None:
    with LEFT:
        BOTH_HELD.wait()
        RIGHT.acquire()  # deadlock: left waits here


def take_right_then_left() -> None:
    with RIGHT:
        BOTH_HELD.wait()
        LEFT.acquire()  # deadlock: right waits here


def start_deadlock() -> None:
    threads = [
        threading.Thread(target=take_left_then_right, name="left", daemon=True),
        threading.Thread(target=take_right_then_left, name="right", daemon=True),
    ]
    for t in threads:
        t.start()
    # Report only once both threads stand on their acquire line, so any stack taken after the report
    # shows them there (the line is the same before and inside the C call).
    lines = {t.ident: _acquire_line(t.name) for t in threads}
    deadline = time.monotonic() + 60
    while True:
        frames = sys._current_frames()
        if all(frames.get(ident) is not None and frames[ident].f_lineno == ln for ident, ln in lines.items()):
            return
        if time.monotonic() > deadline:
            raise SystemExit("the deadlock did not happen")
        time.sleep(0.01)


def _acquire_line(name: str) -> int:
    with open(__file__) as fh:
        for n, line in enumerate(fh, 1):
            if f"# deadlock: {name} waits here" in line:
                return n
    raise SystemExit(f"no acquire line for {name}")


CHILD_CODE = "import sys, time\nsys.stdout.write('ready\\n'); sys.stdout.flush()\ndef child_main():\n" + (
    "    time.sleep(3600)\nchild_main()\n"
)


def start_children(count: int) -> list[int]:
    """Start `count` Python children at once, then wait until each has said it is ready."""
    children = [
        subprocess.Popen([sys.executable, "-c", CHILD_CODE], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]
    for child in children:
        assert child.stdout is not None
        if child.stdout.readline() != b"ready\n":
            raise SystemExit(f"child {child.pid} did not start")
    return [c.pid for c in children]


def spawn_blocked(fifo: str) -> None:
    """posix_spawn() suspends the calling thread in the kernel (vfork: uninterruptible, shown as D) until
    the child execs; the child first opens `fifo`, which blocks until a writer comes. CPython keeps the
    GIL across posix_spawn, so the other threads wait too: a process stuck as a whole."""
    os.posix_spawn("/bin/true", ["true"], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 3, fifo, os.O_RDONLY, 0)])


def serve(report: str, control: str) -> None:
    """Answer each "ping" with "pong": proof that the process still runs after whatever was done to it."""
    while True:
        with open(control) as fh:
            for line in fh:
                if line.strip() == "ping":
                    with open(report, "w") as out:
                        out.write("pong\n")


def main() -> None:
    mode, report, control = sys.argv[1:4]
    py_dir = os.environ.get("STACK_TARGET_PY_DIR")
    if py_dir:
        advertise(py_dir)
    children: list[int] = []
    if mode == "threads":
        start_threads()
        children = start_children(1)
    elif mode == "deadlock":
        start_deadlock()
    elif mode == "tree":
        children = start_children(int(sys.argv[4]) - 1)
    elif mode not in ("plain", "dstate"):
        raise SystemExit(f"unknown mode {mode}")
    with open(report, "w") as out:
        out.write(" ".join([f"main={os.getpid()}", *(f"child={c}" for c in children)]) + "\n")
    if mode == "dstate":
        spawner = threading.Thread(target=spawn_blocked, args=(sys.argv[4],), name="spawner")
        spawner.start()
        spawner.join()
    serve(report, control)


if __name__ == "__main__":
    main()
