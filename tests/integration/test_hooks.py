"""The Python hooks in real interpreters (3.8, 3.13 and the one running the tests), started with the
environment hook_env gives a job: what each process advertises, the faulthandler dump on the fault signal, the
record of a fork() made while another thread holds a lock, chaining an existing sitecustomize, --mp-start,
heartbeats, and nothing at all outside a job."""

from __future__ import annotations

import json
import os
import select
import shutil
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobwarden
from jobwarden.hooks import FALLBACK_DIR, FAULT_SIGNAL, SITE_DIR, heartbeat_env, hook_env
from jobwarden.observations import ThreadStack
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.faultdump import parse_faulthandler
from jobwarden.probes.pyhooks import read_adverts, read_forks, read_heartbeat
from tests.conftest import start_time
from tests.faultcheck import may_signal
from tests.support import eventually

pytestmark = pytest.mark.integration


INTERPRETERS = {
    "python3.8": Path.home() / ".pyenv/versions/3.8.18/bin/python",
    "python3.13": Path.home() / ".pyenv/versions/3.13.0/bin/python",
    "default": Path(sys.executable),
}
TIMEOUT_S = 60


@pytest.fixture(params=list(INTERPRETERS))
def python(request: pytest.FixtureRequest) -> Path:
    path = INTERPRETERS[request.param]
    if not path.exists():
        pytest.skip(f"{path} is not installed (pyenv install {request.param.removeprefix('python')})")
    return path


class Job:
    """One test's run dir, and the job's Python processes started in it."""

    def __init__(self, python: Path, tmp: Path) -> None:
        self.python = python
        self.tmp = tmp
        self.py_dir = tmp / "py"  # not created: the hooks create it
        self.heartbeat = tmp / "heartbeat"
        self.base = {
            k: v for k, v in os.environ.items() if not k.startswith("JOBWARDEN_") and k != "PYTHONPATH"
        }
        self.started: list[subprocess.Popen[bytes]] = []

    def env(self, mp_start: str | None = None, **extra: str) -> dict[str, str]:
        base = {**self.base, **extra}
        return {**base, **hook_env(self.py_dir, self.heartbeat, os.getpid(), mp_start, base)}

    def script(self, source: str) -> Path:
        path = self.tmp / f"job{len(list(self.tmp.glob('job*.py')))}.py"
        path.write_text(textwrap.dedent(source))
        return path

    def run(self, source: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(self.python), str(self.script(source))],
            env=self.env() if env is None else env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            cwd=self.tmp,
        )
        assert result.returncode == 0, result.stderr
        return result

    def start(self, source: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(self.python), str(self.script(source))],
            env=self.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.tmp,
        )
        self.started.append(proc)
        return proc

    def reap(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=TIMEOUT_S)


@pytest.fixture
def job(python: Path, tmp_path: Path) -> Iterator[Job]:
    runner = Job(python, tmp_path)
    yield runner
    runner.reap()


def read_line(proc: subprocess.Popen[bytes]) -> str:
    """One line from the process's stdout, or fail at the deadline (a handshake, not a sleep)."""
    assert proc.stdout is not None
    data = b""
    deadline = time.monotonic() + TIMEOUT_S
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([proc.stdout], [], [], remaining)[0]:
            raise TimeoutError(f"no line from pid {proc.pid} within {TIMEOUT_S}s (got {data!r})")
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise EOFError(f"pid {proc.pid} closed stdout: {proc.communicate(timeout=TIMEOUT_S)[1].decode()}")
        data += chunk
    return data.decode()


def wait_for_dump(path: Path, offset: int, functions: set[str]) -> tuple[ThreadStack, ...]:
    """faulthandler writes from the signal handler, asynchronously to the sender: wait, with a deadline,
    until the dump names every function looked for."""

    def named() -> tuple[ThreadStack, ...] | None:
        threads = read_fault_dump(path, offset)
        return threads if functions <= {f.function for t in threads for f in t.frames} else None

    return eventually(f"{path} with a dump naming {functions}", named, TIMEOUT_S, every_s=0.01)


def read_fault_dump(path: Path, offset: int = 0) -> tuple[ThreadStack, ...]:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return parse_faulthandler(fh.read().decode("utf-8", "replace"))


def expected_ptracer() -> bool:
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    # without Yama or at scope 0 nothing stands in the way; at 1 the prctl names this test's process, alive
    return not scope.exists() or scope.read_text().strip() in ("0", "1")


