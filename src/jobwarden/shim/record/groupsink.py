"""The group records of a run that is one part of a distributed job (`--group`): what RunRecorder records
about the run, appended to the group's shared directory for `explain --group` (store.groupdir).

A run is one rank (`--rank`, Slurm's SLURM_PROCID), or a node whose launcher (torchrun) starts the ranks:
then each process that a RANK variable names gets its own file and its own end, and the node's file holds
the run when no rank is ever seen. Nothing here may hurt the job: a group directory that is missing,
read-only or full is logged once, recorded on the node-local run as an event, and left alone.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobwarden import __version__
from jobwarden.clock import Clock
from jobwarden.model import JobState, ProcessEnd, ProcessSnapshot
from jobwarden.osapi.process import WaitStatus
from jobwarden.shim.record.groupfacts import (
    ERROR_FILE_ENV,
    at_where,
    boot_id,
    error_file,
    exception_of,
    finding_json,
    is_slurm_task,
    nodelist,
    torch_error,
    world_size,
)
from jobwarden.store import JobRecord, Store, groupdir
from jobwarden.store.logfiles import tail_lines

if TYPE_CHECKING:
    from jobwarden.rules.speed.evidence import SpeedEvidence

ALIVE_EVERY_S = 60.0
RANK_VIEWS_EVERY_S = 5.0  # a node's rank views (the straggler across nodes) written at most this often
TAIL_LINES = 20
_TRACEBACK_LINES = 400  # a rank's traceback above torchrun's report
# engine-state comes after `ended`: Slurm is asked once the end is safe (shim.run.ending), so it has a line
_FORWARDED = ("finding", "hung", "engine-signal", "stopping", "engine-state")


@dataclass
class _Rank:
    """One file's writer: a rank (its process), a Slurm task, or the whole node."""

    label: str  # the file: rank-3, task-1 (a rank only as far as Slurm's SLURM_PROCID says), node-n2
    rank: int | None
    pid: int | None
    start_time: int | None
    local_rank: int | None = None
    end: ProcessEnd | None = None
    error_file: str | None = None


