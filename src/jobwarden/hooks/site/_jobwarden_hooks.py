"""jobwarden's hooks for every Python process of a job, loaded without any change to the job's code.

jobwarden puts this directory first on PYTHONPATH; `site` imports its `sitecustomize`, which loads this module
and calls `main`. In a process of a job (JOBWARDEN_PY_DIR set) it:

- registers faulthandler on JOBWARDEN_FAULT_SIGNAL, dumping every thread to a memfd the shim reads as
  /proc/PID/fd/N (`<py_dir>/<pid>.stacks` where memfd_create is refused): a stack even when the process is
  deadlocked in C, with no ptrace;
- declares the shim as allowed tracer (prctl PR_SET_PTRACER) so py-spy, a child of the shim, may attach under
  Yama ptrace_scope=1;
- advertises the above in `<py_dir>/<pid>.json`, with the interpreter's file, so the shim only sends the
  signal (whose default action is to terminate) to a process that still runs this interpreter and handles it
  (announced on the FIFO below, which the shim writes to the file: no file to create in a forked child);
- records fork() made while other threads run in `<py_dir>/<pid>.forks.jsonl` (the classic deadlock): the
  first forks of each call site in full, then a count; the child names its fork in its own advert and
  re-does all of the above for itself, since none of it is inherited as it should be;
- announces the process to its shim on the FIFO `<py_dir>/events.fifo` as it starts and right after each
  fork() (`born PID START PPID RANK`), so the shim holds it by pidfd at once, and reports the wait status
  of every child it reaps (`reaped REAPER PID STATUS UNIXTIME`): a worker that lived 5 ms is still named;
- records its first uncaught exception in `<py_dir>/<pid>.exc.json` (when, what, the frames), and writes
  torchrun's per-rank TORCHELASTIC_ERROR_FILE the way `@record` would, so the agent's report has it;
- records the exceptions it formats without dying of them in `<py_dir>/<pid>.caught.jsonl` (the first
  CAUGHT_RECORDS): a worker that catches its task's exception and sends the formatted traceback to its
  parent (a pool, a DataLoader, torch.multiprocessing.spawn) is named as the process that raised it;
- records where it asks multiprocessing for the "fork" start method explicitly (get_context("fork"),
  set_start_method("fork")) in `<py_dir>/<pid>.start-method.jsonl`: --mp-start cannot change those;
- applies JOBWARDEN_MP_START as multiprocessing's default start method, when multiprocessing is imported;
- once the process has joined a torch.distributed process group (init_process_group returned) with PyTorch's
  flight recorder on, starts one thread that sleeps in read() on the FIFO `<py_dir>/<pid>.fr.req` and, for
  each request the shim writes there on a hang, writes the recorder's last entries to `<pid>.fr.json`: the
  main thread then sits in C++ inside the collective, where no signal handler of Python's would run;
- appends a fallback `jobwarden` package (only `heartbeat`) to the end of sys.path.

Then, job or not, it runs the `sitecustomize` that jobwarden's shadows (a venv's, a distribution's), as `site`
would have.

It runs inside the job's interpreter, any CPython 3.8-3.14: standard library only, 3.8 syntax, and it must
never break the job: every hook swallows its failures (one line on stderr at most). Every Python process of
the job runs it, so it is kept cheap: no json, re, threading or multiprocessing import here.
"""

from __future__ import annotations

import _thread  # built in, like time: the fork hooks must not import anything inside fork()
import errno  # built in
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: typing costs every start-up a few milliseconds on 3.8
    import resource
    from collections.abc import Callable, Mapping
    from importlib.machinery import ModuleSpec, PathFinder
    from types import CodeType, FrameType, ModuleType
    from typing import Any

PY_DIR_ENV = "JOBWARDEN_PY_DIR"
FAULT_SIGNAL_ENV = "JOBWARDEN_FAULT_SIGNAL"
SHIM_PID_ENV = "JOBWARDEN_SHIM_PID"
MP_START_ENV = "JOBWARDEN_MP_START"
DEBUG_ENV = "JOBWARDEN_HOOKS_DEBUG"
MP_START_METHODS = ("spawn", "forkserver")

FRAMES_PER_THREAD = 50  # the before-fork hook runs inside fork(): keep its work bounded
MAX_THREADS = 100  # faulthandler's own limit
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
PR_SET_PTRACER = 0x59616D61  # "Yama", include/uapi/linux/prctl.h