# --- advert and faulthandler ------------------------------------------------------------------------

PARKED = """
    import json, sys, threading
    go = threading.Event()
    parked = threading.Event()

    def park_in_thread():
        parked.set()
        go.wait()

    def wait_for_go():
        version = "%d.%d.%d" % sys.version_info[:3]
        print(json.dumps({"python": version, "executable": sys.executable}), flush=True)
        sys.stdin.readline()

    threading.Thread(target=park_in_thread, name="parked").start()
    parked.wait()
    wait_for_go()
    go.set()
"""


def test_the_advert_is_written_and_the_fault_signal_dumps_every_thread(job: Job) -> None:
    proc = job.start(PARKED)
    said = json.loads(read_line(proc))

    advert = read_adverts(job.py_dir)[proc.pid]
    assert advert.start_time == start_time(proc.pid)
    assert (advert.python, advert.executable) == (said["python"], said["executable"])
    # a memfd, read through /proc while the process lives: no file on disk for each process
    assert (advert.fault_signal, advert.fault_file) == (
        FAULT_SIGNAL,
        Path(f"/proc/{proc.pid}/fd/{advert.fault_fd}"),
    )
    assert (advert.ptracer, advert.mp_start) == (expected_ptracer(), None)
    assert may_signal(advert, ProcFS())

    assert advert.fault_file is not None
    os.kill(proc.pid, advert.fault_signal)
    threads = wait_for_dump(advert.fault_file, 0, {"park_in_thread", "wait_for_go"})
    assert len(threads) == 2

    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()
    assert proc.wait(TIMEOUT_S) == 0  # the signal was handled: the job lives on
    assert not may_signal(advert, ProcFS())


# --- fork() while another thread holds a lock -------------------------------------------------------

LOCK_HOLDER = """
    import json, os, sys, threading
    lock = threading.Lock()
    held = threading.Event()
    release = threading.Event()

    def hold_the_lock():
        with lock:
            held.set()
            release.wait()

    threading.Thread(target=hold_the_lock, name="holder").start()
    held.wait()
"""

OS_FORK = """
    def advert_of(pid):
        with open(os.path.join(os.environ["JOBWARDEN_PY_DIR"], "%d.json" % pid)) as fh:
            return json.load(fh)

    def in_child():
        # the child has its own advert and handler: dump to its own file, by its own signal (the handler
        # writes before kill() returns); the file lives as long as the child: copied for the test
        advert = advert_of(os.getpid())
        os.kill(os.getpid(), advert["fault_signal"])
        with open(advert["fault_file"], "rb") as dump:
            with open(os.path.join(os.environ["JOBWARDEN_PY_DIR"], "child-dump.txt"), "wb") as out:
                out.write(dump.read())
        os._exit(0)

    def fork_while_locked():
        return os.fork()

    pid = fork_while_locked()
    if pid == 0:
        in_child()
    _, status = os.waitpid(pid, 0)
    release.set()
    own = os.path.getsize(advert_of(os.getpid())["fault_file"])
    print(json.dumps({"parent": os.getpid(), "child": pid, "status": status, "parent_dump_bytes": own}))
"""

FORK_PLAIN = """
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    release.set()
    print(json.dumps({"status": os.waitpid(pid, 0)[1]}))
"""


def test_a_fork_while_a_thread_holds_a_lock_is_recorded(job: Job) -> None:
    said = json.loads(job.run(LOCK_HOLDER + OS_FORK).stdout)
    assert said["status"] == 0

    (record,) = read_forks(job.py_dir)
    parent = said["parent"]
    assert (record.parent_pid, record.child_pid) == (parent, said["child"])
    assert [f.function for f in record.stack[:2]] == ["fork_while_locked", "<module>"]
    (holder,) = record.threads
    assert holder.name == "holder"
    assert "hold_the_lock" in [f.function for f in holder.frames]

    child = read_adverts(job.py_dir)[said["child"]]
    assert child.fault_file == Path(f"/proc/{said['child']}/fd/{child.fault_fd}")
    threads = read_fault_dump(job.py_dir / "child-dump.txt")
    assert [f.function for f in threads[0].frames][:2] == ["in_child", "<module>"]
    assert said["parent_dump_bytes"] == 0  # the child did not write to its parent's


MP_FORK = """
    import multiprocessing

    def work():
        pass

    if __name__ == "__main__":
        process = multiprocessing.get_context("fork").Process(target=work)
        process.start()
        process.join()
        release.set()
        print(json.dumps({"child": process.pid, "exitcode": process.exitcode}))
"""


