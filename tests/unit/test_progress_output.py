"""Progress read from a job's output (jobwarden.progress), on what the real libraries printed
(tests/fixtures/progress: recorded from tqdm, PyTorch Lightning, Keras 3, HF Trainer and torchrun, and
reproduced from the format strings of Megatron, DeepSpeed, torchtitan, fairseq and Keras 2; README.md
there). Each recording is read whole, in small pieces (as the shim reads a growing log), and cut at known
frames: the newest frame is what counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.progress import formats
from jobwarden.progress.frames import by_rank, frames, position
from jobwarden.progress.model import Reading
from jobwarden.progress.output import OutputProgress

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "progress"


def recorded(name: str) -> str:
    """A recording as the shim decodes it: bytes, never text mode (which turns every \\r into \\n)."""
    return (FIXTURES / f"{name}.log").read_bytes().decode("utf-8", "replace")


def main_of(text: str, piece: int | None = None) -> tuple[Reading, int | None] | None:
    out = OutputProgress()
    if piece is None:
        out.feed(text, True)
    else:
        for i in range(0, len(text), piece):
            out.feed(text[i : i + piece], True)
    return out.main()


def upto(text: str, marker: str, occurrence: int = 1) -> str:
    """The text up to the end of the frame holding the `occurrence`-th `marker` (not past its end)."""
    at = -1
    for _ in range(occurrence):
        at = text.index(marker, at + 1)
    ends = [i for i in (text.find("\r", at), text.find("\n", at)) if i >= 0]
    return text[: min(ends)] if ends else text


def reading(text: str) -> Reading:
    found = main_of(text)
    assert found is not None, "no progress found"
    return found[0]


# --- every recording, whole and in pieces -----------------------------------------------------------------

WHOLE = {
    # name: (step, total, format, label, epoch, a metric that must be there, rank)
    "tqdm-variants": (1000, 1000, "tqdm", None, None, None, None),
    "tqdm-colour": (40, 40, "tqdm", "training", None, None, None),
    # Lightning's epochs are shown 1-based: its "Epoch 1" (after "Epoch 0") is the 2nd
    "lightning-tqdm": (16, 16, "tqdm", "Epoch 1", 2.0, ("train_loss", 0.0431), None),
    "lightning-default": (16, 16, "rich", "Epoch 1/1", 2.0, ("train_loss", 0.043), None),
    "lightning-default-tty": (16, 16, "rich", "Epoch 1/1", 2.0, ("train_loss", 0.043), None),
    "keras3": (8, 8, "keras", None, 2.0, ("loss", 0.3421), None),
    "keras2": (100, 100, "keras", None, 2.0, ("acc", 0.99), None),
    "hf-trainer": (32, 32, "hf", None, 2.0, ("train_loss", 0.109), None),
    "torchrun-tee": (40, 40, "tqdm", "rank 0", None, None, 0),
    "torchrun-tee-template": (40, 40, "tqdm", "rank 0", None, None, 0),
    "megatron": (100, 1000, "megatron", None, None, ("lm_loss", 5.5), None),
    "deepspeed": (50, None, "deepspeed", None, 0.0, ("CurrSamplesPerSec", 25.7), None),
    "torchtitan": (10, None, "torchtitan", None, None, ("loss", 7.4), None),
    "fairseq": (500, 1000, "fairseq", None, 1.0, ("loss", 9.371), None),
}


@pytest.mark.parametrize("name", sorted(WHOLE))
def test_each_recording_ends_on_its_last_frame(name: str) -> None:
    step, total, fmt, label, epoch, metric, rank = WHOLE[name]
    found = main_of(recorded(name))
    assert found is not None
    got, got_rank = found
    assert (got.step, got.total, got.format, got.label, got.epoch, got_rank) == (
        step,
        total,
        fmt,
        label,
        epoch,
        rank,
    )
    if metric is not None:
        assert dict(got.metrics)[metric[0]] == pytest.approx(metric[1])


@pytest.mark.parametrize("piece", [1, 7, 97, 4096])
@pytest.mark.parametrize("name", sorted(WHOLE))
def test_read_in_pieces_as_a_growing_log_is_read_whole(name: str, piece: int) -> None:
    text = recorded(name)
    assert main_of(text, piece) == main_of(text)


# --- the newest frame, at known points of the recordings ------------------------------------------------


def test_tqdm_frames_at_each_point() -> None:
    text = recorded("tqdm-variants")
    got = reading(upto(text, "| 12/30"))
    assert (got.step, got.total, got.unit, got.label, got.epoch, got.closed) == (
        12,
        30,
        "it",
        "Epoch 1",
        1.0,
        False,
    )
    slow = reading(upto(text, "| 2/3 ["))
    assert (slow.step, slow.total, slow.unit) == (2, 3, "step")  # printed as 1.10s/step: the unit stays
    nototal = reading(upto(text, "nototal: 3it"))
    assert (nototal.step, nototal.total, nototal.unit, nototal.label) == (3, None, "it", "nototal")
    scaled = reading(upto(text, "| 1.00k/2.00k"))
    assert (scaled.step, scaled.total, scaled.unit) == (1000, 2000, "B")
    train = reading(upto(text, "| 50/50", 1))
    assert dict(train.metrics) == {"acc": pytest.approx(0.98), "loss": pytest.approx(0.02)}


def test_nested_bars_are_epochs_of_the_inner_one() -> None:
    text = recorded("tqdm-variants")
    # the inner bar redraws last (position 1: followed by a cursor-up), the outer one is still at 1/3:
    # the second of 3 passes of the inner bar
    at = upto(text, "inner:  75%", 2)
    assert position(at[at.rindex("\r") + 1 :]) == 1
    got = reading(at)
    assert (got.label, got.step, got.total) == ("inner", 3, 4)
    assert (got.epoch, got.epochs, got.per_epoch) == (2.0, 3, True)


def test_a_closed_bar_stays_until_the_next_one() -> None:
    text = recorded("tqdm-variants")
    closed = reading(upto(text, "Epoch 1: 100%", 2) + "\n")
    assert (closed.step, closed.closed, closed.finished) == (30, True, True)


def test_lightning_bars() -> None:
    text = recorded("lightning-tqdm")
    got = reading(upto(text, "Epoch 0:  50%"))
    assert (got.label, got.step, got.total, got.epoch, got.per_epoch) == ("Epoch 0", 8, 16, 1.0, True)
    assert "train_loss" in dict(got.metrics)
    # the validation bar is nested under the training bar: the training bar stays the progress
    during = reading(upto(text, "Validation DataLoader 0:  50%"))
    assert (during.label, during.step) == ("Epoch 0", 16)
    rich = reading(upto(recorded("lightning-default-tty"), "7/16"))
    assert (rich.format, rich.step, rich.total, rich.label) == ("rich", 7, 16, "Epoch 0/1")
    assert (rich.epoch, rich.epochs) == (1.0, 2)  # its "Epoch 0/1" is 0-based: the 1st of max_epochs=2


def test_keras_frames_and_epoch_lines() -> None:
    text = recorded("keras3")
    got = reading(upto(text, "\x1b[1m1/6", 2))
    assert (got.step, got.total, got.epoch, got.format, got.closed) == (1, 6, 2.0, "keras", False)
    assert dict(got.metrics)["loss"] == pytest.approx(1.7506)
    two = reading(upto(recorded("keras2"), " 46/100", 2))
    assert (two.step, two.total, two.epoch) == (46, 100, 2.0)


def test_hf_trainer_dicts_add_the_loss_and_the_epoch_to_its_bar() -> None:
    got = reading(upto(recorded("hf-trainer"), "| 10/32"))
    assert (got.format, got.step, got.total) == ("hf", 10, 32)
    assert dict(got.metrics)["loss"] == pytest.approx(0.1173, abs=0.02)
    assert got.epoch == pytest.approx(0.625)


def test_torchrun_ranks_are_never_summed_and_rank_zero_is_shown() -> None:
    text = recorded("torchrun-tee")
    out = OutputProgress()
    out.feed(text, True)
    assert set(out.ranks) >= {0, 1}
    assert out.ranks[1].bars[0].reading.label == "rank 1"
    got = out.main()
    assert got is not None and got[1] == 0 and got[0].step == 40


def test_a_torchrun_prefix_inserted_mid_line_is_taken_out() -> None:
    # recorded: rank 0's line was copied before it was complete; rank 1's prefix came in between
    text = recorded("torchrun-tee")
    assert "it/s][default1]:" in text
    line = (
        "[default0]:rank 0:  30%|███       | 12/4[default1]:rank 1:   2%|▎  | 1/40 [00:00<00:00, 9.1it/s]\n"
    )
    line += "[default0]:0 [00:00<00:00, 187.13it/s]\n"
    streams, _ = by_rank(line)
    assert streams[0].strip() == "rank 0:  30%|███       | 12/40 [00:00<00:00, 187.13it/s]"
    got = main_of(line)
    assert got is not None and (got[0].step, got[0].total, got[1]) == (12, 40, 0)


def test_line_formats_take_only_complete_lines() -> None:
    text = recorded("megatron")
    cut = text[: text.rindex(" iteration ") + 30]  # the newest line cut short: the line before counts
    got = reading(cut)
    assert got.step == 90


# --- one frame ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "step", "total", "unit"),
    [
        ("Epoch 1:  40%|████      | 12/30 [00:00<00:00, 48.44it/s]", 12, 30, "it"),
        ("slow:  20%|██        | 1/5 [00:01<00:04,  1.20s/step]", 1, 5, "step"),
        ("nototal: 5it [00:00, 99.01it/s]", 5, None, "it"),
        ("bytes: 100%|██████████| 2.00k/2.00k [00:00<00:00, 9.13MB/s]", 2000, 2000, "B"),
        (" 45%|████▌     | 450/1000 [1:02:03<1:15:59, 5.40it/s, loss=0.5]", 450, 1000, "it"),
        ("Epoch 3: 5/? [00:01<?, 4.1it/s]", 5, None, "it"),
    ],
)
def test_tqdm_frames(frame: str, step: int, total: int | None, unit: str) -> None:
    got = formats.parse_tqdm(frame)
    assert got is not None and (got.step, got.total, got.unit) == (step, total, unit)


@pytest.mark.parametrize(
    "frame",
    [
        "Epoch 1:  40%|████      | 12/30 [00:00<00:00, 48.44it",  # cut before its closing bracket
        "Epoch 1:  40%|████      | 12",
        "50/1000 [00:0",
        "saving checkpoint to /tmp/x [done]",
        "",
    ],
)
def test_a_frame_cut_short_or_of_no_bar_is_no_reading(frame: str) -> None:
    assert formats.parse_bar(frame) is None
    assert formats.parse_line(frame) is None


def test_hf_dicts_old_and_new_styles_and_nan() -> None:
    old = formats.parse_hf_dict("{'loss': 2.3456, 'learning_rate': 5e-05, 'epoch': 0.5}")
    assert (
        old is not None and dict(old.metrics) == {"loss": 2.3456, "learning_rate": 5e-05} and old.epoch == 0.5
    )
    new = formats.parse_hf_dict(
        "{'loss': '2.346', 'grad_norm': '1.23', 'learning_rate': '5e-05', 'epoch': '0.5'}"
    )
    assert new is not None and dict(new.metrics)["grad_norm"] == 1.23
    nan = formats.parse_hf_dict("{'loss': nan, 'learning_rate': 5e-05, 'epoch': 0.5}")
    assert nan is not None and "loss" not in dict(nan.metrics)  # a NaN is no point to chart (HF drops it too)


def test_deepspeed_engine_lines() -> None:
    got = formats.parse_deepspeed("[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")
    assert got is not None and (got.step, dict(got.metrics)) == (10, {"lr": 0.0001})


def test_torchtitan_validation_is_no_training_step() -> None:
    line = "validate step: 10  loss:  3.1234  memory: 12.34GiB(15.61%)  tps: 5,678"
    assert formats.parse_torchtitan(line) is None
    got = formats.parse_torchtitan("step:  3  loss:  9.5800  grad_norm:  0.5000  tps: 4,234")
    assert got is not None and dict(got.metrics) == {"loss": 9.58, "grad_norm": 0.5, "tps": 4234.0}


def test_escapes_and_controls_are_out_of_every_frame() -> None:
    text = recorded("tqdm-colour")
    got = reading(text)
    assert got.label == "training"  # its description was bold green: "\x1b[1;32mtraining\x1b[0m"
    assert all("\x1b" not in f.clean() for f in frames(recorded("torchtitan")))


def test_a_read_that_does_not_follow_drops_its_first_frame() -> None:
    out = OutputProgress()
    out.feed("50/1000 [00:01<00:02, 5.40it/s]\r 46%|████▌     | 460/1000 [00:01<00:02, 5.40it/s]", False)
    got = out.main()
    assert got is not None and got[0].step == 460  # "50/1000" was the end of a cut "450/1000"
    lone = OutputProgress()
    lone.feed("50/1000 [00:01<00:02, 5.40it/s]", False)
    assert lone.main() is None


@pytest.mark.parametrize(
    "frame",
    [
        "x: 99999999999999999999999/1 [00:01<00:02, 5.40it/s]",
        " [t] iteration 123456789012345678901234/ 1000 | lm loss: 1.0 |",
        "step:  99999999999999999999999  loss:  1.0",
    ],
)
def test_a_number_past_any_counter_is_no_reading(frame: str) -> None:
    """It would not fit the store's INTEGER: every tick would fail to store it."""
    assert formats.parse_bar(frame) is None and formats.parse_line(frame) is None
