"""`top`'s text: table cells and the detail pane, as rich Text.

Everything a job provides (its name, command, log lines, rule ids such as `[oom-kill]`) goes into
`Text(...)`, never a plain `str`: textual parses a str as markup, and `failed [oom-kill]` would show as
`failed`, `[bold]x[/bold]` as a bold x. Colours are styles on the Text; NO_COLOR is textual's to honour
(it turns every colour monochrome)."""

from __future__ import annotations

import shlex
import time
from typing import Any

from rich.text import Text

from jobwarden.config import format_duration, format_size
from jobwarden.control.views.joblist import JobView
from jobwarden.model import Finding, JobState, ProcessSnapshot
from jobwarden.progress.model import Progress
from jobwarden.text.progress import progress_cell, progress_line, whole_percent
from jobwarden.text.render import how_it_ended
from jobwarden.text.sanitize import one_line
from jobwarden.tui.data import Detail, JobRow, sparkline

COLUMNS = ("ID", "NAME", "STATE", "RUN", "PID", "TIME", "CPU", "MEM", "GPU", "PROGRESS", "FINDING")
# under NARROW_BELOW columns (80 wide): what tells one job from another and how it does, nothing cut
NARROW_COLUMNS = ("ID", "NAME", "STATE", "TIME", "CPU", "MEM", "PROG", "FINDING")
NARROW_BELOW = 110
NARROW_NAME = 14
NARROW_FINDING = 18
STATE_STYLES = {
    "running": "green",
    "hung": "bold magenta",  # running but hung: not the green of a healthy run, as `ps` colours it
    "succeeded": "green",
    "failed": "red",
    "lost": "bold red",
    "stopped": "yellow",
    "stopping": "yellow",
    "starting": "cyan",
    "queued": "cyan",
}
SPARK_WIDTH = 30
WIDE_COLUMNS = 150  # a terminal this wide shows each verdict's title beside its rule
TITLE_WIDTH = 60


def state_text(view: JobView) -> Text:
    run = view.run
    look = "hung" if view.hung else str(run.state)  # one word for a state, as `ps` and `explain` say it
    label = look
    if run.state.is_ended and (run.signal or run.exit_code):
        label += f" ({run.signal or run.exit_code})"
    return Text(label, style=STATE_STYLES.get(look, ""))


def row_cells(row: JobRow, now: float, wide: bool = False) -> tuple[Text, ...]:
    view, run = row.view, row.view.run
    runtime = format_duration((run.ended_at or now) - run.started_at) if run.started_at else "-"
    cpu = f"{view.cpu_percent:.0f}%" if view.cpu_percent is not None else "-"
    cells = (
        str(view.job.id),
        one_line(view.job.name),
        state_text(view),
        str(run.n),
        str(run.pid or "-"),
        runtime,
        cpu,
        format_size(view.rss_bytes),
        format_size(row.gpu_memory_bytes),
        progress_cell(view.progress, run.state == JobState.RUNNING, now),
        _verdict(view, wide),
    )
    return tuple(c if isinstance(c, Text) else Text(c) for c in cells)


def columns_for(width: int) -> tuple[str, ...]:
    return NARROW_COLUMNS if width < NARROW_BELOW else COLUMNS


def narrow_cells(row: JobRow, now: float) -> tuple[Text, ...]:
    """A row in 80 columns: the name and finding cut to their share, the state a word (and its code)."""
    view, run = row.view, row.view.run
    runtime = format_duration((run.ended_at or now) - run.started_at) if run.started_at else "-"
    state = state_text(view)
    if len(state) > 10:  # "stopped (SIGTERM)": the word says it; status has the rest
        state = Text(str(run.state), style=state.style)
    cells = (
        str(view.job.id),
        _cut(one_line(view.job.name), NARROW_NAME),
        state,
        runtime,
        f"{view.cpu_percent:.0f}%" if view.cpu_percent is not None else "-",
        format_size(view.rss_bytes),
        _short_progress(view.progress),
        _cut(f"[{view.finding}]", NARROW_FINDING) if view.finding else "",
    )
    return tuple(c if isinstance(c, Text) else Text(c) for c in cells)


