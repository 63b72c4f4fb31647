"""Text output. Formatters yield lines; only the handlers print."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from jobwarden.clock import shown_time
from jobwarden.config import counted, format_duration, format_size
from jobwarden.model import ENDED_STATES, JobState, Ranks
from jobwarden.text.habits import habit_lines
from jobwarden.text.progress import progress_cell, progress_line, resumed_line
from jobwarden.text.runsunder import runs_under_lines, summary_line
from jobwarden.text.sanitize import one_line
from jobwarden.text.term import colour_wanted, table

if TYPE_CHECKING:  # kept off the import paths of `run` and `ps`, which a user waits for
    from jobwarden.control.dump import DumpResult
    from jobwarden.control.lifecycle import StopResult
    from jobwarden.control.views.joblist import JobView
    from jobwarden.control.views.jobstatus import JobStatus
    from jobwarden.model import Finding, ProcessSnapshot
    from jobwarden.observations import Frame, ProcessStack, ThreadStack
    from jobwarden.store import RunRecord

_COLORS = {
    "running": "32",
    "succeeded": "32",
    "failed": "31",
    "lost": "31;1",
    "stopped": "33",
    "stopping": "33",
    "starting": "36",
    "queued": "36",
    "hung": "35;1",  # running but hung: not the green of a healthy run
}


def _color(text: str, state: str, colored: bool | None = None) -> str:
    """`colored`: whether to color at all, when the caller asked once for many lines."""
    if colored is None:
        colored = colour_wanted()
    if not colored or state not in _COLORS:
        return text
    return f"\033[{_COLORS[state]}m{text}\033[0m"


def how_it_ended(run: RunRecord, hung: bool = False) -> str:
    """The run's state in one word, and how it ended: 'failed: exit code 1'. `hung`: a running run whose
    root cause now is a hang reads `hung`, as `ps` shows it."""
    if hung and run.state == JobState.RUNNING:
        return "hung"
    state = str(run.state)
    if run.end_reason == "hung":
        return f"{state}: ended as hung (--on-hang)"
    if run.end_reason == "mem-limit":
        return f"{state}: over its --mem-limit"
    if run.signal:
        return f"{state}: killed by {run.signal}"
    if run.exit_code is not None and state in ("failed", "succeeded", "stopped"):
        return f"{state}: exit code {run.exit_code}"
    return state


def _runtime(view: JobView, now: float) -> str:
    run = view.run
    if run.started_at is None:
        return "-"
    return format_duration((run.ended_at or now) - run.started_at)


def ps_table(views: list[JobView], now: float, wide: bool = False, width: int | None = None) -> Iterator[str]:
    """One row per job; its verdict as `[rule]` after its state, and with `wide` its title in a column of
    its own and its whole command. A hung job's state reads `hung`. AGE: how long ago an ended job ended,
    how old a job not over is. `width`: what the command is cut to fit (None: the terminal's; 0: never)."""
    if not views:
        yield "no jobs (jobwarden ps --all shows ended ones)"
        return
    # a PROGRESS column where a job shows progress (a list of scripts without bars keeps its width), a GPU
    # column where a job was given GPUs
    progress = any(v.progress is not None for v in views)
    gpus = any(v.run.gpu_ids for v in views)
    head = (
        "ID",
        "NAME",
        "STATE",
        "RUN",
        "PID",
        "AGE",
        "TIME",
        "CPU",
        "MEM",
        *_GPU[:gpus],
        *_PROGRESS[:progress],
    )
    rows: list[tuple[str, ...]] = [(*head, *_VERDICT[:wide], "COMMAND")]
    looks: list[str] = []
    for v in views:
        run = v.run
        look = "hung" if v.hung else run.state.value
        state = look
        if run.state in ENDED_STATES and (run.signal or run.exit_code):
            state += f" ({run.signal or run.exit_code})"
        if v.end_unrecorded:
            state += " (ended, not yet recorded)"
        if v.finding:
            state += f" [{v.finding}]"
        cpu = f"{v.cpu_percent:.0f}%" if v.cpu_percent is not None else "-"
        cells = (
            str(v.job.id),
            one_line(v.job.name),
            state,
            str(run.n),
            str(run.pid or "-"),
            _age_cell(v, now),
            _runtime(v, now),
            cpu,
            format_size(v.rss_bytes),
            *((",".join(map(str, run.gpu_ids)) or "-",) if gpus else ()),
            *((progress_cell(v.progress, run.state == JobState.RUNNING, now),) if progress else ()),
        )
        verdict = (one_line(v.finding_title or "-"),) if wide else ()  # --wide cuts nothing
        rows.append((*cells, *verdict, one_line(shlex.join(v.job.command))))
        looks.append(look)
    colored = colour_wanted()  # asked once: `ps --all` may print 10,000 lines
    # a narrow terminal: the name, the state's [rule] and the progress give way before a row wraps
    shrink = {1: _PS_MIN_NAME, 2: _PS_MIN_STATE, **({len(head) - 1: _PS_MIN_PROGRESS} if progress else {})}
    for i, padded in enumerate(table(rows, 0 if wide else width, _PS_MIN_COMMAND, shrink)):
        if i:
            padded[2] = _color(padded[2], looks[i - 1], colored)
        yield "  ".join(padded).rstrip()


def _age_cell(view: JobView, now: float) -> str:
    """'3h ago' for an ended run (when it ended); a job not over: how long since it was made."""
    if view.run.ended_at is not None and view.run.state in ENDED_STATES:
        return f"{format_duration(now - view.run.ended_at)} ago"
    return format_duration(now - view.job.created_at)


_PS_MIN_NAME = 10
_PS_MIN_STATE = 12  # 'failed (137) [oom-kill]' -> 'failed (137) …'
_PS_MIN_PROGRESS = 9  # '45% 450/1000 5.4it/s ETA 1m42s' -> '45% …'


_PS_MIN_COMMAND = 12  # ps's command column may shrink further than a table's: its AGE column fits 72 wide
_PROGRESS = ("PROGRESS",)
_GPU = ("GPU",)
_VERDICT = ("VERDICT",)


def status_report(status: JobStatus, now: float) -> Iterator[str]:
    job, run = status.job, status.run
    look = "hung" if status.hung else str(run.state)
    yield f"job {job.id} ({one_line(job.name)}) — {_color(how_it_ended(run, status.hung), look)}"
    yield f"  command      {one_line(shlex.join(job.command))}"
    yield f"  cwd          {one_line(job.cwd)}"
    yield f"  run          {run.n}"
    if run.pid:
        yield f"  pid          {run.pid} (supervisor {run.shim_pid})"
    yield f"  containment  {run.containment or '-'}"
    if run.queued_reason:
        yield f"  queued       {one_line(run.queued_reason)}"
    if run.gpu_ids:
        yield f"  gpus         {','.join(str(i) for i in run.gpu_ids)}"
    yield f"  started      {shown_time(run.started_at)}"
    if run.ended_at:
        yield f"  ended        {shown_time(run.ended_at)}"
    summary = summary_line(status, now)
    if summary:
        yield summary
    if status.progress is not None:
        yield f"  progress     {progress_line(status.progress, run.state == JobState.RUNNING, now)}"
    resumed = resumed_line(status.progress, status.previous_progress, run.n - 1)
    if resumed:
        yield f"  resumed      {resumed}"
    if run.error:
        yield f"  error        {one_line(run.error)}"
    yield f"  log          {status.log_path}"
    yield from runs_under_lines(status)
    yield from habit_lines(status)  # rerun of, log dropped, kept processes, failed notifications
    for path in status.disk_full_paths:
        yield f"  WARNING      the disk holding the log filled up ({one_line(path)}); output may be lost"
    for error in status.group_errors:
        yield f"  WARNING      {one_line(error)} (the job ran on; `explain --group` lacks this run)"
    yield from _process_table(status.processes)
    yield from _rank_table(status.ranks)
    if run.orphans_left:
        yield ""
        n, were = len(run.orphans_left), "was" if len(run.orphans_left) == 1 else "were"
        yield f"  {counted(n, 'descendant')} {were} still running when the main process ended:"
        for o in run.orphans_left:
            yield f"    {o['pid']}  {one_line(o['cmdline'])[:90]}"
    if run.survivors:
        yield ""
        yield "  could not be ended:"
        for s in run.survivors:
            yield f"    {s.pid}  {one_line(s.cmdline)[:60]}: {one_line(s.reason)}"
    if status.current_findings:
        yield ""
        for f in status.current_findings:
            yield f"  [{f.rule}] {one_line(f.title)}"
    if status.recovery:
        yield ""
        yield f"  {status.recovery}"


def _process_table(processes: list[ProcessSnapshot]) -> Iterator[str]:
    if not processes:
        return
    yield ""
    gpu = any(p.gpu_memory_bytes is not None for p in processes)  # a GPU column if any
    gpu_head = f"  {'GPU MEM':>7}" if gpu else ""
    ranked = any(p.ranks is not None and p.ranks.rank is not None for p in processes)  # distributed jobs
    rank_head = f"  {'RANK':>4}" if ranked else ""
    yield f"  {'PID':>7}  {'PPID':>7}{rank_head}  S  {'CPU':>5}  {'RSS':>7}{gpu_head}  COMMAND"
    for p in processes:
        cpu = f"{p.cpu_percent:.0f}%" if p.cpu_percent is not None else "-"
        gpu_cell = f"  {format_size(p.gpu_memory_bytes):>7}" if gpu else ""
        rank_cell = f"  {_or_dash(p.ranks.rank if p.ranks else None):>4}" if ranked else ""
        yield (
            f"  {p.pid:>7}  {p.ppid:>7}{rank_cell}  {p.state}  {cpu:>5}  "
            f"{format_size(p.rss_bytes):>7}{gpu_cell}  {one_line(p.cmdline)[:80]}"
        )


def _rank_table(ranks: list[dict[str, Any]]) -> Iterator[str]:
    """Each rank of a running distributed job: its step, its rate, the newest collective its flight
    recorder named (where any rank's did: a rank one call behind the others in a hang shows here), where
    its main thread is."""
    if not ranks:
        return
    calls = any(isinstance(r.get("collective"), dict) for r in ranks)
    yield ""
    yield (
        f"  {'RANK':>4}  {'PID':>7}  {'STEP':>7}  {'RATE':>8}  "
        + (f"{'COLLECTIVE':<22}  " if calls else "")
        + "WHERE"
    )
    for r in ranks:
        rate = f"{r['rate']:.2f}/s" if isinstance(r.get("rate"), int | float) else "-"
        detail = f" ({one_line(str(r['where_detail']))[:50]})" if r.get("where_detail") else ""
        call = f"{_call_cell(r.get('collective')):<22}  " if calls else ""
        yield (
            f"  {_or_dash(r.get('rank')):>4}  {_or_dash(r.get('pid')):>7}  {_or_dash(r.get('step')):>7}  "
            f"{rate:>8}  {call}{one_line(str(r.get('where') or 'unknown'))}{detail}"
        )


def _call_cell(call: object) -> str:
    """`#1205 all_reduce`: the newest collective's number in its group and its op."""
    if not isinstance(call, dict):
        return "-"
    return one_line(f"#{call.get('seq')} {call.get('op')}")[:22]


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def explain_report(status: JobStatus, now: float | None = None) -> Iterator[str]:
    job, run = status.job, status.run
    yield f"job {job.id} ({one_line(job.name)}), run {run.n} — {how_it_ended(run, status.hung)}"
    p = status.progress
    if p is not None:  # how far it got: a crash at 62% is not a crash at the start
        yield f"  progress: {progress_line(p, run.state == JobState.RUNNING, p.at if now is None else now)}"
    resumed = resumed_line(status.progress, status.previous_progress, run.n - 1)
    if resumed:
        yield f"  {resumed}"
    if status.recovery:
        yield ""
        yield f"{status.recovery}: nothing is wrong now"
    elif not status.findings:
        yield ""
        running = run.state == JobState.RUNNING
        yield "  nothing wrong found: it is running" if running else "  nothing wrong found"
        return
    from jobwarden.rules.speed import SPEED_RULES  # a frozenset: nothing of the rules is loaded

    causes = [f for f in status.current_findings if f.rule not in SPEED_RULES]
    for f in status.current_findings:
        yield ""
        label = "why it is slow" if f.rule in SPEED_RULES else "root cause" if f is causes[0] else "also"
        yield from _finding_lines(label, f)
    for f in status.resolved_findings:
        yield ""
        yield from _finding_lines(f"resolved {_moment(f.resolved_at)}", f)


def _finding_lines(label: str, f: Finding) -> Iterator[str]:
    yield f"{label}: {one_line(f.title)}  [{f.rule}, {f.severity}]"
    yield f"  {one_line(f.summary)}"
    said = [_words(f.title), _words(f.summary)]
    for line in f.evidence:
        if not said_before(line, said):  # the evidence stays whole in --json
            yield f"    - {one_line(line)}"
    if f.remedy:
        yield f"  what to do: {one_line(f.remedy)}"


_WORD = re.compile(r"[a-z0-9_./:-]+")


def _words(text: str) -> frozenset[str]:
    """A sentence's words, lower case, a final -ed or -s dropped: "exited" and "exit" say the same."""
    found = set()
    for word in _WORD.findall(text.lower()):
        word = word.strip(".:-/")
        if len(word) > 4 and word.endswith("ed"):
            word = word[:-2]
        elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        if word:
            found.add(word)
    return frozenset(found)


def said_before(line: str, said: list[frozenset[str]]) -> bool:
    """Whether `line` repeats a sentence already said (the title or summary above it): every word of it is
    there ("exit code 1" under "Exited with code 1"), or all but one in ten of a long line ("quiet for 1s
    (window 1s): no output, heartbeat, CPU, I/O or GPU work" under "No output, heartbeat, CPU, I/O or GPU
    work for 1s (the hang window is 1s)")."""
    words = _words(line)
    if not words:
        return False
    spare = len(words) // 10 if len(words) >= 8 else 0
    return any(len(words - sentence) <= spare for sentence in said)


def _moment(at: float | None) -> str:
    return shown_time(at, "time") if at is not None else ""


def stop_report(result: StopResult) -> Iterator[str]:
    run = result.run
    if result.already_ended:
        yield f"job {run.job_id} had already ended ({run.state})"
    else:
        yield f"stopped job {run.job_id} ({_main_process_end(run, bool(result.survivors))})"
    for note in result.notes:
        yield f"  {one_line(note)}"
    for s in result.survivors:
        yield f"  still alive: pid {s.pid} ({one_line(s.cmdline)[:60]}): {one_line(s.reason)}"


def _main_process_end(run: RunRecord, survivors: bool) -> str:
    """How the stopped job's main process ended, as far as it is known: its supervisor may have died
    during the stop (killed, OOM), before it could record the exit status."""
    if run.signal:
        return f"main process: killed by {run.signal}"
    if run.exit_code is not None:
        return f"main process: exit code {run.exit_code}"
    if run.state == JobState.LOST:
        gone = "" if survivors else "; nothing of the job runs now"
        return f"its supervisor died during the stop, before it recorded how the main process ended{gone}"
    return f"how its main process ended is not recorded; the run is {run.state}"


# --- dump ---------------------------------------------------------------------------------------------

_THREAD_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "uninterruptible (D)",
    "T": "stopped",
    "t": "traced",
    "Z": "zombie",
    "X": "dead",
    "I": "idle",
}


