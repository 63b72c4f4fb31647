"""What a group record may hold: the type of every field that `explain --group` reads (store.groupdir
reads, rules.group judges). A record from a shared file system is outside input: one whose field has the
wrong type (a rank that is a string, a wall time of NaN, an output tail that is a number) is skipped and
counted, never handed to the rules, where it ended in "internal error". Fields not named here pass through
unread: a newer writer may add some.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

MAX_INT = 1 << 62  # ranks, pids, exit codes, counts: anything larger is not one
MAX_LIST = 10_000  # items of a list field (an output tail has 20)

Check = Callable[[object], bool]


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value <= MAX_INT


def _natural(value: object) -> bool:
    return _int(value) and value >= 0  # type: ignore[operator]


def _number(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and abs(value) <= MAX_INT


def _str(value: object) -> bool:
    return isinstance(value, str)


def _bool(value: object) -> bool:
    return isinstance(value, bool)


def _dict(value: object) -> bool:
    return isinstance(value, dict)


def _list_of(item: Check) -> Check:
    return lambda value: isinstance(value, list) and len(value) <= MAX_LIST and all(item(v) for v in value)


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


# field -> its check, for every field that rules.group and control.views.group read
RECORD: dict[str, Check] = {
    "v": _int,
    "kind": _str,
    "group": _str,
    "attempt": _natural,
    "rank": _optional(_natural),
    "rank_from": _str,
    "node": _optional(_str),
    "pid": _optional(_natural),
    "start_time": _optional(_natural),
    "wall": _number,
    "mono": _optional(_number),
    "boot_id": _optional(_str),
    "requeue_exit": _optional(_int),
    "max_requeues": _optional(_int),
    # ended
    "state": _optional(_str),
    "end_reason": _optional(_str),
    "stopping_at": _optional(_number),
    "engine_state": _optional(_str),
    "wait_status": _optional(_int),
    "exit_code": _optional(_int),
    "signal": _optional(_str),
    "oom": _bool,
    "died_at": _optional(_number),
    "output_tail": _list_of(_str),
    "exception": _optional(_str),
    "torch_error": _optional(_dict),
    # finding, hung, engine-signal
    "rule": _optional(_str),
    "title": _optional(_str),
    "final": _bool,
    "rules": _list_of(_str),
    "collective": _optional(_str),
    "last_progress": _optional(_number),
    "action": _optional(_str),
}
GROUP_DOCUMENT: dict[str, Check] = {
    "v": _int,
    "group": _str,
    "attempt": _natural,
    "nodelist": _optional(_str),
    "requeue_exit": _optional(_int),
    "max_requeues": _optional(_int),
}


def parse(line: bytes | str, fields: dict[str, Check] | None = None) -> dict[str, Any] | None:
    """A JSON object whose named fields have their types; None for anything else (not JSON, nested too
    deep for the parser, NaN or Infinity, not an object, a field of the wrong type)."""
    try:
        value = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # RecursionError: `[[[[...` nested past the parser's depth
        return None
    if not isinstance(value, dict):
        return None
    checks = RECORD if fields is None else fields
    for name, check in checks.items():
        if name in value and not check(value[name]):
            return None
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a record may hold")