class _Job:
    """What the job's environment asked for, read once at start-up (the job may edit os.environ later)."""

    def __init__(self, py_dir: str, fault_signal: int, shim_pid: int, mp_start: str | None) -> None:
        self.py_dir = py_dir
        self.fault_signal = fault_signal
        self.shim_pid = shim_pid
        self.mp_start = mp_start
        self.stacks_fd: int | None = None
        self.stacks_id: tuple[int, int] | None = None  # (st_dev, st_ino) of stacks_fd's file: still ours?
        self.libc: object = None  # ctypes' libc, loaded only where Yama makes the prctl matter
        self.yama: bytes | None = None  # the Yama ptrace scope, read once (fork does not change it)
        self.program: list[int] | None = None  # (device, inode) of the interpreter (fork keeps it)
        # forking thread -> (at, parent pid, site, forks at that site) of a fork made beside other threads
        # per forking thread: when, the parent, its site and count, and the line its child writes for it
        self.forks: dict[int, tuple[float, int, int, int, dict[str, object] | None]] = {}
        self.fork_counts: dict[tuple[int, ...], list[int]] = {}  # fork site -> [site number, forks there]
        self.warned = False
        self.events_fd = -1  # the shim's FIFO, opened on first use; -2: it cannot be opened
        self.events_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the FIFO events_fd was
        self.advert: dict[str, object] = {}  # this process's advert as last written
        self.fault_taken = ""  # why the fault signal is no longer ours (the job set it): never re-taken
        self.pid = os.getpid()  # os.getpid() is a syscall: this process's pid, set again after fork
        self.reaped: list[str] = []  # `reaped` lines of clean exits not written yet
        self.reaped_since = 0.0  # monotonic time of the oldest of them
        self.flush_registered = False  # atexit writes what is left
        self.exception_seen = False
        self.caught = 0  # exceptions recorded as formatted by this process (CAUGHT_RECORDS at most)
        self.recording = False  # inside a record: an exception formatted meanwhile is ours, not the job's
        self.fork_sites: set[str] = set()  # explicit "fork" requests recorded, by call site
        self.error_file_owner = 0  # the pid torchrun started with TORCHELASTIC_ERROR_FILE: the rank
        # the flight recorder's thread (its ident: not a thread of the job's, for the fork records), the
        # FIFO it reads and that FIFO's (st_dev, st_ino); none of it exists in a forked child
        self.recorder_thread: int | None = None
        self.recorder_fd = -1
        self.recorder_fd_id: tuple[int, int] | None = None

    def path(self, pid: int, suffix: str) -> str:
        return os.path.join(self.py_dir, f"{pid}{suffix}")


_job: _Job | None = None


def job_from_env(environ: Mapping[str, str]) -> _Job | None:
    py_dir = environ.get(PY_DIR_ENV)
    if not py_dir:
        return None
    mp_start = environ.get(MP_START_ENV) or None
    return _Job(
        os.path.abspath(py_dir),
        _int(environ.get(FAULT_SIGNAL_ENV)),
        _int(environ.get(SHIM_PID_ENV)),
        mp_start if mp_start in MP_START_METHODS else None,
    )


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _report(job: _Job | None, what: str, err: BaseException) -> None:
    """One line on stderr per process at most (the full traceback with JOBWARDEN_HOOKS_DEBUG=1)."""
    try:
        if os.environ.get(DEBUG_ENV):
            import traceback

            traceback.print_exception(type(err), err, err.__traceback__)
        elif job is None or not job.warned:
            sys.stderr.write(f"jobwarden: python hook {what} failed: {err}\n")
        if job is not None:
            job.warned = True
    except Exception:
        pass


# --- JSON without importing json (it imports re: milliseconds on every start-up) ----------------------

_ESCAPES: dict[int, str] = {i: f"\\u{i:04x}" for i in range(32)}
_ESCAPES.update({ord('"'): '\\"', ord("\\"): "\\\\"})


def _json_str(text: str) -> str:
    text = text.translate(_ESCAPES)
    if not text.isascii():  # escape as \\uXXXX like json.dumps: file names may hold lone surrogates
        text = "".join(c if ord(c) < 128 else _u_escape(ord(c)) for c in text)
    return '"' + text + '"'


def _u_escape(n: int) -> str:
    if n > 0xFFFF:
        n -= 0x10000
        return f"\\u{0xD800 | (n >> 10):04x}\\u{0xDC00 | (n & 0x3FF):04x}"
    return f"\\u{n:04x}"


