"""--log-max, the shim's side: what store.logfiles.LogWatcher trimmed, written down as `log-trimmed`
events (`status` says how much output was dropped, and where). A chatty job trims every few ticks; one
event a minute, and the last at the run's end, say it all without filling the events table. Loaded at the
first trim: most runs never need it."""

from __future__ import annotations

from jobwarden.shim.record.recorder import RunRecorder, log
from jobwarden.store.logfiles import LogWatcher, Trim

NOTE_EVERY_S = 60.0


class TrimNotes:
    def __init__(self, logs: LogWatcher, record: RunRecorder) -> None:
        self.logs, self.record = logs, record
        self._noted: Trim | None = None
        self._noted_at = float("-inf")

    def note(self, now: float, mono: float, final: bool = False) -> None:
        trim = self.logs.trim
        if trim is None or trim == self._noted:
            return
        if not final and self._noted is not None and mono - self._noted_at < NOTE_EVERY_S:
            return
        if trim.unsupported:
            log(f"--log-max: cannot free part of output.log on this file system: {trim.unsupported}")
            written = self.record.event(
                "log-trim-unsupported", now, error=trim.unsupported, max_bytes=trim.max_bytes
            )
        else:
            written = self.record.event(
                "log-trimmed",
                now,
                start=trim.start,
                end=trim.end,
                dropped_bytes=trim.end - trim.start,
                max_bytes=trim.max_bytes,
            )
        if written:
            self._noted, self._noted_at = trim, mono