def _short_progress(p: Progress | None) -> str:
    if p is None:
        return ""
    shown = p.fraction if p.fraction is not None else p.bar_fraction  # the run's, else its epoch's
    if shown is not None:
        return f"{whole_percent(shown)}%"
    return f"{p.step}" if p.step is not None else ""


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _verdict(view: JobView, wide: bool) -> str:
    """The run's verdict: `[rule]`, and its title where the terminal has room."""
    if not view.finding:
        return ""
    title = f" {one_line(view.finding_title)[:TITLE_WIDTH]}" if wide and view.finding_title else ""
    return f"[{view.finding}]{title}"


def detail_text(detail: Detail | None, width: int) -> Text:
    """The selected job: who it is, how it does (sparklines), what is wrong with it and what to do."""
    if detail is None:
        return Text("no jobs (press a to show ended ones)")
    status = detail.status
    job, run = status.job, status.run
    text = Text()
    text.append(f"job {job.id} ", style="bold")
    text.append(one_line(job.name), style="bold")
    text.append(" — ")
    look = "hung" if status.hung else str(run.state)
    text.append(how_it_ended(run, status.hung), style=STATE_STYLES.get(look, ""))
    text.append(f"   run {run.n}   pid {run.pid or '-'}   {len(status.processes)} process(es) alive\n")
    text.append(f"  {one_line(shlex.join(job.command))[: max(20, width - 4)]}\n", style="dim")
    text.append_text(_usage_line(detail))
    text.append("\n")
    if status.progress is not None:
        text.append_text(_progress_text(detail, status.progress, status.run.state == JobState.RUNNING, width))
        text.append("\n")
    text.append_text(_ranks_text(status.ranks, width))
    text.append_text(findings_text(status.current_findings, width))
    if status.recovery:
        text.append(f"\n  {status.recovery}", style="dim")
    return text


def _ranks_text(ranks: list[dict[str, Any]], width: int) -> Text:
    """Each rank of a running distributed job, a line each: its step, its rate, the newest collective its
    flight recorder named, where it is."""
    text = Text()
    for r in ranks:
        rate = f"{r['rate']:.2f}/s" if isinstance(r.get("rate"), int | float) else "-"
        where = one_line(str(r.get("where") or "unknown"))
        detail = f" ({one_line(str(r['where_detail']))})" if r.get("where_detail") else ""
        step = r.get("step") if r.get("step") is not None else "-"
        call = r.get("collective")
        called = one_line(f"#{call.get('seq')} {call.get('op')}  ")[:32] if isinstance(call, dict) else ""
        line = f"  rank {r.get('rank')}  pid {r.get('pid')}  step {step}  {rate}  {called}"
        text.append(line, style="dim")
        text.append(
            f"{where}{detail}"[: max(10, width - len(line) - 2)] + "\n", style=_WHERE_STYLES.get(where, "")
        )
    return text


_WHERE_STYLES = {"computing": "green", "collective": "yellow", "idle": "dim"}


def _usage_line(detail: Detail) -> Text:
    line = Text("  ")
    cpu = detail.latest_cpu_percent
    for label, values, latest in (
        ("CPU", detail.cpu_percent, f"{cpu:.0f}%" if cpu is not None else "-"),
        ("RSS", detail.rss_bytes, format_size(detail.latest_rss_bytes)),
    ):
        line.append(f"{label} ", style="bold")
        spark = sparkline(values, SPARK_WIDTH)
        if spark:
            line.append(spark, style="cyan")
            line.append(" ")
        line.append(f"{latest}   ")
    return line