def dumps(obj: object) -> str:
    """JSON for the plain values the hooks write (None, bool, int, float, str, list, tuple, dict)."""
    if obj is None:
        return "null"
    if obj is True or obj is False:
        return "true" if obj else "false"
    if isinstance(obj, int):
        return str(int(obj))
    if isinstance(obj, float):
        return repr(obj) if obj == obj and obj not in (float("inf"), float("-inf")) else "null"
    if isinstance(obj, dict):
        return "{" + ",".join(_json_str(str(k)) + ":" + dumps(v) for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    return _json_str(str(obj))


# --- files ------------------------------------------------------------------------------------------


def _write_atomic(path: str, text: str) -> None:
    """Readers see the old file or the new one, never half of one."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _append(path: str, line: str) -> None:
    """One write() on an O_APPEND file: lines from several processes do not interleave."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _start_time() -> int:
    """Field 22 of /proc/self/stat: with the pid, the identity of this process (pids are reused). Three
    syscalls, not the nine of open()'s buffered file: every forked child reads it."""
    fd = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int(os.read(fd, 4096).rpartition(b")")[2].split()[19])
    finally:
        os.close(fd)


def file_id(fd: int) -> tuple[int, int] | None:
    """(st_dev, st_ino) of what `fd` refers to now, None if it is closed. The hooks keep two descriptors
    by number; a job that closes every descriptor (a daemonizer's os.closerange) and opens its own files
    gets those numbers back: before writing to or closing one, the hooks check it is still their file."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


# --- telling the shim: births and reaped children ----------------------------------------------------

EVENTS_FIFO = "events.fifo"
PIPE_BUF = 4096  # Linux: a write of at most this much to a pipe is atomic, all of it or nothing


def _announce(job: _Job, line: str) -> bool:
    """One line to the shim, in one write() (atomic below PIPE_BUF across processes), never blocking.
    True once the FIFO holds it.

    The FIFO is opened O_RDWR: this process is then a reader too, so a write can never meet a FIFO
    without reader, whose SIGPIPE would kill a job that set SIGPIPE to SIG_DFL once its shim is gone.
    With the shim gone the buffer fills and writes fail with EAGAIN: dropped, silently."""
    data = line.encode()
    if job.events_fd == -2 or len(data) > PIPE_BUF:
        return False
    try:
        if job.events_fd >= 0 and file_id(job.events_fd) != job.events_id:
            job.events_fd = -1  # closed behind our back (os.closerange): the number may be the job's now
        if job.events_fd < 0:
            path = os.path.join(job.py_dir, EVENTS_FIFO)
            job.events_fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
            job.events_id = file_id(job.events_fd)
        os.write(job.events_fd, data)
        return True
    except OSError as err:
        if job.events_fd < 0 or err.errno not in (errno.EAGAIN, errno.EPIPE):  # full: try again next time
            job.events_fd = -2  # no FIFO (hooks outside a shim's run): stop trying
        return False


# model.GLOBAL_RANK_VARIABLES, in the same order: the first one set is the process's global rank
_GLOBAL_RANKS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def _digits(text: str | None) -> bool:
    return bool(text) and text.isascii() and text.isdigit()  # type: ignore[union-attr]


def rank_of(environ: Mapping[str, str]) -> str:
    """The process's global rank as model.ranks_from reads it from the launchers' variables, or "-"."""
    for name in _GLOBAL_RANKS:
        value = environ.get(name)
        if _digits(value):
            return str(int(value))  # type: ignore[arg-type]
    local = environ.get("LOCAL_RANK")
    if not _digits(local):
        return "-"
    node = environ.get("GROUP_RANK")
    if not _digits(node):
        node = environ.get("NODE_RANK")
    if not _digits(node) or int(node) == 0:  # type: ignore[arg-type]
        return str(int(local))  # type: ignore[arg-type]
    per_node = environ.get("LOCAL_WORLD_SIZE")
    if _digits(per_node) and int(per_node):  # type: ignore[arg-type]
        return str(int(node) * int(per_node) + int(local))  # type: ignore[arg-type]
    return "-"


def _rank() -> str:
    return rank_of(os.environ)


def _record_rank() -> int | None:
    """The rank a record names: the launcher's variables; else the torch.distributed group this process
    joined (torch.multiprocessing.spawn and a script that passes rank= set no variable: a spawned process
    that raised and was torn down before its parent re-raised anything is named by nothing else). Never
    imports torch; only asked on the way to a record, never per step."""
    rank = _rank()
    if rank != "-":
        return int(rank)
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # a half-torn-down group: the record goes without its rank
        pass
    return None


def birth_line(pid: int, start_time: int) -> str:
    return f"born {pid} {start_time} {os.getppid()} {_rank()}\n"


# A clean exit's line waits for company: with busy threads every syscall that releases the GIL costs the
# reaping thread up to threads x 5 ms to get it back, and a fork loop reaps once per fork. A death by a
# signal or with an exit code goes at once, with what waits; the shim has the others' statuses from its
# pidfds meanwhile, and a late line still fills in one it lacked.
REAPED_BATCH = 64  # lines of ~45 bytes: one write stays below PIPE_BUF (4096), atomic
REAPED_WAIT_S = 5.0


def _reaped(pid: int, status: int) -> None:
    """A child of this process ended and was reaped here: after this, nothing but this line knows how."""
    job = _job
    if job is None or pid <= 0 or not (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
        return
    try:
        line = f"reaped {job.pid} {pid} {status} {time.time():.6f}\n"
        if status != 0:
            _flush_reaped(job, line)
            return
        now = time.monotonic()
        if not job.reaped:
            job.reaped_since = now
            _flush_at_exit(job)
        job.reaped.append(line)
        if len(job.reaped) >= REAPED_BATCH or now - job.reaped_since >= REAPED_WAIT_S:
            _flush_reaped(job)
    except Exception:  # a report must never change what the wait returns
        pass


def _flush_reaped(job: _Job, line: str = "") -> None:
    waiting, job.reaped = job.reaped, []
    _announce(job, "".join(waiting) + line)


def _flush_at_exit(job: _Job) -> None:
    if job.flush_registered:
        return
    job.flush_registered = True
    import atexit  # built in

    atexit.register(_flush_left)


def _flush_left() -> None:
    job = _job
    if job is not None and job.reaped:
        try:  # noqa: SIM105 - importing contextlib would cost every Python start of the job
            _flush_reaped(job)
        except Exception:
            pass


def status_of_waitid(result: object) -> int | None:
    """waitid()'s siginfo as the status waitpid() would have returned: exit code << 8, or the signal
    (| 0x80 for a core dump); None for anything that is not a death."""
    code = getattr(result, "si_code", None)
    status = getattr(result, "si_status", 0)
    if code == os.CLD_EXITED:
        return (status & 0xFF) << 8
    if code == os.CLD_KILLED:
        return status & 0x7F
    if code == os.CLD_DUMPED:
        return (status & 0x7F) | 0x80
    return None


def _wrap_waits() -> None:
    """Report every child reaped through os.wait*: multiprocessing (Popen.poll), subprocess, loky and
    concurrent.futures all reap with these. Installed before the job's code runs: subprocess binds
    os.waitpid as a default argument when it is first imported."""
    waitpid, wait, wait3, wait4 = os.waitpid, os.wait, os.wait3, os.wait4
    waitid = os.waitid if hasattr(os, "waitid") else None

    def waitpid_reported(pid: int, options: int) -> tuple[int, int]:
        result = waitpid(pid, options)
        _reaped(*result)
        return result

    def wait_reported() -> tuple[int, int]:
        result = wait()
        _reaped(*result)
        return result

    def wait3_reported(options: int) -> tuple[int, int, resource.struct_rusage]:
        result = wait3(options)
        _reaped(result[0], result[1])
        return result

    def wait4_reported(pid: int, options: int) -> tuple[int, int, resource.struct_rusage]:
        result = wait4(pid, options)
        _reaped(result[0], result[1])
        return result

    os.waitpid, os.wait, os.wait3, os.wait4 = waitpid_reported, wait_reported, wait3_reported, wait4_reported
    if waitid is not None:

        def waitid_reported(idtype: int, ident: int, options: int) -> os.waitid_result | None:
            result = waitid(idtype, ident, options)
            status = status_of_waitid(result) if result is not None else None
            # WNOWAIT leaves the child to be reaped later, by a call that reports it then
            if status is not None and not options & getattr(os, "WNOWAIT", 0):
                _reaped(int(getattr(result, "si_pid", 0)), status)
            return result

        os.waitid = waitid_reported


# --- parts loaded when first needed ----------------------------------------------------------------
#
# Every process of the job loads this module as it starts; what only some processes need is in parts
# (_jobwarden_<part>.py beside this file), run in this module's own namespace the first time it is needed.
# Loading the hooks' code is most of their start-up cost: 0.35 ms of unmarshalling for 95 KB of code, plus
# running it, in a fresh interpreter.

PARTS = ("exceptions", "progress", "torch")
_code_of: Callable[[str, str], CodeType] | None = None  # sitecustomize's cached compilation, in a job
_loaded: set[str] = set()


def load_part(name: str) -> dict[str, Any]:
    """This module's namespace, with the part `name` run in it (once)."""
    space = globals()
    if name not in _loaded:
        source = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"_jobwarden_{name}.py")
        job = _job
        if _code_of is not None and job is not None:
            code = _code_of(source, os.path.join(job.py_dir, ".cache"))
        else:  # imported by a test or a tool: no py dir to cache in
            with open(source, "rb") as fh:
                code = compile(fh.read(), source, "exec", dont_inherit=True)
        doc = space.get("__doc__")
        exec(code, space)
        space["__doc__"] = doc  # the part's docstring was run as `__doc__ = ...`
        _loaded.add(name)
    return space


