"""`wait-chain` on real hangs: what the job's main process waits for, followed to the process everything
waits for (probes.waits, rules.hang.waits). Each job hangs for real (a lock someone else holds, a pipe
whose writer never writes), the watchdog judges it with a short window, and the finding must name the
process at the end of the chain first, with the words for what is waited on."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.integration.hangcases import HANG, PY, finding, hang_findings, wait_chain
from tests.support import eventually, unavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process of user nobody, outside any job, holding an exclusive lock on a file everyone may open."""
    if os.geteuid() != 0:
        unavailable("only root can hold a lock as another user")
    shared = Path(tempfile.mkdtemp(prefix="jw-lock-"))
    shared.chmod(0o777)
    lock = shared / "cache.lock"
    lock.touch(mode=0o666)
    lock.chmod(0o666)
    code = (
        "import fcntl, sys\n"
        "f = open(sys.argv[1], 'a')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"  # holds it until the test closes its stdin
    )
    proc = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", PY, "-c", code, str(lock)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc, lock
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()
        lock.unlink()
        shared.rmdir()


def test_a_child_waiting_for_another_users_lock_names_the_holder(
    jw: Jobwarden, holder: tuple[subprocess.Popen[str], Path]
) -> None:
    proc, lock = holder
    locker = "import fcntl, sys; fcntl.flock(open(sys.argv[1], 'a'), fcntl.LOCK_EX)"
    main = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {locker!r}, sys.argv[1]])"
    job = jw.start(PY, "-c", main, str(lock), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        assert f["pids"][0] == proc.pid, f
        # another user's process: its command, its user, and that it is none of this user's jobs
        assert f["title"].startswith(f"Waits for a file lock on {lock} held by pid {proc.pid} ({PY[:30]}"), f
        assert f["title"].endswith("), user nobody, not a job of yours"), f
        main_pid = jw.status(job)["pid"]
        assert f["summary"].startswith(f"Pid {main_pid} (") and "waits for its child pid " in f["summary"]
        assert main_pid in f["pids"]  # the chain: the holder, then the main process and its child
        assert finding(jw, job, "no-progress") is None  # the chain explains the hang
    finally:
        jw("stop", str(job), check=True)


def test_a_reader_of_a_pipe_whose_writer_never_writes_names_the_writer(jw: Jobwarden, tmp_path: Path) -> None:
    # a script that starts `tail -f` into a pipe: the reader never gets end-of-file while tail lives
    script = tmp_path / "follow.sh"
    script.write_text(f"tail -f /dev/null | {PY} -c 'import sys; sys.stdin.read()'\n")
    job = jw.start("bash", str(script), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        tail = next(p["pid"] for p in jw.status(job)["processes"] if p["cmdline"].startswith("tail -f"))
        assert f["pids"][0] == tail, f
        assert f["title"] == f"Reads a pipe whose write end pid {tail} still holds open"
        assert "tail -f /dev/null" in "\n".join(f["evidence"])
    finally:
        jw("stop", str(job), check=True)


def test_a_job_sleeping_between_polls_is_no_wait_chain(jw: Jobwarden) -> None:
    # waiting on purpose: the window says hung (as it did before), but no chain is drawn from a sleep
    job = jw.start(PY, "-c", "import time; time.sleep(600)", options=HANG)["id"]
    try:
        found = eventually("a hang finding", lambda: hang_findings(jw, job), 90)
        assert [f["rule"] for f in found] == ["no-progress"], found
    finally:
        jw("stop", str(job), check=True)


SILENT_SERVER = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
sys.stdin.read()  # never answers: holds the connection until the test closes its stdin
"""


def test_a_client_waiting_for_a_local_server_that_never_answers_names_the_server(jw: Jobwarden) -> None:
    server = subprocess.Popen(
        [PY, "-c", SILENT_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        client = (
            "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])));"
            " s.sendall(b'GET'); s.recv(1)"
        )
        job = jw.start(PY, "-c", client, str(port), options=HANG)["id"]
        try:
            f = wait_chain(jw, job)
            assert f["pids"][0] == server.pid, f
            assert f["title"].startswith(
                f"Waits for a reply on a TCP connection to 127.0.0.1:{port} from pid {server.pid} ({PY[:30]}"
            ), f
            assert f["title"].endswith("), user root, not a job of yours"), f
        finally:
            jw("stop", str(job), check=True)
    finally:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.close()
        server.wait(30)
        server.stdout.close()


def test_a_shell_scripts_flock_command_behind_another_users_lock_names_the_holder(
    jw: Jobwarden, holder: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    # flock(1) in a script, the way cron jobs and CI steps serialise on a shared lock file
    proc, lock = holder
    script = tmp_path / "nightly.sh"
    script.write_text('flock --exclusive "$1" echo updating the cache\necho done\n')
    job = jw.start("bash", str(script), str(lock), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        assert f["pids"][0] == proc.pid, f
        assert f["title"].startswith(f"Waits for a file lock on {lock} held by pid {proc.pid} ({PY[:30]}"), f
        assert f["title"].endswith("), user nobody, not a job of yours"), f
        flock = next(p["pid"] for p in jw.status(job)["processes"] if p["cmdline"].startswith("flock "))
        assert f"waits for its child pid {flock} (flock --exclusive" in f["summary"], f
        assert flock in f["pids"]
    finally:
        jw("stop", str(job), check=True)


def test_a_parent_waiting_for_a_child_that_fills_the_pipe_it_never_reads_is_a_deadlock(jw: Jobwarden) -> None:
    # the trap subprocess's documentation warns of: wait() with stdout=PIPE and more than a pipe's worth
    main = (
        "import subprocess, sys\n"
        "talk = 'print(\"x\" * (1 << 20))'\n"
        "child = subprocess.Popen([sys.executable, '-c', talk], stdout=subprocess.PIPE)\n"
        "child.wait()\n"
    )
    job = jw.start(PY, "-c", main, options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        main_pid = jw.status(job)["pid"]
        child = next(p["pid"] for p in jw.status(job)["processes"] if p["pid"] != main_pid)
        assert f["pids"][0] == main_pid, f
        assert sorted(f["pids"]) == sorted([main_pid, child])
        assert f["title"] == f"Deadlock: 2 processes wait for each other (child pid {child}, a pipe)"
        assert f"waits for its child pid {child} (" in f["summary"], f
        assert f"which writes into a full pipe that pid {main_pid} (" in f["summary"], f
        assert "a cycle, nobody can go on (a deadlock)" in f["summary"]
    finally:
        jw("stop", str(job), check=True)


CONSUMER = """
import multiprocessing, sys

def consume(path):
    with open(path) as feed:
        feed.read()

if __name__ == "__main__":
    worker = multiprocessing.Process(target=consume, args=(sys.argv[1],))
    worker.start()
    worker.join()
"""


def test_a_multiprocessing_join_on_a_child_reading_a_fifo_names_the_fifos_writer(
    jw: Jobwarden, tmp_path: Path
) -> None:
    fifo = tmp_path / "feed.fifo"
    os.mkfifo(fifo)
    # a shell outside the job holds the FIFO open (read-write: the open does not wait) and never writes
    writer = subprocess.Popen(
        ["bash", "-c", 'exec 3<>"$1"; echo ready; read line', "bash", str(fifo)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        script = tmp_path / "consumer.py"
        script.write_text(CONSUMER)
        job = jw.start(PY, str(script), str(fifo), options=HANG)["id"]
        try:
            f = wait_chain(jw, job)
            assert f["pids"][0] == writer.pid, f
            assert f["title"].startswith(
                f"Reads the FIFO {fifo} whose write end pid {writer.pid} (bash -c "
            ), f
            assert f["title"].endswith("), user root, not a job of yours still holds open"), f
            main_pid = jw.status(job)["pid"]
            assert f["summary"].startswith(f"Pid {main_pid} (") and "waits for its child pid " in f["summary"]
            assert main_pid in f["pids"]
        finally:
            jw("stop", str(job), check=True)
    finally:
        assert writer.stdin is not None and writer.stdout is not None
        writer.stdin.close()
        writer.wait(30)
        writer.stdout.close()


SILENT_UNIX_SERVER = """
import socket, sys
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen()
print("listening", flush=True)
conn, _ = server.accept()
sys.stdin.read()  # never answers: holds the connection until the test closes its stdin
"""


@pytest.fixture
def unix_server() -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A process outside any job listening on a Unix socket, that accepts and never sends. A short
    directory: a socket's path must fit in 108 bytes."""
    folder = Path(tempfile.mkdtemp(prefix="jw-unix-"))
    path = folder / "feed.sock"
    server = subprocess.Popen(
        [PY, "-c", SILENT_UNIX_SERVER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "listening"
        yield server, path
    finally:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.close()
        server.wait(30)
        server.stdout.close()
        path.unlink(missing_ok=True)
        folder.rmdir()


def test_a_client_waiting_on_a_unix_socket_names_the_silent_server(
    jw: Jobwarden, unix_server: tuple[subprocess.Popen[str], Path]
) -> None:
    server, path = unix_server
    # multiprocessing.connection's client, as a job talking to a local feeder or parameter server would
    client = (
        "import sys; from multiprocessing.connection import Client;"
        " Client(sys.argv[1], family='AF_UNIX').recv()"
    )
    job = jw.start(PY, "-c", client, str(path), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        assert f["pids"][0] == server.pid, f
        assert f["title"].startswith(
            f"Waits for a reply on a Unix socket connected to {path} from pid {server.pid} ({PY[:30]}"
        ), f
        assert f["title"].endswith("), user root, not a job of yours"), f
    finally:
        jw("stop", str(job), check=True)


def test_a_server_waiting_in_accept_is_no_wait_chain(jw: Jobwarden, tmp_path: Path) -> None:
    # waiting on purpose for clients that do not come: a hang by the window, with nobody to blame
    server = "import socket; s = socket.create_server(('127.0.0.1', 0)); s.accept()"
    job = jw.start(PY, "-c", server, options=HANG)["id"]
    try:
        found = eventually("a hang finding", lambda: hang_findings(jw, job), 90)
        assert [f["rule"] for f in found] == ["no-progress"], found
    finally:
        jw("stop", str(job), check=True)


ABBA = """
import threading

a = threading.Lock()
b = threading.Lock()
both = threading.Barrier(2)


def forwards():
    with a:
        both.wait()
        with b:
            print("never")


def backwards():
    with b:
        both.wait()
        with a:
            print("never")


threads = [threading.Thread(target=forwards), threading.Thread(target=backwards)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


@pytest.mark.parametrize("by_hand", [False, True], ids=["with", "acquire"])
def test_two_threads_taking_two_locks_in_opposite_orders_are_a_deadlock_naming_both(
    jw: Jobwarden, tmp_path: Path, by_hand: bool
) -> None:
    # the inner lock taken by a `with`, or by a bare acquire() on the same line
    script = tmp_path / "abba.py"
    code = ABBA
    if by_hand:
        for lock in "ab":
            code = code.replace(f"with {lock}:\n            print", f"{lock}.acquire()\n        print")
        assert code.count(".acquire()") == 2
    script.write_text(code)
    script.chmod(0o644)
    job = jw.start(PY, str(script), options=HANG)["id"]
    try:
        f = wait_chain(jw, job)
        main_pid = jw.status(job)["pid"]
        assert f["pids"] == [main_pid], f
        assert f["title"] == f"Deadlock: 2 threads of pid {main_pid} wait for each other's locks (a, b)", f
        assert (
            f'"Thread-1 (forwards)" waits at {script}:12 for lock b (made at line 5), which thread '
        ) in f["summary"], f
        assert '"Thread-2 (backwards)" holds (its `with` at line 17)' in f["summary"], f
        assert '"Thread-2 (backwards)" waits at line 19 for lock a (made at line 4)' in f["summary"], f
        assert finding(jw, job, "no-progress") is None
    finally:
        jw("stop", str(job), check=True)


HELD_BY_A_SLEEPER = """
import threading, time

lock = threading.Lock()


def slow():
    with lock:
        time.sleep(600)


threading.Thread(target=slow).start()
time.sleep(0.5)
with lock:
    print("never before ten minutes")
"""


def test_a_thread_waiting_for_a_lock_a_sleeper_holds_is_no_deadlock(jw: Jobwarden, tmp_path: Path) -> None:
    # a lock held across a long sleep: hung by the window, but no cycle, so no deadlock is drawn
    script = tmp_path / "slow.py"
    script.write_text(HELD_BY_A_SLEEPER)
    script.chmod(0o644)
    job = jw.start(PY, str(script), options=HANG)["id"]
    try:
        found = eventually("a hang finding", lambda: hang_findings(jw, job), 90)
        assert [f["rule"] for f in found] == ["no-progress"], found
    finally:
        jw("stop", str(job), check=True)
