"""The tree's memory from a fake /proc, and the watchdog's pure decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.observations import OomEvidence
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.memory import MemoryWatchdog, tree_memory, tree_pss, tree_rss

MiB = 1 << 20


def stat_line(pid: int, rss_pages: int) -> str:
    # fields 3.. of proc(5); field 24 (rss) is the 22nd after the comm
    after = ["S", "1", str(pid), str(pid)] + ["0"] * 15 + ["5000", "100000", str(rss_pages)] + ["0"] * 28
    return f"{pid} (python) {' '.join(after)}\n"


class FakeProc(ProcFS):
    """A /proc of a few processes; counts the smaps_rollup reads (the costly ones)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.pss_reads = 0

    def add(self, pid: int, rss: int, pss: int | None) -> None:
        d = self.root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(stat_line(pid, rss // self.page_size))
        if pss is not None:
            (d / "smaps_rollup").write_text(
                "55d0-7ffd ---p 00000000 00:00 0      [rollup]\n"
                f"Rss:  {rss // 1024} kB\nPss:  {pss // 1024} kB\nPss_Anon:  {pss // 1024} kB\n"
            )

    def pss_bytes(self, pid: int) -> int | None:
        self.pss_reads += 1
        return super().pss_bytes(pid)


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    fake = FakeProc(tmp_path)
    fake.add(10, 100 * MiB, 100 * MiB)  # a parent
    fake.add(11, 100 * MiB, 10 * MiB)  # two forked workers sharing most of its pages
    fake.add(12, 100 * MiB, 10 * MiB)
    return fake


def test_rss_counts_shared_pages_once_per_process(proc: FakeProc) -> None:
    assert tree_rss(proc, [10, 11, 12]) == 300 * MiB


def test_pss_counts_them_once(proc: FakeProc) -> None:
    assert tree_pss(proc, [10, 11, 12]) == 120 * MiB


def test_gone_processes_count_nothing(proc: FakeProc) -> None:
    assert tree_rss(proc, [10, 99]) == 100 * MiB
    assert tree_pss(proc, [10, 99]) == 100 * MiB


def test_a_kernel_without_smaps_rollup_counts_rss(tmp_path: Path) -> None:
    fake = FakeProc(tmp_path)
    fake.add(20, 50 * MiB, None)  # Linux < 4.14
    assert tree_pss(fake, [20]) == 50 * MiB


def test_a_zombie_has_an_empty_smaps_rollup(tmp_path: Path) -> None:
    fake = FakeProc(tmp_path)
    fake.add(21, 0, None)
    (tmp_path / "21" / "smaps_rollup").write_text("")
    assert fake.pss_bytes(21) is None and tree_pss(fake, [21]) == 0


def test_under_the_limit_only_the_cheap_sum_is_read(proc: FakeProc) -> None:
    assert tree_memory(proc, [10, 11, 12], exact_above=400 * MiB) == 300 * MiB
    assert proc.pss_reads == 0


def test_over_it_pss_decides(proc: FakeProc) -> None:
    # the RSS sum (300 MiB) says "over 200 MiB"; PSS says the tree holds 120 MiB: nothing to kill
    assert tree_memory(proc, [10, 11, 12], exact_above=200 * MiB) == 120 * MiB
    assert proc.pss_reads == 3


def test_without_a_limit_it_is_the_rss_sum(proc: FakeProc) -> None:
    assert tree_memory(proc, iter([10, 11, 12])) == 300 * MiB
    assert proc.pss_reads == 0


# --- the watchdog ---------------------------------------------------------------------------------


def test_under_and_at_the_limit_is_fine() -> None:
    dog = MemoryWatchdog(64 * MiB)
    assert dog.check(10 * MiB) is False
    assert dog.check(64 * MiB) is False  # the kernel lets usage reach the limit, too


def test_over_the_limit_ends_the_tree() -> None:
    dog = MemoryWatchdog(64 * MiB)
    assert dog.check(64 * MiB + 1) is True


def test_the_peak_is_kept() -> None:
    dog = MemoryWatchdog(64 * MiB)
    for sample in (10 * MiB, 50 * MiB, 20 * MiB):
        dog.check(sample)
    assert dog.peak_bytes == 50 * MiB


def test_the_evidence_names_every_process_ended() -> None:
    dog = MemoryWatchdog(64 * MiB)
    dog.check(80 * MiB)
    assert dog.evidence([10, 11, 12]) == OomEvidence(
        mechanism="watchdog", kills=3, limit_bytes=64 * MiB, peak_bytes=80 * MiB, victims=(10, 11, 12)
    )


@pytest.mark.parametrize("limit", [0, -5])
def test_a_limit_must_be_positive(limit: int) -> None:
    with pytest.raises(ValueError):
        MemoryWatchdog(limit)