def test_a_multiprocessing_fork_while_a_thread_holds_a_lock_is_recorded(job: Job) -> None:
    said = json.loads(job.run(LOCK_HOLDER + MP_FORK).stdout)
    assert said["exitcode"] == 0

    (record,) = read_forks(job.py_dir)
    assert record.child_pid == said["child"]
    launch = record.stack[0]
    assert launch.function.rpartition(".")[2] == "_launch"  # Popen._launch (3.11+), _launch before
    assert launch.file.endswith("popen_fork.py")
    assert [t.name for t in record.threads] == ["holder"]
    assert said["child"] in read_adverts(job.py_dir)


# --- chaining an existing sitecustomize -------------------------------------------------------------

CHAINED = """
    import os
    py_dir = os.environ.get("JOBWARDEN_PY_DIR")
    advert = py_dir and os.path.join(py_dir, "%d.json" % os.getpid())
    with open(os.environ["CHAIN_MARKER"], "w") as fh:
        fh.write("ran after the hooks" if advert and os.path.exists(advert) else "ran without hooks")
"""
SHOW_SITECUSTOMIZE = """
    import sys
    print(sys.modules["sitecustomize"].__file__)
"""


def chained_site(job: Job, source: str) -> Path:
    chained = job.tmp / "chained"
    chained.mkdir()
    (chained / "sitecustomize.py").write_text(textwrap.dedent(source))
    return chained


def test_an_existing_sitecustomize_still_runs_after_the_hooks(job: Job) -> None:
    chained = chained_site(job, CHAINED)
    marker = job.tmp / "marker"
    result = job.run(SHOW_SITECUSTOMIZE, env=job.env(PYTHONPATH=str(chained), CHAIN_MARKER=str(marker)))
    assert marker.read_text() == "ran after the hooks"
    assert result.stdout.strip() == str(chained / "sitecustomize.py")  # what the job sees as its own


def test_an_existing_sitecustomize_runs_outside_a_job_too(job: Job) -> None:
    chained = chained_site(job, CHAINED)
    marker = job.tmp / "marker"
    env = {**job.base, "PYTHONPATH": f"{SITE_DIR}:{chained}", "CHAIN_MARKER": str(marker)}
    job.run(SHOW_SITECUSTOMIZE, env=env)
    assert marker.read_text() == "ran without hooks"


def test_a_failing_sitecustomize_is_reported_as_python_would(job: Job) -> None:
    chained = chained_site(job, "raise RuntimeError('boom')\n")
    alone = job.run("print('ok')\n", env={**job.base, "PYTHONPATH": str(chained)})
    hooked = job.run("print('ok')\n", env=job.env(PYTHONPATH=str(chained)))
    assert hooked.stdout == alone.stdout == "ok\n"
    assert hooked.stderr == alone.stderr
    assert "RuntimeError: boom" in hooked.stderr


# --- --mp-start -------------------------------------------------------------------------------------

MP_DEFAULT = """
    import sys
    imported_at_start = "multiprocessing" in sys.modules
    import json, multiprocessing

    def work():
        pass

    if __name__ == "__main__":
        method = multiprocessing.get_start_method()
        process = multiprocessing.Process(target=work)
        process.start()
        process.join()
        print(json.dumps({"imported_at_start": imported_at_start, "method": method,
                          "child": process.pid, "exitcode": process.exitcode}))
"""


def test_mp_start_forkserver_takes_effect(job: Job) -> None:
    said = json.loads(job.run(MP_DEFAULT, env=job.env("forkserver")).stdout)
    assert said == {"imported_at_start": False, "method": "forkserver", "child": said["child"], "exitcode": 0}
    adverts = read_adverts(job.py_dir)
    assert adverts[said["child"]].mp_start == "forkserver"
    # the job, the fork server (a fresh interpreter: hooked at start-up), the child it forked, and on some
    # versions the resource tracker
    assert len(adverts) >= 3


def test_a_job_that_sets_its_start_method_keeps_its_choice(job: Job) -> None:
    source = """
        import multiprocessing
        multiprocessing.set_start_method("spawn")
        print(multiprocessing.get_start_method())
    """
    assert job.run(source, env=job.env("forkserver")).stdout == "spawn\n"


# --- heartbeat --------------------------------------------------------------------------------------

BEAT = """
    import jobwarden
    jobwarden.heartbeat(step=3)
    print(jobwarden.__file__)
"""


