"""The web server's parsers of outside input, property-tested: query parameters (any text a client may
send: only ASCII numbers within bounds pass, anything else is a 400 naming the parameter), the Cookie
header (any text: never an error, our cookie found among anything), and session cookies."""

from __future__ import annotations

import math
from urllib.parse import quote, urlencode

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from jobwarden.web.messages import Headers, HTTPProblem, Request
from jobwarden.web.params import MAX_WHOLE, BadParameter, finite_number, parse_query, whole_number
from jobwarden.web.sessions import CLOCK_SKEW_S, SESSION_S, Sessions, parse_cookies

TOKEN = "t" * 43
NOW = 1_800_000_000.0


# --- query parameters ---------------------------------------------------------------------------------


@given(st.text())
def test_a_query_string_parses_or_is_a_bad_parameter(query: str) -> None:
    try:
        params = parse_query(query)
    except BadParameter as err:
        assert err.name == "query"
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in params.items())


@given(st.lists(st.tuples(st.text(min_size=1), st.text()), max_size=20))
def test_each_parameter_reads_back_its_first_value(pairs: list[tuple[str, str]]) -> None:
    assume(all("\0" not in k + v for k, v in pairs))
    first: dict[str, str] = {}
    for name, value in pairs:
        first.setdefault(name, value)
    assert parse_query(urlencode(pairs)) == first


@given(st.text(), st.integers(0, 10), st.integers(10, MAX_WHOLE))
def test_a_whole_number_is_ascii_digits_in_bounds(text: str, minimum: int, maximum: int) -> None:
    try:
        value = whole_number("offset", text, minimum, maximum)
    except BadParameter as err:
        assert err.name == "offset" and str(err).startswith("offset: ")
        return
    assert text.isascii() and text.isdigit() and int(text) == value and minimum <= value <= maximum


@given(st.integers(0, MAX_WHOLE))
def test_every_whole_number_in_bounds_is_taken(value: int) -> None:
    assert whole_number("offset", str(value)) == value


@pytest.mark.parametrize(
    "text", ["١٢", "²", "1_000", " 12", "12 ", "+1", "-1", "1e3", "0x10", "1.0", "１", ""]
)
def test_what_int_would_take_is_not_a_whole_number(text: str) -> None:
    with pytest.raises(BadParameter, match=r"^offset: "):
        whole_number("offset", text)


@given(st.text(), st.floats(allow_nan=False, allow_infinity=False))
def test_a_number_is_finite_and_in_bounds(text: str, bound: float) -> None:
    minimum, maximum = sorted((bound, bound + 1e6))
    try:
        value = finite_number("since", text, minimum, maximum)
    except BadParameter as err:
        assert err.name == "since"
        return
    assert text.isascii() and math.isfinite(value) and minimum <= value <= maximum


@given(st.floats(0, 1e11, allow_nan=False))
def test_every_wall_time_is_taken(value: float) -> None:
    assert finite_number("since", repr(value), 0, 1e11) == value


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999", "1_0", "١٢", "0x1p3", "", " 1", "1e"])
def test_what_float_would_take_is_not_a_number(text: str) -> None:
    with pytest.raises(BadParameter, match=r"^since: "):
        finite_number("since", text, 0, 1e11)


@given(st.text())
def test_a_request_names_the_parameter_it_cannot_take(value: str) -> None:
    req = Request("GET", "/api/v1/jobs/1/log", f"offset={quote(value)}&run=1")
    try:
        offset = req.int_param("offset")
    except HTTPProblem as err:
        assert err.status == 400 and err.message.startswith("offset: ")
        return
    assert offset is None or value.isascii()


# --- cookies and sessions -------------------------------------------------------------------------------

COOKIE_NAME = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.[]!#$%&'*+^`|~", min_size=1
)
COOKIE_VALUE = st.text(st.characters(blacklist_characters=';"', blacklist_categories=("Cs", "Zs", "Cc")))


@given(st.text())
def test_any_cookie_header_parses(header: str) -> None:
    for name, value in parse_cookies(header):
        assert name and ";" not in name + value and name == name.strip()


@given(st.lists(st.tuples(COOKIE_NAME, COOKIE_VALUE), max_size=10))
def test_cookies_read_back_as_sent(pairs: list[tuple[str, str]]) -> None:
    assert parse_cookies("; ".join(f"{n}={v}" for n, v in pairs)) == pairs


@given(st.lists(st.text().filter(lambda t: ";" not in t), max_size=6), st.integers(0, 6))
def test_our_session_is_found_among_anything_else(junk: list[str], where: int) -> None:
    sessions = Sessions(TOKEN)
    name = sessions.cookie_name("127.0.0.1:8765")
    pieces = [*junk]
    pieces.insert(min(where, len(pieces)), f"{name}={sessions.issue(name, NOW)}")
    assert sessions.age("; ".join(pieces), name, NOW + 5) == 5


@given(st.text(), st.text(max_size=40))
def test_no_text_is_a_session_but_one_we_issued(header: str, host: str) -> None:
    sessions = Sessions(TOKEN)
    name = sessions.cookie_name(host)
    assert sessions.age(header, name, NOW) is None


def test_a_session_is_bound_to_its_name_its_token_and_its_time() -> None:
    sessions = Sessions(TOKEN)
    name = sessions.cookie_name("127.0.0.1:8765")
    value = sessions.issue(name, NOW)
    assert name == f"jobwarden-8765-{sessions.tag}" and TOKEN not in value
    assert sessions.age(f"{name}={value}", name, NOW + 10) == 10
    other_port = sessions.cookie_name("localhost:8766")
    assert sessions.age(f"{other_port}={value}", other_port, NOW) is None  # moved to another name
    assert Sessions("u" * 43).age(f"{name}={value}", name, NOW) is None  # another token: another server
    assert sessions.age(f"{name}={value}", name, NOW + SESSION_S + 1) is None  # expired
    assert sessions.age(f"{name}={value}", name, NOW - CLOCK_SKEW_S - 1) is None  # from the future
    issued, _, mac = value.partition(".")
    assert sessions.age(f"{name}={int(issued) + 1}.{mac}", name, NOW + 10) is None  # its time changed
    assert sessions.cookie_name("127.0.0.1") == f"jobwarden-80-{sessions.tag}"  # Host without a port
    set_cookie = sessions.set_cookie(name, value)
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {p.strip() for p in set_cookie.split(";")}


def test_repeated_headers_are_joined_and_names_are_any_case() -> None:
    headers = Headers([("Cookie", "a=1"), ("cookie", "b=2"), ("Accept", "x"), ("ACCEPT", "y")])
    assert headers.get("COOKIE") == "a=1; b=2" and headers.get("accept") == "x, y"
    assert "Cookie" in headers and headers.get("Origin") is None
