"""Read /proc from an injectable root, so parsers are tested against captured files.

Errors are translated here, once: a vanished pid becomes `ProcessGone`, a permission error `AccessDenied`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from jobwarden.errors import AccessDenied, ProcessGone


class ProcStat(NamedTuple):
    """The fields of /proc/PID/stat jobwarden uses (proc(5) numbering in comments)."""

    pid: int
    comm: str
    state: str  # (3) R S D Z T t X I
    ppid: int  # (4)
    pgid: int  # (5)
    sid: int  # (6)
    utime: int  # (14) clock ticks
    stime: int  # (15)
    start_time: int  # (22) clock ticks after boot: with pid, the process identity
    rss_pages: int  # (24)
    exit_code: int  # (52) wait status, meaningful while a zombie (kernel >= 3.5)
    processor: int = -1  # (39) the CPU it last ran on

    @property
    def cpu_ticks(self) -> int:
        return self.utime + self.stime


def parse_stat(text: str) -> ProcStat:
    """Parse one stat line. `comm` may contain spaces and ')', so split after the *last* ')'."""
    head, _, tail = text.rpartition(")")
    pid_text, _, comm = head.partition(" (")
    f = tail.split()
    # f[0] is field 3 (state); field N is f[N - 3]
    return ProcStat(
        pid=int(pid_text),
        comm=comm,
        state=f[0],
        ppid=int(f[1]),
        pgid=int(f[2]),
        sid=int(f[3]),
        utime=int(f[11]),
        stime=int(f[12]),
        start_time=int(f[19]),
        rss_pages=int(f[21]),
        exit_code=int(f[49]) if len(f) > 49 else 0,
        processor=int(f[36]) if len(f) > 36 else -1,
    )


class SchedStat(NamedTuple):
    """/proc/PID/schedstat (kernel Documentation/scheduler/sched-stats.rst): time on a CPU, time runnable
    but waiting on a run queue, and how many times it was put on a CPU. The run delay counts both a
    cgroup quota's throttling and other processes' use of the CPUs (measured: research/slowness.md 5.4)."""

    exec_ns: int
    run_delay_ns: int
    timeslices: int


def parse_schedstat(text: str) -> SchedStat:
    """'109292 46900 1'; a kernel without schedstats leaves the file out (ProcessGone) or empty."""
    fields = text.split()
    if len(fields) < 3:
        raise ValueError(f"not a schedstat line: {text[:40]!r}")
    return SchedStat(int(fields[0]), int(fields[1]), int(fields[2]))


class TaskCounters(NamedTuple):
    """One thread's counters the gil-bound rule needs: CPU and run delay (schedstat), and how often it
    gave up its CPU of its own accord (status: voluntary_ctxt_switches; a thread waiting on the GIL sleeps
    on it, a thread computing in native code is only ever preempted)."""

    exec_ns: int
    run_delay_ns: int
    voluntary_switches: int


def parse_voluntary_switches(text: str) -> int:
    """voluntary_ctxt_switches of a /proc/PID/status; ValueError where it is missing or not a number."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "voluntary_ctxt_switches":
            value = value.strip()
            if not (value.isascii() and value.isdigit()):
                break
            return int(value)
    raise ValueError("no voluntary_ctxt_switches line")


class StatCounters(NamedTuple):
    """The counters of a stat line the speed rules read (proc(5) numbering), beyond ProcStat's."""

    majflt: int  # (12) major faults: pages read back from storage
    num_threads: int  # (20)
    processor: int  # (39) the CPU it last ran on


def parse_stat_counters(text: str) -> StatCounters:
    f = text.rpartition(")")[2].split()
    return StatCounters(majflt=int(f[9]), num_threads=int(f[17]), processor=int(f[36]) if len(f) > 36 else -1)


class Pressure(NamedTuple):
    """One PSI file (/proc/pressure/*, a v2 cgroup's *.pressure): the total microseconds some (and, where
    the kernel keeps it, all) of the tasks stalled on the resource. docs.kernel.org/accounting/psi.html"""

    some_us: int
    full_us: int | None


def parse_pressure(text: str) -> Pressure:
    """'some avg10=0.00 avg60=0.00 avg300=0.00 total=123' and an optional 'full ...' line."""
    totals: dict[str, int] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for field in rest.split():
            name, _, value = field.partition("=")
            if name == "total" and value.isascii() and value.isdigit():
                totals[kind] = int(value)
    if "some" not in totals:
        raise ValueError(f"not a pressure file: {text[:40]!r}")
    return Pressure(totals["some"], totals.get("full"))


class ProcIO(NamedTuple):
    """Storage I/O of a process so far (/proc/PID/io): bytes it made the kernel fetch from, or send to,
    the storage layer. A write counts when it dirties the page cache, before the disk sees it."""

    read_bytes: int
    write_bytes: int


