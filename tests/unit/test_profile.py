"""The profile's logic: py-spy's speedscope read (and refused when it is not one), the top list, the
samples added for D-state ticks, the rate chosen from the thread count, the options' parsers, the stored
files and their pruning, and the state sampler on a captured /proc."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobwarden.control.profile import (
    BUDGET_SHARE,
    MAX_DURATION_S,
    MAX_RATE_HZ,
    choose_rate,
    parse_profile_duration,
    parse_rate,
)
from jobwarden.errors import UsageError
from jobwarden.osapi.procfs import ProcFS
from jobwarden.paths import Layout
from jobwarden.probes import profiledata
from jobwarden.probes.profiledata import IO_WAIT, IoWait, Profile, ProfileFormatError, from_speedscope
from jobwarden.probes.pyspyrecord import StateSampler
from jobwarden.store import profiles as stored


def pyspy_file(profiles: list[tuple[str, list[list[int]]]], frames: list[dict[str, Any]]) -> dict[str, Any]:
    """A speedscope file as py-spy 0.4 writes it (`record --subprocesses --format speedscope`)."""
    return {
        "$schema": profiledata.SCHEMA,
        "profiles": [
            {
                "type": "sampled",
                "name": name,
                "unit": "seconds",
                "startValue": 0,
                "endValue": len(samples) / 10,
                "samples": samples,
                "weights": [0.1] * len(samples),
            }
            for name, samples in profiles
        ],
        "shared": {"frames": frames},
        "activeProfileIndex": None,
        "exporter": "py-spy@0.4.3",
        "name": "py-spy profile",
    }


FRAMES = [
    {"name": 'process 10:"python train.py"', "file": "", "line": 0, "col": None},
    {"name": "<module>", "file": "train.py", "line": 40, "col": None},
    {"name": "step", "file": "train.py", "line": 12, "col": None},
    {"name": "fib", "file": "train.py", "line": 3, "col": None},
    {"name": "fib", "file": "train.py", "line": 4, "col": None},
    {"name": "__getitem__", "file": "data.py", "line": 7, "col": None},
    {"name": 'process 11:"python train.py"', "file": "", "line": 0, "col": None},
]


def test_top_is_inclusive_largest_first_and_counts_recursion_once() -> None:
    data = pyspy_file(
        [
            ('Process 10 Thread 10 "MainThread"', [[0, 1, 2, 3, 4, 3], [0, 1, 2], [0, 1, 2, 3]]),
            ('Process 11 Thread 11 "MainThread"', [[0, 6, 5]]),
        ],
        FRAMES,
    )
    profile = from_speedscope(data)
    top = profile.top()
    share = {e["function"]: e["fraction"] for e in top}
    assert share == {"<module>": 0.75, "step": 0.75, "fib": 0.5, "__getitem__": 0.25}
    assert [e["fraction"] for e in top] == sorted(share.values(), reverse=True)
    fib = next(e for e in top if e["function"] == "fib")
    assert (fib["file"], fib["line"]) == ("train.py", 3)  # the line it spent most samples on
    # py-spy's process frames are not code of the job's: left out, the pid says which process
    assert not any(e["function"].startswith("process ") for e in top)
    assert profile.processes() == pytest.approx({10: 0.3, 11: 0.1})
    assert [e["function"] for e in profile.top(self_only=True)][:1] == ["fib"]


def test_io_wait_ticks_become_samples_of_their_thread() -> None:
    profile = from_speedscope(pyspy_file([('Process 10 Thread 10 "MainThread"', [[1, 2]])], FRAMES))
    added = profiledata.add_io_waits(
        profile, [IoWait(10, 12, "loader", 3, {"folio_wait_bit_common": 3})], interval_s=0.1
    )
    assert added == pytest.approx(0.3)
    io = next(e for e in profile.top() if e["function"] == IO_WAIT)
    assert io["file"] == "kernel: folio_wait_bit_common" and io["fraction"] == 0.75
    assert profile.threads[(10, 12)].name == "loader"


def test_our_speedscope_reads_back_the_same() -> None:
    profile = from_speedscope(
        pyspy_file([('Process 10 Thread 10 "MainThread"', [[1, 2], [1, 2], [1]])], FRAMES)
    )
    again = from_speedscope(json.loads(json.dumps(profile.to_speedscope("job 1"))))
    assert again.top() == profile.top()
    assert again.threads[(10, 10)].weights == pytest.approx([0.2, 0.1])  # a steady stack: one entry
    assert again.threads[(10, 10)].name == "MainThread"


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
        max_leaves=20,
    )
)
def test_anything_else_is_refused_as_not_a_profile(data: Any) -> None:
    for candidate in (data, {"shared": {"frames": data}, "profiles": [{"name": "x", "samples": data}]}):
        try:
            read = from_speedscope(candidate)
        except ProfileFormatError as err:  # the one error, with what was wrong
            assert str(err).startswith("not a speedscope profile: ")
        else:
            assert isinstance(read, Profile) and read.seconds >= 0


@given(st.integers(0, 5000), st.integers(0, 300), st.integers(1, 256))
def test_the_rate_is_within_bounds_and_falls_as_threads_grow(threads: int, processes: int, cpus: int) -> None:
    choice = choose_rate(threads, processes, cpus)
    assert 1 <= choice.rate_hz <= MAX_RATE_HZ
    assert choose_rate(threads + 50, processes, cpus).rate_hz <= choice.rate_hz
    if choice.note is None:
        assert choice.cost_share <= BUDGET_SHARE + 1e-9


def test_the_rate_chosen_for_one_and_for_64_threads() -> None:
    assert choose_rate(1, 1, 2).rate_hz >= 50
    many = choose_rate(65, 1, 2)
    assert 1 <= many.rate_hz <= 10  # research/slowness.md §5.3: ≤ 10-20 Hz for a 65-thread process
    assert choose_rate(5000, 64, 1).note is not None


@given(st.text(max_size=20))
def test_duration_and_rate_parsers_take_anything(text: str) -> None:
    try:
        seconds = parse_profile_duration(text)
    except UsageError as err:
        assert err.message.startswith("--duration: ") and "\n" not in err.message
    else:
        assert 1 <= seconds <= MAX_DURATION_S
    try:
        rate = parse_rate(text)
    except UsageError as err:
        assert err.message.startswith("--rate: ")
    else:
        assert rate is not None and 1 <= rate <= MAX_RATE_HZ


def test_durations_round_up_to_whole_seconds() -> None:
    assert parse_profile_duration(None) == 10
    assert parse_profile_duration("250ms") == 1
    assert parse_profile_duration("1.5s") == 2
    assert parse_profile_duration("5m") == 300
    with pytest.raises(UsageError):
        parse_profile_duration("5m1s")


def test_stored_profiles_are_private_and_pruned_to_the_newest(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    for i in range(stored.KEEP + 2):
        stored.save(layout, 1, 1, 1_700_000_000_000 + i, "cli", b'{"profiles":[]}', {"n": i})
    kept = stored.listed(layout, 1, 1)
    assert [p.summary() for p in kept] == [{"n": i} for i in range(2, stored.KEEP + 2)]
    newest = stored.newest(layout, 1, 1)
    assert newest is not None and newest.speedscope_bytes() == b'{"profiles":[]}'
    folder = stored.profiles_dir(layout, 1, 1)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in folder.iterdir())
    with pytest.raises(stored.ProfileTooLarge):
        stored.save(layout, 1, 1, 1, "cli", b" " * (stored.MAX_SPEEDSCOPE_BYTES + 1), {})


def test_a_planted_link_is_never_read(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text('{"stolen": true}')
    folder = stored.profiles_dir(layout, 2, 1)
    folder.mkdir(parents=True)
    (folder / "1700000000000-cli.json").symlink_to(secret)
    found = stored.newest(layout, 2, 1)
    assert found is not None and found.summary() is None


def fake_task(
    root: Path, pid: int, tid: int, state: str, wchan: str = "0", ppid: int = 1, children: str = ""
) -> None:
    task = root / str(pid) / "task" / str(tid)
    task.mkdir(parents=True, exist_ok=True)
    rest = " ".join(["0"] * 40)
    (task / "stat").write_text(f"{tid} (py thread) {state} {ppid} {rest}\n")
    (task / "wchan").write_text(wchan)
    (task / "children").write_text(children)
    if pid == tid:
        (root / str(pid) / "stat").write_text(f"{pid} (python) {state} {ppid} {rest}\n")


def test_the_state_sampler_counts_d_ticks_with_their_wchan(tmp_path: Path) -> None:
    fake_task(tmp_path, 10, 10, "R")
    fake_task(tmp_path, 10, 12, "D", "folio_wait_bit_common", children="20 ")  # forked by thread 12
    fake_task(tmp_path, 20, 20, "S", ppid=10)  # a child: found by the rescan
    fake_task(tmp_path, 20, 21, "D", "jbd2_log_wait_commit", ppid=10)
    fake_task(tmp_path, 30, 30, "D", ppid=99)  # someone else's
    found: list[int] = []
    sampler = StateSampler(ProcFS(tmp_path), [10], 0.01, on_new=found.append)
    sampler._find_children()
    assert found == [20]  # each new process told once, to be recorded
    for _ in range(3):
        sampler._tick()
    waits = {(w.pid, w.tid): w for w in sampler.io_waits()}
    assert set(waits) == {(10, 12), (20, 21)}
    assert waits[(10, 12)].wchan == {"folio_wait_bit_common": 3} and waits[(10, 12)].name == "py thread"
    assert waits[(20, 21)].ticks == 3
    os.rename(tmp_path / "20", tmp_path / "gone")  # ended: dropped, not an error
    sampler._tick()
    assert 20 not in sampler.pids
