"""OomWatch against a fake /proc, fake cgroup directories and a saved kernel log that the tests append to.

Each test moves the counters the way the kernel does (mm/oom_kill.c bumps /proc/vmstat oom_kill and the
victim's memcg counter, then prints the lines) and checks what the watch concludes."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.observations import OomEvidence
from jobwarden.osapi.cgroup import JobCgroup
from jobwarden.probes.oom import OomBaseline, OomWatch, counters_before_start, read_vmstat_oom_kills

VMSTAT = "nr_free_pages 123\nnr_zone_inactive_anon 4\noom_kill {n}\nnuma_hit 9\n"
KILLED = "Memory cgroup out of memory: Killed process {pid} (python) total-vm:77276kB, anon-rss:66560kB"
GLOBAL_KILLED = "Out of memory: Killed process {pid} (python) total-vm:77276kB, anon-rss:66560kB"
SUMMARY = (
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg={memcg},"
    "task_memcg={memcg},task=python,pid={pid},uid=0"
)


class Machine:
    """A fake host: /proc (vmstat, mountinfo), a v1 memory mount, the kernel log."""

    def __init__(self, root: Path) -> None:
        self.proc = root / "proc"
        (self.proc / "self").mkdir(parents=True)
        self.memory = root / "memory"
        self.memory.mkdir()
        (self.proc / "self" / "mountinfo").write_text(
            f"35 31 0:32 / {self.memory} rw - cgroup cgroup rw,memory\n"
        )
        (self.proc / "self" / "cgroup").write_text("4:memory:/ctr\n")
        self.kmsg = root / "kmsg"
        self.kmsg.write_bytes(b"6,1,100,-;Linux version 6.18\n")
        self.seq = 1
        self.host_kills = 0
        self.set_vmstat(0)

    def set_vmstat(self, n: int) -> None:
        self.host_kills = n
        (self.proc / "vmstat").write_text(VMSTAT.format(n=n))

    def cgroup(self, rel: str, *, limit: int | None = None, peak: int = 0) -> JobCgroup:
        path = self.memory / rel
        path.mkdir(parents=True)
        (path / "cgroup.procs").write_text("")
        (path / "memory.limit_in_bytes").write_text(str(limit) if limit else "9223372036854771712")
        (path / "memory.usage_in_bytes").write_text("0")
        (path / "memory.max_usage_in_bytes").write_text(str(peak))
        self.set_kills(JobCgroup(path, 1), 0)
        return JobCgroup(path, 1)

    def set_kills(self, cgroup: JobCgroup, n: int) -> None:
        (cgroup.path / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n")

    def log(self, message: str, facility: int = 0) -> None:
        self.seq += 1
        with self.kmsg.open("ab") as fh:
            fh.write(f"{facility << 3 | 3},{self.seq},{self.seq * 1000},-;{message}\n".encode())

    def kill(self, pid: int, *, cgroup: JobCgroup | None = None, counted: JobCgroup | None = None) -> None:
        """The kernel's order: counters first (host, then the victim's memcg), then the log lines."""
        self.set_vmstat(self.host_kills + 1)
        if counted is not None:
            self.set_kills(counted, (counted.oom_kills() or 0) + 1)
        if cgroup is not None:
            self.log(SUMMARY.format(memcg="/" + cgroup.path.relative_to(self.memory).as_posix(), pid=pid))
            self.log(KILLED.format(pid=pid))
        else:
            self.log(GLOBAL_KILLED.format(pid=pid))

    def watch(self, cgroup: JobCgroup | None, enclosing: JobCgroup | None = None, **kw: Path) -> OomWatch:
        return OomWatch(cgroup, self.proc, enclosing=enclosing, kmsg_path=kw.get("kmsg", self.kmsg))


@pytest.fixture
def host(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


# --- the job's own cgroup: certain ----------------------------------------------------------------


def test_nothing_happened(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    assert watch.certain
    assert watch.poll([100]) is None


def test_a_kill_in_the_jobs_cgroup(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20, peak=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    host.kill(101, cgroup=job, counted=job)
    evidence = watch.poll([100, 101])
    assert evidence is not None
    assert (evidence.mechanism, evidence.kills, evidence.victims) == ("cgroup-v1", 1, (101,))
    assert (evidence.limit_bytes, evidence.peak_bytes) == (64 << 20, 64 << 20)
    assert len(evidence.kernel_lines) == 2 and "Killed process 101" in evidence.kernel_lines[1]


def test_the_victim_is_known_by_its_cgroup_even_when_its_pid_never_was(host: Machine) -> None:
    # a pool worker born and killed between two scans: the shim never saw its pid
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    host.kill(555, cgroup=job, counted=job)
    evidence = watch.poll([100])
    assert evidence is not None and evidence.victims == (555,)


def test_counters_come_before_the_log_lines(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    host.set_kills(job, 1)  # counted, not printed yet
    first = watch.poll([101])
    assert first is not None and (first.kills, first.victims) == (1, ())
    host.log(KILLED.format(pid=101))
    second = watch.poll([101])
    assert second is not None and (second.kills, second.victims) == (1, (101,))


def test_kills_accumulate_since_the_baseline(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    host.set_kills(job, 4)  # an earlier run's kills in a reused cgroup
    watch = host.watch(job)
    watch.baseline()
    host.kill(101, cgroup=job, counted=job)
    host.kill(102, cgroup=job, counted=job)
    evidence = watch.poll([101, 102])
    assert evidence is not None and (evidence.kills, evidence.victims) == (2, (101, 102))
    assert watch.poll([101, 102]) == evidence  # the same answer until something changes


def test_a_kill_before_the_baseline_counts_in_a_cgroup_made_for_the_job(host: Machine) -> None:
    # the watches start once `run` has its answer: a job that allocates at once may be killed before
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    host.kill(101, cgroup=job, counted=job)
    watch = host.watch(job._replace(fresh=True))
    watch.baseline(fresh_cgroup=True)
    evidence = watch.poll([101])
    assert evidence is not None and evidence.kills == 1
    late = host.watch(job)
    late.baseline()  # a reused cgroup: what it counted before is not this run's
    assert late.poll([101]) is None


def test_a_kill_elsewhere_on_the_host_is_not_the_jobs(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    other = host.cgroup("other")
    watch = host.watch(job)
    watch.baseline()
    host.kill(900, cgroup=other, counted=other)
    assert watch.poll(None) is None  # even when asked for every victim: the job's counter did not move


def test_the_log_is_not_read_while_no_counter_moves(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    seq = watch.kernel_log.last_seq
    host.log("some driver chatter")
    assert watch.poll([100]) is None
    assert watch.kernel_log.last_seq == seq


def test_the_log_stops_being_read_once_the_victims_are_named(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    host.kill(101, cgroup=job, counted=job)
    watch.poll([101])
    seq = watch.kernel_log.last_seq
    host.log("later chatter")
    watch.poll([101])
    assert watch.kernel_log.last_seq == seq


def test_the_log_is_given_up_after_a_few_polls_without_the_lines(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    host.set_kills(job, 1)  # the lines never come (rate limited, or overwritten)
    for _ in range(10):
        watch.poll([101])
    seq = watch.kernel_log.last_seq
    host.log(KILLED.format(pid=101))
    evidence = watch.poll([101])
    assert watch.kernel_log.last_seq == seq
    assert evidence is not None and evidence.kills == 1


def test_a_job_cgroup_without_a_limit_names_the_enclosing_limit(host: Machine) -> None:
    ctr = host.cgroup("ctr", limit=1 << 30, peak=1 << 30)
    job = host.cgroup("ctr/jobwarden-1")  # no --mem-limit: the container's limit killed it
    watch = host.watch(job, enclosing=ctr)
    watch.baseline()
    host.kill(101, cgroup=job, counted=job)
    evidence = watch.poll([101])
    assert evidence is not None and (evidence.mechanism, evidence.limit_bytes) == ("cgroup-v1", 1 << 30)


def test_a_cgroup_path_seen_from_inside_a_cgroup_namespace(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    host.set_kills(job, 1)
    host.log(SUMMARY.format(memcg="/kubepods/pod1/ctr/jobwarden-1", pid=555))  # the kernel's full path
    evidence = watch.poll([100])
    assert evidence is not None and evidence.victims == (555,)


def test_a_forged_kill_line_is_ignored(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    watch = host.watch(job)
    watch.baseline()
    host.set_kills(job, 1)
    host.log(KILLED.format(pid=1), facility=1)  # `echo ... > /dev/kmsg` from a root process
    evidence = watch.poll(None)
    assert evidence is not None and evidence.victims == ()


# --- no cgroup of the job's own: the container's, then the host's ----------------------------------


def test_the_containers_limit_kills_a_job_without_a_cgroup(host: Machine) -> None:
    ctr = host.cgroup("ctr", limit=1 << 30, peak=1 << 30)
    watch = host.watch(None, enclosing=ctr)
    watch.baseline()
    assert not watch.certain
    host.kill(101, cgroup=ctr, counted=ctr)
    evidence = watch.poll([100, 101])
    assert evidence is not None
    assert (evidence.mechanism, evidence.kills, evidence.victims) == ("cgroup-v1", 1, (101,))
    assert evidence.limit_bytes == 1 << 30


def test_a_container_kill_before_a_late_baseline_counts_from_the_counters_read_before_the_start(
    host: Machine,
) -> None:
    # the job OOM-killed in its first second, the shim's baseline taken later (a loaded machine)
    ctr = host.cgroup("ctr", limit=150 << 20)
    before = counters_before_start(None, host.proc)
    host.kill(101, counted=ctr)
    late = host.watch(None, enclosing=ctr, kmsg=host.kmsg.parent / "absent")
    late.baseline()
    assert late.poll([101]) is None  # what happened before this fix: the kill was in the baseline
    watch = host.watch(None, enclosing=ctr, kmsg=host.kmsg.parent / "absent")
    watch.baseline(before=before)
    evidence = watch.poll([101])
    assert evidence is not None and (evidence.mechanism, evidence.kills) == ("cgroup-v1", 1)


def test_a_container_kill_the_log_pins_on_another_process_is_not_the_jobs(host: Machine) -> None:
    ctr = host.cgroup("ctr", limit=1 << 30)
    watch = host.watch(None, enclosing=ctr)
    watch.baseline()
    host.kill(777, cgroup=ctr, counted=ctr)
    assert watch.poll([100, 101]) is None
    assert watch.poll(None) is not None  # asked for every victim, it is one


def test_without_the_log_a_container_kill_is_reported_as_a_correlation(host: Machine) -> None:
    ctr = host.cgroup("ctr", limit=1 << 30)
    watch = host.watch(None, enclosing=ctr, kmsg=host.kmsg.parent / "absent")
    watch.baseline()
    assert watch.kernel_log.error is not None  # unreadable: victims are known only from exit statuses
    host.kill(777, cgroup=ctr, counted=ctr)
    evidence = watch.poll([100])
    assert evidence is not None and (evidence.mechanism, evidence.kills, evidence.victims) == (
        "cgroup-v1",
        1,
        (),
    )


def test_a_host_oom_of_a_job_process(host: Machine) -> None:
    watch = host.watch(None)
    watch.baseline()
    host.kill(101)
    evidence = watch.poll([100, 101])
    assert evidence == OomEvidence("host", 1, None, None, (101,), (GLOBAL_KILLED.format(pid=101),))


def test_a_host_oom_of_some_other_process(host: Machine) -> None:
    watch = host.watch(None)
    watch.baseline()
    host.kill(999)
    assert watch.poll([100, 101]) is None


def test_without_the_log_a_host_oom_is_reported_as_a_correlation(host: Machine) -> None:
    watch = host.watch(None, kmsg=host.kmsg.parent / "absent")
    watch.baseline()
    host.kill(999)
    host.kill(998)
    assert watch.poll([100]) == OomEvidence("host", 2)


def test_a_job_cgroup_that_counts_nothing_falls_back_to_the_host(host: Machine) -> None:
    # a v2 job cgroup without the memory controller has no memory.events
    bare = host.memory / "ctr" / "jobwarden-1"
    bare.mkdir(parents=True)
    watch = host.watch(JobCgroup(bare, 2))
    watch.baseline()
    assert not watch.certain
    host.kill(101)
    evidence = watch.poll([101])
    assert evidence is not None and (evidence.mechanism, evidence.victims) == ("host", (101,))


# --- a new shim continues the count -----------------------------------------------------------------


def test_a_restored_baseline_counts_what_happened_while_nobody_watched(host: Machine) -> None:
    job = host.cgroup("ctr/jobwarden-1", limit=64 << 20)
    first = host.watch(job)
    saved = OomBaseline.from_json(first.baseline().to_json())
    first.close()
    host.kill(101, cgroup=job, counted=job)  # the shim was dead
    second = host.watch(job)
    second.restore(saved)
    evidence = second.poll([101])
    assert evidence is not None and (evidence.kills, evidence.victims) == (1, (101,))
    second.close()


def test_the_baseline_round_trips_through_json() -> None:
    saved = OomBaseline(3, None, 17, 422)
    assert OomBaseline.from_json(saved.to_json()) == saved


# --- /proc/vmstat --------------------------------------------------------------------------------------


def test_vmstat_oom_kill(host: Machine) -> None:
    host.set_vmstat(12)
    assert read_vmstat_oom_kills(host.proc) == 12


def test_vmstat_with_oom_kill_on_the_first_line(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_text("oom_kill 5\nnuma_hit 1\n")
    assert read_vmstat_oom_kills(tmp_path) == 5


def test_vmstat_without_oom_kill(tmp_path: Path) -> None:
    (tmp_path / "vmstat").write_text("nr_free_pages 1\n")  # Linux < 4.13
    assert read_vmstat_oom_kills(tmp_path) is None
    assert read_vmstat_oom_kills(tmp_path / "absent") is None