class SignalMasks(NamedTuple):
    """How a process treats each signal, from /proc/PID/status: bit (signum - 1) of each mask."""

    blocked: int  # SigBlk: the main thread's mask
    ignored: int  # SigIgn
    caught: int  # SigCgt: a handler is installed

    def catches(self, sig: int) -> bool:
        return bool(self.caught >> (sig - 1) & 1)

    def blocks(self, sig: int) -> bool:
        return bool(self.blocked >> (sig - 1) & 1)


def parse_signal_masks(text: str) -> SignalMasks:
    """The SigBlk, SigIgn and SigCgt lines of /proc/PID/status (hexadecimal); a missing line reads 0."""
    masks = {"SigBlk": 0, "SigIgn": 0, "SigCgt": 0}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in masks:
            masks[name] = int(value.strip() or "0", 16)
    return SignalMasks(masks["SigBlk"], masks["SigIgn"], masks["SigCgt"])


def parse_io(raw: bytes) -> ProcIO:
    """Parse /proc/PID/io ("read_bytes: N" lines; a field the kernel lacks counts 0)."""
    fields = dict(line.split(b": ", 1) for line in raw.splitlines() if b": " in line)
    return ProcIO(int(fields.get(b"read_bytes", 0)), int(fields.get(b"write_bytes", 0)))


RUNNING = -1  # main_thread_syscall: the thread is on a CPU, in no call


