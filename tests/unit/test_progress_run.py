"""The progress of the run, not of its inner bar (issue 28, items 1-3), on recorded output
(tests/fixtures/progress, README.md there): nested tqdm bars, Lightning's and Keras' epochs, a loop's own
prints ("Epoch 1/3 | step 10/50 | loss 0.1"), XGBoost's and LightGBM's eval lines with the round count of
the command line, lines that must not be read as progress, and the Trainer's dicts beside a bar seen
in-process."""

from __future__ import annotations

import pytest

from jobwarden.progress import formats
from jobwarden.progress.epochs import with_hints
from jobwarden.progress.hints import Hints, from_command
from jobwarden.progress.model import Bar, HookProgress, Progress, Reading, run_counter
from jobwarden.progress.sources import choose, in_process, output_candidate
from jobwarden.text.progress import progress_cell
from tests.unit.test_progress_output import main_of, reading, recorded, upto


def run_fraction(r: Reading) -> float | None:
    done = run_counter(r)
    return None if done is None else done[0] / done[1]


# --- nested bars, Lightning, Keras ------------------------------------------------------------------------


def test_nested_tqdm_bars_in_epoch_2_of_3() -> None:
    """tqdm's trange(3) around a bar of 16 batches, seen while the 2nd epoch is half done."""
    got = reading(upto(recorded("tqdm-nested"), "train:  50%", 2))
    assert (got.step, got.total, got.epoch, got.epochs, got.per_epoch) == (8, 16, 2.0, 3, True)
    assert run_fraction(got) == pytest.approx((16 + 8) / 48)


def test_between_two_epochs_the_ended_inner_bar_counts_as_its_epoch_done() -> None:
    text = recorded("tqdm-nested")
    at = upto(text, "epochs:  33%")  # the outer bar moved to 1/3 after the first inner bar ended
    got = reading(at)
    assert (got.epoch, got.epochs, got.step, got.total) == (1.0, 3, 16, 16)
    assert run_fraction(got) == pytest.approx(1 / 3)
    whole = reading(text)
    assert run_fraction(whole) == 1.0 and whole.finished


def test_lightning_epoch_2_of_3_with_max_epochs_on_the_command_line() -> None:
    """Lightning's tqdm bar says "Epoch 1" (0-based) and never how many: the command says."""
    got = reading(upto(recorded("lightning-tqdm"), "Epoch 1:  50%"))
    assert (got.label, got.epoch, got.epochs, got.step, got.total) == ("Epoch 1", 2.0, None, 8, 16)
    assert run_fraction(got) is None  # an epoch of an unknown number of them
    hinted = with_hints(got, from_command(["python", "fit.py", "--max_epochs", "3"]))
    assert hinted.epochs == 3 and run_fraction(hinted) == pytest.approx((16 + 8) / 48)


def test_keras_epoch_lines_give_the_count() -> None:
    got = reading(upto(recorded("keras3"), "\x1b[1m1/6", 2))
    assert (got.step, got.total, got.epoch, got.epochs, got.per_epoch) == (1, 6, 2.0, 3, True)
    assert run_fraction(got) == pytest.approx((6 + 1) / 18)


def test_the_column_and_the_json_of_a_run_in_epoch_2_of_3() -> None:
    p = Progress(106, 128, 18.7, "it", 2.0, (), "output", "tqdm", 0.0, epochs=3, per_epoch=True)
    assert progress_cell(p, True, 1.0) == "ep 2/3 83% 106/128 18.7it/s ETA 8s"
    got = p.to_json(1.0)
    assert got["epoch"] == {"n": 2, "total": 3}
    assert got["fraction"] == pytest.approx((128 + 106) / 384, abs=1e-4)
    assert got["eta_s"] == pytest.approx((384 - 234) / 18.7, abs=0.1)
    hf = Progress(450, 1000, 5.0, "it", 1.3, (), "output", "hf", 0.0)  # the global step against max_steps
    assert hf.to_json()["epoch"] == {"n": 2, "total": None} and hf.fraction == 0.45 and hf.eta_s == 110.0


def test_in_process_nested_bars_and_a_closed_inner_one() -> None:
    outer = Bar("tqdm", 1, 3, "it", "epochs", 0, False)
    inner = Bar("tqdm", 100, 128, "it", "train", 1, False)
    got = in_process([HookProgress(1, None, 1.0, (outer, inner))])
    assert got is not None
    r = got.reading
    assert (r.step, r.total, r.epoch, r.epochs, r.label) == (100, 128, 2.0, 3, "train")
    ended = Bar("tqdm", 128, 128, "it", "train", 1, True)  # leave=False: closed before the next epoch
    between = in_process([HookProgress(1, None, 1.0, (outer, ended))])
    assert between is not None and run_fraction(between.reading) == pytest.approx(1 / 3)
    validation = Bar("tqdm", 4, 8, "it", "Validation DataLoader 0", 1, False)
    lightning = Bar("tqdm", 16, 16, "it", "Epoch 0", 0, False)
    side = in_process([HookProgress(1, None, 1.0, (lightning, validation))])
    assert side is not None and (side.reading.label, side.reading.step) == ("Epoch 0", 16)


# --- a loop's own prints ----------------------------------------------------------------------------------

HOMEMADE = {
    # line of homemade.log: (step, total, epoch, epochs, a metric)
    "Epoch 2/3 | step 30/50 | loss 0.0167 | lr 1e-04": (30, 50, 2.0, 3, ("loss", 0.0167)),
    "iter 200 / 1000, loss=0.00250, grad_norm=1.25, 0.31s/it": (200, 1000, None, None, ("loss", 0.0025)),
    "step 120/1000 train_loss=0.0421 val_acc=0.91": (120, 1000, None, None, ("val_acc", 0.91)),
    "Epoch 3/10": (None, None, 3.0, 10, None),
}


