"""One shim, many attempts: run the job, and when an attempt ends, decide (rules.retry) whether to start
another after a backoff. Each attempt is its own run, with its own log, findings and JOBWARDEN_RUN.

Notifications go out from here and from the supervisor: failed, hung, recovered, restarted, succeeded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobwarden.clock import Clock, iso
from jobwarden.errors import StoreError
from jobwarden.model import EndReason, JobState
from jobwarden.osapi.procfs import ProcFS
from jobwarden.shim.record.recorder import log
from jobwarden.shim.run.jobos import JobOS
from jobwarden.shim.run.supervisor import Supervisor
from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store.logfiles import tail_lines

if TYPE_CHECKING:  # loaded once the first attempt runs: `run` waits for nothing it does not need
    from jobwarden.rules.retry import AttemptOutcome, RestartDecision, RestartPolicy
    from jobwarden.shim.record.notify import Notifier

NOTIFY_DRAIN_S = 10.0  # how long the shim waits at exit for notifications still in flight


def supervise_job(
    store: Store,
    job: JobRecord,
    run: int,
    clock: Clock,
    procfs: ProcFS,
    report_fd: int,
    mode: str,
    jobos: JobOS | None = None,
) -> int:
    notifier = _notifier(job)
    sup = Supervisor(store, job, run, clock, procfs, notifier, jobos)
    code = _begin(sup, mode, report_fd)
    # `run` refused the start and removes the job, or an adopt found nothing to take over (the command
    # was told why): nothing of it is this shim's to record, nor to restart
    if sup.state.refused or (mode != "launch" and code != 0):
        sup.close()
        return code
    from jobwarden.rules.retry import RestartPolicy, decide

    policy = RestartPolicy.from_options(job.options)
    # a restart carried on by `adopt` counts the attempts before it: --max-restarts and the same failure
    # twice judge the job's whole history, as its first shim would have
    history = _earlier_outcomes(store, job, run) if mode == "restart" else []
    while True:
        record = store.run(job.id, sup.state.run)
        history.append(outcome_of(store, job, record, sup.state.restart_after_hang))
        decision = decide(policy, history)
        if not decision.restart:
            sup.close()
            _conclude(store, job, record, decision, policy, notifier, clock)
            break
        ended, sup = sup, _next_attempt(store, job, record, decision, clock, procfs, notifier, jobos)
        sup.take_over_signals(ended)  # a signal as the attempt ended is the next attempt's to act on
        if not sup.wait_backoff(decision.delay_s):
            sup.end_before_start()
            break
        code = sup.launch(-1)
    if notifier:
        notifier.close(NOTIFY_DRAIN_S)
        from jobwarden.shim.record.notify import record_outcomes

        record_outcomes(store, job.id, notifier, log)  # the last event's delivery, said in `status`
    return code


def _begin(sup: Supervisor, mode: str, report_fd: int) -> int:
    """The first attempt this shim supervises: a new run (`launch`), the processes of a lost one
    (`adopt`), or the restart a lost shim was waiting to make (`restart`)."""
    if mode == "adopt":
        return sup.adopt(report_fd)
    if mode == "restart":
        return sup.carry_on_restart(report_fd)
    return sup.launch(report_fd)


def _earlier_outcomes(store: Store, job: JobRecord, run: int) -> list[AttemptOutcome]:
    hang_restart = job.options.on_hang == "restart"
    return [
        outcome_of(store, job, r, hang_restart and r.end_reason == EndReason.HUNG)
        for r in store.runs(job.id)
        if r.n < run
    ]


def _notifier(job: JobRecord) -> Notifier | None:
    if not (job.options.notify or job.options.on_event):
        return None
    from jobwarden.shim.record.notify import Notifier

    return Notifier.from_options(job.options, log)


def _next_attempt(
    store: Store,
    job: JobRecord,
    ended: RunRecord,
    decision: RestartDecision,
    clock: Clock,
    procfs: ProcFS,
    notifier: Notifier | None,
    jobos: JobOS | None,
) -> Supervisor:
    now = clock.wall()
    # failed -> (a new run) restarting: the shim stays, the next attempt waits out its backoff
    n = store.new_run(job.id, JobState.RESTARTING, now)
    sup = Supervisor(store, job, n, clock, procfs, notifier, jobos)
    store.update_run(job.id, n, shim_pid=sup.state.pid, shim_start=procfs.stat(sup.state.pid).start_time)
    store.add_event(
        job.id, n, "restarting", now, after_run=ended.n, delay_s=decision.delay_s, reason=decision.reason
    )
    log(f"run {ended.n} {decision.reason}")
    if notifier:  # "was restarted (now run 2)": `run` is the new run, `after_run` the one that ended
        payload = _payload("restarted", job, ended, store, run_n=n)
        notifier.deliver({**payload, "state": str(JobState.RESTARTING), "after_run": ended.n})
    return sup


def _conclude(
    store: Store,
    job: JobRecord,
    record: RunRecord,
    decision: RestartDecision,
    policy: RestartPolicy,
    notifier: Notifier | None,
    clock: Clock,
) -> None:
    """The last attempt: say why it was not restarted when a restart was asked for, and notify."""
    failed = record.state == JobState.FAILED
    hang_restart = record.end_reason == EndReason.HUNG and job.options.on_hang == "restart"
    if failed and (policy.mode != "no" or hang_restart):
        try:
            store.add_event(job.id, record.n, "not-restarted", clock.wall(), reason=decision.reason)
        except StoreError as err:
            log(f"cannot record why the run was not restarted: {err}")
    if notifier and record.state in (JobState.SUCCEEDED, JobState.FAILED):
        notifier.deliver(_payload(str(record.state), job, record, store))


def _payload(
    event: str, job: JobRecord, record: RunRecord, store: Store, run_n: int | None = None
) -> dict[str, object]:
    """The notification of `record`'s end (`run_n`: the run the event names, when another)."""
    from jobwarden.shim.record.notify import event_payload, job_page
    from jobwarden.verdict.explainer import findings_for  # the rules, only when someone listens

    cause = None
    if event != "succeeded":
        try:
            findings = findings_for(store, job, record)
            cause = findings[0] if findings else None
        except StoreError:
            pass
    return event_payload(
        event,
        job.id,
        job.name,
        run_n or record.n,
        str(record.state),
        record.exit_code,
        record.signal,
        cause.title if cause is not None else None,
        at=iso(record.ended_at) if record.ended_at is not None else None,
        page=job_page(job.options.web_url, job.id),
        cause=cause,
    )


