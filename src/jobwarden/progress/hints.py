"""Counts the job passed on its command line that its output may not print: the epochs of a Lightning run
whose tqdm bar says only "Epoch 1", the rounds of an XGBoost or LightGBM run whose eval lines say only
"[37]". Read once per run from its argv: `--epochs 3`, `--max_epochs=3`, `--trainer.max_epochs 3` (Lightning's
CLI), `trainer.max_epochs=3` (Hydra's overrides); `--num-boost-round 200`, `--n_estimators=200`,
`num_round=200` (XGBoost's CLI). Spelled with `-` or `_`; the last one given wins, as argparse has it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

_EPOCHS = frozenset(
    ("epochs", "max_epochs", "num_epochs", "n_epochs", "num_train_epochs", "train_epochs", "nepochs")
)
_ROUNDS = frozenset(
    (
        "num_boost_round",
        "num_boost_rounds",
        "n_estimators",
        "num_rounds",
        "num_round",
        "n_rounds",
        "num_iterations",
        "num_trees",
        "boost_rounds",
    )
)
_OPTION = re.compile(r"^(?:--?)?(?:[\w-]+\.)*(?P<name>[A-Za-z][\w-]{0,40})$")
MAX_COUNT = 10**9


class Hints(NamedTuple):
    epochs: int | None = None
    rounds: int | None = None


def from_command(argv: Sequence[str]) -> Hints:
    epochs = rounds = None
    for i, arg in enumerate(argv[:4096]):
        if "=" in arg:
            name, _, value = arg.partition("=")
        elif arg.startswith("-") and i + 1 < len(argv):
            name, value = arg, argv[i + 1]
        else:
            continue
        key = _name(name)
        count = _count(value)
        if key is None or count is None:
            continue
        if key in _EPOCHS:
            epochs = count
        elif key in _ROUNDS:
            rounds = count
    return Hints(epochs, rounds)


def _name(option: str) -> str | None:
    m = _OPTION.match(option)
    return m.group("name").replace("-", "_").lower() if m else None


def _count(text: str) -> int | None:
    text = text.strip()
    if not text.isdigit() or len(text) > 10:
        return None
    value = int(text)
    return value if 0 < value <= MAX_COUNT else None