def dump_heading(result: DumpResult) -> str:
    job, run = result.job, result.run
    who = f"job {job.id} ({one_line(job.name)}), run {run.n}"
    when = shown_time(result.at)
    if result.live:
        took = f" in {result.elapsed_s:.2f}s" if result.elapsed_s is not None else ""
        return f"{who} — {run.state}: stacks of {len(result.stacks)} process(es), taken {when}{took}"
    return (
        f"{who} has no live process ({how_it_ended(run)}); these are the last stacks taken "
        f"while it ran: {when}, by {result.trigger}"
    )


def dump_report(result: DumpResult) -> Iterator[str]:
    yield dump_heading(result)
    if not result.stacks:
        yield "  no live process"
    for stack in result.stacks:
        yield ""
        yield from process_stack_lines(stack, result.ranks.get(stack.pid))
    if result.recorders:
        yield ""
        yield from recorder_lines(result)


RECORDER_CALLS = 3


def recorder_lines(result: DumpResult) -> Iterator[str]:
    """Each rank's last collectives from its PyTorch flight recorder, newest last, and where they part."""
    yield f"PyTorch flight recorder, the last {RECORDER_CALLS} collectives of each rank (newest last):"
    for r in sorted(result.recorders, key=lambda r: (r.rank is None, r.rank or 0, r.pid)):
        who = f"rank {r.rank} (pid {r.pid})" if r.rank is not None else f"pid {r.pid}"
        calls = ", ".join(
            f"{one_line(c.op)} #{c.seq} {'done' if c.done else 'waiting'}" for c in r.calls[-RECORDER_CALLS:]
        )
        yield f"  {who}: {calls or 'none yet'}"
    if result.divergence:
        yield f"  where they part: {one_line(result.divergence)}"


