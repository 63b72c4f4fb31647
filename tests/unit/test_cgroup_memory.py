"""Memory limits and counters of a cgroup, against directories laid out like cgroup v1 and v2 ones.

(The kernel's own rules, such as memsw >= limit at every moment, are proved in
tests/integration/test_oom_kill.py against a real cgroup.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.errors import JobwardenError, OsApiError
from jobwarden.osapi.cgroup import CgroupMemory, JobCgroup, enclosing_cgroup

V1_UNLIMITED = "9223372036854771712\n"


def v1_cgroup(root: Path, *, memsw: bool = True, oom_kill: int = 0) -> JobCgroup:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.procs").write_text("")
    (root / "memory.limit_in_bytes").write_text(V1_UNLIMITED)
    (root / "memory.usage_in_bytes").write_text("1048576\n")
    (root / "memory.max_usage_in_bytes").write_text("2097152\n")
    (root / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
    if memsw:
        (root / "memory.memsw.limit_in_bytes").write_text(V1_UNLIMITED)
    return JobCgroup(root, 1)


def v2_cgroup(root: Path, *, swap: bool = True, peak: bool = True, oom_kill: int = 0) -> JobCgroup:
    root.mkdir(parents=True, exist_ok=True)
    (root / "cgroup.procs").write_text("")
    (root / "memory.max").write_text("max\n")
    (root / "memory.current").write_text("4096\n")
    (root / "memory.events").write_text(
        f"low 0\nhigh 0\nmax 7\noom 2\noom_kill {oom_kill}\noom_group_kill 0\n"
    )
    if peak:
        (root / "memory.peak").write_text("8192\n")
    if swap:
        (root / "memory.swap.max").write_text("max\n")
    return JobCgroup(root, 2)


# --- limits ---------------------------------------------------------------------------------------


def test_v1_limit_caps_memory_and_memory_plus_swap(tmp_path: Path) -> None:
    cg = v1_cgroup(tmp_path / "job")
    cg.set_memory_limit(64 << 20)
    assert (cg.path / "memory.limit_in_bytes").read_text() == str(64 << 20)
    assert (cg.path / "memory.memsw.limit_in_bytes").read_text() == str(64 << 20)


def test_v1_limit_without_swap_accounting_sets_memory_only(tmp_path: Path) -> None:
    cg = v1_cgroup(tmp_path / "job", memsw=False)
    cg.set_memory_limit(1 << 30)
    assert (cg.path / "memory.limit_in_bytes").read_text() == str(1 << 30)
    assert not (cg.path / "memory.memsw.limit_in_bytes").exists()  # not created where the kernel has none


def test_v2_limit_sets_memory_max_and_no_swap(tmp_path: Path) -> None:
    cg = v2_cgroup(tmp_path / "job")
    cg.set_memory_limit(512 << 20)
    assert (cg.path / "memory.max").read_text() == str(512 << 20)
    assert (cg.path / "memory.swap.max").read_text() == "0"


def test_v2_limit_without_swap_controller_sets_memory_max_only(tmp_path: Path) -> None:
    cg = v2_cgroup(tmp_path / "job", swap=False)
    cg.set_memory_limit(512 << 20)
    assert (cg.path / "memory.max").read_text() == str(512 << 20)
    assert not (cg.path / "memory.swap.max").exists()


@pytest.mark.parametrize("version", [1, 2])
def test_a_cgroup_without_the_memory_controller_refuses_a_limit(tmp_path: Path, version: int) -> None:
    (tmp_path / "cgroup.procs").write_text("")
    cg = JobCgroup(tmp_path, version)
    assert not cg.has_memory_controller
    with pytest.raises(JobwardenError) as info:
        cg.set_memory_limit(64 << 20)
    assert "no memory controller" in info.value.message
    assert "--mem-limit" in info.value.remedy


def test_the_controller_is_seen_when_present(tmp_path: Path) -> None:
    assert v1_cgroup(tmp_path / "a").has_memory_controller
    assert v2_cgroup(tmp_path / "b").has_memory_controller


def test_a_limit_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    cg = v2_cgroup(tmp_path / "job")
    (cg.path / "memory.max").unlink()
    (cg.path / "memory.max").mkdir()  # exists (so the controller is there) but cannot be written
    with pytest.raises(OsApiError) as info:
        cg.set_memory_limit(64 << 20)
    assert "cannot set memory.max" in info.value.message and str(cg.path) in info.value.message


@pytest.mark.parametrize("limit", [0, -1])
def test_a_non_positive_limit_is_refused(tmp_path: Path, limit: int) -> None:
    with pytest.raises(OsApiError):
        v1_cgroup(tmp_path / "job").set_memory_limit(limit)


# --- counters -------------------------------------------------------------------------------------


def test_v1_stats(tmp_path: Path) -> None:
    cg = v1_cgroup(tmp_path / "job", oom_kill=3)
    assert cg.memory_stats() == CgroupMemory(1 << 20, 2 << 20, None, 3)  # "unlimited" reads as None
    cg.set_memory_limit(64 << 20)
    stats = cg.memory_stats()
    assert stats is not None and stats.limit_bytes == 64 << 20


def test_v2_stats(tmp_path: Path) -> None:
    cg = v2_cgroup(tmp_path / "job", oom_kill=1)
    assert cg.memory_stats() == CgroupMemory(4096, 8192, None, 1)  # "max" reads as no limit
    (cg.path / "memory.max").write_text("67108864\n")
    stats = cg.memory_stats()
    assert stats is not None and stats.limit_bytes == 64 << 20


def test_v2_without_memory_peak_has_no_peak(tmp_path: Path) -> None:
    stats = v2_cgroup(tmp_path / "job", peak=False).memory_stats()  # Linux < 5.19
    assert stats is not None and stats.peak_bytes is None and stats.current_bytes == 4096


def test_the_oom_kill_counter_is_read_not_the_oom_event_counter(tmp_path: Path) -> None:
    # v2 memory.events has both "oom" (the limit was hit) and "oom_kill" (a process was killed)
    assert v2_cgroup(tmp_path / "job", oom_kill=5).oom_kills() == 5


def test_a_kernel_without_the_v1_oom_kill_line_has_no_count(tmp_path: Path) -> None:
    cg = v1_cgroup(tmp_path / "job")
    (cg.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # Linux < 4.13
    assert cg.oom_kills() is None
    stats = cg.memory_stats()
    assert stats is not None and stats.oom_kills is None


def test_a_removed_cgroup_has_no_stats(tmp_path: Path) -> None:
    assert JobCgroup(tmp_path / "gone", 1).memory_stats() is None
    assert JobCgroup(tmp_path / "gone", 2).oom_kills() is None


# --- where a cgroup sits ----------------------------------------------------------------------------


def fake_proc(root: Path, mountinfo: str, cgroup: str) -> Path:
    (root / "self").mkdir(parents=True)
    (root / "self" / "mountinfo").write_text(mountinfo)
    (root / "self" / "cgroup").write_text(cgroup)
    return root


def test_hierarchy_path_is_the_path_the_kernel_log_prints(tmp_path: Path) -> None:
    mnt = tmp_path / "sys/fs/cgroup"
    proc = fake_proc(
        tmp_path / "proc",
        f"31 23 0:28 / {mnt} rw - tmpfs tmpfs rw\n35 31 0:32 / {mnt}/memory rw - cgroup cgroup rw,memory\n",
        "4:memory:/a\n",
    )
    cg = v1_cgroup(mnt / "memory/a/jobwarden-12")
    assert cg.hierarchy_path(str(proc)) == "/a/jobwarden-12"


def test_hierarchy_path_includes_the_mount_root(tmp_path: Path) -> None:
    # a container's v1 mount shows its own cgroup as the mount root ("/docker/abc")
    mnt = tmp_path / "memory"
    proc = fake_proc(
        tmp_path / "proc",
        f"35 31 0:32 /docker/abc {mnt} rw - cgroup cgroup rw,memory\n",
        "4:memory:/docker/abc\n",
    )
    assert v1_cgroup(mnt / "jobwarden-3").hierarchy_path(str(proc)) == "/docker/abc/jobwarden-3"


def test_hierarchy_path_outside_any_cgroup_mount_is_unknown(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path / "proc", "", "0::/\n")
    assert v2_cgroup(tmp_path / "elsewhere").hierarchy_path(str(proc)) is None


def test_the_enclosing_cgroup_prefers_v2_with_an_oom_counter(tmp_path: Path) -> None:
    unified, memory = tmp_path / "unified", tmp_path / "memory"
    v2_cgroup(unified / "ctr", oom_kill=2)
    v1_cgroup(memory / "ctr")
    proc = fake_proc(
        tmp_path / "proc",
        f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw\n"
        f"35 31 0:32 / {memory} rw - cgroup cgroup rw,memory\n",
        "4:memory:/ctr\n0::/ctr\n",
    )
    found = enclosing_cgroup(str(proc))
    assert found == JobCgroup(unified / "ctr", 2)


def test_the_enclosing_cgroup_falls_back_to_v1_memory(tmp_path: Path) -> None:
    # this machine's layout: cgroup2 mounted with no memory controller, v1 memory writable
    unified, memory = tmp_path / "unified", tmp_path / "memory"
    (unified / "ctr").mkdir(parents=True)
    v1_cgroup(memory / "ctr")
    proc = fake_proc(
        tmp_path / "proc",
        f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw\n"
        f"35 31 0:32 / {memory} rw - cgroup cgroup rw,memory\n",
        "4:memory:/ctr\n0::/ctr\n",
    )
    assert enclosing_cgroup(str(proc)) == JobCgroup(memory / "ctr", 1)


def test_no_enclosing_cgroup_without_a_counter(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    unified.mkdir()  # the v2 root cgroup: no memory.events
    proc = fake_proc(tmp_path / "proc", f"41 31 0:38 / {unified} rw - cgroup2 cgroup2 rw\n", "0::/\n")
    assert enclosing_cgroup(str(proc)) is None
    assert enclosing_cgroup(str(tmp_path / "no-proc")) is None
