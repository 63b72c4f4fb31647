"""The kernel log records and the OOM killer's lines in them, from records captured on this machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.probes.kmsg import (
    KernelLog,
    KernelRecord,
    oom_lines,
    parse_oom_line,
    parse_record,
    parse_records,
)

MEMCG = "/process_api/74f3a171fcd0927a827500f0d72302a1/jw-memtest-6757"

# Captured from /dev/kmsg on Linux 6.18 after a 64 MiB cgroup v1 limit killed a Python hog (pid 8152).
CAPTURED = [
    b"4,344,2306292214,-;python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n",
    b"4,350,2306293798,-; oom_kill_process.cold+0x8/0x8a\n",
    b"6,372,2306295628,-;memory: usage 65536kB, limit 65536kB, failcnt 0\n",
    b"6,373,2306295637,-;memory+swap: usage 65536kB, limit 65536kB, failcnt 0\n",
    b"6,420,2306295946,-;[   8152]     0  8152    19319    18085    16640     1445         0   196608"
    b"        0             0 python\n",
    b"6,421,2306295950,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    b"oom_memcg=" + MEMCG.encode() + b",task_memcg=" + MEMCG.encode() + b",task=python,pid=8152,uid=0\n",
    b"3,422,2306295973,-;Memory cgroup out of memory: Killed process 8152 (python) total-vm:77276kB, "
    b"anon-rss:66560kB, file-rss:5780kB, shmem-rss:0kB, UID:0 pgtables:192kB oom_score_adj:0\n",
]
# Written from the format strings of mm/oom_kill.c (dump_oom_summary, __oom_kill_process, oom_reap_task)
# for the cases this machine did not produce: a global OOM, and a command name with spaces and a ')'.
GLOBAL_SUMMARY = (
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,3,global_oom,"
    "task_memcg=/user.slice/user-1000.slice,task=pt_main thread,pid=4242,uid=1000"
)
GLOBAL_KILLED = (
    "Out of memory: Killed process 4242 (pt_main thread) total-vm:9876543kB, anon-rss:8765432kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:20000kB oom_score_adj:0"
)


def test_a_record_is_parsed() -> None:
    record = parse_record(CAPTURED[-1])
    assert record == KernelRecord(
        seq=422, facility=0, level=3, usec=2306295973, message=CAPTURED[-1].decode().split(";", 1)[1].rstrip()
    )


def test_the_dictionary_lines_are_not_part_of_the_message() -> None:
    record = parse_record(b"6,7,100,-;usb 1-1: new device\n SUBSYSTEM=usb\n DEVICE=c189:1\n")
    assert record is not None and record.message == "usb 1-1: new device"


def test_escaped_bytes_are_decoded() -> None:
    record = parse_record(b"6,8,100,-;tab\\x09and \\xc3\\xa9\n")
    assert record is not None and record.message == "tab\tand é"


def test_a_userspace_record_has_its_facility() -> None:
    record = parse_record(b"14,9,100,-;hello from userspace\n")  # LOG_USER (1) << 3 | LOG_INFO (6)
    assert record is not None and (record.facility, record.level) == (1, 6)


@pytest.mark.parametrize("raw", [b"", b"garbage", b"x,y,z;text", b"6,1;too few fields"])
def test_garbage_is_not_a_record(raw: bytes) -> None:
    assert parse_record(raw) is None


def test_a_saved_log_holds_many_records() -> None:
    raw = b"".join(CAPTURED[:2]) + b" SUBSYSTEM=x\n" + b"".join(CAPTURED[2:])
    assert [r.seq for r in parse_records(raw)] == [344, 350, 372, 373, 420, 421, 422]


# --- the OOM lines --------------------------------------------------------------------------------


def test_the_captured_memcg_kill_names_its_victim_twice() -> None:
    lines = oom_lines(parse_records(b"".join(CAPTURED)))
    assert [(line.pid, line.comm, line.memcg) for line in lines] == [
        (8152, "python", MEMCG),  # the oom-kill: summary
        (8152, "python", None),  # "Memory cgroup out of memory: Killed process"
    ]
    assert lines[1].text.startswith("Memory cgroup out of memory: Killed process 8152 (python)")


def test_a_global_oom_summary_with_commas_in_mems_allowed_and_spaces_in_the_name() -> None:
    line = parse_oom_line(GLOBAL_SUMMARY)
    assert line is not None
    assert (line.pid, line.comm, line.memcg) == (4242, "pt_main thread", "/user.slice/user-1000.slice")


def test_a_global_kill_line() -> None:
    line = parse_oom_line(GLOBAL_KILLED)
    assert line is not None and (line.pid, line.comm) == (4242, "pt_main thread")


def test_a_command_name_with_a_parenthesis() -> None:
    line = parse_oom_line("Out of memory: Killed process 77 (a) b) total-vm:1kB, anon-rss:1kB")
    assert line is not None and (line.pid, line.comm) == (77, "a) b")


def test_the_line_of_kernels_before_4_19() -> None:
    line = parse_oom_line("Killed process 5150 (python3) total-vm:1067156kB, anon-rss:301864kB")
    assert line is not None and line.pid == 5150
    line = parse_oom_line("Killed process 5151 (python3)")
    assert line is not None and line.pid == 5151


def test_the_oom_reaper_line() -> None:
    line = parse_oom_line("oom_reaper: reaped process 8152 (python), now anon-rss:0kB, file-rss:0kB")
    assert line is not None and line.pid == 8152


@pytest.mark.parametrize(
    "message",
    [
        "python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        "memory: usage 65536kB, limit 65536kB, failcnt 0",
        "EXT4-fs (vda): mounted filesystem",
        "[   8152]     0  8152    19319    18085 python",
    ],
)
def test_other_lines_name_no_victim(message: str) -> None:
    assert parse_oom_line(message) is None


def test_a_kill_line_written_from_userspace_is_not_believed() -> None:
    forged = parse_records(b"14,500,1,-;Out of memory: Killed process 1 (init) total-vm:1kB\n")
    assert len(forged) == 1 and oom_lines(forged) == []


# --- the reader (the real /dev/kmsg: tests/integration/test_oom_kill.py) ----------------------------


def test_the_reader_resumes_after_a_saved_sequence_number(tmp_path: Path) -> None:
    saved = tmp_path / "kmsg"
    saved.write_bytes(b"".join(CAPTURED))
    log = KernelLog(saved)
    log.open_after(372)
    assert [r.seq for r in log.read_new()] == [373, 420, 421, 422]
    assert log.last_seq == 422
    assert log.read_new() == []
    log.close()


def test_the_reader_opened_at_the_end_sees_only_what_comes_later(tmp_path: Path) -> None:
    saved = tmp_path / "kmsg"
    saved.write_bytes(b"".join(CAPTURED[:3]))
    log = KernelLog(saved)
    log.open_at_end()
    assert (log.last_seq, log.read_new()) == (None, [])  # not read through: the supervisor's start
    with saved.open("ab") as fh:
        fh.write(b"".join(CAPTURED[3:]))
    assert [r.seq for r in log.read_new()] == [373, 420, 421, 422]
    assert log.last_seq == 422
    log.close()


def test_an_unreadable_log_says_why_and_reads_nothing(tmp_path: Path) -> None:
    log = KernelLog(tmp_path / "no-kmsg")
    log.open_at_end()
    assert log.error is not None and "unreadable" in log.error and "no-kmsg" in log.error
    assert log.read_new() == []


def test_a_log_we_may_not_read_names_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*_: object) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("jobwarden.probes.kmsg.os.open", denied)
    log = KernelLog(tmp_path / "kmsg")
    log.open_at_end()
    assert log.fd is None and log.error is not None and "dmesg_restrict" in log.error


def test_a_flood_is_read_a_bounded_amount_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("jobwarden.probes.kmsg._READS_PER_CALL", 1)
    saved = tmp_path / "kmsg"
    saved.write_bytes(b"".join(f"6,{n},{n},-;driver chatter number {n:05d}\n".encode() for n in range(1000)))
    log = KernelLog(saved)
    log.open_after(None)
    first = log.read_new()  # one read: 16 KiB, not the whole 39 KiB
    assert 0 < len(first) < 1000
    rest = log.read_new() + log.read_new()
    assert [r.seq for r in first + rest] == list(range(1000))  # none lost or cut where a read ended
    assert all(r.message.startswith("driver chatter number ") and len(r.message) == 27 for r in first + rest)
