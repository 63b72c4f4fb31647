"""Progress as `ps`, `status`, `explain` and `top` write it: the contract's PROGRESS column
("45% 450/1000 5.4it/s ETA 1m42s", "step 4500 5.4it/s"), where an ended run stopped, where a restarted
run resumed, and nothing the job wrote reaching the terminal raw."""

from __future__ import annotations

import pytest

from jobwarden.progress.model import Progress
from jobwarden.text.progress import metrics_text, progress_cell, progress_line, rate_text, resumed_line
from jobwarden.tui.cells import progress_bar

NOW = 1_700_000_100.0


def p(
    step: int | None = 450, total: int | None = 1000, rate: float | None = 5.4, **changes: object
) -> Progress:
    fields: dict[str, object] = {
        "step": step,
        "total": total,
        "rate": rate,
        "unit": "it",
        "epoch": None,
        "metrics": (),
        "source": "output",
        "format": "tqdm",
        "at": NOW - 2,
        **changes,
    }
    return Progress(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("progress", "live", "cell"),
    [
        (p(), True, "45% 450/1000 5.4it/s ETA 1m42s"),
        (p(step=4500, total=None), True, "step 4500 5.4it/s"),
        (p(rate=None), True, "45% 450/1000"),
        (p(rate=0.2, unit="step"), True, "45% 450/1000 5s/step ETA 45m50s"),
        (p(rate=1234.5), True, "45% 450/1000 1234it/s ETA 0s"),
        (p(stalled_since=NOW - 130), True, "45% 450/1000 stalled 2m10s"),
        (p(step=620), False, "62% 620/1000"),
        (p(step=1000, closed=True), True, "100% 1000/1000"),
        (p(step=None, total=None, rate=None, epoch=1.25), True, "ep 2"),  # a Trainer's dicts: 1.25 done
        # a bar per epoch: its own percentage, the epoch, the ETA of the whole run (a 2nd and a 3rd epoch)
        (
            p(step=106, total=128, rate=18.7, epoch=2.0, epochs=3, per_epoch=True),
            True,
            "ep 2/3 83% 106/128 18.7it/s ETA 8s",
        ),
        (
            p(step=128, total=128, rate=10.0, epoch=2.0, epochs=3, per_epoch=True, closed=True),
            True,
            "ep 2/3 100% 128/128 10it/s ETA 13s",
        ),
        (p(step=8, total=16, rate=2.0, epoch=2.0, epochs=None, per_epoch=True), True, "ep 2 50% 8/16 2it/s"),
        (
            p(step=450, total=1000, rate=5.4, epoch=1.3, format="hf"),
            True,
            "ep 2 45% 450/1000 5.4it/s ETA 1m42s",
        ),
        (None, True, "-"),
    ],
)
def test_the_progress_column(progress: Progress | None, live: bool, cell: str) -> None:
    assert progress_cell(progress, live, NOW) == cell


def test_megatrons_iterations_are_its() -> None:
    assert rate_text(p(unit="iteration", rate=2.0)) == "2it/s"


def test_an_ended_run_says_where_it_stopped_and_what_it_reported() -> None:
    crashed = p(
        step=620, metrics=(("lr", 5e-05), ("val_loss", 0.9), ("loss", 0.0116)), epoch=3.0, label="train"
    )
    line = progress_line(crashed, False, NOW)
    assert line.startswith(
        "stopped at 62%, step 620/1000; epoch 3; loss 0.0116, lr 5e-05, val_loss 0.9 [train]"
    )
    assert line.endswith("(tqdm, from the log, 2s ago)")
    assert progress_line(p(step=1000, closed=True), False, NOW).startswith("reached 100%, step 1000/1000")
    assert progress_line(p(step=7, total=None, format="heartbeat", observed="heartbeat"), False, NOW) == (
        "stopped at step 7 (heartbeat, 2s ago)"
    )


def test_an_ended_run_of_epochs_says_which_epoch_and_how_far_the_run_got() -> None:
    crashed = p(step=8, total=16, epoch=2.0, epochs=3, per_epoch=True, closed=True)
    assert progress_line(crashed, False, NOW).startswith("stopped at 50%, epoch 2/3, step 8/16")  # 24 of 48
    done = p(step=16, total=16, epoch=3.0, epochs=3, per_epoch=True, closed=True)
    assert progress_line(done, False, NOW).startswith("reached 100%, epoch 3/3, step 16/16")
    unknown = p(step=4, total=16, epoch=2.0, per_epoch=True, closed=True)  # of an unknown number: the bar
    assert progress_line(unknown, False, NOW).startswith("stopped at 25%, epoch 2, step 4/16")


def test_a_restarted_run_says_where_it_resumed() -> None:
    assert (
        resumed_line(p(step=610, first_step=600), p(step=620), 1)
        == "resumed at step 600 (run 1 had reached 620/1000)"
    )
    assert resumed_line(p(first_step=600), None, 1) is None


def test_job_text_never_reaches_the_terminal_raw() -> None:
    evil = p(label="\x1b]0;pwned\x07Epoch\x1b[2J 1", metrics=(("lo\x1bss\r", 0.5),), unit="\x1b[31mit")
    text = progress_line(evil, True, NOW) + metrics_text(evil) + progress_cell(evil, True, NOW)
    assert "\x1b" not in text and "\r" not in text and "\x07" not in text


def test_the_bar_in_eighths() -> None:
    assert progress_bar(0.0, 8) == " " * 8
    assert progress_bar(0.5, 8) == "████    "
    assert progress_bar(0.5625, 8) == "████▌   "
    assert progress_bar(2.0, 4) == "████"


def test_a_percentage_is_rounded_as_tqdm_and_the_web_page_round_it() -> None:
    """605/1000 read 61% on the page and 60% in the CLI: one figure, half to even in both (as tqdm's own
    bar shows it, and common.js's wholePercent); and never 100% before the last step."""
    assert progress_cell(p(step=605), False).startswith("60% 605/1000")
    assert progress_cell(p(step=615), False).startswith("62% 615/1000")
    assert progress_cell(p(step=999), False).startswith("99% 999/1000")
    assert progress_cell(p(step=1000), False).startswith("100% 1000/1000")
    assert progress_line(p(step=606), False, NOW).startswith("stopped at 61%, step 606/1000")