def _in_part(part: str, name: str) -> Callable[..., Any]:
    """The function `name` of `part`, which loads the part at its first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return load_part(part)[name](*args, **kwargs)

    return call


def __getattr__(name: str) -> Any:
    """A name from a part not loaded yet (a test, a tool): every part is loaded, then asked. Never
    anything but AttributeError: the job's own code may ask (pickle looks a name up in every module)."""
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        for part in PARTS:
            load_part(part)
        return globals()[name]
    except Exception:
        raise AttributeError(name) from None


# --- the first uncaught exception (recorded by the `exceptions` part) -------------------------------

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def _install_excepthook(job: _Job) -> None:
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: object) -> None:
        try:
            load_part("exceptions")["_record_exception"](job, exc)
        except Exception as err:
            _report(job, "exception record", err)
        previous(kind, exc, tb)  # type: ignore[arg-type]

    sys.excepthook = excepthook


# --- the hooks --------------------------------------------------------------------------------------


def install_fault_handler(job: _Job, pid: int) -> str:
    """Dump every thread to `<pid>.stacks` on the fault signal; the file's path, or '' if not installed.

    faulthandler's handler is C code that needs neither the GIL nor the main thread, so it answers even when
    the process is deadlocked in C. chain=False: the signal was chosen for us alone. Once the job has set
    the signal itself (`fault_taken`), a forked child keeps the job's handler: it is never taken back."""
    if job.fault_signal <= 0 or job.fault_taken:
        return ""
    import faulthandler  # built in: no file to load

    fd = -1
    try:
        fd, path = _stacks_file(job, pid)
        faulthandler.register(job.fault_signal, file=fd, all_threads=True, chain=False)
    except Exception:
        faulthandler.unregister(job.fault_signal)  # a child must not go on writing to its parent's file
        if fd >= 0:
            os.close(fd)
        raise
    previous, previous_id = job.stacks_fd, job.stacks_id
    job.stacks_fd, job.stacks_id = fd, file_id(fd)
    if previous is not None and previous_id is not None and file_id(previous) == previous_id:
        os.close(previous)  # after fork: the parent's file, which faulthandler no longer uses
    if not faulthandler.is_enabled():
        # On a fatal signal (SIGSEGV in an extension, SIGABRT) every thread's Python stack then goes to
        # stderr, the job's output log: the evidence the native-crash finding quotes.
        try:  # noqa: SIM105 - importing contextlib would cost every Python start of the job
            faulthandler.enable(all_threads=True)
        except Exception:  # no usable stderr: the crash is still named, without its frames
            pass
    return path


def _stacks_file(job: _Job, pid: int) -> tuple[int, str]:
    """faulthandler's file: a memfd, which the shim reads as /proc/PID/fd/N while the process lives (a dump
    serves only then). Creating a file on disk costs ext4 an inode, 0.7 ms measured, in every forked
    child, and the shim an unlink once it ends; a file in the py dir where memfd_create is refused."""
    try:
        fd = os.memfd_create("jobwarden-stacks", os.MFD_CLOEXEC)
        return fd, f"/proc/{pid}/fd/{fd}"
    except (AttributeError, OSError):  # not Linux >= 3.17, or a seccomp filter says no
        path = job.path(pid, ".stacks")
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600), path