def installed_jobwarden(python: Path) -> str | None:
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util as u; s = u.find_spec('jobwarden'); print(s and s.origin)",
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    ).stdout.strip()
    return None if found == "None" else found


def test_heartbeat_works_in_any_interpreter_and_an_installed_jobwarden_wins(job: Job) -> None:
    started = time.time()
    used = job.run(BEAT).stdout.strip()
    beat = read_heartbeat(job.heartbeat)
    assert beat is not None
    assert beat.info == {"step": 3}
    assert beat.at >= started - 1
    assert used == (installed_jobwarden(job.python) or str(FALLBACK_DIR / "jobwarden" / "__init__.py"))


def test_heartbeat_env_alone_is_enough_where_jobwarden_is_installed(tmp_path: Path) -> None:
    # --no-py-hooks: only the heartbeat variable, and the interpreter running the tests has jobwarden
    assert Path(jobwarden.__file__).is_file()
    target = tmp_path / "heartbeat"
    env = {**os.environ, **heartbeat_env(target)}
    env.pop("PYTHONPATH", None)
    subprocess.run(
        [sys.executable, "-c", "import jobwarden; jobwarden.heartbeat(epoch=2)"],
        env=env,
        check=True,
        timeout=60,
    )
    beat = read_heartbeat(target)
    assert beat is not None and beat.info == {"epoch": 2}


# --- outside a job, and when things go wrong --------------------------------------------------------

EVERYTHING = """
    import os, sys, threading
    hooked = [p for p in sys.path if p.endswith("fallback")]
    done = threading.Event()
    threading.Thread(target=done.wait).start()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    done.set()
    import multiprocessing
    print(hooked, multiprocessing.get_start_method())
"""


def test_without_the_job_variables_the_hooks_do_nothing(job: Job) -> None:
    env = {**job.base, "PYTHONPATH": str(SITE_DIR)}
    result = job.run(EVERYTHING, env=env)
    assert result.stdout.split()[0] == "[]"
    assert not job.py_dir.exists()
    assert sorted(p.name for p in job.tmp.iterdir()) == ["job0.py"]
    assert "jobwarden" not in result.stderr


def test_a_broken_py_dir_never_breaks_the_job(job: Job) -> None:
    job.py_dir.write_text("a file where the hooks expect a folder")
    result = job.run(LOCK_HOLDER + FORK_PLAIN)
    assert json.loads(result.stdout)["status"] == 0
    ours = [line for line in result.stderr.splitlines() if line.startswith("jobwarden:")]
    assert 1 <= len(ours) <= 2, result.stderr  # one line at most per process: parent and child


IMPORTED = """
    import sys
    heavy = ("json", "re", "threading", "typing", "multiprocessing", "ctypes", "importlib.util", "traceback")
    print(" ".join(m for m in heavy if m in sys.modules))
"""


def test_the_hooks_import_nothing_heavy(job: Job) -> None:
    baseline = set(job.run(IMPORTED, env=job.base).stdout.split())
    hooked = set(job.run(IMPORTED, env=job.env("spawn")).stdout.split())
    yama = Path("/proc/sys/kernel/yama/ptrace_scope")
    declared = {"ctypes"} if yama.exists() and yama.read_text().strip() == "1" else set()  # for the prctl
    assert hooked - baseline <= declared
    # the next processes load it compiled
    assert list((job.py_dir / ".cache").glob("_jobwarden_hooks.cpython-*.code"))


SETS_THE_FAULT_SIGNAL = """
    import json, os, signal, sys
    sig = int(os.environ["JOBWARDEN_FAULT_SIGNAL"])
    path = os.path.join(os.environ["JOBWARDEN_PY_DIR"], "%d.json" % os.getpid())
    before = json.load(open(path))
    try:
        signal.signal(signal.SIGKILL, signal.SIG_IGN)
    except OSError as err:  # raised as without the hooks
        refused = err.errno
    previous = signal.signal(sig, signal.SIG_IGN)  # returned as without the hooks
    after = json.load(open(path))
    same = previous is signal.SIG_DFL  # the enum member, as signal.signal returns it without the hooks
    print(json.dumps({"before": before, "after": after, "refused": refused, "previous_is_dfl": same}))
"""


