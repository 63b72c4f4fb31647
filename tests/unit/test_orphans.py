"""Finding strays against a fake /proc and a real store: which processes are listed, with which reason,
and which never are (a live job's, an unmarked one, another store's, a zombie, a reused pid)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobwarden.control.orphans import StrayFinder, self_and_ancestors, stray_reason
from jobwarden.model import JobSpec, JobState, ProcessSnapshot
from jobwarden.observations import GpuProcess
from jobwarden.osapi.procfs import ProcFS
from jobwarden.store import Store
from tests.support import unavailable
from tests.unit.test_procfs import CAPTURED_PROC_STAT, add_process, stat_line

NOW = 1_800_000_000.0
SHIM, SHIM_START = 500, 9000


@pytest.fixture
def root(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(CAPTURED_PROC_STAT)
    add_process(proc, 1, stat_line(1, "init", f4=0, f5=1, f6=1, f22=1), cmdline=b"/sbin/init\0")
    return proc


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(tmp_path / "home") as s:
        yield s


def new_job(store: Store, state: JobState, **run: object) -> int:
    job_id, n = store.create_job(JobSpec(("python", "train.py"), "/tmp", "train.py"), {}, NOW - 10_000)
    store.update_run(job_id, n, state=state, **run)
    return job_id


def marker(store: Store, job: int, run: int | None = 1, home: str | None = None) -> bytes:
    pairs = [f"JOBWARDEN_HOME={home or store.layout.home}", f"JOBWARDEN_JOB_ID={job}", "PATH=/usr/bin"]
    if run is not None:
        pairs.append(f"JOBWARDEN_RUN={run}")
    return ("\0".join(pairs) + "\0").encode()


def proc(
    root: Path,
    pid: int,
    *,
    ppid: int = 1,
    start: int = 1000,
    state: str = "S",
    environ: bytes = b"",
    comm: str = "python",
    pgid: int | None = None,
    opened: tuple[str, ...] = ("/dev/null", "/dev/nvidia0", "/dev/nvidiactl"),
) -> None:
    stat = stat_line(pid, comm, state, f4=ppid, f5=pgid or pid, f6=pgid or pid, f22=start)
    d = add_process(root, pid, stat, cmdline=f"{comm} {pid}\0".encode(), environ=environ)
    (d / "fd").mkdir()
    for fd, path in enumerate(opened):
        (d / "fd" / str(fd)).symlink_to(path)


def find(
    store: Store,
    root: Path,
    gpu: list[GpuProcess] | None = None,
    exclude: tuple[int, ...] = (),
    host_pids: bool = True,
) -> dict[int, str]:
    strays = StrayFinder(store, ProcFS(root), NOW, exclude, host_pids).find(gpu or [])
    return {s.pid: s.reason for s in strays}


# --- the reason of a run ------------------------------------------------------------------------------


def test_reason_of_an_ended_run_says_when_and_how(store: Store) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 7200)
    job, run = store.job(job_id), store.run(job_id)
    assert stray_reason(job_id, 1, job, run, NOW) == f"job {job_id} run 1 ended 2h00m ago (failed)"


def test_reason_of_a_removed_job_and_of_a_lost_run(store: Store) -> None:
    assert stray_reason(12, 1, None, None, NOW) == "job 12 was removed"
    job_id = new_job(store, JobState.LOST)
    assert (
        stray_reason(job_id, 1, store.job(job_id), store.run(job_id), NOW)
        == f"supervisor of job {job_id} died"
    )


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.STARTING, JobState.STOPPING, JobState.QUEUED])
def test_a_live_run_gives_no_reason(store: Store, state: JobState) -> None:
    job_id = new_job(store, state)
    assert stray_reason(job_id, 1, store.job(job_id), store.run(job_id), NOW) is None


# --- marked processes ---------------------------------------------------------------------------------


def test_a_marked_process_of_an_ended_run_is_listed(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.SUCCEEDED, ended_at=NOW - 90)
    proc(root, 40, environ=marker(store, job_id))
    assert find(store, root) == {40: f"job {job_id} run 1 ended 1m30s ago (succeeded)"}


def test_a_marked_process_of_a_removed_job_is_listed(store: Store, root: Path) -> None:
    proc(root, 40, environ=marker(store, 77))
    assert find(store, root) == {40: "job 77 was removed"}


def test_a_process_of_a_live_run_with_its_shim_alive_is_not_listed(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.RUNNING, shim_pid=SHIM, shim_start=SHIM_START)
    proc(root, SHIM, start=SHIM_START)
    proc(root, 40, ppid=SHIM, environ=marker(store, job_id))
    assert find(store, root) == {}


def test_a_process_whose_shim_died_is_listed_and_the_run_is_marked_lost(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.RUNNING, shim_pid=SHIM, shim_start=SHIM_START)
    proc(root, SHIM, start=SHIM_START + 1)  # the shim's pid now names another process
    proc(root, 40, environ=marker(store, job_id))
    assert find(store, root) == {40: f"supervisor of job {job_id} died"}
    assert store.run(job_id).state == JobState.LOST


def test_the_old_run_of_a_restarted_job_is_judged_on_its_own(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 60)
    run2 = store.new_run(job_id, JobState.RUNNING, NOW - 50)
    store.update_run(job_id, run2, shim_pid=SHIM, shim_start=SHIM_START)
    proc(root, SHIM, start=SHIM_START)
    proc(root, 40, environ=marker(store, job_id, run=1))
    proc(root, 41, ppid=SHIM, environ=marker(store, job_id, run=run2))
    assert find(store, root) == {40: f"job {job_id} run 1 ended 1m00s ago (failed)"}


def test_a_marked_process_started_by_a_live_process_outside_the_job_is_not_its(
    store: Store, root: Path
) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 1)
    proc(root, 30, comm="bash")  # a user's shell: alive, not the job's
    proc(root, 40, ppid=30, environ=marker(store, job_id))  # it copied the job's variables
    proc(root, 41, ppid=40, environ=marker(store, job_id))  # and its child inherited them
    assert find(store, root) == {}


def test_a_marked_process_whose_marked_parent_was_adopted_is_the_jobs(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 1)
    proc(root, 40, ppid=1, environ=marker(store, job_id))  # the leftover, adopted by init
    proc(root, 41, ppid=40, environ=marker(store, job_id))  # its child
    proc(root, 50, comm="systemd")  # a user's systemd: a subreaper
    proc(root, 42, ppid=50, environ=marker(store, job_id))
    reason = f"job {job_id} run 1 ended 1s ago (failed)"
    assert find(store, root) == {40: reason, 41: reason, 42: reason}


def test_unmarked_zombie_and_foreign_processes_are_never_listed(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 60)
    proc(root, 40)  # no marker
    proc(root, 41, state="Z", environ=marker(store, job_id))  # a zombie cannot be ended, only reaped
    proc(root, 42, environ=marker(store, job_id, home="/home/someone/.local/state/jobwarden"))
    proc(root, 43, environ=b"JOBWARDEN_JOB_ID=1\0")  # no home: not ours to judge
    proc(root, 44, environ=marker(store, job_id).replace(b"JOB_ID=1", b"JOB_ID=x"))
    assert find(store, root) == {}


def test_excluded_pids_are_not_listed(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 60)
    proc(root, 40, environ=marker(store, job_id))
    assert find(store, root, exclude=(40,)) == {}


def test_a_marker_through_a_symlinked_home_is_ours(store: Store, root: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(store.layout.home)
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 60)
    proc(root, 40, environ=marker(store, job_id, home=str(link)))
    assert list(find(store, root)) == [40]


def test_a_stray_carries_what_the_table_shows(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 60)
    proc(root, 40, ppid=1, start=2500, pgid=40, environ=marker(store, job_id))
    (stray,) = StrayFinder(store, ProcFS(root), NOW).find()
    data = stray.to_json(NOW)
    assert {k: data[k] for k in ("pid", "job", "run", "job_name", "ppid", "pgid", "start_time")} == {
        "pid": 40,
        "job": job_id,
        "run": 1,
        "job_name": "train.py",
        "ppid": 1,
        "pgid": 40,
        "start_time": 2500,
    }
    assert data["command"] == "python 40"
    assert data["user"] and data["reason"]
    boot = 1795299835  # btime of the captured /proc/stat
    assert stray.started_at == pytest.approx(boot + 2500 / ProcFS(root).ticks_per_s)


# --- recorded processes (another user's: no readable environment) --------------------------------------


def test_a_recorded_survivor_of_an_ended_run_is_listed_without_a_marker(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 60, pid=40, pid_start=1000)
    survivor = ProcessSnapshot(41, 40, 1100, "S", "sudo sleep", 0, None)
    store.record_tree(job_id, 1, NOW - 100, [survivor], [])
    proc(root, 41, start=1100)  # environ unreadable in real life (another user): empty here
    proc(root, 40, start=1234)  # the main pid was reused by another process: not ours
    assert find(store, root) == {41: f"job {job_id} run 1 ended 1m00s ago (failed)"}


def test_the_main_process_of_a_lost_run_is_listed_from_the_run_record(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.LOST, pid=40, pid_start=1000)
    proc(root, 40, start=1000)
    assert find(store, root) == {40: f"supervisor of job {job_id} died"}


# --- GPU holders --------------------------------------------------------------------------------------


def test_a_gpu_holder_reparented_to_init_is_listed_with_its_memory(store: Store, root: Path) -> None:
    proc(root, 60, ppid=1)
    gpu = [GpuProcess(0, 60, 5 << 30), GpuProcess(1, 60, 1 << 29)]
    (stray,) = StrayFinder(store, ProcFS(root), NOW).find(gpu)
    assert (stray.pid, stray.job, stray.gpu_memory_bytes, stray.gpus) == (
        60,
        None,
        (5 << 30) + (1 << 29),
        (0, 1),
    )
    assert "5.5G on GPU 0, 1" in stray.reason and "no live job" in stray.reason and "init" in stray.reason


def test_a_gpu_holder_adopted_by_a_user_manager_is_listed(store: Store, root: Path) -> None:
    proc(root, 30, comm="systemd")
    proc(root, 60, ppid=30)
    assert "systemd (pid 30)" in find(store, root, [GpuProcess(0, 60, None)])[60]


def test_gpu_holders_with_a_live_parent_or_of_a_live_job_are_not_listed(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.RUNNING, shim_pid=SHIM, shim_start=SHIM_START)
    proc(root, SHIM, start=SHIM_START)
    proc(root, 20, comm="bash")
    proc(root, 60, ppid=20)  # a notebook of a logged-in user: its parent still owns it
    proc(root, 61, ppid=1, environ=marker(store, job_id))  # a live job's process
    proc(root, 62, ppid=1, start=1500)  # recorded by a live run's shim (its environment was replaced)
    store.record_tree(job_id, 1, NOW, [ProcessSnapshot(62, 1, 1500, "S", "x", 0, None)], [])
    gpu = [GpuProcess(0, pid, 1 << 30) for pid in (60, 61, 62, 99)]  # 99: not visible here
    assert find(store, root, gpu) == {}


def test_in_a_container_a_gpu_pid_naming_a_process_without_a_gpu_open_is_not_listed(
    store: Store, root: Path
) -> None:
    # NVML reports host pids; in a container the same number may name an unrelated process here
    proc(root, 60, ppid=1, opened=("/dev/null", "/home/ana/data.bin"))
    proc(root, 61, ppid=1)  # this one has /dev/nvidia0 open: the holder NVML meant
    gpu = [GpuProcess(0, 60, 5 << 30), GpuProcess(0, 61, 1 << 30)]
    assert list(find(store, root, gpu, host_pids=False)) == [61]
    assert list(find(store, root, gpu, host_pids=True)) == [60, 61]


def test_a_graphics_only_gpu_process_is_never_a_stray(store: Store, root: Path) -> None:
    proc(root, 60, ppid=1, comm="Xorg")
    proc(root, 61, ppid=1)
    gpu = [GpuProcess(0, 60, 1 << 28, kind="graphics"), GpuProcess(0, 61, 1 << 30, kind="compute+graphics")]
    assert list(find(store, root, gpu)) == [61]


def test_a_marked_stray_holding_gpu_memory_gets_it_added(store: Store, root: Path) -> None:
    job_id = new_job(store, JobState.FAILED, ended_at=NOW - 60)
    proc(root, 40, ppid=77, environ=marker(store, job_id))
    (stray,) = StrayFinder(store, ProcFS(root), NOW).find([GpuProcess(2, 40, 1 << 30)])
    assert (stray.reason.startswith(f"job {job_id} run 1 ended"), stray.gpu_memory_bytes, stray.gpus) == (
        True,
        1 << 30,
        (2,),
    )


def test_self_and_ancestors_walks_up_to_init(root: Path) -> None:
    proc(root, 10, ppid=1)
    proc(root, 11, ppid=10)
    proc(root, 12, ppid=11)
    assert self_and_ancestors(ProcFS(root), 12) == {10, 11, 12}


# --- the command line ---------------------------------------------------------------------------------


def test_orphans_options_parse() -> None:
    from jobwarden.cli.main import build_parser

    args = build_parser().parse_args(["orphans", "--kill", "--grace", "2s", "--json"])
    assert (args.command, args.kill, args.grace, args.json) == ("orphans", True, "2s", True)
    assert build_parser().parse_args(["orphans"]).kill is False


def test_the_table_ends_with_what_to_do() -> None:
    from jobwarden.text.render import orphans_table

    row = {"pid": 40, "user": "ana", "command": "python\ntrain.py", "reason": "supervisor of job 3 died"}
    lines = list(orphans_table([{**row, "job": 3, "run": 1, "age_s": 7200.0, "rss_bytes": 1 << 20}]))
    assert lines[0].split() == ["PID", "USER", "AGE", "RSS", "GPU", "MEM", "JOB/RUN", "REASON", "COMMAND"]
    assert lines[1].split()[:5] == ["40", "ana", "2h00m", "1.0M", "-"] and "python train.py" in lines[1]
    assert lines[-2] == "job 3 lost its supervisor; to keep it running instead: jobwarden adopt 3"
    assert lines[-1] == "1 stray process(es). End them with: jobwarden orphans --kill"
    assert next(orphans_table([])).startswith("no strays")


def test_a_marked_process_started_after_its_run_ended_is_not_the_runs(store: Store, root: Path) -> None:
    # anyone may copy the marker variables into a new process: one born after the end is not the job's
    job_id = new_job(store, JobState.SUCCEEDED, ended_at=NOW - 90)
    boot = 1795299835  # btime of CAPTURED_PROC_STAT; the clock ticks 100 times a second
    proc(root, 40, environ=marker(store, job_id), start=int((NOW - 80 - boot) * 100))
    proc(root, 41, environ=marker(store, job_id), start=int((NOW - 95 - boot) * 100))
    assert set(find(store, root)) == {41}


def test_a_marked_process_of_another_user_is_found_only_by_its_recorded_identity(
    store: Store, root: Path
) -> None:
    if os.geteuid() != 0:
        unavailable("only root can give a file to another user")
    job_id = new_job(store, JobState.SUCCEEDED, ended_at=NOW - 90)
    proc(root, 40, environ=marker(store, job_id))
    os.chown(root / "40", 65534, 65534)
    assert find(store, root) == {}