def yama_scope(job: _Job, scope_path: str = YAMA_SCOPE) -> bytes:
    """The Yama ptrace scope (b"" without Yama), read once per job process tree: fork() keeps it."""
    if job.yama is None:
        try:
            with open(scope_path, "rb") as fh:
                job.yama = fh.read().strip()
        except OSError:
            job.yama = b""
    return job.yama


def declare_ptracer(job: _Job, scope_path: str = YAMA_SCOPE) -> bool:
    """Let the shim and its descendants (py-spy) attach as far as Yama goes; True if nothing is in the way.

    Under ptrace_scope=1 only ancestors may attach, and py-spy, a child of the shim, is not one, unless this
    process names the shim with PR_SET_PTRACER (yama_lsm.c accepts the declared tracer or a descendant of it).
    The declaration is not inherited by fork(): the child calls this again. Without Yama, or at scope 0,
    there is nothing to declare; at scopes 2 and 3 a declaration does not help."""
    scope = yama_scope(job, scope_path)
    if scope in (b"", b"0"):
        return True
    if scope != b"1" or job.shim_pid <= 0:
        return False
    import ctypes  # only here: loading it costs about a millisecond

    if job.libc is None:
        job.libc = ctypes.CDLL(None, use_errno=True)
    prctl = job.libc.prctl  # type: ignore[attr-defined]
    return int(prctl(PR_SET_PTRACER, ctypes.c_ulong(job.shim_pid), 0, 0, 0)) == 0


def write_advert(
    job: _Job,
    pid: int,
    fault_file: str,
    ptracer: bool,
    start_time: int,
    forked: dict[str, object] | None = None,
    born: str = "",
) -> None:
    """`<pid>.json`. With the fault file, the descriptor faulthandler writes to and what file it is: the
    shim signals only while /proc/PID/fd/N is still that file (the job may have closed it and reused the
    number for its own data). `forked`: the fork record this process was forked under, in its parent.
    `born`: the process's `born` line, announced in the same write (each syscall of a forked child costs
    it a fault on pages it shares with its parent)."""
    if job.program is None:
        job.program = _program()
    on_signal = bool(fault_file) and job.stacks_fd is not None and job.stacks_id is not None
    advert: dict[str, object] = {
        "pid": pid,
        "start_time": start_time,
        "python": ".".join(str(part) for part in sys.version_info[:3]),
        "executable": sys.executable or "",
        "fault_signal": job.fault_signal if on_signal else 0,
        "fault_file": fault_file,
        "fault_fd": job.stacks_fd if on_signal else None,
        "fault_file_id": list(job.stacks_id) if on_signal and job.stacks_id else None,
        "fault_withdrawn": job.fault_taken or None,
        "ptracer": ptracer,
        "mp_start": job.mp_start,
        "exe": job.program,
    }
    if forked is not None:
        advert["forked"] = forked
    job.advert = advert
    text = dumps(advert)
    # The shim writes the file from the announcement (shim.tree.pyfiles.store_advert): a file created here
    # costs ext4 an inode and a rename, 0.2 ms of every forked child measured. Written here only where
    # there is no shim to tell, or its FIFO is full.
    if not _announce(job, f"{born}advert {text}\n") and not (born and _announce(job, born)):
        _write_atomic(job.path(pid, ".json"), text)


def _program() -> list[int] | None:
    """(device, inode) of the interpreter this process runs. An exec() keeps the pid and start time and
    drops the fault handler: the shim compares this with the process's program before it signals."""
    try:
        st = os.stat("/proc/self/exe")
    except OSError:
        return None
    return [st.st_dev, st.st_ino]


def _hook_process(job: _Job, pid: int, forked: dict[str, object] | None = None) -> None:
    """Everything a process of the job does for itself: at start-up, and again in a forked child. First
    the announcement: the sooner the shim holds the process, the shorter a life it can miss."""
    job.pid = pid
    job.reaped = []  # a forked child's: the parent's lines stay the parent's to write
    start_time = _start_time()
    job.exception_seen = False
    job.caught = 0  # a forked child's own records (the counters came with the parent's memory)
    job.fork_sites = set()
    job.fork_counts = {}
    fault_file = ""
    try:
        fault_file = install_fault_handler(job, pid)
    except Exception as err:
        _report(job, "faulthandler", err)
    ptracer = False
    try:
        ptracer = declare_ptracer(job)
    except Exception as err:
        _report(job, "PR_SET_PTRACER", err)
    write_advert(job, pid, fault_file, ptracer, start_time, forked, birth_line(pid, start_time))


# --- the job takes the fault signal for itself ----------------------------------------------------------


def _wrap_signal(job: _Job) -> None:
    """Withdraw the fault signal from the advert as soon as the job sets anything on it (a handler, SIG_IGN,
    SIG_DFL): the shim must then never send it, or the job's own handler runs ("clean up and exit on any
    signal") or the default action ends it. signal.signal() calls _signal.signal through the module, so
    wrapping the built-in sees both. The wrapper returns what the original returns and raises what it
    raises: it only looks, after a call that succeeded."""
    if job.fault_signal <= 0:
        return
    import _signal  # type: ignore[import-not-found]  # built in: no file to load (signal imports enum)

    original = _signal.signal

    def signal(signalnum: Any, handler: Any) -> Any:
        previous = original(signalnum, handler)
        try:
            if _job is not None and not _job.fault_taken and signalnum == _job.fault_signal:
                _fault_signal_taken(_job, handler)
        except Exception as err:
            _report(_job, "fault signal taken", err)
        return previous

    signal.__doc__ = original.__doc__
    _signal.signal = signal