class ProcFS:
    """A view of one /proc tree (the real one by default)."""

    def __init__(self, root: str | Path = "/proc") -> None:
        self.root = Path(root)
        self.page_size = os.sysconf("SC_PAGE_SIZE")
        self.ticks_per_s = os.sysconf("SC_CLK_TCK")

    def pids(self) -> list[int]:
        return [int(name) for name in os.listdir(self.root) if name.isdigit()]

    def _read(self, pid: int, name: str, what: str) -> bytes:
        try:
            with open(self.root / str(pid) / name, "rb") as fh:
                return fh.read()
        except (FileNotFoundError, ProcessLookupError) as err:
            raise ProcessGone(pid) from err
        except PermissionError as err:
            raise AccessDenied(pid, what, "it belongs to another user; run as that user or root") from err
        except OSError as err:  # ESRCH from a process exiting mid-read
            raise ProcessGone(pid) from err

    def stat(self, pid: int) -> ProcStat:
        text = self._read(pid, "stat", "read the status of").decode("utf-8", "replace")
        if not text:
            raise ProcessGone(pid)
        return parse_stat(text)

    def cmdline(self, pid: int) -> str:
        """The command line, arguments joined by spaces; '[comm]' for kernel threads and zombies."""
        try:
            raw = self._read(pid, "cmdline", "read the command line of")
        except AccessDenied:
            raw = b""
        if not raw:
            return f"[{self.stat(pid).comm}]"
        return " ".join(a.decode("utf-8", "replace") for a in raw.rstrip(b"\0").split(b"\0"))

    def environ_has(self, pid: int, markers: dict[str, str]) -> bool:
        """True if the process was started with every KEY=VALUE of `markers`. Never returns the environment
        itself: it often holds secrets. Other users' processes raise AccessDenied."""
        raw = self._read(pid, "environ", "read the environment of")
        entries = set(raw.split(b"\0"))
        return all(f"{k}={v}".encode() in entries for k, v in markers.items())

    def pss_bytes(self, pid: int) -> int | None:
        """Proportional set size from /proc/PID/smaps_rollup (Linux >= 4.14): pages shared by n processes
        count 1/n each, so summing it over a tree counts a fork's copy-on-write pages once. Costly (the
        kernel walks the page tables): ~2-4 ms a process here, against ~25 µs for `stat`. None when the
        kernel has no smaps_rollup."""
        try:
            raw = self._read(pid, "smaps_rollup", "read the memory map of")
        except ProcessGone:
            if (self.root / str(pid)).is_dir():
                return None  # alive, but no smaps_rollup on this kernel
            raise
        at = raw.find(b"\nPss:")
        if at < 0:
            return None
        return int(raw[at + 5 : raw.index(b"kB", at)]) * 1024

    def environ_values(self, pid: int, names: tuple[str, ...]) -> dict[str, str]:
        """The values of the named variables the process was started with (those it has), and nothing else
        of its environment: it often holds secrets. Other users' processes raise AccessDenied."""
        wanted = {name.encode() for name in names}
        raw = self._read(pid, "environ", "read the environment of")
        found = {}
        for entry in raw.split(b"\0"):
            key, sep, value = entry.partition(b"=")
            if sep and key in wanted:
                found[key.decode()] = value.decode("utf-8", "replace")
        return found

    def has_open_file(self, pid: int, prefix: str) -> bool:
        """Does `pid` hold open a file whose path starts with `prefix` (e.g. '/dev/nvidia')? Reading
        another user's descriptors raises AccessDenied."""
        fd_dir = self.root / str(pid) / "fd"
        try:
            names = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError) as err:
            raise ProcessGone(pid) from err
        except PermissionError as err:
            raise AccessDenied(pid, "list the open files of") from err
        for name in names:
            try:
                if os.readlink(fd_dir / name).startswith(prefix):
                    return True
            except OSError:  # closed meanwhile
                continue
        return False

    def uid(self, pid: int) -> int:
        try:
            return os.stat(self.root / str(pid)).st_uid
        except FileNotFoundError as err:
            raise ProcessGone(pid) from err

    def wchan(self, pid: int) -> str:
        try:
            return self._read(pid, "wchan", "read the wait channel of").decode() or "0"
        except AccessDenied:
            return "?"

    def main_thread_syscall(self, pid: int) -> int | None:
        """The system call the main thread is blocked in (/proc/PID/task/PID/syscall's first field, the
        x86-64 or arm64 number); RUNNING while it runs (the file says "running": it woke since its
        stat line was read); None when it is blocked outside any call ("-1") or the file is refused (it
        needs ptrace access: the shim is the job's ancestor, allowed under Yama's scope 1)."""
        try:
            text = self._read(pid, f"task/{pid}/syscall", "read the system call of")
        except AccessDenied:
            return None
        head = text.split(b" ", 1)[0].strip()
        if head == b"running":
            return RUNNING
        return int(head) if head.isdigit() else None

    def task_stats(self, pid: int) -> list[ProcStat]:
        """/proc/PID/task/*/stat of every thread of `pid` (a process's own state is only its main
        thread's); threads that end while being read are left out."""
        try:
            tids = os.listdir(self.root / str(pid) / "task")
        except FileNotFoundError as err:
            raise ProcessGone(pid) from err
        stats = []
        for tid in tids:
            try:
                with open(self.root / str(pid) / "task" / tid / "stat") as fh:
                    stats.append(parse_stat(fh.read()))
            except (FileNotFoundError, ProcessLookupError):
                continue
        return stats

    def task_counters(self, pid: int) -> dict[int, TaskCounters]:
        """Each thread's CPU, run delay and voluntary sleeps so far (/proc/PID/task/TID/schedstat and
        status: the process's own files are its main thread's alone), by thread id. Threads that end while
        being read, or a kernel without schedstats, leave theirs out. Two files a thread: the shim asks
        only for a few busy processes."""
        try:
            tids = os.listdir(self.root / str(pid) / "task")
        except FileNotFoundError as err:
            raise ProcessGone(pid) from err
        found: dict[int, TaskCounters] = {}
        for tid in tids:
            task = self.root / str(pid) / "task" / tid
            try:
                with open(task / "schedstat") as fh:
                    sched = parse_schedstat(fh.read())
                with open(task / "status", "rb") as fh:
                    sleeps = parse_voluntary_switches(fh.read().decode("ascii", "replace"))
                found[int(tid)] = TaskCounters(sched.exec_ns, sched.run_delay_ns, sleeps)
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
        return found

    def threads_in_state(self, pid: int, states: str) -> list[int]:
        """Thread ids of `pid` whose state is one of `states` (e.g. 'D' before a blocking stack dump)."""
        return [t.pid for t in self.task_stats(pid) if t.state in states]

    def thread_states(self, pid: int) -> list[str]:
        """The state of every thread of `pid`."""
        return [t.state for t in self.task_stats(pid)]

    def io_chars(self, pid: int) -> int | None:
        """Bytes passed through read/write syscalls so far (rchar + wchar of /proc/PID/io): storage,
        pipes and sockets alike. None where the kernel hides it (another user's process)."""
        try:
            text = self._read(pid, "io", "read the I/O counters of").decode()
        except AccessDenied:
            return None
        fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        return int(fields.get("rchar", 0)) + int(fields.get("wchar", 0))

    def io(self, pid: int) -> ProcIO | None:
        """The process's storage I/O; None where the kernel hides it (another user's process: EACCES).
        Read by the shim every second for every busy process: one os.read, no buffered file."""
        try:
            fd = os.open(self.root / str(pid) / "io", os.O_RDONLY | os.O_CLOEXEC)
        except PermissionError:
            return None
        except OSError as err:
            raise ProcessGone(pid) from err
        try:
            return parse_io(os.read(fd, 4096))
        except PermissionError:  # the io file checks access on read, not only on open
            return None
        except OSError as err:  # ESRCH: it exited between open and read
            raise ProcessGone(pid) from err
        finally:
            os.close(fd)

    def schedstat(self, pid: int) -> SchedStat | None:
        """CPU time and run-queue wait so far; None on a kernel without schedstats. One os.read: the shim
        reads it for every member every few seconds."""
        try:
            fd = os.open(self.root / str(pid) / "schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if (self.root / str(pid)).exists():
                return None
            raise ProcessGone(pid) from None
        except OSError as err:
            raise ProcessGone(pid) from err
        try:
            return parse_schedstat(os.read(fd, 256).decode("ascii", "replace"))
        except ValueError:
            return None
        except OSError as err:
            raise ProcessGone(pid) from err
        finally:
            os.close(fd)

    def pressure(self, resource: str) -> Pressure | None:
        """The machine's pressure on `resource` (cpu, io, memory); None where the kernel keeps no PSI."""
        try:
            with open(self.root / "pressure" / resource, "rb") as fh:
                return parse_pressure(fh.read(512).decode("ascii", "replace"))
        except (OSError, ValueError):
            return None

    def affinity(self, pid: int) -> frozenset[int]:
        """The CPUs the process may run on (sched_getaffinity: taskset, a cpuset, Slurm's binding)."""
        try:
            return frozenset(os.sched_getaffinity(pid))
        except OSError as err:
            raise ProcessGone(pid) from err

    def maps_any(self, pid: int, needles: tuple[bytes, ...]) -> bool:
        """Whether a mapped file's path holds one of `needles` (a CUDA library: b"libcuda")."""
        raw = self._read(pid, "maps", "read the memory map of")
        return any(n in raw for n in needles)

    def signal_masks(self, pid: int) -> SignalMasks:
        return parse_signal_masks(self._read(pid, "status", "read the status of").decode("utf-8", "replace"))

    def program(self, pid: int) -> tuple[int, int] | None:
        """(device, inode) of the file the process executes: exec() changes it, a renamed or deleted file
        does not (stat follows the /proc link to the inode itself). None when the kernel does not let us
        see it (another user's process)."""
        try:
            st = os.stat(self.root / str(pid) / "exe")
        except (FileNotFoundError, ProcessLookupError) as err:
            raise ProcessGone(pid) from err
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def open_file(self, pid: int, fd: int) -> tuple[int, int] | None:
        """(device, inode) of what descriptor `fd` of the process refers to now; None when it is closed
        or hidden from us."""
        try:
            st = os.stat(self.root / str(pid) / "fd" / str(fd))
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def exe_name(self, pid: int) -> str | None:
        """The file name the process executes ('python3.11'), None when unreadable."""
        try:
            return os.path.basename(os.readlink(self.root / str(pid) / "exe"))
        except FileNotFoundError as err:
            raise ProcessGone(pid) from err
        except OSError:
            return None

    def iter_stats(self) -> Iterator[ProcStat]:
        for pid in self.pids():
            try:
                yield self.stat(pid)
            except (ProcessGone, AccessDenied):
                continue

    def boot_time(self) -> float:
        with open(self.root / "stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
        raise OSError("no btime in /proc/stat")

    def wall_time_of(self, start_ticks: int) -> float:
        """A process's start (its stat's start_time, in clock ticks since boot) as seconds since the epoch:
        to a tick, after a boot time /proc/stat gives to the second. OSError without a boot time."""
        return self.boot_time() + start_ticks / self.ticks_per_s

    def boot_id(self) -> str | None:
        """This boot's random id (a new one at every boot): a run recorded under another one was ended by
        a reboot, whatever its pids are now (they count from 1 again). None where it cannot be read."""
        try:
            with open(self.root / "sys" / "kernel" / "random" / "boot_id", "rb") as fh:
                text = fh.read(64).decode("ascii", "replace").strip()
        except OSError:
            return None
        return text or None

    def identity_matches(self, pid: int, start_time: int) -> bool:
        """Is `pid` still the process that started at `start_time` (and not a zombie or a reused pid)?"""
        try:
            st = self.stat(pid)
        except (ProcessGone, AccessDenied):
            return False
        return st.start_time == start_time and st.state not in ("Z", "X")


def why_still_alive(procfs: ProcFS, pid: int) -> str:
    """Why a process survived SIGKILL, in words for the user: a process in D state dies only when its
    I/O completes (the kernel queues the signal until then)."""
    try:
        st = procfs.stat(pid)
    except (ProcessGone, AccessDenied):
        return "exited while being reported"
    if st.state == "D":
        return (
            f"in uninterruptible sleep (D state, waiting in {procfs.wchan(pid)}): it ends when its I/O "
            "completes; check the storage or device it uses"
        )
    return f"still alive after SIGKILL (state {st.state})"
