"""Notifications as a user meets them (issue 21): each carries when it happened (`at`), the run it is
about, and the job page's address when a web address is configured; one that cannot be delivered (a Slack
webhook that was removed answers 404) is said in `status`, `explain` and `ps`, not only in shim.log."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.conftest import Jobwarden
from tests.integration.webhook import Server

pytestmark = pytest.mark.integration


def test_a_webhook_that_answers_404_is_noticed_in_status_explain_and_ps(
    jw: Jobwarden,
    server: Server,
) -> None:
    server.status = 404
    result = jw("run", "-w", "--name", "nightly", "--notify", server.url, "--", "true")
    assert result.returncode == 0
    assert [body["event"] for _, _, body in server.received] == ["succeeded"]
    status = jw.status(1)
    failure = status["notify_failures"]
    assert len(failure) == 1 and failure[0]["event"] == "succeeded"
    assert failure[0]["target"] == f"http://127.0.0.1:{server.server_address[1]}/…"  # never its secret path
    assert failure[0]["detail"] == "HTTP 404 (the webhook is gone or its URL is wrong)"
    text = jw("status", "1").stdout
    assert "WARNING      the 'succeeded' notification to http://127.0.0.1:" in text
    finding = next(f for f in jw.json("explain", "1")["findings"] if f["rule"] == "notify-failed")
    assert finding["severity"] == "warning" and "curl" in finding["remedy"]
    assert jw.json("ps", "--all")[0]["finding"] == "notify-failed"
    assert "secret" not in text + str(status)


def test_each_notification_says_when_which_run_and_where_its_page_is(
    jw: Jobwarden,
    server: Server,
    tmp_path: Path,
) -> None:
    config = Path(jw.env["XDG_CONFIG_HOME"]) / "jobwarden" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[web]\nurl = "http://gpu-box:8765/"\n')
    result = jw(
        "run", "-w", "--name", "flaky", "--notify", server.url, "--restart", "on-failure",
        "--max-restarts", "1", "--restart-delay", "0.01s", "--", "sh", "-c", "exit 2",
    )  # fmt: skip
    assert result.returncode == 2
    bodies = [body for _, _, body in server.received]
    assert [b["event"] for b in bodies] == ["restarted", "failed"]
    restarted, failed = bodies
    assert (restarted["run"], restarted["after_run"], restarted["state"]) == (2, 1, "restarting")
    assert "(flaky) was restarted (now run 2)" in restarted["text"]
    assert failed["run"] == 2 and "(flaky) run 2 failed (exit code 2)" in failed["text"]
    for body in bodies:
        assert body["url"] == "http://gpu-box:8765/jobs/1"
        assert body["text"].endswith(" http://gpu-box:8765/jobs/1")
        assert datetime.fromisoformat(str(body["at"]).replace("Z", "+00:00")).year >= 2024
    assert jw.status(1)["notify_failures"] == []


def test_a_failure_notification_carries_the_message_and_first_evidence_as_text(
    jw: Jobwarden,
    server: Server,
) -> None:
    """The title alone ("Uncaught RuntimeError") sends the reader to a terminal: the message comes with
    it, and what the job wrote (here a Slack mention and a link) arrives as text, never as markup."""
    boom = "raise RuntimeError('shard 7 missing <!channel> <http://evil|click> & co')"
    result = jw("run", "-w", "--name", "loader", "--notify", server.url, "--", sys.executable, "-c", boom)
    assert result.returncode == 1
    ((_, _, failed),) = server.received
    lines = failed["text"].splitlines()
    assert lines[0].endswith("(loader) run 1 failed (exit code 1): Uncaught RuntimeError")
    assert lines[1] == "> RuntimeError: shard 7 missing &lt;!channel&gt; &lt;http://evil|click&gt; &amp; co"
    assert lines[2].startswith("> raised at ")
    assert "<!channel>" not in failed["text"] and "<http" not in failed["text"]
    assert (
        failed["summary"] == "RuntimeError: shard 7 missing <!channel> <http://evil|click> & co"
    )  # JSON: as is
    assert failed["evidence"][0].startswith("RuntimeError: shard 7 missing")
