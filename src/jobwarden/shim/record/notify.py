"""Tell someone when a job fails, hangs, stalls (its step counter stops while it looks busy) or recovers,
restarts or succeeds: `--notify URL` (a JSON POST whose `text`
field is what Slack-style webhooks show, plus structured fields) and `--on-event CMD` (run through
/bin/sh with the event as JSON on its stdin).

Delivery happens on one short-lived background thread, so the shim's loop never waits on a slow or
dead server: `deliver` only queues. Every failure (refused, timed out, non-2xx, a command exiting
non-zero) is logged with its reason and is never fatal. The thread exits as soon as the queue is empty,
so between events the shim is single-threaded again (it forks the job's next attempt).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from jobwarden.config import counted
from jobwarden.errors import JobwardenError
from jobwarden.joboptions import JobOptions, redact
from jobwarden.model import Finding
from jobwarden.osapi.shell import run_shell
from jobwarden.store import Store

EVENTS = ("failed", "hung", "stalled", "recovered", "restarted", "succeeded", "slowed")
DEFAULT_TIMEOUT_S = 10.0
_MAX_PENDING = 64  # a job restarting in a tight loop must not pile up threads' worth of work
_MAX_RESPONSE = 1 << 16
_CANCEL_WAIT_S = 6.0  # a cancelled hook is SIGKILLed and reaped within the shell runner's 5 s


def event_payload(
    event: str,
    job_id: int,
    job_name: str,
    run: int,
    state: str,
    exit_code: int | None = None,
    signal: str | None = None,
    finding: str | None = None,
    host: str | None = None,
    at: str | None = None,
    page: str | None = None,
    cause: Finding | None = None,
) -> dict[str, object]:
    """The JSON every notification carries. `finding`: the title of the most likely root cause; `cause`:
    that finding, whose summary (the error's message) and first evidence line follow the title in `text`
    (a title alone, "Uncaught RuntimeError", sends the reader to a terminal); `at`: when it happened
    (default now); `page`: the job's page on a `jobwarden web` (the config file's [web] url), also at the
    end of `text`."""
    from jobwarden.clock import iso

    host = host or socket.gethostname()
    text = _summary(event, job_id, job_name, run, exit_code, signal, finding, host)
    details = cause_lines(cause) if cause is not None else []
    text = "\n".join([slack_escaped(text), *(f"> {slack_escaped(line)}" for line in details)])
    return {
        "text": f"{text} {page}" if page else text,
        "event": event,
        "job_id": job_id,
        "job_name": job_name,
        "run": run,
        "state": state,
        "exit_code": exit_code,
        "signal": signal,
        "finding": finding,
        "summary": cause.summary if cause is not None else None,
        "evidence": list(cause.evidence[:EVIDENCE_SENT]) if cause is not None else [],
        "host": host,
        "at": at or iso(time.time()),
        "url": page,
    }


DETAIL_CHARS = 300  # each line of detail in `text`: a message the job wrote may be megabytes
EVIDENCE_SENT = 5  # the structured `evidence` field: the first lines, as explain shows them first


def cause_lines(cause: Finding) -> list[str]:
    """The summary and the first evidence line that says more, each on one line and cut; nothing twice,
    never the title again."""
    said = {_one_line(cause.title)}
    lines = []
    for text in (cause.summary, *cause.evidence):
        line = _one_line(text)
        if not line or line in said:
            continue
        said.add(line)
        lines.append(line if len(line) <= DETAIL_CHARS else line[: DETAIL_CHARS - 1] + "…")
        if len(lines) == 2:
            break
    return lines


def _one_line(text: str) -> str:
    """A traceback's message on one line: a chat shows it as the quote's one line, not as lines of its own."""
    return " ".join(text.split())


def slack_escaped(text: str) -> str:
    """The three characters Slack-style renderers read as markup (<!channel>, <url|link>, entities):
    text the job controls (an error message, a name) becomes text, never a mention or a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def job_page(web_url: str | None, job_id: int) -> str | None:
    """The job's page under the web address the config file names, without any token."""
    return f"{web_url.rstrip('/')}/jobs/{job_id}" if web_url else None


def _summary(
    event: str,
    job_id: int,
    name: str,
    run: int,
    exit_code: int | None,
    signal: str | None,
    finding: str | None,
    host: str,
) -> str:
    how = f"killed by {signal}" if signal else f"exit code {exit_code}" if exit_code is not None else ""
    verb = {
        "failed": f"failed ({how})" if how else "failed",
        "hung": "looks hung",
        "stalled": "has stalled",  # shim.watch.progresswatch: the step counter stands still, the job is busy
        "recovered": "is making progress again",
        "restarted": f"was restarted (now run {run})",
        "succeeded": "succeeded",
    }.get(event, event)
    run_part = "" if event == "restarted" else f" run {run}"
    text = f"jobwarden on {host}: job {job_id} ({name}){run_part} {verb}"
    return f"{text}: {finding}" if finding else text


