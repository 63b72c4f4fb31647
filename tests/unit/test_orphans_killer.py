"""The killer against a fake /proc and fake pidfds: a reused pid is never signalled, another user's
process is never touched, a group made only of strays is followed, and each survivor says why."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from jobwarden.clock import FakeClock
from jobwarden.control.killer import Killer, KillResult, Target, outcomes_json
from jobwarden.errors import AccessDenied, ProcessGone
from jobwarden.osapi.procfs import ProcFS
from tests.unit.test_procfs import CAPTURED_PROC_STAT, add_process, stat_line

ME = 1000


class FakeProcesses:
    """Fake pidfds over a fake /proc: signals are recorded and act on the fake processes."""

    def __init__(self, root: Path, clock: FakeClock) -> None:
        self.root, self.clock = root, clock
        self.sent: list[tuple[int, str]] = []
        self.open_handles: dict[int, int] = {}  # handle -> pid
        self.next_handle = 100
        self.ignores: dict[int, set[int]] = {}  # pid -> signals it survives
        self.on_open: Callable[[int], None] = lambda pid: None
        self.on_signal: Callable[[int, int], None] = lambda pid, sig: None
        self.denied: set[int] = set()
        self.exited: set[int] = set()

    def add(self, pid: int, start: int = 1000, state: str = "S", pgid: int | None = None) -> None:
        stat = stat_line(pid, "sleep", state, f4=1, f5=pgid or pid, f6=pgid or pid, f22=start)
        add_process(self.root, pid, stat, cmdline=f"sleep {pid}\0".encode(), wchan=b"nfs_wait_bit")

    def replace(self, pid: int, start: int) -> None:
        """The pid now names another process (the first exited, the number was reused)."""
        (self.root / str(pid) / "stat").write_text(stat_line(pid, "other", "S", f4=1, f22=start))

    def exit(self, pid: int) -> None:
        (self.root / str(pid) / "stat").write_text(stat_line(pid, "sleep", "Z", f4=1))
        self.exited.add(pid)

    # --- the Handles protocol ---

    def open(self, pid: int) -> int:
        if not (self.root / str(pid)).exists():
            raise ProcessGone(pid)
        self.on_open(pid)
        self.next_handle += 1
        self.open_handles[self.next_handle] = pid
        return self.next_handle

    def send(self, handle: int, pid: int, sig: int) -> bool:
        assert self.open_handles[handle] == pid
        if pid in self.denied:
            raise AccessDenied(pid, f"send {signal.Signals(sig).name} to", "it runs as another user")
        if pid in self.exited:
            return False
        self.sent.append((pid, signal.Signals(sig).name))
        self.on_signal(pid, sig)
        if sig not in self.ignores.get(pid, set()):
            self.exit(pid)
        return True

    def wait(self, handles: Sequence[int], timeout_s: float) -> set[int]:
        done = {h for h in handles if self.open_handles[h] in self.exited}
        if not done:
            self.clock.advance(timeout_s)
        return done

    def close(self, handle: int) -> None:
        del self.open_handles[handle]


@pytest.fixture
def fake(tmp_path: Path) -> FakeProcesses:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "stat").write_text(CAPTURED_PROC_STAT)
    return FakeProcesses(root, FakeClock())


def killer(fake: FakeProcesses, euid: int = 0) -> Killer:
    return Killer(ProcFS(fake.root), fake, fake.clock, euid=euid)


def target(pid: int, start: int = 1000, uid: int = ME, pgid: int | None = None) -> Target:
    return Target(pid, start, uid, pgid or pid, f"sleep {pid}")


def by_pid(results: list[KillResult]) -> dict[int, tuple[str | None, str | None]]:
    return {r.pid: (r.how, r.reason) for r in results}


def test_sigterm_ends_a_stray_within_the_grace(fake: FakeProcesses) -> None:
    fake.add(10)
    results = killer(fake).terminate([target(10)], grace_s=10)
    assert by_pid(results) == {10: ("SIGTERM", None)}
    assert fake.sent == [(10, "SIGTERM")]
    assert fake.open_handles == {}  # every pidfd closed


def test_sigkill_follows_the_grace(fake: FakeProcesses) -> None:
    fake.add(10)
    fake.ignores[10] = {signal.SIGTERM}
    start = fake.clock.monotonic()
    results = killer(fake).terminate([target(10)], grace_s=5)
    assert by_pid(results) == {10: ("SIGKILL", None)}
    assert fake.sent == [(10, "SIGTERM"), (10, "SIGKILL")]
    assert fake.clock.monotonic() - start == pytest.approx(5, abs=0.5)


def test_a_pid_reused_before_the_kill_is_never_signalled(fake: FakeProcesses) -> None:
    fake.add(10, start=2000)  # the stray (start 1000) exited; pid 10 now names a newer process
    results = killer(fake).terminate([target(10, start=1000)], grace_s=5)
    assert by_pid(results) == {10: ("gone", None)}
    assert fake.sent == []
    assert fake.open_handles == {}


def test_a_pid_reused_while_its_pidfd_is_opened_is_never_signalled(fake: FakeProcesses) -> None:
    fake.add(10, start=1000)
    fake.on_open = lambda pid: fake.replace(pid, start=3000)  # exited and reused just before pidfd_open
    results = killer(fake).terminate([target(10, start=1000)], grace_s=5)
    assert by_pid(results) == {10: ("gone", None)}
    assert fake.sent == []


def test_a_stray_gone_meanwhile_is_not_an_error(fake: FakeProcesses) -> None:
    results = killer(fake).terminate([target(10)], grace_s=5)  # no such process any more
    assert [r.ended for r in results] == [True]


def test_another_users_process_is_never_touched_without_root(fake: FakeProcesses) -> None:
    fake.add(10)
    fake.add(11)
    opened: list[int] = []
    fake.on_open = opened.append
    results = killer(fake, euid=ME).terminate([target(10, uid=0), target(11, uid=ME)], grace_s=5)
    assert opened == [11]  # not even a pidfd for the other user's process
    assert fake.sent == [(11, "SIGTERM")]
    how, reason = by_pid(results)[10]
    assert how is None and reason is not None
    assert "owned by another user (root)" in reason and "sudo" in reason


def test_root_ends_another_users_process(fake: FakeProcesses) -> None:
    fake.add(10)
    assert by_pid(killer(fake, euid=0).terminate([target(10, uid=4242)], grace_s=5)) == {
        10: ("SIGTERM", None)
    }


def test_a_refused_signal_is_reported_with_its_remedy(fake: FakeProcesses) -> None:
    fake.add(10)
    fake.denied.add(10)  # a setuid program: same uid on paper, still refused
    how, reason = by_pid(killer(fake, euid=ME).terminate([target(10)], grace_s=5))[10]
    assert how is None and reason == "not allowed to send SIGTERM to process 10: it runs as another user"


def test_a_process_in_d_state_is_reported_with_its_wait_channel(fake: FakeProcesses) -> None:
    fake.add(10, state="D")
    fake.ignores[10] = {signal.SIGTERM, signal.SIGKILL}
    how, reason = by_pid(killer(fake).terminate([target(10)], grace_s=1))[10]
    assert how is None and reason is not None
    assert "D state" in reason and "nfs_wait_bit" in reason
    assert fake.sent.count((10, "SIGKILL")) == 3  # retried, then reported
    assert fake.open_handles == {}


def test_a_group_of_strays_only_is_followed_to_what_it_forks(fake: FakeProcesses) -> None:
    fake.add(10, pgid=10)
    fake.ignores[10] = {signal.SIGTERM}

    def fork_on_term(pid: int, sig: int) -> None:
        if sig == signal.SIGTERM and pid == 10:
            fake.add(12, pgid=10)  # forked by the stray while it is being ended

    fake.on_signal = fork_on_term
    results = killer(fake).terminate([target(10, pgid=10)], grace_s=5)
    assert by_pid(results) == {10: ("SIGKILL", None), 12: ("SIGTERM", None)}
    assert (12, "SIGTERM") in fake.sent


def test_a_group_with_an_innocent_member_is_not_followed(fake: FakeProcesses) -> None:
    fake.add(10, pgid=10)
    fake.add(11, pgid=10)  # not a stray: a live job's process sharing the group
    fake.ignores[10] = {signal.SIGTERM}
    fake.on_signal = lambda pid, sig: fake.add(12, pgid=10) if pid == 10 and sig == signal.SIGTERM else None
    results = killer(fake).terminate([target(10, pgid=10)], grace_s=5)
    assert [r.pid for r in results] == [10]
    assert {pid for pid, _ in fake.sent} == {10}


def test_outcomes_keep_the_listing_and_add_what_became_of_each() -> None:
    listed: list[dict[str, object]] = [
        {"pid": 10, "user": "ana", "command": "sleep", "reason": "r", "job": 3}
    ]
    results = [KillResult(10, "sleep", "SIGTERM"), KillResult(12, "sleep 2", None, "D state", uid=0)]
    out = outcomes_json(listed, results)
    assert out[0] == {**listed[0], "ended": True, "ended_by": "SIGTERM", "not_ended_because": None}
    assert out[1]["job"] is None and out[1]["user"] == "root" and out[1]["not_ended_because"] == "D state"


def test_a_child_forked_by_a_dying_stray_is_ended_too(fake: FakeProcesses) -> None:
    fake.add(10, pgid=10)
    fake.on_signal = lambda pid, sig: fake.add(12, pgid=10) if pid == 10 else None  # forks, then dies
    results = killer(fake).terminate([target(10, pgid=10)], grace_s=5)
    assert by_pid(results) == {10: ("SIGTERM", None), 12: ("SIGTERM", None)}