def process_stack_lines(stack: ProcessStack, ranks: Ranks | None = None) -> Iterator[str]:
    """One process: what it is, how it was captured, then each thread innermost frame first. Idle threads
    with the same stack are shown once; threads without frames (native-only threads) on one line."""
    who = f" ({ranks})" if ranks else ""
    yield f"process {stack.pid}{who}  {one_line(stack.cmdline)[:100]}"
    if stack.method != "none":
        yield f"  captured with {stack.method}"
    if not stack.threads:
        yield f"  no stack: {one_line(stack.error or 'unknown reason')}"
        return
    if stack.error:
        yield f"  note: {one_line(stack.error)}"
    shown, frameless = _group_threads(stack)
    for thread, twins in shown:
        yield f"  {_thread_label(thread)}"
        for frame in thread.frames:
            yield f"      {_frame_text(frame)}"
        if twins:
            yield f"    + {counted(len(twins), 'more idle thread')} with this stack: " + ", ".join(
                _thread_name(t) for t in twins
            )
    if frameless:
        yield f"  {counted(len(frameless), 'thread')} without Python frames: " + ", ".join(
            f"{_thread_name(t)} {t.state or '?'}" for t in frameless
        )


def _group_threads(
    stack: ProcessStack,
) -> tuple[list[tuple[ThreadStack, list[ThreadStack]]], list[ThreadStack]]:
    """Main thread first; idle threads sharing a stack folded into the first of them."""
    ordered = sorted(stack.threads, key=lambda t: t.tid != stack.pid)
    shown: list[tuple[ThreadStack, list[ThreadStack]]] = []
    by_frames: dict[tuple[Frame, ...], list[ThreadStack]] = {}
    frameless = []
    for t in ordered:
        if not t.frames:
            frameless.append(t)
            continue
        if t.active is not True and t.frames in by_frames:
            by_frames[t.frames].append(t)
            continue
        twins: list[ThreadStack] = []
        if t.active is not True:
            by_frames[t.frames] = twins
        shown.append((t, twins))
    return shown, frameless


