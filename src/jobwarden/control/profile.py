"""`jobwarden profile JOB`: a sampled profile of every process of a running job (DataLoader workers and
ranks included), stored with the run; `explain` and the job page show the newest.

The rate, when not given, is chosen from the job's thread count so that the profile costs the job at most
a few percent: py-spy's work per sample grows with every thread of every process it reads (measured here
without pausing: ~0.3 ms a sample for a 2-thread process, ~6-8 ms for a 66-thread one, almost all of it
system time reading /proc and the target's memory; research/slowness.md §5.3 has the blocking figures:
2.4x slower at 65 threads and 100 Hz). scripts/bench-profile measures the job's slowdown at the rate
chosen, on a 1-thread and a 64-thread process.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobwarden import config
from jobwarden.clock import SystemClock, iso
from jobwarden.errors import JobwardenError, UsageError
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes import profiledata, pyspy, pyspyrecord
from jobwarden.probes.stackbase import CaptureError, Failure, ptrace_denied_help
from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store import profiles as stored_profiles

DEFAULT_DURATION_S = 10.0
MAX_DURATION_S = 300.0  # py-spy holds every sample in memory until the end: minutes, not hours
MAX_RATE_HZ = 100  # py-spy's default; more says nothing more of a training step
# py-spy's CPU per sample, measured on this kind of machine without pausing (scripts/bench-profile)
COST_PER_PROCESS_S = 300e-6
COST_PER_THREAD_S = 120e-6  # py-spy's reads, and the state sampler's
# of the CPUs the job may use: what a job that uses them all loses to py-spy's reads, about 1.5 % (with
# about as much again lost per CPU-second it keeps: scripts/bench-profile), within the 5 % goal
BUDGET_SHARE = 0.015
TRIGGERS = ("cli", "auto")


@dataclass(frozen=True)
class RateChoice:
    rate_hz: int
    threads: int
    processes: int
    cpus: int
    note: str | None = None  # when even the lowest rate costs more than the budget

    @property
    def cost_share(self) -> float:
        """The share of the job's CPUs the profile is expected to take."""
        per_sample = self.processes * COST_PER_PROCESS_S + self.threads * COST_PER_THREAD_S
        return self.rate_hz * per_sample / max(1, self.cpus)


def choose_rate(threads: int, processes: int, cpus: int) -> RateChoice:
    """The highest rate (1..100 Hz) at which py-spy's reads stay within BUDGET_SHARE of the job's CPUs."""
    per_sample = max(1, processes) * COST_PER_PROCESS_S + max(1, threads) * COST_PER_THREAD_S
    budget = BUDGET_SHARE * max(1, cpus)
    rate = min(MAX_RATE_HZ, math.floor(budget / per_sample))
    choice = RateChoice(max(1, rate), threads, processes, cpus)
    if rate < 1:
        return RateChoice(
            1,
            threads,
            processes,
            cpus,
            f"{threads} threads in {processes} processes: even 1 sample a second costs the job about "
            f"{choice.cost_share:.0%} of its CPUs",
        )
    return choice