def recovered_text(title: str, since: float | None, until: float) -> str:
    """'No progress for 10m (hung 14:02-14:19)': what a `recovered` notification says was wrong, and when."""
    from jobwarden.clock import shown_span

    return f"{title} (hung {shown_span(since, until)})"


class Outcome(NamedTuple):
    """One delivery: of which event, for which run, to where (a URL cut to its host), and how it went."""

    event: str
    run: int
    target: str
    ok: bool
    detail: str
    at: float


class Notifier:
    """Delivers events to a URL and/or a shell command, off the caller's thread."""

    def __init__(
        self,
        url: str | None,
        command: str | None,
        log: Callable[[str], None],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.url, self.command, self.log, self.timeout_s = url, command, log, timeout_s
        # how each delivery went, for the shim's main thread to record (the store is not for this thread)
        self._outcomes: collections.deque[Outcome] = collections.deque(maxlen=_MAX_PENDING)
        self.env = dict(os.environ if env is None else env)
        self._lock = threading.Lock()
        self._queue: collections.deque[dict[str, object]] = collections.deque()
        self._worker: threading.Thread | None = None
        self._helpers: set[int] = set()
        self._closed = False
        # readable once `close` gives up: a running hook is killed then, so none outlives the shim
        self._cancel: tuple[int, int] | None = None
        # a stall and the hang it became are one trouble: both end as the job moves again, and the user
        # hears `recovered` once (the progress watch and the hang watchdog each see the end)
        self._in_trouble = False

    @classmethod
    def from_options(cls, options: JobOptions, log: Callable[[str], None]) -> Notifier:
        """The notifier a job asked for with `run --notify URL --on-event CMD`; inactive when it asked for
        neither."""
        return cls(options.notify, options.on_event, log)

    @property
    def active(self) -> bool:
        return bool(self.url or self.command)

    def deliver(self, event: dict[str, object]) -> None:
        """Queue `event` and return at once. A `recovered` with no `hung` or `stalled` before it since the
        last one is not delivered."""
        if not self.active:
            return
        kind = event.get("event")
        if kind == "recovered" and not self._in_trouble:
            return
        if kind != "slowed":  # a speed finding during a stall is no end of it: its `recovered` still comes
            self._in_trouble = kind in ("hung", "stalled")
        with self._lock:
            if self._closed:
                self.log(f"notify: closed; {event.get('event')!r} not delivered")
                return
            if len(self._queue) >= _MAX_PENDING:
                self.log(f"notify: {len(self._queue)} events still pending; dropped {event.get('event')!r}")
                return
            self._queue.append(event)
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="jobwarden-notify", daemon=True)
                self._worker.start()

    def take_outcomes(self) -> list[Outcome]:
        """The deliveries done since the last call, oldest first."""
        taken = []
        while self._outcomes:
            taken.append(self._outcomes.popleft())
        return taken

    def _done(self, event: dict[str, object], target: str, ok: bool, detail: str) -> None:
        run = event.get("run")
        self._outcomes.append(
            Outcome(
                str(event.get("event")),
                int(run) if isinstance(run, int) else 0,
                target,
                ok,
                detail,
                time.time(),
            )
        )

    def helper_pids(self) -> set[int]:
        """Pids of --on-event commands running now. They are children of the shim (in a session of
        their own): its tree discovery must not count them as the job's."""
        with self._lock:
            return set(self._helpers)

    def close(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for pending deliveries; what is left is logged and abandoned, and a
        running --on-event command is killed (with its whole session)."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join(timeout_s)
        with self._lock:
            self._closed = True
            gave_up = self._worker is not None
            left = len(self._queue) + 1
            self._queue.clear()
            cancel, hook_running = self._cancel, bool(self._helpers)
        if gave_up:
            self.log(f"notify: gave up waiting after {timeout_s:g}s; {counted(left, 'event')} not delivered")
        if gave_up and cancel is not None:
            os.write(cancel[1], b"x")  # stays readable: a hook starting just now is cancelled at once
            if worker is not None and hook_running:
                worker.join(_CANCEL_WAIT_S)
        if worker is not None and worker.is_alive():
            return  # stuck in a POST (a daemon thread: it dies with us); it may still read the pipe
        for fd in cancel or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._worker = None  # idle -> gone: no thread lives between events
                    return
                event = self._queue.popleft()
            body = json.dumps(event).encode()
            kind = str(event.get("event", "event"))
            if self.url:
                self._done(event, redact(self.url), *self._post(kind, body))
            if self.command:
                self._done(event, "--on-event", *self._run_hook(kind, body))

    def _post(self, kind: str, body: bytes) -> tuple[bool, str]:
        where = redact(self.url or "")
        try:
            status = post_json(self.url or "", body, self.timeout_s)
        except Exception as err:  # any failure is logged, never raised into the shim
            self.log(f"notify: {kind} to {where} failed: {describe_error(err)}")
            return False, describe_error(err)
        if 200 <= status < 300:
            self.log(f"notify: {kind} delivered to {where} (HTTP {status})")
            return True, f"HTTP {status}"
        self.log(f"notify: {kind} to {where} failed: HTTP {status}")
        return False, f"HTTP {status}" + (
            " (the webhook is gone or its URL is wrong)" if status in (403, 404, 410) else ""
        )

    def _run_hook(self, kind: str, body: bytes) -> tuple[bool, str]:
        env = {**self.env, "JOBWARDEN_EVENT": kind}
        with self._lock:
            if self._closed:
                return False, "not run: the supervisor was exiting"  # given up on while the POST ran
            if self._cancel is None:
                self._cancel = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            cancel_r = self._cancel[0]
        spawned: list[int] = []

        def started(pid: int) -> None:
            spawned.append(pid)
            with self._lock:
                self._helpers.add(pid)

        try:
            outcome = run_shell(self.command or "", body, self.timeout_s, env, started, cancel_r)
        finally:
            with self._lock:
                self._helpers.difference_update(spawned)
        if outcome.ok:
            self.log(f"notify: --on-event command ran for {kind}")
            return True, "ran"
        self.log(f"notify: --on-event command for {kind} failed: {outcome.describe()}")
        return False, outcome.describe()


def post_json(url: str, body: bytes, timeout_s: float) -> int:
    """POST `body` as JSON; the HTTP status. Raises on connection errors and timeouts."""
    import urllib.error
    import urllib.request

    from jobwarden import __version__

    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"jobwarden/{__version__}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read(_MAX_RESPONSE)
            return int(response.status)
    except urllib.error.HTTPError as err:
        err.close()
        return int(err.code)


def describe_error(err: BaseException) -> str:
    """'connection refused', 'timed out after 10s', ... from urllib's nested errors."""
    reason = getattr(err, "reason", err)
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (is the server up?)"
    if isinstance(reason, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve the host ({reason.strerror})"
    return f"{type(reason).__name__}: {reason}"


NOTIFY_FAILED = "notify-failed"


def record_outcomes(store: Store, job_id: int, notifier: Notifier, log: Callable[[str], None]) -> None:
    """The deliveries done since the last look, into the store (from the shim's main thread): each as an
    event of the run it was about, and the first failure of a run as a finding, so that a broken
    webhook shows in `status`, `explain` and `ps` rather than only in shim.log."""
    for outcome in notifier.take_outcomes():
        kind = "notified" if outcome.ok else NOTIFY_FAILED
        try:
            failed_before = any(e.kind == NOTIFY_FAILED for e in store.events(job_id, outcome.run))
            store.add_event(
                job_id,
                outcome.run,
                kind,
                outcome.at,
                event=outcome.event,
                target=outcome.target,
                detail=outcome.detail,
            )
            if not outcome.ok and not failed_before:
                store.add_finding(job_id, outcome.run, outcome.at, _failed_finding(outcome))
        except JobwardenError as err:
            log(f"notify: cannot record how {outcome.event!r} went: {err}")


def _failed_finding(outcome: Outcome) -> Finding:
    hook = outcome.target == "--on-event"
    return Finding(
        rule=NOTIFY_FAILED,
        title="a notification could not be delivered",
        summary=f"the {outcome.event!r} notification to {outcome.target} failed: {outcome.detail}",
        severity="warning",
        evidence=(f"{outcome.event} -> {outcome.target}: {outcome.detail}",),
        remedy=(
            "fix the --on-event command (it gets the event as JSON on stdin); shim.log has its output"
            if hook
            else "check the webhook (`--notify`, or `notify` in the config file): a Slack webhook that was "
            'removed answers 404 or 410; try it: curl -d \'{"text": "test"}\' -H \'Content-Type: '
            "application/json' URL"
        ),
    )
