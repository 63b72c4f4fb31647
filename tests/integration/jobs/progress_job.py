"""Jobs that show progress the way real training does, for tests/integration/test_progress.py.

    python progress_job.py MODE READY GO [ARG]

READY and GO are FIFOs: the job writes a line to READY when it has reached the point the test looks at,
then waits for a line on GO before it goes on (a handshake, never a sleep). Modes:

    tqdm          a tqdm bar "Epoch 3" to 450/1000 with a loss in its postfix, holds, then ends at 1000
    ansi          a green tqdm bar with a coloured description, to 40/100, then holds
    heartbeat     jobwarden.heartbeat(step=85, total=1000, loss=0.0116), then holds
    quiet         plain lines, no progress at all
    crash         a bar to 620/1000, then an uncaught exception (READY and GO unused)
    resume        a bar from the step in the file ARG (0 when there is none) to 620, writing 600 to ARG at
                  600; run 1 then fails; run 2 (JOBWARDEN_RUN=2) holds at 620 instead
    spin          a bar that moves for a few seconds, then spins the CPU at its step until GO says go,
                  then moves again to its end
    rank-bar      under torchrun: rank 0 to 20/100, rank 1 to 60/100, then both hold
    lightning     a PyTorch Lightning fit (its default bar; ARG "tqdm": TQDMProgressBar), holding inside
                  epoch 0 at batch 5 of 16; with `--max_epochs 3` after ARG (as a script takes it from
                  argparse), 3 epochs, holding inside the 2nd ("Epoch 1") at batch 8 of 16
    keras         a Keras 3 fit (torch backend), holding in epoch 2 at step 3 of 8
    nested        tqdm's trange(3) "epochs" around a bar of 128 batches (leave=False), holding in the
                  2nd epoch at batch 106
    homemade      a loop's own prints, "Epoch 2/3 | step 30/50 | loss 0.0167", holding there
    hf-tqdm       a tqdm bar of 32 steps and, through tqdm.write, the log dicts HF's Trainer prints
                  (recorded in tests/fixtures/progress/hf-trainer.log), holding at step 12
"""

from __future__ import annotations

import os
import sys
import time


def signal_ready(ready: str) -> None:
    with open(ready, "w") as fh:
        fh.write("ready\n")


def wait_go(go: str) -> str:
    with open(go) as fh:
        return fh.readline()


def held(ready: str, go: str) -> None:
    signal_ready(ready)
    wait_go(go)


def tqdm_mode(ready: str, go: str) -> None:
    from tqdm import tqdm

    bar = tqdm(total=1000, desc="Epoch 3")
    for i in range(450):
        bar.set_postfix(loss=1.0 / (i + 1), refresh=False)
        time.sleep(0.15 if i == 449 else 0.002)  # the last step as long as a real model's
        bar.update(1)
    bar.refresh()
    held(ready, go)
    bar.update(550)
    bar.close()


def ansi_mode(ready: str, go: str) -> None:
    from tqdm import tqdm

    bar = tqdm(total=100, desc="\x1b[1;32mtraining\x1b[0m", colour="green", mininterval=0)
    bar.update(40)
    bar.refresh()
    held(ready, go)
    bar.close()


def heartbeat_mode(ready: str, go: str) -> None:
    import jobwarden

    jobwarden.heartbeat(step=85, total=1000, loss=0.0116)
    held(ready, go)


def quiet_mode(ready: str, go: str) -> None:
    print("loading data", flush=True)
    print("epoch done", flush=True)
    held(ready, go)


def crash_mode() -> None:
    from tqdm import tqdm

    bar = tqdm(total=1000, desc="train", mininterval=0)
    for _ in range(620):
        bar.update(1)
    raise RuntimeError("diverged at step 620")


def resume_mode(ready: str, go: str, checkpoint: str) -> None:
    from tqdm import tqdm

    with open(checkpoint) if os.path.exists(checkpoint) else open(os.devnull) as fh:
        start = int(fh.read() or 0)
    bar = tqdm(total=1000, initial=start, desc="train", mininterval=0)
    for step in range(start + 1, 621):
        bar.update(1)
        if step == 600:
            with open(checkpoint, "w") as fh:
                fh.write("600")
    bar.refresh()
    if os.environ.get("JOBWARDEN_RUN") == "1":
        sys.exit(1)
    held(ready, go)


def _read_now(fd: int) -> bytes:
    """What the FIFO holds now; nothing while no writer has it open, or while one has opened it and not
    yet written (EAGAIN)."""
    try:
        return os.read(fd, 100)
    except BlockingIOError:
        return b""