def parse_rate(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        rate = int(text.strip())
    except ValueError:
        raise UsageError(f"--rate: bad rate {text!r}", "give samples per second, e.g. --rate 20") from None
    if not 1 <= rate <= MAX_RATE_HZ:
        raise UsageError(f"--rate: {rate} is not within 1..{MAX_RATE_HZ} Hz", "e.g. --rate 20")
    return rate


def parse_profile_duration(text: str | None) -> int:
    """--duration as whole seconds (py-spy records whole seconds): at least 1, at most MAX_DURATION_S."""
    if text is None:
        return int(DEFAULT_DURATION_S)
    seconds = config.parse_duration(text, "--duration")
    if seconds > MAX_DURATION_S:
        raise UsageError(
            f"--duration: {text!r} is longer than {config.format_duration(MAX_DURATION_S)}",
            "a profile of a few tens of seconds shows a training step many times over; e.g. --duration 30s",
        )
    return max(1, math.ceil(seconds))


@dataclass
class ProfileResult:
    job: JobRecord
    run: RunRecord
    at: float
    trigger: str
    duration_s: int
    rate_hz: int
    summary: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    path: Path | None = None

    def to_json(self) -> dict[str, Any]:
        return self.summary


def profile_job(
    home: Path,
    procfs: ProcFS,
    job_ref: str,
    *,
    duration_s: int = int(DEFAULT_DURATION_S),
    rate_hz: int | None = None,
    run_n: int | None = None,
    trigger: str = "cli",
) -> ProfileResult:
    from jobwarden.control.dump import _live_pids
    from jobwarden.control.views.joblist import refresh

    with Store(home) as store:
        job = store.job(job_ref)
        run = refresh(store, procfs, job, store.run(job.id, run_n))
        pids = _live_pids(store, procfs, job, run)
        layout = store.layout
    if run.state.is_ended:
        raise JobwardenError(
            f"job {job.id} is {run.state}: there is no process of it left to profile",
            f"profile a running job; `jobwarden explain {job.id}` tells how this one ended",
        )
    if not pids:
        raise JobwardenError(
            f"job {job.id} is {run.state}: none of its processes runs right now",
            f"profile it once it runs (`jobwarden status {job.id}`)",
        )
    binary = pyspy.find_py_spy()
    if binary is None:
        raise JobwardenError(pyspy.missing_message(), "profiles are sampled by py-spy")
    commands = _commands(procfs, pids)
    choice = choose_rate(_threads(procfs, pids), len(pids), _cpus(pids[0]))
    rate = rate_hz or choice.rate_hz
    at = SystemClock().wall()
    folder = stored_profiles.profiles_dir(layout, job.id, run.n)
    with Store(home) as store:
        store.make_run_dir(job.id, run.n)
    from jobwarden.paths import ensure_private_dir

    ensure_private_dir(folder)
    work = Path(tempfile.mkdtemp(prefix=".record-", dir=folder))
    try:
        recording = pyspyrecord.record(binary, pids, rate, duration_s, procfs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failures = [f for _, f in recording.failures]
    if not recording.speedscope:
        raise _failed(job, procfs, failures, pids)
    profile = profiledata.Profile()
    for pid, data in recording.speedscope:
        try:
            profiledata.from_speedscope(data, profile, pid)
        except profiledata.ProfileFormatError as err:
            raise JobwardenError(f"py-spy's profile could not be read: {err}", "report it") from err
    profiledata.add_io_waits(profile, recording.io_waits, 1.0 / rate)
    notes = list(recording.notes)
    if rate_hz is None and choice.note:
        notes.append(choice.note)
    notes += [
        f"process {pid} could not be profiled: {f.message}"
        for pid, f in recording.failures
        if f.kind not in (Failure.NOT_PYTHON, Failure.GONE)  # a shell wrapper, a worker that ended
    ]
    if recording.left_out:
        notes.append(f"{recording.left_out} processes left out: at most {pyspyrecord.MAX_RECORDS} at once")
    if profile.seconds <= 0:
        notes.append("no thread ran or waited on I/O while it was sampled: the job was idle")
    summary = {
        "id": job.id,
        "run": run.n,
        "at": iso(at),
        "trigger": trigger,
        "duration_s": duration_s,
        "rate_hz": rate,
        **profiledata.summary(profile, commands, rate),
        "io_wait_fraction": _io_share(profile),
        "notes": notes,
    }
    speedscope = json.dumps(
        profile.to_speedscope(f"job {job.id} run {run.n} ({duration_s}s at {rate} Hz)"), separators=(",", ":")
    ).encode()
    try:
        saved = stored_profiles.save(layout, job.id, run.n, int(at * 1000), trigger, speedscope, summary)
    except stored_profiles.ProfileTooLarge as err:
        raise JobwardenError(f"the profile is too large to keep: {err}", "profile for less time") from err
    return ProfileResult(job, run, at, trigger, duration_s, rate, summary, notes, saved.speedscope_path)


def _io_share(profile: profiledata.Profile) -> float:
    total = profile.seconds
    if total <= 0:
        return 0.0
    waited = sum(
        w
        for t in profile.threads.values()
        for stack, w in zip(t.stacks, t.weights, strict=True)
        if stack and profile.frames[stack[-1]].function == profiledata.IO_WAIT
    )
    return round(waited / total, 4)


def _failed(job: JobRecord, procfs: ProcFS, failures: list[CaptureError], pids: list[int]) -> JobwardenError:
    kinds = {f.kind for f in failures}
    if Failure.DENIED in kinds:
        return JobwardenError(f"cannot profile job {job.id}: {ptrace_denied_help(procfs, pids[0])}")
    if Failure.UNAVAILABLE in kinds:
        return JobwardenError(pyspy.missing_message())
    if kinds <= {Failure.NOT_PYTHON, Failure.GONE} and Failure.NOT_PYTHON in kinds:
        return JobwardenError(
            f"job {job.id} runs no Python process: py-spy profiles Python code",
            "for native code use `perf record -g -p PID`",
        )
    if Failure.GONE in kinds:
        return JobwardenError(f"job {job.id} ended while it was being profiled", "nothing was stored")
    detail = "; ".join(f.message for f in failures) or "no profile came back"
    return JobwardenError(f"could not profile job {job.id}: {detail}")


def _threads(procfs: ProcFS, pids: list[int]) -> int:
    count = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            count += len(os.listdir(procfs.root / str(pid) / "task"))
    return count


def _cpus(pid: int) -> int:
    try:
        return len(os.sched_getaffinity(pid))
    except OSError:
        return os.cpu_count() or 1


def _commands(procfs: ProcFS, pids: list[int]) -> dict[int, str]:
    found = {}
    for pid in pids:
        with contextlib.suppress(JobwardenError):
            found[pid] = procfs.cmdline(pid)[:200]
    return found


def newest_summary(home: Path, job_id: int, run: int) -> dict[str, Any] | None:
    """The newest stored profile's summary of the run, or None."""
    with Store(home) as store:
        found = stored_profiles.newest(store.layout, job_id, run)
    return found.summary() if found else None


def newest_speedscope(home: Path, job_id: int, run: int) -> bytes | None:
    with Store(home) as store:
        found = stored_profiles.newest(store.layout, job_id, run)
    return found.speedscope_bytes() if found else None