def _thread_name(t: ThreadStack) -> str:
    parts = [str(t.tid)] if t.tid is not None else []
    if t.name:
        parts.append(f'"{one_line(t.name)}"')
    return " ".join(parts) or "?"


def _thread_label(t: ThreadStack) -> str:
    status = []
    if t.state:
        status.append(_THREAD_STATES.get(t.state, t.state))
    if t.active is not None:
        status.append("active" if t.active else "idle")
    return f"thread {_thread_name(t)}" + (f"  [{', '.join(status)}]" if status else "")


def _frame_text(frame: Frame) -> str:
    """A frame on one line: its function and file are the job's (a file name may hold any byte)."""
    function, file = one_line(frame.function), one_line(frame.file)
    if frame.native:
        where = os.path.basename(file) if frame.line is None else f"{file}:{frame.line}"
        return f"{function}  ({where or '?'})  [native]"
    where = _short_path(file) + (f":{frame.line}" if frame.line is not None else "")
    return f"{function}  ({where})" if where else function


_STDLIB_DIR = re.compile(r"/lib/python\d+\.\d+t?/")


def _short_path(path: str) -> str:
    """Library files by their import path (…/site-packages/torch/x.py -> torch/x.py); the job's own
    files in full, so they can be opened as printed."""
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    stdlib = _STDLIB_DIR.search(path)
    return path[stdlib.end() :] if stdlib else path