def spin_mode(ready: str, go: str) -> None:
    """Moves ~20 steps a second for 12 s (the watchdog learns its pace), then spins at its step (a busy
    loop: the CPU burns, no step is made) until GO is written, then finishes."""
    from tqdm import tqdm

    bar = tqdm(total=1000, desc="train", mininterval=0)
    for _ in range(240):
        bar.update(1)
        time.sleep(0.05)
    signal_ready(ready)
    fd = os.open(go, os.O_RDONLY | os.O_NONBLOCK)
    while not _read_now(fd):  # a spin: nothing but CPU until the test writes
        pass
    for _ in range(200):
        bar.update(1)
        time.sleep(0.02)
    bar.close()


def rank_bar_mode(ready: str, go: str) -> None:
    from tqdm import tqdm

    rank = int(os.environ["RANK"])
    bar = tqdm(total=100, desc=f"rank {rank}", mininterval=0)
    time.sleep(0.15)  # a step of a real model's length: its end is redrawn and recorded
    bar.update(20 if rank == 0 else 60)
    if rank == 0:
        held(ready, go)
    else:
        time.sleep(3600)  # ended with the job


def lightning_mode(ready: str, go: str, bar: str, rest: list[str]) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import TQDMProgressBar
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch: object, i: int) -> object:
            x, y = batch  # type: ignore[misc]
            loss = torch.nn.functional.mse_loss(self.lin(x), y)
            self.log("train_loss", loss, prog_bar=True)
            if self.current_epoch == hold_epoch and i <= hold_batch:
                time.sleep(0.15)  # steps of a real model's length: every one is redrawn and recorded
            if self.current_epoch == hold_epoch and i == hold_batch:
                held(ready, go)
            return loss

        def configure_optimizers(self) -> object:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    max_epochs = int(rest[rest.index("--max_epochs") + 1]) if "--max_epochs" in rest else None
    hold_epoch, hold_batch = (1, 8) if max_epochs else (0, 5)
    torch.manual_seed(0)
    data = TensorDataset(torch.rand(64, 4), torch.rand(64, 1))
    callbacks = [TQDMProgressBar()] if bar == "tqdm" else []
    trainer = pl.Trainer(
        max_epochs=max_epochs or 2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))


def keras_mode(ready: str, go: str) -> None:
    os.environ["KERAS_BACKEND"] = "torch"
    import keras
    import numpy as np

    class Hold(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: object = None) -> None:
            self.epoch = epoch

        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            if self.epoch == 1:
                time.sleep(0.15)  # steps of a real model's length: every one is redrawn and recorded
            if self.epoch == 1 and batch == 2:
                held(ready, go)

    rng = np.random.default_rng(0)
    x, y = rng.random((64, 4), dtype="float32"), rng.random((64, 1), dtype="float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, epochs=3, batch_size=8, verbose=1, callbacks=[Hold()])


def nested_mode(ready: str, go: str) -> None:
    from tqdm import tqdm, trange

    for epoch in trange(3, desc="epochs"):
        for batch in tqdm(range(128), desc="train", leave=False, miniters=1):
            time.sleep(0.004)
            if epoch == 1 and batch == 105:
                time.sleep(0.15)  # a step as long as a real model's: the next one (106) is redrawn
            if epoch == 1 and batch == 106:
                held(ready, go)  # the bar shows 106/128 of the 2nd epoch


def homemade_mode(ready: str, go: str) -> None:
    for epoch in (1, 2):
        for step in range(5, 51, 5):
            if (epoch, step) > (2, 30):
                break
            print(
                f"Epoch {epoch}/3 | step {step}/50 | loss {1.0 / (epoch * step):.4f} | lr 1e-04", flush=True
            )
            time.sleep(0.05)
    held(ready, go)


def hf_tqdm_mode(ready: str, go: str) -> None:
    from tqdm import tqdm

    bar = tqdm(total=32)
    for step in range(1, 13):
        time.sleep(0.05)
        bar.update(1)
        if step % 5 == 0:  # the Trainer's ProgressCallback.on_log: its dict through the bar's write
            logs = {"loss": f"{0.6 / step:.4g}", "grad_norm": "0.2616", "epoch": f"{step / 16:.4g}"}
            bar.write(str({**logs, "learning_rate": "4.375e-05"}))
    bar.refresh()
    held(ready, go)
    bar.update(20)
    bar.close()


def main() -> None:
    mode, ready, go = sys.argv[1:4]
    arg = sys.argv[4] if len(sys.argv) > 4 else ""
    if mode == "crash":
        crash_mode()
    elif mode == "resume":
        resume_mode(ready, go, arg)
    elif mode == "lightning":
        lightning_mode(ready, go, arg, sys.argv[5:])
    else:
        modes = {
            "tqdm": tqdm_mode,
            "ansi": ansi_mode,
            "heartbeat": heartbeat_mode,
            "quiet": quiet_mode,
            "spin": spin_mode,
            "rank-bar": rank_bar_mode,
            "keras": keras_mode,
            "nested": nested_mode,
            "homemade": homemade_mode,
            "hf-tqdm": hf_tqdm_mode,
        }
        modes[mode](ready, go)


if __name__ == "__main__":
    main()