class GroupSink:
    def __init__(
        self, store: Store, job: JobRecord, run: int, clock: Clock, log: Callable[[str], None]
    ) -> None:
        options = job.options
        assert options.group is not None
        self.store, self.job, self.run, self.clock, self.log = store, job, run, clock, log
        self.node = options.node or socket.gethostname().split(".")[0]
        root = groupdir.group_root(store.layout.home, options.group, options.group_dir)
        self.dir = groupdir.attempt_dir(root, options.attempt)
        self.boot_id = boot_id()
        self.ranks: dict[int | None, _Rank] = {}
        # --rank N: this run is rank N. Slurm's SLURM_PROCID (the default) is a rank only as long as no
        # process of the job says otherwise: under `--ntasks-per-node=1 … torchrun` the task is a node and
        # each worker's RANK names it (research §5.2); its records wait in task-<N>.jsonl meanwhile
        self.task_rank = options.rank if is_slurm_task(options.engine, options.rank) else None
        self.fixed_rank = options.rank if self.task_rank is None else None
        self.oom_victims: set[int] = set()
        self.oom_seen = False
        self.failed = False
        self.engine_state: object = None
        self._alive_at = 0.0
        self._views_at = -RANK_VIEWS_EVERY_S
        self._main: _Rank | None = None

    # --- what RunRecorder tells ---------------------------------------------------------------------

    def started(self, at: float, pid: int, start_time: int) -> None:
        error_path = self.job.env.get(ERROR_FILE_ENV) or os.environ.get(ERROR_FILE_ENV)
        self._main = self._node_writer(pid, start_time, error_path)
        self._write_group_documents(at, pid)
        if self.fixed_rank is not None:
            self.ranks[self.fixed_rank] = self._main
        self._append(self._main, "started", at, self._started_data())

    def event(self, kind: str, at: float, data: dict[str, Any]) -> None:
        if kind == "engine-state":  # Slurm's word on why it ended the job: TIMEOUT, CANCELLED, PREEMPTED...
            self.engine_state = data.get("state")
        if kind == "oom":
            self.oom_seen = True
            self.oom_victims.update(int(v) for v in data.get("victims") or ())
        if kind not in _FORWARDED:
            return
        extra = dict(data)
        if kind == "finding":
            extra.update(self._finding_text(str(data.get("rule"))))
        elif kind == "hung":
            extra.update(self._hung_stacks(at), last_progress=self._last_progress())
        for target in self._targets():
            self._append(target, kind, at, extra)

    def tree(self, at: float, live: Sequence[ProcessSnapshot], ended: Sequence[ProcessEnd]) -> None:
        """The processes as the shim recorded them: ranks as they appear and end, and `alive`."""
        if self.fixed_rank is None:
            by_pid = {s.pid: s for s in live}
            for snap in live:
                parent = by_pid.get(snap.ppid)
                if snap.ranks is not None and (parent is None or parent.ranks != snap.ranks):
                    self._seen(snap.ranks.rank, snap.ranks.local_rank, snap.pid, snap.start_time, at)
            for end in ended:
                if end.ranks is not None:
                    known = self.ranks.get(end.ranks.rank)
                    if known is None:
                        known = self._seen(end.ranks.rank, end.ranks.local_rank, end.pid, end.start_time, at)
                    if known.pid == end.pid and known.end is None:
                        known.end = end
        if live and at - self._alive_at >= ALIVE_EVERY_S:
            self._alive_at = at
            rss = sum(s.rss_bytes for s in live)
            for target in self._targets():
                alive = {"processes": len(live), "rss_bytes": rss, "last_progress": self._last_progress()}
                self._append(target, "alive", at, alive)

    def rank_views(self, at: float, ev: SpeedEvidence) -> None:
        """This node's ranks over the speed watch's last window, for the straggler across nodes
        (rules.speed.acrossnodes): one small document, replaced at most every RANK_VIEWS_EVERY_S."""
        if not ev.ranks or at - self._views_at < RANK_VIEWS_EVERY_S:
            return
        from jobwarden.rules.speed.acrossnodes import node_document

        self._views_at = at
        doc = node_document(self.node, at, ev.window_s, ev.ranks, ev.neighbours)
        path = groupdir.rank_views_file(self.dir, self.node)
        self._guarded(lambda: groupdir.write_document(path, doc))

    def end(self, fields: dict[str, Any]) -> None:
        """Each rank's end: its own process's, or the run's for --rank and a node of unknown ranks."""
        run_data = {
            "state": str(fields.get("state")),
            "end_reason": str(fields.get("end_reason")),
            "stopping_at": self._stopping_at(),
            "engine_state": self.engine_state,
        }
        # each line cut: a record stays under the readers' line cap (groupdir.MAX_RECORD_LINE)
        cut = groupdir.TAIL_LINE_CHARS
        lines = [b.decode("utf-8", "replace").rstrip("\n")[:cut] for b in self._tail(_TRACEBACK_LINES)]
        # A run that succeeded has no cause to look for: no exception, no verdict (and a short attached
        # srun step waits for none of the rules' imports)
        succeeded = run_data["state"] == JobState.SUCCEEDED
        hooked = {} if succeeded else self._hooked_exceptions()
        launcher = self.fixed_rank is None and bool(self.ranks)
        for target in self._targets():
            data = {**run_data, **self._end_status(target, fields), "output_tail": lines[-TAIL_LINES:]}
            exception = None if succeeded else hooked.get(target.pid or -1)
            exception = exception or (None if succeeded else exception_of(lines, target.rank, launcher))
            data["exception"] = exception[:cut] if exception else None
            data["torch_error"] = torch_error(target.error_file)
            self._append(target, "ended", fields["ended_at"], data, at_pid=target.pid)
        if not succeeded:
            self._final_findings(fields["ended_at"])

    # --- records --------------------------------------------------------------------------------------

    def _targets(self) -> list[_Rank]:
        """The files a record of the whole run goes to: every rank seen, else the node's."""
        if self.ranks:
            return list(self.ranks.values())
        if self._main is None:
            self._main = self._node_writer(None, None, None)
        return [self._main]

    def _node_writer(self, pid: int | None, start_time: int | None, error_path: str | None) -> _Rank:
        if self.fixed_rank is not None:
            return _Rank(f"rank-{self.fixed_rank}", self.fixed_rank, pid, start_time, error_file=error_path)
        if self.task_rank is not None:
            return _Rank(f"task-{self.task_rank}", self.task_rank, pid, start_time, error_file=error_path)
        return _Rank(f"node-{self.node}", None, pid, start_time, error_file=error_path)

    def _seen(self, rank: int | None, local_rank: int | None, pid: int, start: int, at: float) -> _Rank:
        known = self.ranks.get(rank)
        if known is None:
            label = f"rank-{rank}" if rank is not None else f"node-{self.node}"
            known = self.ranks[rank] = _Rank(label, rank, pid, start, local_rank, error_file=error_file(pid))
            self._append(known, "started", at, self._started_data(local_rank))
        return known

    def _started_data(self, local_rank: int | None = None) -> dict[str, Any]:
        options = self.job.options
        return {
            "local_rank": local_rank,
            "world_size": world_size(self.job.env),
            "cmdline": " ".join(self.job.command)[: groupdir.TAIL_LINE_CHARS],
            "job_id": self.job.id,
            "run": self.run,
            "requeue_exit": options.requeue_exit,
            "max_requeues": options.max_requeues,
            "engine": options.engine,
        }

    def _append(
        self, target: _Rank, kind: str, at: float, data: dict[str, Any], at_pid: int | None = None
    ) -> None:
        if self.failed:
            return
        record = {
            "v": groupdir.FORMAT_VERSION,
            "kind": kind,
            "group": self.job.options.group,
            "attempt": self.job.options.attempt,
            "rank": target.rank,
            **({"rank_from": "slurm-task"} if target.label.startswith("task-") else {}),
            "node": self.node,
            "pid": at_pid if at_pid is not None else target.pid,
            "start_time": target.start_time,
            "wall": at,
            # the monotonic time of the same moment as `wall`, which may lie in the past (a record
            # written late, after a locked store let the end through): the pair must agree
            "mono": self.clock.monotonic() - (self.clock.wall() - at),
            "boot_id": self.boot_id,
            **data,
        }
        path = groupdir.records_file(self.dir, target.label)
        self._guarded(lambda: groupdir.append_record(path, record))

    def _guarded(self, write: Callable[[], object]) -> None:
        """Never fatal: the first failure is logged and recorded on the run, later writes are skipped."""
        if self.failed:
            return
        try:
            write()
        except OSError as err:
            self.failed = True
            message = f"group records not written to {self.dir}: {err.strerror or err}"
            self.log(message)
            try:
                self.store.add_event(
                    self.job.id, self.run, "group-unwritable", self.clock.wall(), error=message
                )
            except Exception as store_err:  # the run goes on whatever the store says
                self.log(f"cannot record it either: {store_err}")

    def _write_group_documents(self, at: float, pid: int) -> None:
        options = self.job.options
        group_doc = {
            "v": groupdir.FORMAT_VERSION,
            "group": options.group,
            "attempt": options.attempt,
            "engine": options.engine,
            "created": at,
            "nodelist": nodelist(),
            "requeue_exit": options.requeue_exit,
            "max_requeues": options.max_requeues,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        }
        self._guarded(lambda: groupdir.write_document(self.dir / "group.json", group_doc, replace=False))
        node_doc = {
            "v": groupdir.FORMAT_VERSION,
            "node": self.node,
            "shim_pid": os.getpid(),
            "version": __version__,
            "boot_id": self.boot_id,
            "wall": at,
            "mono": self.clock.monotonic(),
            "job_id": self.job.id,
            "run": self.run,
            "pid": pid,
        }
        self._guarded(lambda: groupdir.write_document(groupdir.node_file(self.dir, self.node), node_doc))

    # --- evidence ------------------------------------------------------------------------------------

    def _finding_text(self, rule: str) -> dict[str, Any]:
        found = [f for _, f in self._store_read(lambda: self.store.findings(self.job.id, self.run), [])]
        latest = next((f for f in reversed(found) if f.rule == rule), None)
        return finding_json(latest) if latest else {}

    def _hung_stacks(self, at: float) -> dict[str, Any]:
        """The stacks the watchdog took, as a document of their own, and the collective they wait in."""
        from jobwarden.rules.hang.collective import collective_of

        dumps = self._store_read(lambda: self.store.stacks(self.job.id, self.run), [])
        if not dumps:
            return {}
        stacks = dumps[-1].stacks
        label = self._main.label if self._main and not (self.ranks and self.fixed_rank is None) else None
        path = groupdir.stacks_file(self.dir, label or f"node-{self.node}", at)
        doc = {"at": dumps[-1].at, "node": self.node, "stacks": [s.to_json() for s in stacks]}
        self._guarded(lambda: groupdir.write_document(path, doc))
        return {"stacks_file": path.name, "collective": collective_of(stacks)}

    def _store_read(self, read: Callable[[], Any], default: Any) -> Any:
        try:
            return read()
        except Exception as err:  # a locked or full store costs the detail, never the record
            self.log(f"group records: cannot read the store: {err}")
            return default

    def _stopping_at(self) -> float | None:
        events = self._store_read(lambda: self.store.events(self.job.id, self.run), [])
        return next((e.at for e in events if e.kind == "stopping"), None)

    def _end_status(self, target: _Rank, fields: dict[str, Any]) -> dict[str, Any]:
        if target is self._main or target.pid == (self._main.pid if self._main else None):
            raw, at = fields.get("wait_status"), fields["ended_at"]
        elif target.end is not None:
            raw, at = target.end.status, target.end.at
        else:  # a rank the shim saw start and never saw end: it ended with the tree
            raw, at = None, fields["ended_at"]
        status = WaitStatus.decode(raw) if raw is not None and raw >= 0 else None
        oom = target.pid in self.oom_victims or (
            self.oom_seen and (status is None or status.signal_name == "SIGKILL") and not self.oom_victims
        )
        if fields.get("end_reason") is not None and str(fields["end_reason"]) == "mem-limit":
            oom = True
        return {
            "wait_status": raw,
            "exit_code": status.exit_code if status else None,
            "signal": status.signal_name if status else None,
            "oom": oom,
            "died_at": at,
        }

    def _final_findings(self, at: float) -> None:
        """The run's verdict, as `explain` gives it, for the ranks whose end is the run's own."""
        from jobwarden.verdict.explainer import findings_for

        if self.fixed_rank is None and self.ranks:
            return  # a launcher's node: each rank's own end speaks for it
        try:
            findings = findings_for(self.store, self.job, self.store.run(self.job.id, self.run))
        except Exception as err:  # the verdict is a convenience; the raw end is recorded already
            self.log(f"group records: no verdict for the end record: {err}")
            return
        for finding in findings[:3]:
            self._append(self._targets()[0], "finding", at, {**finding_json(finding), "final": True})

    def _hooked_exceptions(self) -> dict[int, str]:
        """{pid: "Type: message"}: the uncaught exceptions the Python hooks recorded, process by process."""
        from jobwarden.probes.pyhooks import read_exceptions
        from jobwarden.rules.death import raised_at

        found = read_exceptions(self.store.layout.py_dir(self.job.id, self.run))
        return {e.pid: f"{e.type}: {e.message}" + at_where(raised_at(e.frames)) for e in found}

    def _last_progress(self) -> float | None:
        """When the run last wrote output or touched its heartbeat (wall clock): the hang leader across
        nodes is the rank that stopped first."""
        layout = self.store.layout
        times = []
        for path in (layout.output_log(self.job.id, self.run), layout.heartbeat_file(self.job.id, self.run)):
            with contextlib.suppress(OSError):
                times.append(path.stat().st_mtime)
        return max(times) if times else None

    def _tail(self, n: int) -> list[bytes]:
        try:
            return tail_lines(self.store.layout.output_log(self.job.id, self.run), n)
        except OSError:
            return []
