"""What a notification says, and what is never logged (a webhook's secret path); the option checks."""

from __future__ import annotations

import json
import socket
import urllib.error
from pathlib import Path

import pytest

from jobwarden.control.options import notify_options, run_options
from jobwarden.errors import UsageError
from jobwarden.joboptions import JobOptions, redact
from jobwarden.shim.record.notify import EVENTS, Notifier, describe_error, event_payload


def test_the_payload_has_a_slack_text_and_the_structured_fields() -> None:
    payload = event_payload(
        "failed",
        12,
        "train.py",
        1,
        "failed",
        signal="SIGKILL",
        finding="Killed by the OOM killer",
        host="gpu-3",
    )
    assert (
        payload["text"]
        == "jobwarden on gpu-3: job 12 (train.py) run 1 failed (killed by SIGKILL): Killed by the OOM killer"
    )
    assert {
        k: payload[k] for k in ("event", "job_id", "job_name", "run", "state", "exit_code", "signal", "host")
    } == {
        "event": "failed",
        "job_id": 12,
        "job_name": "train.py",
        "run": 1,
        "state": "failed",
        "exit_code": None,
        "signal": "SIGKILL",
        "host": "gpu-3",
    }
    assert payload["finding"] == "Killed by the OOM killer"


@pytest.mark.parametrize(
    ("event", "kwargs", "text"),
    [
        ("failed", {"exit_code": 3}, "job 4 (t) run 2 failed (exit code 3)"),
        ("succeeded", {"exit_code": 0}, "job 4 (t) run 2 succeeded"),
        ("hung", {"finding": "Fork deadlock"}, "job 4 (t) run 2 looks hung: Fork deadlock"),
        ("restarted", {}, "job 4 (t) was restarted (now run 2)"),
        (
            "stalled",
            {"finding": "step 620/1000 (62%), no step for 2m00s while busy"},
            "job 4 (t) run 2 has stalled: step 620/1000 (62%), no step for 2m00s while busy",
        ),
        ("recovered", {}, "job 4 (t) run 2 is making progress again"),
    ],
)
def test_each_event_reads_as_a_sentence(event: str, kwargs: dict[str, object], text: str) -> None:
    payload = event_payload(event, 4, "t", 2, "running", host="h", **kwargs)  # type: ignore[arg-type]
    assert payload["text"] == f"jobwarden on h: {text}"
    assert event in EVENTS


def test_the_host_defaults_to_this_machine() -> None:
    assert event_payload("succeeded", 1, "t", 1, "succeeded")["host"] == socket.gethostname()


def test_a_webhook_url_is_logged_without_its_secret_path() -> None:
    assert redact("https://hooks.slack.com/services/T000/B000/XXXX?token=1") == "https://hooks.slack.com/…"
    assert redact("http://127.0.0.1:8080/hook") == "http://127.0.0.1:8080/…"


def test_errors_are_described_in_words() -> None:
    assert describe_error(urllib.error.URLError(ConnectionRefusedError(111, "x"))).startswith(
        "connection refused"
    )
    assert describe_error(TimeoutError("timed out")) == "timed out"
    assert describe_error(urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))) == (
        "cannot resolve the host (Name or service not known)"
    )


def test_a_notifier_with_nowhere_to_deliver_does_nothing() -> None:
    logged: list[str] = []
    notifier = Notifier(None, None, logged.append)
    notifier.deliver({"event": "failed"})
    notifier.close(1)
    assert not notifier.active and logged == []


# --- the run options ------------------------------------------------------------------------------------


def test_notify_options_are_stored_under_their_keys() -> None:
    assert notify_options("https://example.com/hook", "logger -t jw") == {
        "notify": "https://example.com/hook",
        "on_event": "logger -t jw",
    }
    assert notify_options(None, None) == {}


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x", "example.com/hook", "file:///etc/passwd", "http://", ""]
)
def test_a_notify_url_must_be_http_or_https(url: str) -> None:
    with pytest.raises(UsageError) as info:
        notify_options(url, None)
    assert "not an http(s) URL" in info.value.message
    assert "https://" in info.value.remedy


def test_an_empty_on_event_command_is_refused() -> None:
    with pytest.raises(UsageError):
        notify_options(None, "  ")


def test_run_takes_notify_and_on_event() -> None:
    from jobwarden.cli.main import build_parser

    args = build_parser().parse_args(["run", "--notify", "https://x/h", "--on-event", "cat", "--", "true"])
    assert (args.notify, args.on_event, args.argv[-1]) == ("https://x/h", "cat", "true")


def test_a_notifier_is_made_from_the_job_options() -> None:
    notifier = Notifier.from_options(run_options(notify="https://x/h", on_event="cat"), print)
    assert (notifier.url, notifier.command, notifier.active) == ("https://x/h", "cat", True)
    assert not Notifier.from_options(JobOptions(), print).active


def test_a_stall_and_the_hang_it_became_end_in_one_recovered(tmp_path: Path) -> None:
    out = tmp_path / "events"
    notifier = Notifier(None, f"cat >> {out}; echo >> {out}", lambda line: None)
    for kind in ("recovered", "stalled", "hung", "recovered", "recovered", "hung", "restarted", "recovered"):
        notifier.deliver({"event": kind, "run": 1})
    notifier.close(60)
    delivered = [json.loads(line)["event"] for line in out.read_text().splitlines() if line.strip()]
    assert delivered == ["stalled", "hung", "recovered", "hung", "restarted"]


def test_a_slowdown_during_a_stall_does_not_swallow_its_recovered(tmp_path: Path) -> None:
    out = tmp_path / "events"
    notifier = Notifier(None, f"cat >> {out}; echo >> {out}", lambda line: None)
    for kind in ("stalled", "slowed", "recovered", "slowed", "recovered"):
        notifier.deliver({"event": kind, "run": 1})
    notifier.close(60)
    delivered = [json.loads(line)["event"] for line in out.read_text().splitlines() if line.strip()]
    assert delivered == ["stalled", "slowed", "recovered", "slowed"]


def test_the_cause_follows_the_title_capped_deduplicated_and_never_markup() -> None:
    from jobwarden.model import Finding

    long_message = "ValueError: " + "x" * 5000
    cause = Finding(
        "python-exception",
        "Uncaught ValueError",
        long_message,
        "error",
        (long_message, "raised at train.py:41 in step", "exit code 1"),
        "fix it",
        (7,),
    )
    text = str(
        event_payload("failed", 4, "t", 1, "failed", finding=cause.title, host="h", cause=cause)["text"]
    )
    head, message, where = text.splitlines()
    assert head == "jobwarden on h: job 4 (t) run 1 failed: Uncaught ValueError"
    assert message.startswith("> ValueError: xxx") and message.endswith("…") and len(message) <= 302
    assert where == "> raised at train.py:41 in step"  # the first evidence line that says more
    marked = Finding("exit-code", "Exited with <code>", "a <@U123> & b", "error", (), "", ())
    assert (
        event_payload("failed", 4, "t", 1, "failed", finding=marked.title, host="h", cause=marked)["text"]
        == "jobwarden on h: job 4 (t) run 1 failed: Exited with &lt;code&gt;\n> a &lt;@U123&gt; &amp; b"
    )