def test_a_job_that_sets_the_fault_signal_takes_it_back_from_the_advert(job: Job) -> None:
    said = json.loads(job.run(SETS_THE_FAULT_SIGNAL).stdout)
    assert said["before"]["fault_signal"] == FAULT_SIGNAL and said["before"]["fault_withdrawn"] is None
    assert said["after"]["fault_signal"] == 0 and said["after"]["fault_fd"] is None
    assert said["after"]["fault_withdrawn"] == f"the job set signal {FAULT_SIGNAL} to SIG_IGN"
    assert said["refused"] == 22 and said["previous_is_dfl"]  # EINVAL, as without the hooks


def test_without_bytecode_writes_the_first_process_caches_sitecustomize(job: Job) -> None:
    """PYTHONDONTWRITEBYTECODE (common in containers) made Python compile sitecustomize at every start of
    every process: the first process of a run writes its bytecode, where jobwarden's folder is writable,
    and the hooks' own, without the __future__ import (a file read at each start)."""
    site = job.tmp / "site"
    shutil.copytree(SITE_DIR, site, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**job.env(), "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    job.run("pass", env=env)
    (pyc,) = (site / "__pycache__").glob("sitecustomize.*.pyc")
    said = job.run(
        """
        import sys
        print(sys.modules["sitecustomize"].__cached__, "__future__" in sys.modules)
        """,
        env=env,
    )
    assert said.stdout.split() == [str(pyc), "False"]
    assert (job.py_dir / ".cache").is_dir()

    os.utime(site / "sitecustomize.py", (1, 1))  # edited since: the bytecode is stale, and rewritten
    job.run("pass", env={**env, "JOBWARDEN_PY_DIR": str(job.tmp / "py2")})  # the next run's first process
    assert pyc.read_bytes()[8:12] == (1).to_bytes(4, "little")


def test_an_advert_outlives_an_exec_but_may_signal_knows(job: Job) -> None:
    # The fault signal would kill it: after exec() the handler is gone, while the advert stays.
    proc = job.start("""
        import os
        os.execv("/bin/sh", ["sh", "-c", "echo exec-ed; read line"])
    """)
    assert read_line(proc) == "exec-ed\n"
    advert = read_adverts(job.py_dir)[proc.pid]
    assert ProcFS().identity_matches(advert.pid, advert.start_time)
    assert not may_signal(advert, ProcFS())
    assert proc.stdin is not None
    proc.stdin.write(b"\n")
    proc.stdin.flush()
    assert proc.wait(TIMEOUT_S) == 0


# --- PyTorch's flight recorder ---------------------------------------------------------------------------


def test_a_rank_serves_its_flight_recorder_and_a_forked_child_does_not(tmp_path: Path) -> None:
    # torch is in the test venv only: this interpreter alone
    runner = Job(Path(sys.executable), tmp_path)
    try:
        ran = runner.run(
            f"""
            import os, sys
            import torch, torch.distributed as dist

            dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
            dist.all_reduce(torch.ones(4))
            r, w = os.pipe()
            pid = os.fork()  # beside gloo's threads (native) and the hooks' recorder thread
            if pid == 0:
                os.write(w, str(len(sys._current_frames())).encode())
                os._exit(0)
            os.waitpid(pid, 0)
            print(os.getpid(), pid, os.read(r, 64).decode())
            dist.destroy_process_group()
            """
        )
    finally:
        runner.reap()
    parent, child, child_threads = (int(x) for x in ran.stdout.split())
    fifo = (runner.py_dir / f"{parent}.fr.req").lstat()
    assert stat.S_ISFIFO(fifo.st_mode) and stat.S_IMODE(fifo.st_mode) == 0o600
    assert not (runner.py_dir / f"{child}.fr.req").exists()  # the child joined no group of its own
    assert child_threads == 1  # fork copies only the forking thread: no recorder thread in the child
    assert read_forks(runner.py_dir) == []  # the hooks' own thread is not "another thread" of the job's
    assert "jobwarden: python hook" not in ran.stderr


LOADED_PARTS = """
    import sys
    hooks = sys.modules["_jobwarden_hooks"]
    print(sorted(hooks._loaded))
    import traceback
    print(sorted(hooks._loaded))
"""


def test_a_part_of_the_hooks_loads_only_when_a_process_needs_it(job: Job) -> None:
    """Start-up loads the hooks' core only (their code is most of their start-up cost); the records of
    exceptions come with `traceback`, compiled once a run like the core."""
    at_start, after = job.run(LOADED_PARTS).stdout.splitlines()
    assert at_start == "[]" and after == "['exceptions']"
    assert list((job.py_dir / ".cache").glob("_jobwarden_exceptions.cpython-*.code"))