def _fault_signal_taken(job: _Job, handler: object) -> None:
    if handler == 0:
        what = "its default action (SIG_DFL)"
    elif handler == 1:
        what = "SIG_IGN"
    else:
        what = "a handler of its own"
    job.fault_taken = f"the job set signal {job.fault_signal} to {what}"
    advert = dict(job.advert)
    if not advert:
        return
    advert.update(fault_signal=0, fault_file="", fault_fd=None, fault_file_id=None)
    advert["fault_withdrawn"] = job.fault_taken
    job.advert = advert
    text = dumps(advert)
    # announced first, so that the shim, writing the announcements in order, ends on this one; then
    # written at once: the shim may be about to signal (it never writes a withdrawn advert back)
    _announce(job, f"advert {text}\n")
    _write_atomic(job.path(os.getpid(), ".json"), text)


# --- fork() while threads run -----------------------------------------------------------------------


def frames_of(frame: FrameType | None, limit: int = FRAMES_PER_THREAD) -> list[dict[str, object]]:
    """Innermost first. co_qualname (3.11+) gives 'Pool.map' like py-spy does; older Pythons the bare name."""
    found: list[dict[str, object]] = []
    while frame is not None and len(found) < limit:
        code = frame.f_code
        name = getattr(code, "co_qualname", code.co_name)
        found.append({"function": name, "file": code.co_filename, "line": frame.f_lineno})
        frame = frame.f_back
    return found


FORK_RECORDS_PER_SITE = 2  # full records per fork site: the first forks are the story, the rest repeats
MAX_FORK_SITES = 32  # sites recorded in full per process; forks at further sites are only counted


def fork_record(forking_frame: FrameType | None, at: float) -> dict[str, object] | None:
    """The forking thread's stack and every other thread's, or None when no other thread runs."""
    me = _thread.get_ident()
    current = sys._current_frames()
    known = _known_threads()
    ours = _job.recorder_thread if _job is not None else None
    idents = [i for i in list(current) + [i for i in known if i not in current] if i not in (me, ours)]
    if not idents:
        return None
    threads = []
    for ident in idents[:MAX_THREADS]:
        thread = known.get(ident)
        threads.append(
            {
                "tid": getattr(thread, "native_id", None),
                "name": getattr(thread, "name", None),
                "frames": frames_of(current.get(ident)),
            }
        )
    return {
        "at": at,
        "parent_pid": os.getpid(),
        "stack": frames_of(forking_frame),
        "threads": threads,
    }


def _known_threads() -> dict[int, object]:
    threading = sys.modules.get("threading")
    # threading._active is read without its lock: active_count() would take a lock inside fork()
    return dict(getattr(threading, "_active", None) or {})


def _others_run() -> bool:
    """Another thread of the job's runs besides the forking one: no I/O, a few microseconds. The hooks'
    own recorder thread does not count: it sleeps in read() holding no lock a child could need."""
    ours = _job.recorder_thread if _job is not None else None
    current = sys._current_frames()
    if len(current) > 1 + (ours in current):
        return True
    me = _thread.get_ident()
    return any(ident not in (me, ours) for ident in _known_threads())


def fork_site(frame: FrameType | None, limit: int = FRAMES_PER_THREAD) -> tuple[int, ...]:
    """The call site of a fork, as a key: the code objects and lines of the forking stack. No I/O and no
    text: forks at the same place are told apart from others in microseconds."""
    key: list[int] = []
    while frame is not None and len(key) < 2 * limit:
        key += (id(frame.f_code), frame.f_lineno)
        frame = frame.f_back
    return tuple(key)


def _os_threads(pid: int) -> int | None:
    """Native threads count too (a CUDA or OpenMP pool can hold a lock the child will need)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def _before_fork() -> None:
    """Note a fork made while other threads run: the first FORK_RECORDS_PER_SITE at each call site in
    full, then only a count, written when it reaches a power of two.

    The parent does no I/O here: with busy threads every syscall that releases the GIL costs the forking
    thread up to threads x the switch interval (5 ms) to get it back, 100 forks beside 8 spinning threads
    took x1.3 when the parent wrote its records. The record is built in memory, which the child inherits,
    and the child writes it (_after_fork_in_child), alone with the GIL."""
    job = _job
    if job is None:
        return
    try:
        if not _others_run():
            return
        # Called from C by os.fork(): the frame below this one is the Python code that forks.
        frame = sys._getframe(1)
        key = fork_site(frame)
        counted = job.fork_counts.get(key)
        if counted is None:
            counted = job.fork_counts[key] = [len(job.fork_counts) + 1, 0]
        counted[1] += 1
        site, n = counted
        at, pid = time.time(), job.pid
        line: dict[str, object] | None = None
        if n <= FORK_RECORDS_PER_SITE and site <= MAX_FORK_SITES:
            line = fork_record(frame, at)
            if line is not None:
                line.update(site=site, n=n)
        elif n & (n - 1) == 0 and site <= MAX_FORK_SITES:  # 4, 8, 16...: log2 short lines in all
            line = {"parent_pid": pid, "site": site, "forks": n, "at": at}
        job.forks[_thread.get_ident()] = (at, pid, site, n, line)
    except Exception as err:
        _report(job, "fork record", err)


def _after_fork_in_parent() -> None:
    if _job is not None:
        _job.forks.pop(_thread.get_ident(), None)


def _after_fork_in_child() -> None:
    job = _job
    if job is None:
        return
    try:
        # The forking thread is the child's only thread and keeps its ident.
        recorded = job.forks.pop(_thread.get_ident(), None)
        job.forks.clear()
        _forget_recorder(job)
        job.warned = False
        forked: dict[str, object] | None = None
        if recorded is not None:  # in the child's own advert: the link a hung child needs, one per child
            at, parent, site, n, line = recorded
            forked = {"parent_pid": parent, "fork_at": at, "site": site, "n": n}
            if line is not None:
                _write_fork_line(job, parent, line)
        _hook_process(job, os.getpid(), forked)
    except Exception as err:
        _report(job, "after fork", err)


def _write_fork_line(job: _Job, parent: int, line: dict[str, object]) -> None:
    """The parent's record of this fork, to the parent's file: one write() on O_APPEND, so that siblings
    forked at once do not interleave."""
    if "threads" in line:  # a full record: the parent's native threads, which this child no longer has
        line["os_threads"] = _os_threads(parent)
    _append(job.path(parent, ".forks.jsonl"), dumps(line))


def _forget_recorder(job: _Job) -> None:
    """In a forked child: the recorder's thread stayed in the parent (fork copies the calling thread
    only), and the FIFO is the parent's to read. A child that joins a group of its own starts its own."""
    job.recorder_thread = None
    fd, job.recorder_fd = job.recorder_fd, -1
    if fd >= 0 and file_id(fd) == job.recorder_fd_id:
        os.close(fd)
    job.recorder_fd_id = None


