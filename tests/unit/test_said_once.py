"""Words (issue 21): explain leaves out an evidence line that repeats its finding's title or summary."""

from __future__ import annotations

from jobwarden.model import Finding
from jobwarden.text.render import _finding_lines


def shown(title: str, summary: str, *evidence: str) -> list[str]:
    finding = Finding("exit-code", title, summary, "error", evidence, "do this")
    return [line[6:] for line in _finding_lines("root cause", finding) if line.startswith("    - ")]


def test_an_evidence_line_all_of_whose_words_were_said_is_left_out() -> None:
    assert shown(
        "Exited with code 1", "Main process 7 exited with status 1.", "exit code 1", "output: hi"
    ) == ["output: hi"]
    notify = "the 'failed' notification to https://h/… failed: cannot resolve the host"
    assert (
        shown(
            "a notification could not be delivered", notify, "failed -> https://h/…: cannot resolve the host"
        )
        == []
    )


def test_a_long_line_with_one_word_in_ten_new_is_a_repeat_a_short_one_is_not() -> None:
    summary = "No output, heartbeat, CPU, I/O or GPU work for 1s (the hang window is 1s)."
    quiet = "quiet for 1s (window 1s): no output, heartbeat, CPU, I/O or GPU work"
    assert shown("No progress for 1s", summary, quiet) == []
    signal = "Something sent SIGKILL to main process 620."
    assert shown("Killed by SIGKILL", signal, "main process 620 killed by SIGKILL") == [
        "main process 620 killed by SIGKILL"  # "by"... "kill": new words in a short line
    ]
    assert shown("Exited with code 2", "Main process 7 exited with status 2.", "exit code 1") == [
        "exit code 1"
    ]