def outcome_of(store: Store, job: JobRecord, record: RunRecord, hung_restart: bool) -> AttemptOutcome:
    """How an attempt ended, as the restart policy sees it: the exception and its place, OOM, the last
    line of output (a stand-in for the step it reached)."""
    from jobwarden.rules.retry import AttemptOutcome

    lines = [
        b.decode("utf-8", "replace").rstrip("\n")
        for b in tail_lines(store.layout.output_log(job.id, record.n), 60)
    ]
    parsed = None
    if record.exit_code not in (None, 0):  # loaded only then: a clean end waits for no parser
        from jobwarden.rules.death import parse_traceback

        parsed = parse_traceback(lines)
    exception = f"{parsed[0]}: {parsed[1]} @ {parsed[2]}" if parsed else None
    events = store.events(job.id, record.n)
    oom = record.end_reason == EndReason.MEM_LIMIT or (
        record.signal == "SIGKILL" and any(e.kind == "oom" for e in events)
    )
    last = next((line for line in reversed(lines) if line.strip()), None)
    return AttemptOutcome(
        state=str(record.state),
        exit_code=record.exit_code,
        signal=record.signal,
        end_reason=record.end_reason,
        exception=exception,
        oom=oom,
        last_output=last,
        stopped_by_user=record.end_reason == EndReason.STOPPED,
        timed_out=record.end_reason == EndReason.TIMEOUT,
        hung=hung_restart,
        ran_s=_ran_s(record),
    )


def _ran_s(record: RunRecord) -> float | None:
    """From start to end; None for a run that never started (or never ended, which a lost run may)."""
    if record.started_at is None or record.ended_at is None:
        return None
    return record.ended_at - record.started_at