# --- multiprocessing's start method, and modules hooked as they are imported -----------------------


def record_fork_request(job: _Job, frame: FrameType | None) -> None:
    """`<pid>.start-method.jsonl`: the stack that asked multiprocessing for "fork" by name (once per call
    site). --mp-start changes only the default, so the remedy for a fork deadlock is then that line."""
    stack = frames_of(frame, 12)
    site = next((f"{f['file']}:{f['line']}" for f in stack if "multiprocessing" not in str(f["file"])), None)
    if site is None or site in job.fork_sites:
        return
    job.fork_sites.add(site)
    pid = os.getpid()
    _append(
        job.path(pid, ".start-method.jsonl"),
        dumps({"pid": pid, "at": time.time(), "method": "fork", "stack": stack}),
    )


def hook_multiprocessing(module: ModuleType) -> None:
    """Note every explicit request for the "fork" context: BaseContext.get_context is what
    get_context("fork") and set_start_method("fork") both end in (DefaultContext defers to it)."""
    cls = module.context.BaseContext
    original = cls.get_context
    if getattr(original, "_jobwarden", False):
        return

    def get_context(self: object, method: object = None) -> object:
        job = _job
        if method == "fork" and job is not None:
            try:
                record_fork_request(job, sys._getframe(1))
            except Exception as err:
                _report(job, "start method record", err)
        return original(self, method)

    get_context._jobwarden = True  # type: ignore[attr-defined]
    cls.get_context = get_context


def set_default_start_method(method: str) -> Callable[[ModuleType], None]:
    """--mp-start: multiprocessing's *default* context, not set_start_method(force=True): a job that calls
    set_start_method() itself would then get "context has already been set"; here its own choice still
    wins, as get_context("fork") does."""

    def apply(module: ModuleType) -> None:
        context = module.context
        default = context._default_context
        if not hasattr(default, "_default_context"):
            raise AttributeError("multiprocessing.context has no DefaultContext._default_context")
        default._default_context = context._concrete_contexts[method]

    return apply


class AfterImport:
    """Runs callbacks on a module right after its first import, by wrapping the real loader's
    exec_module: importing the modules eagerly here would cost every process of the job milliseconds
    (multiprocessing pulls in socket, pickle...), most of them for nothing. A module already imported is
    handed to its callbacks at once, and the finder leaves sys.meta_path once it has nothing to wait for."""

    def __init__(self, callbacks: dict[str, list[Callable[[ModuleType], None]]]) -> None:
        self.callbacks = callbacks

    def install(self) -> None:
        for name in [n for n in self.callbacks if n in sys.modules]:
            self._run(name, sys.modules[name])
        if self.callbacks:
            sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        if fullname not in self.callbacks:
            return None
        try:
            for finder in list(sys.meta_path):
                find_spec = getattr(finder, "find_spec", None)
                if finder is self or find_spec is None:
                    continue
                spec: ModuleSpec | None = find_spec(fullname, path, target)
                if spec is not None:
                    self._wrap(fullname, spec)
                    return spec
        except Exception as err:
            _report(_job, "import hook for " + fullname, err)
        return None  # the import system asks the next finders, as if this one were not there

    def _wrap(self, fullname: str, spec: ModuleSpec) -> None:
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if loader is None or exec_module is None:
            raise ImportError(f"{fullname} has a legacy loader; left alone")
        own = vars(loader).get("exec_module")  # someone else's wrapper, to put back

        def exec_then_hook(module: ModuleType) -> None:
            try:
                exec_module(module)
            finally:
                if own is None:
                    del loader.exec_module
                else:
                    loader.exec_module = own  # type: ignore[method-assign]
            self._run(fullname, module)

        loader.exec_module = exec_then_hook  # type: ignore[method-assign]

    def _run(self, fullname: str, module: ModuleType) -> None:
        for callback in self.callbacks.pop(fullname, ()):
            try:
                callback(module)
            except Exception as err:
                _report(_job, "import hook for " + fullname, err)
        if not self.callbacks and self in sys.meta_path:
            sys.meta_path.remove(self)


