"""ProcFS and parse_stat against fake /proc trees built from captured files.

The stat lines below were captured from /proc on a Linux 6.x machine (52 fields, proc(5)) and are edited
field by field, so each tree reads like the real thing: a zombie, a D-state process, a kernel thread, a
command name holding ')' and spaces, a pid that vanished or was reused.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.osapi.procfs import ProcFS, ProcStat, StatCounters, parse_stat, parse_stat_counters

# `python -c ...` with a second thread, captured from /proc/self/stat and /proc/self/task/*/stat.
CAPTURED_PYTHON_STAT = (
    "4665 (python) R 4663 4663 3141 0 -1 4194304 1040 0 0 0 0 0 0 0 20 0 2 0 56071 88453120 2362 "
    "18446744073709551615 93904125730816 93904125731157 140723342896272 0 0 0 0 16781312 2 0 0 0 17 1 0 "
    "0 0 0 0 93904125742512 93904125743128 93904319655936 140723342899690 140723342899940 "
    "140723342899940 140723342901223 0\n"
)
CAPTURED_THREAD_STAT = (
    "4666 (python) S 4663 4663 3141 0 -1 4194368 3 0 0 0 0 0 0 0 20 0 2 0 56075 88453120 2362 "
    "18446744073709551615 93904125730816 93904125731157 140723342896272 0 0 0 0 16781312 2 1 0 0 -1 1 0 "
    "0 0 0 0 93904125742512 93904125743128 93904319655936 140723342899690 140723342899940 "
    "140723342899940 140723342901223 0\n"
)
# /proc/stat of the same machine, shortened to the lines around btime.
CAPTURED_PROC_STAT = (
    "cpu  3107 0 1574 105788 130 0 21 12 0 0\n"
    "cpu0 975 0 659 53645 6 0 5 4 0 0\n"
    "intr 123456 0 9 0 0\n"
    "ctxt 987654\n"
    "btime 1795299835\n"
    "processes 4700\n"
    "procs_running 1\n"
    "procs_blocked 0\n"
)
PF_KTHREAD = 0x00200000


def stat_line(
    pid: int,
    comm: str,
    state: str = "S",
    *,
    template: str = CAPTURED_PYTHON_STAT,
    **fields: int,
) -> str:
    """The captured template with pid, comm, state and any field set by proc(5) number: f4=ppid, ..."""
    _, _, tail = template.rpartition(")")
    values = tail.split()  # values[0] is field 3
    values[0] = state
    for name, value in fields.items():
        values[int(name.removeprefix("f")) - 3] = str(value)
    return f"{pid} ({comm}) {' '.join(values)}\n"


def add_process(
    root: Path,
    pid: int,
    stat: str,
    *,
    cmdline: bytes = b"",
    environ: bytes = b"",
    wchan: bytes | None = None,
    threads: dict[int, str] | None = None,
) -> Path:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(stat)
    (d / "cmdline").write_bytes(cmdline)
    (d / "environ").write_bytes(environ)
    if wchan is not None:
        (d / "wchan").write_bytes(wchan)
    task = d / "task"
    task.mkdir()
    for tid, text in (threads or {pid: stat}).items():
        (task / str(tid)).mkdir()
        (task / str(tid) / "stat").write_text(text)
    return d


@pytest.fixture
def root(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(CAPTURED_PROC_STAT)
    (proc / "self").symlink_to("4665")  # non-numeric entries are not pids
    (proc / "sys").mkdir()
    return proc


# --- parse_stat -------------------------------------------------------------------------------------


def test_the_captured_template_has_52_fields() -> None:
    head, _, tail = CAPTURED_PYTHON_STAT.rpartition(")")
    assert len(head.split(" (", 1)) + len(tail.split()) == 52


def test_parse_stat_reads_the_fields_by_proc5_number() -> None:
    st = parse_stat(CAPTURED_PYTHON_STAT)
    assert st == ProcStat(
        pid=4665,
        comm="python",
        state="R",
        ppid=4663,
        pgid=4663,
        sid=3141,
        utime=0,
        stime=0,
        start_time=56071,
        rss_pages=2362,
        exit_code=0,
        processor=1,
    )
    assert parse_stat_counters(CAPTURED_PYTHON_STAT) == StatCounters(majflt=0, num_threads=2, processor=1)


def test_parse_stat_cpu_ticks_add_user_and_system_time() -> None:
    st = parse_stat(stat_line(10, "busy", "R", f14=250, f15=50))
    assert (st.utime, st.stime, st.cpu_ticks) == (250, 50, 300)


@pytest.mark.parametrize(
    "comm",
    [
        "(my) proc)",  # ')' inside and at the end, and a space
        ") Z 1 1 1 (",  # looks like the fields that follow it
        "a (b",  # the separator " (" inside the name
        "tmux: server",
        "",
    ],
)
def test_parse_stat_splits_after_the_last_paren(comm: str) -> None:
    st = parse_stat(stat_line(4242, comm, "S", f4=1, f22=777))
    assert (st.pid, st.comm, st.state, st.ppid, st.start_time) == (4242, comm, "S", 1, 777)


def test_parse_stat_of_a_zombie_reads_its_wait_status() -> None:
    # Field 52 (exit_code, kernel >= 3.5) holds the wait status: 9 is "killed by SIGKILL".
    st = parse_stat(stat_line(4700, "python", "Z", f52=9))
    assert st.state == "Z"
    assert st.exit_code == 9
    assert os.WIFSIGNALED(st.exit_code) and os.WTERMSIG(st.exit_code) == 9


def test_parse_stat_of_an_exited_zombie_reads_its_exit_code() -> None:
    st = parse_stat(stat_line(4700, "python", "Z", f52=3 << 8))
    assert os.WIFEXITED(st.exit_code) and os.WEXITSTATUS(st.exit_code) == 3


def test_parse_stat_of_an_old_kernel_line_without_field_52() -> None:
    # Kernels before 3.5 write fewer fields; the exit code then reads as 0, not an IndexError.
    short = " ".join(CAPTURED_PYTHON_STAT.split()[:44])
    assert parse_stat(short).exit_code == 0


def test_parse_stat_of_the_live_proc_self() -> None:
    with open("/proc/self/stat") as fh:
        st = parse_stat(fh.read())
    assert st.pid == os.getpid()
    assert st.ppid == os.getppid()
    assert st.state in "RS"


# --- ProcFS: stat and cmdline -----------------------------------------------------------------------


def test_stat_of_a_normal_process(root: Path) -> None:
    add_process(root, 4665, CAPTURED_PYTHON_STAT, cmdline=b"python\0-c\0import time\0")
    st = ProcFS(root).stat(4665)
    assert (st.pid, st.comm, st.state, st.start_time) == (4665, "python", "R", 56071)


def test_cmdline_joins_arguments_with_spaces(root: Path) -> None:
    add_process(root, 4665, CAPTURED_PYTHON_STAT, cmdline=b"python\0train.py\0--lr\x000.1\0")
    assert ProcFS(root).cmdline(4665) == "python train.py --lr 0.1"


def test_cmdline_keeps_empty_arguments_in_the_middle(root: Path) -> None:
    add_process(root, 4665, CAPTURED_PYTHON_STAT, cmdline=b"printf\0%s\0\0x\0")
    assert ProcFS(root).cmdline(4665) == "printf %s  x"


def test_cmdline_replaces_undecodable_bytes(root: Path) -> None:
    add_process(root, 4665, CAPTURED_PYTHON_STAT, cmdline=b"cat\0caf\xe9.txt\0")
    assert ProcFS(root).cmdline(4665) == "cat caf\ufffd.txt"


def test_kernel_thread_has_no_cmdline_so_it_shows_as_bracketed_comm(root: Path) -> None:
    line = stat_line(57, "kworker/0:1-events", "I", f4=2, f5=0, f6=0, f9=PF_KTHREAD, f24=0)
    add_process(root, 57, line, cmdline=b"")
    procfs = ProcFS(root)
    assert procfs.cmdline(57) == "[kworker/0:1-events]"
    assert procfs.stat(57).ppid == 2


def test_zombie_has_no_cmdline_and_keeps_its_wait_status(root: Path) -> None:
    add_process(root, 4700, stat_line(4700, "python", "Z", f4=4665, f52=9), cmdline=b"")
    procfs = ProcFS(root)
    assert procfs.cmdline(4700) == "[python]"
    assert procfs.stat(4700).exit_code == 9


def test_command_name_with_parens_and_spaces_through_procfs(root: Path) -> None:
    add_process(root, 4242, stat_line(4242, "(my) proc)", "S"), cmdline=b"")
    procfs = ProcFS(root)
    assert procfs.stat(4242).comm == "(my) proc)"
    assert procfs.cmdline(4242) == "[(my) proc)]"


def test_d_state_process_and_its_wait_channel(root: Path) -> None:
    add_process(root, 5000, stat_line(5000, "python", "D"), cmdline=b"python\0", wchan=b"io_schedule")
    procfs = ProcFS(root)
    assert procfs.stat(5000).state == "D"
    assert procfs.wchan(5000) == "io_schedule"


def test_wchan_of_a_running_process_reads_0(root: Path) -> None:
    # A running task's wchan file is empty on some kernels and "0" on others: both read as "0".
    add_process(root, 5001, stat_line(5001, "a", "R"), wchan=b"")
    add_process(root, 5002, stat_line(5002, "b", "R"), wchan=b"0")
    procfs = ProcFS(root)
    assert procfs.wchan(5001) == procfs.wchan(5002) == "0"


def test_pids_lists_only_numeric_entries(root: Path) -> None:
    add_process(root, 1, stat_line(1, "init", "S", f4=0))
    add_process(root, 4665, CAPTURED_PYTHON_STAT)
    assert sorted(ProcFS(root).pids()) == [1, 4665]


def test_iter_stats_skips_processes_that_vanish_mid_scan(root: Path) -> None:
    add_process(root, 1, stat_line(1, "init", "S", f4=0))
    (root / "4700").mkdir()  # exited between listdir and open: no stat file
    empty = add_process(root, 4701, "x")
    (empty / "stat").write_text("")  # a read that raced the exit returns nothing
    assert [st.pid for st in ProcFS(root).iter_stats()] == [1]


# --- a vanished pid, and errors translated once ---------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.stat(999),
        lambda p: p.cmdline(999),
        lambda p: p.environ_has(999, {"A": "1"}),
        lambda p: p.wchan(999),
        lambda p: p.threads_in_state(999, "D"),
        lambda p: p.uid(999),
    ],
    ids=["stat", "cmdline", "environ_has", "wchan", "threads_in_state", "uid"],
)
def test_a_vanished_pid_raises_process_gone(root: Path, call: Callable[[ProcFS], object]) -> None:
    with pytest.raises(ProcessGone) as info:
        call(ProcFS(root))
    assert info.value.pid == 999


def test_an_empty_stat_file_means_the_process_is_gone(root: Path) -> None:
    add_process(root, 4700, "")
    with pytest.raises(ProcessGone):
        ProcFS(root).stat(4700)


class _FailingOpen:
    """Stands in for open() inside procfs: raises `err` for files named `name`, opens the rest."""

    def __init__(self, name: str, err: OSError) -> None:
        self.name, self.err = name, err

    def __call__(self, path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == self.name:
            raise self.err
        return open(path, *args, **kwargs)


@pytest.mark.parametrize(
    "err",
    [
        FileNotFoundError(errno.ENOENT, "No such file or directory"),  # its /proc dir went between calls
        ProcessLookupError(errno.ESRCH, "No such process"),  # it exited while the file was open
    ],
    ids=["ENOENT", "ESRCH"],
)
def test_a_process_exiting_mid_read_is_gone(
    root: Path, monkeypatch: pytest.MonkeyPatch, err: OSError
) -> None:
    add_process(root, 4665, CAPTURED_PYTHON_STAT)
    monkeypatch.setattr("jobwarden.osapi.procfs.open", _FailingOpen("stat", err), raising=False)
    with pytest.raises(ProcessGone) as info:
        ProcFS(root).stat(4665)
    assert isinstance(info.value.__cause__, OSError)


def test_permission_error_becomes_access_denied_with_a_remedy(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_process(root, 4665, CAPTURED_PYTHON_STAT, environ=b"SECRET_TOKEN=hunter2\0")
    denied = PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr("jobwarden.osapi.procfs.open", _FailingOpen("environ", denied), raising=False)
    with pytest.raises(AccessDenied) as info:
        ProcFS(root).environ_has(4665, {"SECRET_TOKEN": "hunter2"})
    assert info.value.pid == 4665
    assert info.value.remedy
    assert "hunter2" not in str(info.value)
    assert info.value.__cause__ is denied


def test_unreadable_cmdline_falls_back_to_comm(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Another user's process under hidepid / a hardened kernel: show its name, do not fail the listing.
    add_process(root, 4665, CAPTURED_PYTHON_STAT, cmdline=b"python\0secret-arg\0")
    denied = PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr("jobwarden.osapi.procfs.open", _FailingOpen("cmdline", denied), raising=False)
    assert ProcFS(root).cmdline(4665) == "[python]"


def test_unreadable_wchan_reads_as_unknown(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    add_process(root, 5000, stat_line(5000, "python", "D"), wchan=b"io_schedule")
    denied = PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr("jobwarden.osapi.procfs.open", _FailingOpen("wchan", denied), raising=False)
    assert ProcFS(root).wchan(5000) == "?"


# --- environ_has ----------------------------------------------------------------------------------

ENVIRON = (
    b"PATH=/usr/bin:/bin\0"
    b"JOBWARDEN_HOME=/home/ana/.local/state/jobwarden\0"
    b"JOBWARDEN_JOB_ID=7\0"
    b"JOBWARDEN_RUN=1\0"
    b"HF_TOKEN=hf_s3cr3t\0"
    b"OPTS=a=b=c\0"
)
MARKERS = {"JOBWARDEN_HOME": "/home/ana/.local/state/jobwarden", "JOBWARDEN_JOB_ID": "7"}


@pytest.fixture
def procfs_with_env(root: Path) -> ProcFS:
    add_process(root, 4665, CAPTURED_PYTHON_STAT, environ=ENVIRON)
    return ProcFS(root)


def test_environ_has_every_marker(procfs_with_env: ProcFS) -> None:
    assert procfs_with_env.environ_has(4665, MARKERS) is True
    assert procfs_with_env.environ_has(4665, {**MARKERS, "JOBWARDEN_RUN": "1"}) is True


def test_environ_has_values_containing_equals(procfs_with_env: ProcFS) -> None:
    assert procfs_with_env.environ_has(4665, {"OPTS": "a=b=c"}) is True


@pytest.mark.parametrize(
    "markers",
    [
        {**MARKERS, "JOBWARDEN_JOB_ID": "8"},  # another job
        {**MARKERS, "JOBWARDEN_JOB_ID": ""},
        {**MARKERS, "JOBWARDEN_RUN": "2"},  # an earlier run of the same job
        {"JOBWARDEN_JOB_ID": "77"},  # a prefix of a value is not the value
        {"JOBWARDEN_JOB": "7"},  # nor a prefix of a name
        {"JOBWARDEN_HOME": "/home/ana"},
        {"MISSING": "1"},
    ],
)
def test_environ_has_is_false_unless_every_marker_matches_exactly(
    procfs_with_env: ProcFS, markers: dict[str, str]
) -> None:
    assert procfs_with_env.environ_has(4665, markers) is False


def test_environ_has_returns_a_bool_never_the_environment(procfs_with_env: ProcFS) -> None:
    result = procfs_with_env.environ_has(4665, {"HF_TOKEN": "hf_s3cr3t"})
    assert type(result) is bool
    assert "hf_s3cr3t" not in repr(result)


def test_a_zombie_has_an_empty_environ_and_carries_no_markers(root: Path) -> None:
    add_process(root, 4700, stat_line(4700, "python", "Z"), environ=b"")
    assert ProcFS(root).environ_has(4700, MARKERS) is False


# --- threads_in_state -----------------------------------------------------------------------------


def test_threads_in_state_finds_the_blocked_threads(root: Path) -> None:
    threads = {
        5000: stat_line(5000, "python", "S", template=CAPTURED_THREAD_STAT),
        5001: stat_line(5001, "pt_data_worker", "D", template=CAPTURED_THREAD_STAT),
        5002: stat_line(5002, "pt_autograd_0", "R", template=CAPTURED_THREAD_STAT),
        5003: stat_line(5003, "nccl (io) thr", "D", template=CAPTURED_THREAD_STAT),
    }
    add_process(root, 5000, threads[5000], threads=threads)
    procfs = ProcFS(root)
    assert sorted(procfs.threads_in_state(5000, "D")) == [5001, 5003]
    assert sorted(procfs.threads_in_state(5000, "DR")) == [5001, 5002, 5003]
    assert procfs.threads_in_state(5000, "Z") == []


def test_threads_in_state_skips_a_thread_that_exited_mid_scan(root: Path) -> None:
    threads = {
        5000: stat_line(5000, "python", "D", template=CAPTURED_THREAD_STAT),
        5001: stat_line(5001, "worker", "D", template=CAPTURED_THREAD_STAT),
    }
    d = add_process(root, 5000, threads[5000], threads=threads)
    (d / "task" / "5001" / "stat").unlink()
    assert ProcFS(root).threads_in_state(5000, "D") == [5000]


# --- identity -------------------------------------------------------------------------------------


def test_identity_matches_the_same_process(root: Path) -> None:
    add_process(root, 4665, CAPTURED_PYTHON_STAT)
    assert ProcFS(root).identity_matches(4665, 56071) is True


def test_identity_rejects_a_reused_pid(root: Path) -> None:
    # pid 4665 came round again: same number, later start time.
    add_process(root, 4665, stat_line(4665, "bash", "S", f22=990001))
    assert ProcFS(root).identity_matches(4665, 56071) is False


def test_identity_rejects_a_zombie_of_the_same_process(root: Path) -> None:
    add_process(root, 4665, stat_line(4665, "python", "Z", f22=56071, f52=9))
    assert ProcFS(root).identity_matches(4665, 56071) is False


def test_identity_rejects_a_dead_task(root: Path) -> None:
    add_process(root, 4665, stat_line(4665, "python", "X", f22=56071))
    assert ProcFS(root).identity_matches(4665, 56071) is False


def test_identity_of_a_vanished_pid_is_false_not_an_error(root: Path) -> None:
    assert ProcFS(root).identity_matches(4665, 56071) is False


def test_identity_of_an_unreadable_process_is_false(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    add_process(root, 4665, CAPTURED_PYTHON_STAT)
    denied = PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr("jobwarden.osapi.procfs.open", _FailingOpen("stat", denied), raising=False)
    assert ProcFS(root).identity_matches(4665, 56071) is False


def test_identity_of_this_process_on_the_live_proc() -> None:
    procfs = ProcFS()
    me = procfs.stat(os.getpid())
    assert procfs.identity_matches(os.getpid(), me.start_time) is True
    assert procfs.identity_matches(os.getpid(), me.start_time + 1) is False


# --- boot time and uid ----------------------------------------------------------------------------


def test_boot_time_reads_btime(root: Path) -> None:
    assert ProcFS(root).boot_time() == 1795299835.0


def test_boot_time_without_btime_is_an_error(root: Path) -> None:
    (root / "stat").write_text("cpu  1 2 3 4\nctxt 5\n")
    with pytest.raises(OSError, match="btime"):
        ProcFS(root).boot_time()


def test_uid_is_the_owner_of_the_pid_directory(root: Path) -> None:
    d = add_process(root, 4665, CAPTURED_PYTHON_STAT)
    assert ProcFS(root).uid(4665) == d.stat().st_uid


def test_io_chars_sums_rchar_and_wchar_of_a_real_process() -> None:
    procfs = ProcFS()
    before = procfs.io_chars(os.getpid())
    assert before is not None
    with open(os.devnull, "wb") as sink:
        sink.write(b"x" * 100_000)
    after = procfs.io_chars(os.getpid())
    assert after is not None and after - before >= 100_000


def test_thread_states_lists_every_thread() -> None:
    import threading

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        states = ProcFS().thread_states(os.getpid())
        assert len(states) >= 2 and all(s in "RSDT" for s in states)
    finally:
        stop.set()
        worker.join()


def test_exe_name_of_this_interpreter() -> None:
    name = ProcFS().exe_name(os.getpid())
    assert name is not None and name.startswith("python")
