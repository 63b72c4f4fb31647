"""Query parameters, parsed strictly: what a browser or a script sends, never what Python would also accept.

`int()` takes '١٢' (Arabic-Indic digits), ' 12 ', '1_000' and numbers of any size; `float()` takes 'nan',
'inf' and '1e999'; `str.isdigit()` is true for '²', which `int()` then refuses. Each of these once reached
the store or a file offset and ended in an internal error. Here a number is ASCII digits within bounds,
and anything else is the client's error, naming the parameter.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

MAX_FIELDS = 64  # no page of ours sends more than a few
MAX_WHOLE = (1 << 63) - 1  # a file offset: off_t is 64-bit signed
_WHOLE = re.compile(r"[0-9]{1,40}")  # longer than any bound: a bound says what is too large
_DECIMAL = re.compile(r"-?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][-+]?[0-9]{1,3})?")
_SHOWN = 40  # characters of a bad value quoted back


class BadParameter(ValueError):
    """A query parameter the server cannot take; the message names it and says what it must be."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


def parse_query(query: str) -> dict[str, str]:
    """The parameters of a query string (percent-decoded as UTF-8), the first of each name kept."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, errors="strict", max_num_fields=MAX_FIELDS)
    except UnicodeDecodeError:
        raise BadParameter("query", "a percent-escape is not UTF-8") from None
    except ValueError:
        raise BadParameter("query", f"more than {MAX_FIELDS} parameters") from None
    params: dict[str, str] = {}
    for name, value in pairs:
        params.setdefault(name, value)
    return params


def whole_number(name: str, text: str, minimum: int = 0, maximum: int = MAX_WHOLE) -> int:
    """ASCII digits only (no sign, space, underscore or exponent), from `minimum` to `maximum`."""
    if not _WHOLE.fullmatch(text):
        raise BadParameter(name, f"{_shown(text)} is not a whole number")
    value = int(text)
    _check_range(name, value, minimum, maximum)
    return value


def finite_number(name: str, text: str, minimum: float, maximum: float) -> float:
    """A decimal number in ASCII ('12', '1.5', '1.7e9'), from `minimum` to `maximum`: never nan or inf."""
    if not _DECIMAL.fullmatch(text):
        raise BadParameter(name, f"{_shown(text)} is not a number")
    value = float(text)
    _check_range(name, value, minimum, maximum)  # '1e999' is inf: above any maximum
    return value


def _check_range(name: str, value: float, minimum: float, maximum: float) -> None:
    if value < minimum:
        raise BadParameter(name, f"must be at least {_number(minimum)}")
    if value > maximum:
        raise BadParameter(name, f"must be at most {_number(maximum)}")


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "…")