# --- start-up ---------------------------------------------------------------------------------------

# the modules with progress bars, and the hook of the `progress` part that reads each
PROGRESS_MODULES = {
    "tqdm.std": "_hook_tqdm",
    "keras.src.utils.progbar": "_hook_progbar",  # Keras 3
    "keras.src.callbacks.progbar_logger": "_hook_progbar_logger",
    "keras.utils.generic_utils": "_hook_progbar",  # Keras 2
    "keras.src.utils.generic_utils": "_hook_progbar",
    "tf_keras.src.utils.generic_utils": "_hook_progbar",
    "keras.callbacks": "_hook_progbar_logger",
    "keras.src.callbacks": "_hook_progbar_logger",
    "tf_keras.src.callbacks": "_hook_progbar_logger",
    "rich.progress": "_hook_rich",  # Lightning's RichProgressBar, its default where rich is installed
}


def _activate(job: _Job) -> None:
    global _job
    _job = job
    try:  # noqa: SIM105 (contextlib would cost an import; processes of the job race to create it)
        os.mkdir(job.py_dir, 0o700)
    except FileExistsError:
        pass
    if os.environ.get(ERROR_FILE_ENV):
        job.error_file_owner = os.getpid()
    _hook_process(job, os.getpid())
    _wrap_waits()
    _wrap_signal(job)
    _install_excepthook(job)
    os.register_at_fork(
        before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child
    )
    on_import: dict[str, list[Callable[[ModuleType], None]]] = {
        "traceback": [_in_part("exceptions", "hook_traceback")],
        "multiprocessing": [hook_multiprocessing],
        "torch.distributed": [_in_part("torch", "hook_torch_distributed")],
        **{module: [_in_part("progress", hook)] for module, hook in PROGRESS_MODULES.items()},
    }
    if job.mp_start is not None and "multiprocessing" not in sys.modules:
        on_import["multiprocessing"].append(set_default_start_method(job.mp_start))
    AfterImport(on_import).install()
    fallback = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fallback")
    if fallback not in sys.path:
        sys.path.append(fallback)  # last: an installed jobwarden always wins


def chain(sitecustomize_file: str) -> None:
    """Run the sitecustomize that `sitecustomize_file` shadows: the next one on sys.path after its folder."""
    ours = os.path.abspath(sitecustomize_file)
    here = os.path.dirname(ours)
    entries = list(sys.path)
    start = 0
    for i, entry in enumerate(entries):
        if os.path.abspath(entry or ".") == here:
            start = i + 1
    for entry in entries[start:]:
        if not _may_hold_sitecustomize(entry):
            continue
        spec = _path_finder().find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None or not spec.origin or os.path.abspath(spec.origin) == ours:
            continue
        _run_chained(spec)
        return


def _may_hold_sitecustomize(entry: str) -> bool:
    """Whether the import system could find a sitecustomize in `entry`, from a few stat() calls: asking it
    lists each folder (the standard library's, site-packages) into a cache, 0.1 ms of every start of every
    process of the job. A zip file or anything but a folder is left to the import system."""
    folder = entry or "."
    if not os.path.isdir(folder):
        return os.access(folder, os.F_OK)
    imp = sys.modules.get("_imp")
    suffixes = ["", ".py", ".pyc", *(imp.extension_suffixes() if imp is not None else [".so"])]
    stem = os.path.join(folder, "sitecustomize")  # os.access: no exception raised for each name absent
    return any(os.access(stem + suffix, os.F_OK) for suffix in suffixes)


def _path_finder() -> type[PathFinder]:
    """importlib's PathFinder, from the bootstrap module every process has (importlib.machinery costs an
    import on 3.8)."""
    found = getattr(sys.modules.get("_frozen_importlib_external"), "PathFinder", None)
    if found is not None:
        return found  # type: ignore[no-any-return]
    from importlib.machinery import PathFinder

    return PathFinder


def _run_chained(spec: ModuleSpec) -> None:
    bootstrap = sys.modules.get("_frozen_importlib")
    if hasattr(bootstrap, "module_from_spec"):
        module: ModuleType = bootstrap.module_from_spec(spec)  # type: ignore[union-attr]
    else:
        from importlib.util import module_from_spec

        module = module_from_spec(spec)
    mine = sys.modules.get("sitecustomize")
    sys.modules["sitecustomize"] = module  # what the job sees as its sitecustomize
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as err:  # reported as site.py reports a failing sitecustomize
        if mine is not None:
            sys.modules["sitecustomize"] = mine
        sys.stderr.write(
            f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(err).__name__}: {err}\n"
        )


def main(sitecustomize_file: str, code_of: Callable[[str, str], CodeType] | None = None) -> None:
    """Called by jobwarden's sitecustomize (`sitecustomize_file`) each time one runs in this process: the
    hooks are set up once, and the sitecustomize on sys.path after the caller's directory is run.
    `code_of(source, cache_dir)`: how the sitecustomize compiled this module, for the parts too."""
    global _code_of
    if code_of is not None:
        _code_of = code_of
    if _job is None:
        try:
            job = job_from_env(os.environ)
            if job is not None:
                _activate(job)
        except Exception as err:
            _report(_job, "start-up", err)
    try:
        chain(sitecustomize_file)
    except Exception as err:
        _report(_job, "chaining sitecustomize", err)