BAR_WIDTH = 20
BLOCKS = " ▏▎▍▌▋▊▉█"


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """A bar of `width` cells in eighths, as tqdm draws its own."""
    eighths = round(min(max(fraction, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (BLOCKS[part] if part else "")).ljust(width)


def _progress_text(detail: Detail, p: Progress, live: bool, width: int) -> Text:
    """The job's step counter: a bar, where it stands, its rate and loss over the last minutes. The first
    line fits the pane (its tail, where the progress came from, is what gives way)."""
    line = Text("  ")
    line.append("progress ", style="bold")
    shown = p.fraction if p.fraction is not None else p.bar_fraction  # the run's, else its epoch's
    if shown is not None:
        line.append(progress_bar(shown), style="green" if not p.stalled_since else "yellow")
        line.append(" ")
    line.append(progress_line(p, live, time.time()))
    line.truncate(max(width - 1, 20), overflow="ellipsis")
    if detail.step_rate:
        line.append("\n  ")
        line.append("steps/s  ", style="bold")
        line.append(sparkline(detail.step_rate, SPARK_WIDTH), style="cyan")
    if detail.loss:
        line.append("   ")
        line.append(f"{one_line(p.loss_name or 'loss')} ", style="bold")
        line.append(sparkline(detail.loss, SPARK_WIDTH), style="magenta")
    return line


def findings_text(findings: list[Finding], width: int) -> Text:
    if not findings:
        return Text("  no findings")
    text = Text()
    for i, f in enumerate(findings):
        if i:
            text.append("\n")
        text.append(f"  [{f.rule}] ", style="bold red" if i == 0 else "bold")
        text.append(one_line(f.title))
        if f.remedy:
            text.append("\n      what to do: ", style="dim")
            text.append(one_line(f.remedy)[: max(20, width * 2)])
    return text


PROCESS_HEADER = ("PID", "RANK", "ROLE", "CPU", "RSS", "GPU MEM")
PROCESSES_SHOWN = 6  # the detail pane's share; `status` and the web page list them all


def process_role(p: ProcessSnapshot, main_pid: int | None, ranks: dict[int, int | None]) -> str:
    """main (the job's own process), rank (a process a launcher gave a RANK to; its children inherit
    that variable, so a process whose parent has the same rank is that rank's worker), worker."""
    if p.pid == main_pid:
        return "main"
    rank = p.ranks.rank if p.ranks else None
    if rank is not None and ranks.get(p.ppid) != rank:
        return "rank"
    return "worker"


def _process_order(sort: str, p: ProcessSnapshot) -> float:
    if sort == "mem":
        return -p.rss_bytes
    if sort == "pid":
        return p.pid
    return -(p.cpu_percent or 0.0)  # cpu: the busiest first


def processes_text(processes: list[ProcessSnapshot], main_pid: int | None, width: int, sort: str) -> Text:
    """The selected job's processes, the busiest first: pid, rank, role, CPU, RSS, GPU memory, command."""
    if not processes:
        return Text("  no live process", style="dim")
    ranks = {p.pid: (p.ranks.rank if p.ranks else None) for p in processes}
    shown = sorted(processes, key=lambda p: (p.pid != main_pid, _process_order(sort, p)))[:PROCESSES_SHOWN]
    widths = (7, 4, 6, 5, 9, 9)
    command_width = max(10, width - sum(widths) - len(widths) - 3)
    text = Text(
        "  " + " ".join(h.rjust(w) for h, w in zip(PROCESS_HEADER, widths, strict=True)), style="bold"
    )
    text.append(" COMMAND\n", style="bold")
    for i, p in enumerate(shown):
        rank = ranks[p.pid]
        cells = (
            str(p.pid),
            "-" if rank is None else str(rank),
            process_role(p, main_pid, ranks),
            f"{p.cpu_percent:.0f}%" if p.cpu_percent is not None else "-",
            format_size(p.rss_bytes),
            format_size(p.gpu_memory_bytes),
        )
        text.append("  " + " ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " ")
        text.append(_cut(one_line(p.cmdline), command_width), style="dim")
        if i < len(shown) - 1:
            text.append("\n")
    if len(processes) > len(shown):
        text.append(
            f"\n  … {len(processes) - len(shown)} more (jobwarden status shows them all)", style="dim"
        )
    return text


HELP = (
    "jobwarden top — keys",
    "",
    "  up/down  select a job",
    "  s        stop the selected job (asks y/N; not with --read-only)",
    "  d        dump: the stacks of every process of the job, now (not with --read-only)",
    "  e        explain: why it ended or is stuck, root cause first",
    "  l        the job's log, full screen",
    "  a        show ended jobs too / only active ones",
    "  o        sort the jobs by: id, CPU, memory, run time, state (again: the next)",
    "  p        sort the selected job's processes by: CPU, memory, pid",
    "  /        filter the jobs by name or state as you type; Enter keeps it, Esc clears it",
    "  ?        this help",
    "  q        quit; in a view (explain, dump, log, help) q or Esc goes back to the list",
)
