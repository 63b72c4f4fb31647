"""Gather a run's evidence from the store and files, and hand it to the pure rules.

Two sources meet here: the findings the shim recorded while the run was live (a hang judged on the stacks
of that moment, a pool worker lost, a process stopped), and what the rules conclude now from how the run
ended. A rule found live is not repeated; the order is the rules' root-cause-first order, and a finding
that stopped being true (resolved) comes after every current one: it is history, never the root cause.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jobwarden.model import Finding, ProcessEnd
from jobwarden.observations import OomEvidence, ProcessDeath
from jobwarden.probes.pyhooks import read_caught, read_exceptions, read_fork_requests
from jobwarden.rules import RunEvidence
from jobwarden.rules.evidence import death_of
from jobwarden.rules.verdict import collect, order
from jobwarden.store import JobRecord, RunRecord, Store
from jobwarden.store.logfiles import tail_lines
from jobwarden.store.records import Event

# enough for a rank's `[rankN]:` traceback above torchrun's ChildFailedError report and its own traceback
_TAIL_LINES = 400


def findings_for(store: Store, job: JobRecord, run: RunRecord) -> list[Finding]:
    live = [f for _, f in store.findings(job.id, run.n)]
    events = store.events(job.id, run.n)
    evidence = _evidence(store, job, run, events)
    seen = {f.rule for f in live}
    merged = [f for f in live if f.current] + [f for f in collect(evidence) if f.rule not in seen]
    ordered = order(merged, evidence)
    refusal = next((e for e in events if e.kind == "not-restarted"), None)
    if refusal and ordered:  # the restart policy's verdict belongs with the root cause it judged
        first = ordered[0]
        ordered[0] = first._replace(evidence=(*first.evidence, str(refusal.data.get("reason"))))
    return ordered + [f for f in live if not f.current]


def store_verdict(store: Store, job: JobRecord, run_n: int, now: Callable[[], float]) -> Finding | None:
    """An ended run's first current finding, kept with the run for the lists (`ps`, the web, `top`), and
    a `verdict` event saying when it was (scripts/bench-rootcause times it from the first failure)."""
    run = store.run(job.id, run_n)
    first = next((f for f in findings_for(store, job, run) if f.current), None)
    if first is not None:
        store.update_run_with_event(
            job.id,
            run_n,
            "verdict",
            now(),
            {"rule": first.rule, "pids": list(first.pids)},
            verdict_rule=first.rule,
            verdict_title=first.title,
        )
    return first


def _evidence(store: Store, job: JobRecord, run: RunRecord, events: list[Event]) -> RunEvidence:
    tail = [
        b.decode("utf-8", "replace").rstrip("\n")
        for b in tail_lines(store.layout.output_log(job.id, run.n), _TAIL_LINES)
    ]
    oom = next((_oom(e.data) for e in reversed(events) if e.kind == "oom"), None)
    engine_stop = next(
        (e for e in events if e.kind == "engine-signal" and e.data.get("action") == "stop"), None
    )
    engine_state: dict[str, Any] = next((e.data for e in reversed(events) if e.kind == "engine-state"), {})
    dumps = store.stacks(job.id, run.n)
    py_dir = store.layout.py_dir(job.id, run.n)
    return RunEvidence(
        state=str(run.state),
        exit_code=run.exit_code,
        signal=run.signal,
        end_reason=run.end_reason,
        pid=run.pid,
        error=run.error,
        job_id=job.id,
        mp_start=job.options.mp_start,
        timeout_s=job.options.timeout_s,
        orphans_left=run.orphans_left,
        survivors=[s._asdict() for s in run.survivors],
        log_tail=tail,
        events=tuple(e.kind for e in events),
        disk_full=tuple(str(e.data.get("path")) for e in events if e.kind == "disk-full"),
        stopping_at=next((e.at for e in events if e.kind == "stopping"), None),
        engine=job.options.engine,
        engine_budget_s=job.options.engine_budget_s,
        engine_signal=str(engine_stop.data.get("signal")) if engine_stop else None,
        engine_signal_at=engine_stop.at if engine_stop else None,
        engine_state=_text(engine_state.get("state")),
        engine_reason=_text(engine_state.get("reason")),
        engine_job=_text(engine_state.get("job")),
        deaths=_deaths(store, job, run),
        exceptions=read_exceptions(py_dir),
        caught=read_caught(py_dir),
        fork_requests=read_fork_requests(py_dir),
        last_stacks={s.pid: s for dump in dumps for s in dump.stacks if s.threads},
        stack_triggers=tuple(dump.trigger for dump in dumps),
        oom=oom,
        mem_limit_bytes=job.options.mem_limit_bytes,
    )


def _text(value: object) -> str | None:
    return str(value) if value is not None else None


def _deaths(store: Store, job: JobRecord, run: RunRecord) -> tuple[ProcessDeath, ...]:
    return tuple(
        death_of(
            ProcessEnd(p.pid, p.start_time, p.wait_status, p.ended_at, p.ppid, p.cmdline, p.ranks),
            is_main=p.pid == run.pid and p.start_time == run.pid_start,
        )
        for p in store.processes(job.id, run.n)
        if p.ended_at is not None and p.wait_status is not None and p.wait_status >= 0
    )


def _oom(data: dict[str, object]) -> OomEvidence:
    def ints(key: str) -> tuple[int, ...]:
        value = data.get(key) or ()
        return tuple(int(v) for v in value) if isinstance(value, list | tuple) else ()

    def opt_int(key: str) -> int | None:
        value = data.get(key)
        return int(value) if isinstance(value, int | float) else None

    lines = data.get("kernel_lines")
    return OomEvidence(
        mechanism=str(data.get("mechanism", "host")),
        kills=opt_int("kills") or 0,
        limit_bytes=opt_int("limit_bytes"),
        peak_bytes=opt_int("peak_bytes"),
        victims=ints("victims"),
        kernel_lines=tuple(str(line) for line in lines) if isinstance(lines, list) else (),
    )
