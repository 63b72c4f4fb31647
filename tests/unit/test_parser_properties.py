"""Property tests (hypothesis) for the parsers of outside input: durations, sizes and counts as users type
them, job references, group records read from a shared file system, Slurm nodelists. Whatever the input,
each answers or refuses with a UsageError (or None, for records): never another exception, never an
unbounded result."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jobwarden import config
from jobwarden.errors import JobNotFound, UsageError
from jobwarden.model import JobSpec
from jobwarden.rules.group import MAX_NODES, RankStory, expand_nodelist, merge
from jobwarden.store import Store, groupschema

# text as a shell hands it over: any character, surrogates (bytes that are not UTF-8) included
ARGUMENTS = st.text(st.characters(codec=None, exclude_categories=()), max_size=60) | st.sampled_from(
    [
        "9" * 5000,
        "1e400",
        "nan",
        "inf",
        "-1",
        "0",
        "1_000",
        "٣",
        "²",
        "\udcff",
        " 5m ",
        "1h1h",
        "9" * 400 + "G",
    ]
)


# --- durations, sizes, counts ---------------------------------------------------------------------------


@given(ARGUMENTS)
def test_a_duration_is_a_positive_finite_time_within_a_year_or_a_usage_error(text: str) -> None:
    try:
        value = config.parse_duration(text, "--timeout")
    except UsageError as err:
        assert err.message.startswith("--timeout: ")
        return
    assert math.isfinite(value) and 0 < value <= config.MAX_DURATION_S


@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=99), st.sampled_from(["d", "h", "m", "s", "ms"])),
        min_size=1,
        max_size=4,
    )
)
def test_a_duration_in_units_is_their_sum(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in parts)
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    expected = sum(n * units[unit] for n, unit in parts)
    assume(0 < expected <= config.MAX_DURATION_S)
    assert config.parse_duration(text) == pytest.approx(expected)


@given(ARGUMENTS)
def test_a_size_is_positive_and_bounded_or_a_usage_error(text: str) -> None:
    try:
        value = config.parse_size(text, "--mem-limit")
    except UsageError as err:
        assert err.message.startswith("--mem-limit: ")
        return
    assert isinstance(value, int) and 0 < value <= config.MAX_SIZE_BYTES


@given(st.integers(min_value=1, max_value=1 << 20), st.sampled_from(["", "K", "M", "G", "KiB", "mb", "gib"]))
def test_a_size_with_a_unit_is_exact(number: int, unit: str) -> None:
    factor = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "kib": 1 << 10, "mb": 1 << 20, "gib": 1 << 30}
    assert config.parse_size(f"{number}{unit}") == number * factor[unit.lower()]


@given(ARGUMENTS)
def test_a_count_is_a_bounded_whole_number_or_a_usage_error(text: str) -> None:
    try:
        value = config.parse_count(text, "--max-restarts")
    except UsageError:
        return
    assert 0 <= value <= config.MAX_COUNT and value == int(text.strip())


@given(ARGUMENTS)
def test_a_line_count_is_a_bounded_whole_number_all_or_a_usage_error_naming_n(text: str) -> None:
    try:
        value = config.parse_lines(text)
    except UsageError as err:
        assert err.message.startswith("-n: bad line count")
        return
    if value is None:
        assert text.strip().lower() == "all"
    else:
        assert 0 <= value <= config.MAX_COUNT and value == int(text.strip())


@given(st.integers(min_value=1, max_value=config.MAX_COUNT))
def test_a_negative_line_count_is_refused(n: int) -> None:
    with pytest.raises(UsageError, match="must be 0 or more, or all"):
        config.parse_lines(f"-{n}")


@given(ARGUMENTS | st.lists(st.sampled_from(config.STATE_WORDS), min_size=1).map(",".join))
def test_a_state_list_is_known_words_or_a_usage_error_naming_state(text: str) -> None:
    try:
        states = config.parse_states(text)
    except UsageError as err:
        assert err.message.startswith("--state: ") and "\n" not in err.message
        return
    assert states and states <= set(config.STATE_WORDS)
    assert states == {w.strip().lower() for w in text.split(",")}


@given(st.lists(st.sampled_from(config.STATE_WORDS), min_size=1), st.booleans())
def test_every_listed_state_is_taken_in_any_case(words: list[str], upper: bool) -> None:
    text = ",".join(w.upper() if upper else w for w in words)
    assert config.parse_states(text) == set(words)


# --- job references -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with Store(tmp_path_factory.mktemp("home")) as s:
        for name in ("train", "train-lr3", "x$(touch y)", "my name"):
            s.create_job(JobSpec(command=("true",), cwd="/", name=name, env={}), {}, 1.0)
        yield s


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ARGUMENTS | st.integers(min_value=-(10**30), max_value=10**30).map(str))
def test_a_job_reference_names_a_job_or_none(store: Store, ref: str) -> None:
    try:
        job = store.job(ref)
    except JobNotFound:
        return
    assert ref in (str(job.id), job.name)


def test_names_and_ids_resolve(store: Store) -> None:
    assert (
        store.job("1").name == "train" and store.job("x$(touch y)").id == 3 and store.job("my name").id == 4
    )


# --- group records --------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELD_NAMES = sorted(groupschema.RECORD)
KINDS = ["started", "alive", "finding", "hung", "engine-signal", "stopping", "ended", "engine-state"]
RECORDS = st.dictionaries(
    st.sampled_from(FIELD_NAMES),
    JSON_VALUES | st.sampled_from([0, 1, 3, "SIGKILL", "n1", 1.7e9]),
    max_size=12,
) | st.builds(
    lambda kind, extra: {"kind": kind, **extra},
    st.sampled_from(KINDS),
    st.dictionaries(st.sampled_from(FIELD_NAMES), JSON_VALUES, max_size=8),
)


def _line(record: Any) -> bytes:
    return json.dumps(record, allow_nan=True).encode()


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_parse_to_a_record_or_none(line: bytes) -> None:
    record = groupschema.parse(line)
    assert record is None or isinstance(record, dict)


@given(st.lists(st.lists(RECORDS, max_size=6), min_size=1, max_size=4), st.booleans())
def test_records_that_pass_the_schema_never_break_the_verdict(files: list[list[Any]], over: bool) -> None:
    stories = []
    for i, records in enumerate(files):
        parsed = [r for r in (groupschema.parse(_line(record)) for record in records) if r is not None]
        for record in parsed:  # what passed has its fields' types
            for name, check in groupschema.RECORD.items():
                assert name not in record or check(record[name])
        stories.append(RankStory.of(f"rank-{i}", parsed))
    verdict = merge(stories, expected_nodes=["n1", "n2"], over=over)
    assert verdict.state in ("succeeded", "failed", "stopped", "running", "unknown")
    assert len(verdict.ranks) <= len(stories)


@given(st.integers(min_value=1, max_value=200_000))
def test_json_nested_at_any_depth_never_raises(depth: int) -> None:
    assert groupschema.parse("[" * depth + "]" * depth) is None  # no object
    nested = groupschema.parse('{"x":' * depth + "1" + "}" * depth)
    assert nested is None or isinstance(nested, dict)


def test_json_nested_past_the_parser_is_no_record() -> None:
    assert groupschema.parse('{"x":' * 100_000 + "1" + "}" * 100_000) is None


# --- nodelists ------------------------------------------------------------------------------------------


@given(st.text(alphabet="n[]-,0123456789ab", max_size=40) | st.text(max_size=40) | st.none() | st.integers())
def test_a_nodelist_expands_to_at_most_the_cap_and_never_raises(text: Any) -> None:
    names = expand_nodelist(text, limit=1000)
    assert len(names) <= 1000 and all(isinstance(n, str) for n in names)


HOST_PREFIX = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=6)


@given(
    st.lists(
        st.tuples(
            HOST_PREFIX,
            st.lists(st.tuples(st.integers(0, 300), st.integers(0, 20), st.integers(1, 3)), max_size=3),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_a_well_formed_nodelist_expands_to_its_hosts(
    groups: list[tuple[str, list[tuple[int, int, int]]]],
) -> None:
    parts, expected = [], []
    for prefix, ranges in groups:
        if not ranges:
            parts.append(prefix)
            expected.append(prefix)
            continue
        pieces = []
        for low, span, width in ranges:
            pieces.append(f"{low:0{width}d}-{low + span:0{width}d}")
            expected += [f"{prefix}{n:0{width}d}" for n in range(low, low + span + 1)]
        parts.append(f"{prefix}[{','.join(pieces)}]")
    assert expand_nodelist(",".join(parts)) == expected


def test_a_huge_nodelist_is_cut_at_the_cap() -> None:
    names = expand_nodelist("n[0-99999999],login")
    assert len(names) == MAX_NODES and names[:2] == ["n0", "n1"]
    assert expand_nodelist("n[" + "9" * 5000 + "-" + "9" * 5001 + "]") == [
        "n" + "9" * 5000 + "-" + "9" * 5001
    ]


def test_a_records_file_of_mixed_lines_keeps_only_records(tmp_path: Path) -> None:
    from jobwarden.store.groupdir import read_rank_log

    folder = tmp_path / "ranks"
    folder.mkdir(mode=0o700)
    good = {"v": 1, "kind": "alive", "rank": 0, "wall": 5.0}
    lines = [
        _line(good),
        b"[" * 5000 + b"]" * 5000,
        b'{"kind": "ended", "rank": -1}',
        _line({**good, "wall": 9.0}),
    ]
    (folder / "rank-0.jsonl").write_bytes(b"\n".join(lines) + b'\n{"torn')
    log = read_rank_log(folder / "rank-0.jsonl")
    assert (log.records, log.bad, log.torn) == ([{**good, "wall": 9.0}], 2, 1)  # one alive: the newest


def test_a_records_file_holds_at_most_its_newest_records_and_one_alive(tmp_path: Path) -> None:
    from jobwarden.store.groupdir import MAX_RECORDS_PER_FILE, read_rank_log

    folder = tmp_path / "ranks"
    folder.mkdir(mode=0o700)
    lines = []
    for i in range(MAX_RECORDS_PER_FILE + 500):
        lines.append(_line({"v": 1, "kind": "finding", "rank": 0, "wall": float(i), "rule": "x"}))
        lines.append(_line({"v": 1, "kind": "alive", "rank": 0, "wall": i + 0.5}))
    (folder / "rank-0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    records = read_rank_log(folder / "rank-0.jsonl").records
    assert len(records) == MAX_RECORDS_PER_FILE + 1
    assert records[0]["wall"] == 500.0 and records[-1] == {"v": 1, "kind": "alive", "rank": 0, "wall": 5499.5}
