"""`top`'s pop-up views: a text page (explain, dump, help, the full log) and the y/N question before a
stop. Texts arrive as lines and are shown as rich Text in a RichLog with markup off (nothing parsed),
wrapped at the screen's width: an explanation's long remedy is read whole, not cut at the edge. Every
view says its name and how to leave it (q or Esc) in the same place, its title line."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, RichLog, Static

from jobwarden.text.sanitize import terminal_text

BACK = "q/esc: back"


class TextScreen(Screen[None]):
    """A full-screen page of lines, wrapped; q or Esc goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "app.pop_screen", "Back", key_display="q/esc")
    ]
    DEFAULT_CSS = """
    TextScreen #title { background: $boost; text-style: bold; }
    TextScreen RichLog { height: 1fr; }
    """

    def __init__(self, title: str, lines: list[str], follow: bool = False) -> None:
        super().__init__()
        self.title_text, self.lines, self.follow = title, lines, follow

    def compose(self) -> ComposeResult:
        yield Static(Text(f"{terminal_text(self.title_text)} — {BACK}"), id="title")
        yield RichLog(
            wrap=True, markup=False, highlight=False, auto_scroll=self.follow, min_width=20, id="page"
        )
        yield Footer()

    def on_mount(self) -> None:
        self.show_lines(self.lines)

    def show_lines(self, lines: list[str], again: bool = False) -> None:
        page = self.query_one("#page", RichLog)
        if lines == self.lines and page.lines and not again:
            return
        self.lines = lines
        page.clear()
        width = max(20, self.app.size.width - 2)  # the scroll bar's column
        for line in lines:  # Text: never markup; sanitised: no escape reaches the terminal
            clean = terminal_text(line)
            for piece in [clean] if self.follow else hanging(clean, width):
                page.write(Text(piece), scroll_end=self.follow)
        if not self.follow:
            page.scroll_home(animate=False)

    def on_resize(self) -> None:
        if self.lines and not self.follow:
            self.show_lines(self.lines, again=True)  # wrapped anew at the new width


def hanging(line: str, width: int) -> list[str]:
    """A line too long for `width`, cut at spaces, its continuations indented under its text ("  what to
    do: ..." goes on four columns in), as `explain` reads in a terminal wide enough."""
    if len(line) <= width:
        return [line]
    lead = len(line) - len(line.lstrip(" "))
    indent = " " * min(lead + 4, width // 2)
    # the lead as the first line's indent, not as text: textwrap drops it when the first word must be cut
    first = " " * min(lead, width // 2)
    return textwrap.wrap(
        line[lead:], width, initial_indent=first, subsequent_indent=indent, break_on_hyphens=False
    ) or [line]


class LogScreen(TextScreen):
    """The job's log, full screen, its tail read again every `interval` seconds (in a worker thread)."""

    def __init__(self, title: str, read: Callable[[], list[str]], interval: float) -> None:
        super().__init__(title, [], follow=True)
        self.read, self.interval = read, interval

    def on_mount(self) -> None:
        self.reload()
        self.set_interval(self.interval, self.reload)

    @work(thread=True, exclusive=True, group="log")
    def reload(self) -> None:
        lines = self.read()
        self.app.call_from_thread(self.show_lines, lines)


class ConfirmScreen(ModalScreen[bool]):
    """A y/N question: y answers yes, any other key no."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 80%; height: auto; border: heavy $warning; padding: 1 2;
                               background: $surface; }
    """

    def __init__(self, question: Text) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.question, id="question")

    def on_key(self, event: events.Key) -> None:
        event.stop()
        self.dismiss(event.key == "y")