@pytest.mark.parametrize("line", sorted(HOMEMADE))
def test_a_loops_own_prints(line: str) -> None:
    assert line in recorded("homemade").splitlines()
    step, total, epoch, epochs, metric = HOMEMADE[line]
    got = formats.parse_line(line)
    assert got is not None and got.format == "plain"
    assert (got.step, got.total, got.epoch, got.epochs) == (step, total, epoch, epochs)
    if metric is not None:
        assert dict(got.metrics)[metric[0]] == pytest.approx(metric[1])
    assert not {"epoch", "step", "iter"} & set(dict(got.metrics))


def test_behind_the_logging_modules_prefix_and_counted_from_0() -> None:
    text = recorded("homemade")
    got = reading(upto(text, "epoch 1/2 step 7/8") + "\n")
    assert (got.step, got.total, got.epoch, got.epochs, dict(got.metrics)) == (7, 8, 2.0, 2, {"loss": 0.25})
    assert run_fraction(got) == pytest.approx((8 + 7) / 16)


def test_the_whole_recording_ends_on_its_last_counter() -> None:
    got = reading(recorded("homemade"))  # its last line is prose about a step, never read
    assert (got.step, got.total, got.format) == (120, 1000, "plain")


NOT_PROGRESS = [
    "Step 1/3: loading the data set from disk",  # recorded: prose
    "we are at step 3/4 of the install, please wait",
    "Saved checkpoint at step 120/1000 to ckpt/step120.pt",
    "Step 1/5 : FROM python:3.11-slim",
    "Step 2/3 complete",
    "see docs/step/1/2 for details",
    "epoch 12/10 | loss 0.1",  # past its total: no counter
    "step 3/0 loss 1",
    "the iteration 2/3 went fine",
    "Processing file 3/10",
    "[12]\tsome words here",
    "[12]\tvalid-logloss:0.5\tand more",
    "{'step': '1/2'}",
]


@pytest.mark.parametrize("line", NOT_PROGRESS)
def test_prose_that_names_a_step_is_no_progress(line: str) -> None:
    assert formats.parse_line(line) is None and formats.parse_bar(line) is None
    assert main_of(line + "\n") is None


# --- gradient boosting ------------------------------------------------------------------------------------


def test_xgboost_rounds_with_the_count_from_the_command() -> None:
    text = recorded("xgboost")
    first = reading(upto(text, "[11]\t") + "\n")  # the first train(): 12 rounds, 0-based
    assert (first.step, first.total, first.format, first.unit) == (12, None, "xgboost", "round")
    assert dict(first.metrics)["valid-logloss"] == pytest.approx(0.28255)
    last = with_hints(reading(text), from_command(["python", "boost.py", "--num-boost-round=25"]))
    assert (last.step, last.total) == (25, 25)  # verbose_eval=10 prints round 24 (0-based) last


def test_lightgbm_rounds_with_the_count_from_the_command() -> None:
    text = recorded("lightgbm")
    first = reading(upto(text, "[12]\t") + "\n")
    assert (first.step, first.format) == (12, "lightgbm")
    assert dict(first.metrics)["valid_1-auc"] == pytest.approx(0.955329)
    second = reading(upto(text, "[10]\t", 2) + "\n")
    got = with_hints(second, from_command(["python", "gbm.py", "n_estimators=25"]))
    assert (got.step, got.total, run_fraction(got)) == (10, 25, 0.4)


@pytest.mark.parametrize(
    ("argv", "hints"),
    [
        (["python", "t.py", "--epochs", "3"], Hints(3, None)),
        (["python", "t.py", "--max-epochs=10", "--num_boost_round", "200"], Hints(10, 200)),
        (["python", "t.py", "--trainer.max_epochs", "5"], Hints(5, None)),
        (["python", "t.py", "trainer.max_epochs=4", "num_round=50"], Hints(4, 50)),
        (["python", "t.py", "--n-estimators", "300", "--epochs", "2", "--epochs", "6"], Hints(6, 300)),
        (["python", "t.py", "--epochs"], Hints()),
        (["python", "t.py", "--epochs", "three", "--num-boost-round", "0"], Hints()),
        (["python", "t.py", "epochs.txt", "--lr", "3"], Hints()),
    ],
)
def test_counts_from_the_command_line(argv: list[str], hints: Hints) -> None:
    assert from_command(argv) == hints


# --- the sources merge -------------------------------------------------------------------------------------


def test_the_trainers_dicts_keep_their_loss_beside_its_bar_seen_in_process() -> None:
    """The step from the hooks' exact bar, the loss from the dicts the log shows (it was lost: {})."""
    text = upto(recorded("hf-trainer"), "| 10/32")
    found = main_of(text)
    assert found is not None
    hooks = in_process([HookProgress(1, None, 1.0, (Bar("tqdm", 11, 32, "it", None, 0, False),))])
    got = choose(None, hooks, output_candidate(*found))
    assert got is not None and (got.observed, got.reading.step, got.reading.format) == (
        "in-process",
        11,
        "hf",
    )
    assert dict(got.reading.metrics)["loss"] == pytest.approx(0.1173, abs=0.02)


def test_a_loops_printed_loss_joins_the_bar_seen_in_process() -> None:
    printed = formats.parse_line("Epoch 1/3 | step 10/50 | loss 0.1")
    assert printed is not None
    bar = Bar("tqdm", 12, 50, "it", None, 0, False)
    got = choose(None, in_process([HookProgress(1, None, 1.0, (bar,))]), output_candidate(printed, None))
    assert got is not None and got.reading.step == 12 and dict(got.reading.metrics) == {"loss": 0.1}