def _age(seconds: object) -> str:
    return format_duration(float(seconds)) if isinstance(seconds, int | float) else "-"


def _job_cell(d: dict[str, Any]) -> str:
    if d.get("job") is None:
        return "-"
    return f"{d['job']}/{d['run']}" if d.get("run") else str(d["job"])


def orphans_table(strays: list[dict[str, Any]]) -> Iterator[str]:
    """`jobwarden orphans`: one row per stray, then what to do about them."""
    if not strays:
        yield "no strays: every process jobwarden started belongs to a live job; no GPU memory is orphaned"
        return
    rows = [("PID", "USER", "AGE", "RSS", "GPU MEM", "JOB/RUN", "REASON", "COMMAND")]
    for d in strays:
        rows.append(
            (
                str(d["pid"]),
                one_line(str(d["user"])),
                _age(d.get("age_s")),
                format_size(d.get("rss_bytes")),
                format_size(d.get("gpu_memory_bytes")),
                _job_cell(d),
                one_line(str(d["reason"])),
                one_line(str(d["command"])),
            )
        )
    for cells in table(rows):
        yield "  ".join(cells).rstrip()
    yield ""
    lost = sorted({d["job"] for d in strays if str(d["reason"]).startswith("supervisor of job")})
    for job in lost:
        yield f"job {job} lost its supervisor; to keep it running instead: jobwarden adopt {job}"
    yield f"{len(strays)} stray process(es). End them with: jobwarden orphans --kill"


