"""The `top` application: a live table of jobs, the selected job's detail below it, keys to act.

Reads and actions run in worker threads (textual's `@work(thread=True)`) and hand their results back
with `call_from_thread`: the screen stays responsive while a store is busy, a stop waits out its grace
period or a dump attaches py-spy to every process."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Input, Log, Static

from jobwarden.clock import SystemClock, shown_time
from jobwarden.errors import JobwardenError
from jobwarden.osapi.procfs import ProcFS
from jobwarden.text import render
from jobwarden.text.sanitize import one_line
from jobwarden.tui import cells, data
from jobwarden.tui.screens import ConfirmScreen, LogScreen, TextScreen

FULL_LOG_LINES = 2000
_WRITES = frozenset({"stop", "dump"})  # what --read-only takes away
_ON_THE_LIST = frozenset(
    {
        "stop",
        "dump",
        "explain",
        "logs",
        "toggle_all",
        "help",
        "sort",
        "sort_processes",
        "filter",
        "clear_filter",
    }
)
# `o` goes round these: how the job list is ordered (nvitop's and htop's sort keys)
SORTS = ("id", "cpu", "mem", "time", "state")
PROCESS_SORTS = ("cpu", "mem", "pid")


class TopApp(App[None]):
    TITLE = "jobwarden top"
    ENABLE_COMMAND_PALETTE = False  # every command is one key, listed in the footer and on ?
    CSS = """
    #bar { background: $boost; }
    #jobs { height: auto; max-height: 45%; }
    #detail { height: 1fr; border-top: solid $primary; }
    #summary { height: auto; max-height: 12; }
    #procs { height: auto; max-height: 8; border-top: dashed $primary-darken-2; }
    #tail { height: 1fr; }
    #filter { dock: bottom; height: 3; display: none; }
    #filter.shown { display: block; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "stop", "Stop"),
        Binding("d", "dump", "Dump"),
        Binding("e", "explain", "Explain"),
        Binding("l", "logs", "Logs"),
        Binding("a", "toggle_all", "All"),
        Binding("o", "sort", "Sort"),
        Binding("p", "sort_processes", "Procs sort", show=False),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, home: Path, interval: float, include_ended: bool, read_only: bool) -> None:
        super().__init__()
        self.home, self.interval, self.read_only = home, interval, read_only
        self.include_ended = include_ended
        self.procfs = ProcFS()
        self.selected: int | None = None
        self.snapshot: data.Snapshot | None = None
        self._loading = self._load_again = False
        self._tail_shown: list[str] = []
        self.sort, self.process_sort, self.filter_text = "id", "cpu", ""
        self.shown_columns: tuple[str, ...] = ()

    def compose(self) -> ComposeResult:
        yield Static(id="bar")
        yield DataTable(id="jobs", cursor_type="row")
        with Vertical(id="detail"):
            yield Static(id="summary")
            yield Static(id="procs")
            yield Log(id="tail")
        yield Input(placeholder="filter: a name or a state (Enter keeps it, Esc clears it)", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self._set_columns()
        self.reload()
        self.set_interval(self.interval, self.reload)

    def _set_columns(self) -> bool:
        """The columns the terminal's width has room for (cells.columns_for); True when they changed."""
        wanted = cells.columns_for(self.size.width)
        if wanted == self.shown_columns:
            return False
        table = self.query_one("#jobs", DataTable)
        table.clear(columns=True)
        self.columns = table.add_columns(*wanted)
        self.shown_columns = wanted
        return True

    def on_resize(self) -> None:
        if self._set_columns() and self.snapshot is not None:
            self._show(self.snapshot)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _ON_THE_LIST and len(self.screen_stack) > 1:
            return False  # a page is open (explain, dump, log, help): its keys only
        return not (self.read_only and action in _WRITES)

    # --- reading ------------------------------------------------------------------------------------

    def reload(self) -> None:
        """Read again, unless a read is under way: then once more right after it."""
        if self._loading:
            self._load_again = True
            return
        self._loading = True
        self._load(self.include_ended, self.selected)

    @work(thread=True, group="load")
    def _load(self, include_ended: bool, selected: int | None) -> None:
        try:
            snapshot: data.Snapshot | str = data.load(self.home, self.procfs, include_ended, selected)
        except Exception as err:  # a store that cannot be opened: say so, keep trying
            snapshot = " ".join(_failure(err))
        self.call_from_thread(self._loaded, snapshot)

    def _loaded(self, snapshot: data.Snapshot | str) -> None:
        self._loading = False
        if isinstance(snapshot, str):
            self.query_one("#bar", Static).update(Text(f"jobwarden top: {snapshot}", style="red"))
        else:
            self.snapshot = snapshot
            self._show(snapshot)
        if self._load_again:
            self._load_again = False
            self.reload()

    def _show(self, snapshot: data.Snapshot) -> None:
        now = SystemClock().wall()
        rows = self._arranged(snapshot.rows, now)
        self._fill_table(rows, now)
        count = f"{len(rows)} job{'s' if len(rows) != 1 else ''}"
        which = "all" if self.include_ended else "active; a: all"
        clock = shown_time(now, "time")  # the zone every command shows (--utc: a Z)
        mode = " — read-only" if self.read_only else ""
        order = f" — by {self.sort}" if self.sort != "id" else ""
        bar = Text(f"jobwarden top — {count} ({which}){order} — every {self.interval:g}s — {clock}{mode}")
        if self.filter_text:
            bar.append(" — filter: ")
            bar.append(self.filter_text, style="bold")  # typed by the user, shown as text
        bar.append("   ?: help")
        self.query_one("#bar", Static).update(bar)
        self._show_detail(snapshot.detail)

    def _arranged(self, rows: list[data.JobRow], now: float) -> list[data.JobRow]:
        """The rows the filter keeps, in the chosen order (the newest first among equals)."""
        wanted = self.filter_text.strip().lower()
        if wanted:
            rows = [r for r in rows if wanted in r.view.job.name.lower() or wanted == str(r.view.run.state)]
        keys = {
            "id": lambda r: r.view.job.id,
            "cpu": lambda r: r.view.cpu_percent or 0.0,
            "mem": lambda r: r.view.rss_bytes or 0,
            "time": lambda r: (r.view.run.ended_at or now) - (r.view.run.started_at or now),
            "state": lambda r: str(r.view.run.state),
        }
        if self.sort == "id":  # what runs first, then the newest: `top --all` keeps the live jobs in view
            return sorted(rows, key=lambda r: (r.view.run.state.is_ended, -r.view.job.id))
        ordered = sorted(rows, key=lambda r: r.view.job.id)
        return sorted(ordered, key=keys[self.sort], reverse=self.sort != "state")

    def _fill_table(self, rows: list[data.JobRow], now: float) -> None:
        """Same jobs as shown: update the cells in place (the cursor and scroll stay). Otherwise rebuild,
        and put the cursor back on the selected job."""
        table = self.query_one("#jobs", DataTable)
        wide = self.size.width >= cells.WIDE_COLUMNS  # room for each verdict's title
        narrow = self.shown_columns == cells.NARROW_COLUMNS

        def row_cells(row: data.JobRow) -> tuple[Text, ...]:
            return cells.narrow_cells(row, now) if narrow else cells.row_cells(row, now, wide)

        keys = [str(r.view.job.id) for r in rows]
        if keys == [k.value for k in table.rows]:
            for key, row in zip(keys, rows, strict=True):
                for column, cell in zip(self.columns, row_cells(row), strict=True):
                    table.update_cell(key, column, cell, update_width=True)
            return
        keep = str(self.selected)
        table.clear()
        for key, row in zip(keys, rows, strict=True):
            table.add_row(*row_cells(row), key=key)
        if keep in keys:
            table.move_cursor(row=keys.index(keep), animate=False)

    def _show_detail(self, detail: data.Detail | None) -> None:
        width = self.size.width
        self.query_one("#summary", Static).update(cells.detail_text(detail, width))
        procs = self.query_one("#procs", Static)
        procs.display = detail is not None
        if detail is not None:
            run = detail.status.run
            procs.update(cells.processes_text(detail.status.processes, run.pid, width, self.process_sort))
        lines = detail.log_tail if detail else []
        if lines != self._tail_shown:  # rewritten only when it changed: a scrolled tail stays put
            self._tail_shown = lines
            tail = self.query_one("#tail", Log)
            tail.clear()
            tail.write_lines(lines)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.cursor_row != event.data_table.cursor_row:
            return  # stale: the table was rebuilt since
        chosen = int(event.row_key.value) if event.row_key.value else None
        if chosen != self.selected:
            self.selected = chosen
            self.reload()

    # --- actions ------------------------------------------------------------------------------------

    def _selected_row(self) -> data.JobRow | None:
        rows = self.snapshot.rows if self.snapshot else []
        return next((r for r in rows if r.view.job.id == self.selected), rows[0] if rows else None)

    def action_toggle_all(self) -> None:
        self.include_ended = not self.include_ended
        self.reload()

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.notify(f"jobs by {self.sort}", markup=False, timeout=2)
        if self.snapshot is not None:
            self._show(self.snapshot)

    def action_sort_processes(self) -> None:
        self.process_sort = PROCESS_SORTS[(PROCESS_SORTS.index(self.process_sort) + 1) % len(PROCESS_SORTS)]
        self.notify(f"processes by {self.process_sort}", markup=False, timeout=2)
        if self.snapshot is not None:
            self._show_detail(self.snapshot.detail)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        self._filter_done()

    def _filter_done(self) -> None:
        self.query_one("#filter", Input).remove_class("shown")
        self.query_one("#jobs", DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter_text = event.value
        if self.snapshot is not None:
            self._show(self.snapshot)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._filter_done()

    def action_help(self) -> None:
        self.push_screen(TextScreen("help", list(cells.HELP)))

    def action_logs(self) -> None:
        row = self._selected_row()
        if row is None:
            return
        job, run_n = row.view.job, row.view.run.n
        title = f"log of job {job.id} ({one_line(job.name)}), run {run_n}"
        self.push_screen(
            LogScreen(
                title, lambda: data.read_job_log(self.home, job.id, run_n, FULL_LOG_LINES), self.interval
            )
        )

    def action_explain(self) -> None:
        row = self._selected_row()
        if row is not None:
            self._explain(row.view.job.id)

    @work(thread=True, group="act")
    def _explain(self, job_id: int) -> None:
        try:
            lines = list(render.explain_report(data.load_status(self.home, self.procfs, job_id)))
        except Exception as err:
            lines = _failure(err)
        self.call_from_thread(self.push_screen, TextScreen(f"explain {job_id}", lines))

    def action_dump(self) -> None:
        row = self._selected_row()
        if row is not None:
            self.notify(f"taking the stacks of job {row.view.job.id}…", markup=False)
            self._dump(row.view.job.id)

    @work(thread=True, group="act")
    def _dump(self, job_id: int) -> None:
        from jobwarden.control.dump import dump_job

        try:
            lines = list(render.dump_report(dump_job(self.home, self.procfs, str(job_id))))
        except Exception as err:
            lines = _failure(err)
        self.call_from_thread(self.push_screen, TextScreen(f"dump {job_id}", lines))

    def action_stop(self) -> None:
        row = self._selected_row()
        if row is None:
            return
        job_id = row.view.job.id
        question = Text(f"Stop job {job_id} (")
        question.append(one_line(row.view.job.name))
        question.append(")? It gets SIGTERM, then SIGKILL after its grace period.  y/N")

        def answered(yes: bool | None) -> None:
            if yes:
                self.notify(f"stopping job {job_id}…", markup=False)
                self._stop(job_id)

        self.push_screen(ConfirmScreen(question), answered)

    @work(thread=True, group="act")
    def _stop(self, job_id: int) -> None:
        from jobwarden.control.lifecycle import stop

        try:
            message = one_line(" ".join(render.stop_report(stop(self.home, self.procfs, str(job_id), None))))
        except Exception as err:
            message = " ".join(_failure(err))
        self.call_from_thread(self.notify, message, markup=False)
        self.call_from_thread(self.reload)


def _failure(err: Exception) -> list[str]:
    """What went wrong, as lines for the screen: a worker's exception must never end the UI with a
    traceback. jobwarden's own errors say what to do; anything else is named by its type."""
    if isinstance(err, JobwardenError):
        return [one_line(err.message), one_line(err.remedy)] if err.remedy else [one_line(err.message)]
    return [f"{type(err).__name__}: {one_line(str(err))}"]