def kill_report(outcomes: list[dict[str, Any]]) -> Iterator[str]:
    """`jobwarden orphans --kill`: what became of each stray; those left, with why."""
    if not outcomes:
        yield "no strays: nothing to end"
        return
    left = [o for o in outcomes if not o["ended"]]
    for o in outcomes:
        what = f"{o['pid']} ({one_line(str(o['command']))[:60]})"
        if not o["ended"]:
            yield f"could not end {what}: {one_line(str(o['not_ended_because']))}"
        elif o["ended_by"] == "gone":
            yield f"{what} had already exited"
        else:
            yield f"ended {what} with {o['ended_by']}"
    yield ""
    if left:
        yield f"{len(outcomes) - len(left)} ended, {len(left)} still alive"
    else:
        yield f"all {len(outcomes)} ended"


_STATUS_COLORS = {"ok": "32", "warn": "33", "fail": "31;1"}


def doctor_report(report: dict[str, Any]) -> Iterator[str]:
    """One line per check (status, name, what was found), its fix indented below, then a verdict."""
    checks = report["checks"]
    width = max(len(c["name"]) for c in checks)
    for c in checks:
        status = c["status"].ljust(4)
        if colour_wanted():
            status = f"\033[{_STATUS_COLORS.get(c['status'], '0')}m{status}\033[0m"
        yield f"{status}  {c['name'].ljust(width)}  {one_line(c['message'])}"
        if c["fix"] and c["status"] != "ok":
            yield f"      {' ' * width}  fix: {one_line(c['fix'])}"
    yield ""
    if report["failed"]:
        yield f"{counted(report['failed'], 'check')} failed, {counted(report['warnings'], 'warning')}"
    elif report["warnings"]:
        yield f"no failures; {counted(report['warnings'], 'warning')}: jobwarden works, with the limits above"
    else:
        yield "all checks passed"
