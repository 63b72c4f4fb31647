"""What the probes observe and the rules judge: stack frames, fork records, process facts and deaths, OOM
and GPU evidence. Plain data, stdlib only; kept apart from `model` so that `run` does not pay for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class LocalRLock:
    """A `threading.RLock` one of a frame's local names (a parameter, a variable) is bound to, as a hang's
    dump saw it (py-spy --locals: the name, the object's address), and who owns it, as the process's memory
    said right after (probes.rlocks). Like Frame.owner, an address that means something only live."""

    name: str
    address: int
    owner: int | None = None  # the owning thread's ident (py-spy's thread_id); 0: free; None: not read
    count: int = 0  # how many times the owner holds it (an RLock is reentrant)


@dataclass(frozen=True)
class Frame:
    """One stack frame. `file`/`line` are empty for native frames without debug info. `owner`: the address
    of the frame's `self`, where a hang's dump read it (py-spy --locals; its value is never kept): which
    object a method runs on, so that two threads' `with self._lock:` can be told the same lock or not. Not
    part of a frame's identity."""

    function: str
    file: str = ""
    line: int | None = None
    native: bool = False
    owner: int | None = field(default=None, compare=False)
    # the RLocks its local names hold (py-spy --locals), with their owner as the memory read them
    rlocks: tuple[LocalRLock, ...] = field(default=(), compare=False)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{self.function} ({where})" if where else self.function

    def to_json(self) -> dict[str, object]:
        # no owner: an address means something only in the live process, to the rules judging it then
        return {"function": self.function, "file": self.file, "line": self.line, "native": self.native}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Frame:
        return cls(str(d["function"]), str(d.get("file") or ""), d.get("line"), bool(d.get("native")))


@dataclass(frozen=True)
class ThreadStack:
    """The frames of one thread, innermost first."""

    tid: int | None
    name: str | None
    frames: tuple[Frame, ...]
    state: str | None = None  # kernel state of the thread (R S D T t Z) when known
    active: bool | None = None  # py-spy's view: running Python code (vs idle in a wait)
    owns_gil: bool | None = None  # py-spy's view: holds the GIL (stuck in C with it, it starves the rest)
    # Python's own id of the thread (threading.get_ident(), py-spy's thread_id): what an RLock's owner
    # names. Read live only, like Frame.owner.
    ident: int | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, object]:
        return {
            "tid": self.tid,
            "name": self.name,
            "state": self.state,
            "active": self.active,
            "owns_gil": self.owns_gil,
            "frames": [f.to_json() for f in self.frames],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ThreadStack:
        return cls(
            d.get("tid"),
            d.get("name"),
            tuple(Frame.from_json(f) for f in d.get("frames", ())),
            d.get("state"),
            d.get("active"),
            d.get("owns_gil"),
        )


@dataclass(frozen=True)
class ProcessStack:
    """Every thread of one process at one moment, and how it was captured. `error` says why a stack is
    missing or partial (py-spy timed out, ptrace denied, not a Python process and no gdb)."""

    pid: int
    method: str  # "py-spy", "py-spy --native", "py-spy --nonblocking", "faulthandler", "gdb", "none"
    threads: tuple[ThreadStack, ...] = ()
    error: str | None = None
    cmdline: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "method": self.method,
            "cmdline": self.cmdline,
            "error": self.error,
            "threads": [t.to_json() for t in self.threads],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProcessStack:
        return cls(
            int(d["pid"]),
            str(d["method"]),
            tuple(ThreadStack.from_json(t) for t in d.get("threads", ())),
            d.get("error"),
            str(d.get("cmdline") or ""),
        )


@dataclass(frozen=True)
class ForkRecord:
    """A fork() made while other threads ran, as the Python hook recorded it in the parent."""

    parent_pid: int
    at: float
    stack: tuple[Frame, ...]  # the forking thread, innermost first
    threads: tuple[ThreadStack, ...]  # the other threads alive at that moment
    child_pid: int | None = None  # set when the child reported in (it may hang before it can)
    # The hooks record the first forks at each call site in full, then only count them: `site_forks` is
    # how many forks (beside other threads) the parent made there, as far as known; `exact` is False for
    # a later fork, whose stack and threads are those recorded at an earlier fork from the same site.
    site_forks: int = 1
    exact: bool = True


@dataclass(frozen=True)
class ProcessFacts:
    """A live process of the job as the shim sees it when it judges."""

    pid: int
    ppid: int
    cmdline: str
    state: str  # R S D T t Z (of the process; see thread_states for its threads)
    thread_states: tuple[str, ...] = ()
    wchan: str | None = None
    is_python: bool = False
    started_at: float | None = None  # wall clock
    is_main: bool = False
    # per thread, in the order of thread_states (empty when not gathered): a D-state thread's own wait
    # channel is the evidence, the process's wchan is only its main thread's
    thread_ids: tuple[int, ...] = ()
    thread_wchans: tuple[str, ...] = ()
    state_for_s: float | None = None  # how long the process has been in `state`, over consecutive samples
    stop_signal: str | None = None  # for state T, when known ("SIGTTIN": PTRACE_EVENT_STOP or py-spy's error)
    rank: int | None = None  # its RANK variable: a rank of a distributed job (torchrun)


@dataclass(frozen=True)
class ProcessDeath:
    """A process of the job that ended (main or descendant), with how. `at` is the moment of death where the
    kernel's process events or the reaping parent said it, else when the shim noticed."""

    pid: int
    ppid: int | None
    cmdline: str
    at: float
    exit_code: int | None
    signal: str | None  # "SIGKILL" or None
    is_main: bool = False
    rank: int | None = None  # its RANK variable: a rank of a distributed job (torchrun)

    @property
    def abnormal(self) -> bool:
        return self.signal is not None or self.exit_code not in (None, 0)


@dataclass(frozen=True)
class UncaughtException:
    """The first uncaught exception of one Python process of the job, as the hooks recorded it: when, what,
    and where (the traceback's frames, innermost first). `chain` is what it was raised from or during
    (type, message), outward."""

    pid: int
    at: float
    type: str  # qualified: "ValueError", "concurrent.futures.process.BrokenProcessPool"
    message: str
    frames: tuple[Frame, ...] = ()
    chain: tuple[tuple[str, str], ...] = ()
    rank: int | None = None
    executable: str | None = None  # the interpreter that ran the process (its advert's sys.executable)

    @property
    def types(self) -> tuple[str, ...]:
        """Its own type, then the chained ones'."""
        return (self.type, *(t for t, _ in self.chain))


@dataclass(frozen=True)
class ForkRequest:
    """A process asked multiprocessing for its "fork" start method by name (get_context("fork"),
    set_start_method("fork")), as the hooks recorded it: --mp-start changes only the default."""

    pid: int
    at: float
    stack: tuple[Frame, ...]  # the asking thread, innermost first (multiprocessing's own frames first)


@dataclass(frozen=True)
class OomEvidence:
    """Counters and log lines that show the OOM killer (or jobwarden's memory watchdog) at work."""

    mechanism: str  # "cgroup-v1", "cgroup-v2", "host", "watchdog"
    kills: int  # OOM kills counted during the run
    limit_bytes: int | None = None
    peak_bytes: int | None = None
    victims: tuple[int, ...] = ()
    kernel_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_percent: float | None
    # the SM clock now and at most, and NVML's clock event reasons (bitmask); None: not supported
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    clock_reasons: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU (NVML's compute or graphics process list)."""

    gpu_index: int
    pid: int
    used_bytes: int | None  # None: NVML cannot tell (WDDM, some containers); never guessed as 0
    # "compute", "graphics" or "compute+graphics": a desktop's Xorg holding a little memory (graphics)
    # must not make a GPU look taken by a job (compute)
    kind: str = "compute"


@dataclass(frozen=True)
class GitState:
    """The git repository a job ran in, as its run started. Untracked files are not looked at."""

    commit: str | None  # the full hash of HEAD; None: a repository with no commit yet
    branch: str | None  # None: a detached HEAD
    dirty: bool  # tracked files differ from HEAD
    diff_hash: str | None = None  # `git diff HEAD` hashed (never stored) when dirty

    def to_json(self) -> dict[str, object]:
        return {
            "commit": self.commit,
            "branch": self.branch,
            "dirty": self.dirty,
            "diff_hash": self.diff_hash,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GitState:
        return cls(d.get("commit"), d.get("branch"), bool(d.get("dirty")), d.get("diff_hash"))


@dataclass(frozen=True)
class Fingerprint:
    """What a run was started with, taken at each launch without a change to the job's code: the answer
    to "it worked yesterday: what is different?" (rules.changes compares two). `unknown` names the parts
    that could not be read, with why ("git": "timed out after 10 s"); they are never taken for absent."""

    command: tuple[str, ...]
    cwd: str
    env_keys: tuple[str, ...]  # the names of its --env variables, never their values
    host: str
    jobwarden: str  # the version that supervised it
    python: str | None = None  # the interpreter the command runs, as resolved; None: none found
    python_version: str | None = None
    packages: tuple[tuple[str, str], ...] | None = None  # (name, version) installed where it imports from
    torch_cuda: str | None = None  # the CUDA version torch was built for (torch.version.cuda)
    git: GitState | None = None  # None: its cwd is in no repository
    cuda_visible: str | None = None  # CUDA_VISIBLE_DEVICES as the job got it; None: unset
    gpus: tuple[str, ...] | None = None  # the GPUs it could see ("0 NVIDIA H100 GPU-1a2b3c4d"); None: unknown
    driver: str | None = None  # the NVIDIA driver ("550.54.15")
    cuda_driver: str | None = None  # the CUDA version the driver supports ("12.4")
    unknown: tuple[tuple[str, str], ...] = ()  # (part, why) for git, python, packages, gpus

    def why_unknown(self, part: str) -> str | None:
        return next((why for name, why in self.unknown if name == part), None)

    def to_json(self, packages: bool = True) -> dict[str, object]:
        """As stored (store.fingerprints keeps the package list apart, once per distinct list)."""
        body: dict[str, object] = {
            "command": list(self.command),
            "cwd": self.cwd,
            "env_keys": list(self.env_keys),
            "host": self.host,
            "jobwarden": self.jobwarden,
            "python": self.python,
            "python_version": self.python_version,
            "torch_cuda": self.torch_cuda,
            "git": self.git.to_json() if self.git is not None else None,
            "cuda_visible": self.cuda_visible,
            "gpus": list(self.gpus) if self.gpus is not None else None,
            "driver": self.driver,
            "cuda_driver": self.cuda_driver,
            "unknown": dict(self.unknown),
        }
        if packages:
            body["packages"] = [list(p) for p in self.packages] if self.packages is not None else None
        return body

    @classmethod
    def from_json(cls, d: dict[str, Any], packages: tuple[tuple[str, str], ...] | None = None) -> Fingerprint:
        listed = d.get("packages")
        if packages is None and listed is not None:
            packages = tuple((str(n), str(v)) for n, v in listed)
        git = d.get("git")
        gpus = d.get("gpus")
        return cls(
            command=tuple(d.get("command", ())),
            cwd=str(d.get("cwd", "")),
            env_keys=tuple(d.get("env_keys", ())),
            host=str(d.get("host", "")),
            jobwarden=str(d.get("jobwarden", "")),
            python=d.get("python"),
            python_version=d.get("python_version"),
            packages=packages,
            torch_cuda=d.get("torch_cuda"),
            git=GitState.from_json(git) if isinstance(git, dict) else None,
            cuda_visible=d.get("cuda_visible"),
            gpus=tuple(gpus) if gpus is not None else None,
            driver=d.get("driver"),
            cuda_driver=d.get("cuda_driver"),
            unknown=tuple((str(k), str(v)) for k, v in (d.get("unknown") or {}).items()),
        )


@dataclass(frozen=True)
class Wait:
    """What one blocked thread of the job waits for, from the kernel's own evidence (probes.waits): the
    system call it sits in, the descriptor or child it names, and who is on the other side."""

    pid: int
    tid: int
    kind: str  # "child", "file-lock", "pipe-read", "pipe-write", "socket-read", "sleep"
    call: str  # the system call: "wait4", "flock", "read"...
    thing: str  # what it waits on: "/data/cache.lock", "pipe:[81234]", "child pid 812", "a sleep"
    on: tuple[int, ...] = ()  # the processes it waits for: the lock's holder, the pipe's other end, the child


@dataclass(frozen=True)
class HeldLock:
    """A module-level `threading.Lock()` / `RLock()` of one source file, or one its class binds to an
    attribute of `self` once, as a `with` statement names it."""

    name: str  # the module-level name: "cache_lock"; an instance's: "self._lock"
    defined: int  # the line that assigns it
    with_line: int  # the line of the `with` statement that takes it
    attribute: bool = False  # an instance's lock: the same only on the same object (the frame's owner)


@dataclass(frozen=True)
class LockSite:
    """What the source says at one frame's line (probes.withlocks): the lock a `with` on this very line
    takes (a thread stopped here waits to enter it), and the locks whose `with` blocks hold the line: locks
    the file itself creates (at module level, or bound once to `self`), and the local name a `with` or an
    `acquire()` on the line takes; only from a file not changed since the process started."""

    file: str
    line: int
    takes: HeldLock | None
    holds: tuple[HeldLock, ...] = ()  # outermost first
    # a local name (a parameter, a variable of the function) that a `with NAME:` or a lone
    # `NAME.acquire()` on this line takes: which lock it is, only the dump's locals tell (Frame.rlocks)
    takes_local: str = ""


@dataclass(frozen=True)
class FeedStart:
    """Where the source starts a thread or a process on a function that feeds a queue, an event or a
    condition: `threading.Thread(target=load, name="loader")`, a `Thread` subclass made (it runs its
    `run`), an executor's `pool.submit(load)` (a task)."""

    kind: str  # "thread", "process" or "task"
    line: int
    name: str  # the `name=` it is given, "" when none (or not a plain string)
    scope: str  # the function whose code starts it ("<module>" at module level)
    first: int  # that function's lines: a live thread inside them may start another
    last: int


@dataclass(frozen=True)
class Feeder:
    """A function whose code feeds a queue, an event or a condition (`put`, `set`, `notify`)."""

    function: str  # its bare name, as py-spy's frames end
    first: int  # its lines: a live thread or process with a frame among them may still feed it
    last: int
    line: int  # its first line that feeds it
    starts: tuple[FeedStart, ...] = ()  # where it is a thread's or a process's target
    only_started: bool = False  # referenced nowhere else: it runs only in what those starts started
    file: str = ""  # the module it is in, when not the waiting line's (an imported object's module)


@dataclass(frozen=True)
class FeedSite:
    """A line where a thread waits, without a timeout, on a queue, an event or a condition the source
    names (probes.feeds): what it is, where it is made, and every function of the file that feeds it, or
    None when the text does not show them all (the object is handed to code the file does not show)."""

    file: str
    line: int
    name: str  # as the source names it: "results"
    kind: str  # "queue", "event", "condition"
    across: str  # "threads" (queue.Queue, threading.Event) or "processes" (multiprocessing's)
    defined: int  # the line that makes it
    feeders: tuple[Feeder, ...] | None
    made_in: str = ""  # the module that makes it, when not this file (imported: `from jobqueue import q`)


@dataclass(frozen=True)
class WaitParty:
    """A process a wait leads to, possibly outside the job: who it is, and whose."""

    pid: int
    cmdline: str
    user: str
    in_job: bool
    # outside the job: another job of this user's that it belongs to (shim.tree.whosejob)
    job: int | None = None
    job_name: str = ""


@dataclass(frozen=True)
class CollectiveCall:
    """One entry of a rank's PyTorch flight recorder: a collective it called, in the order of its process
    group (`seq`, torch's collective_seq_id, 1 for the group's first)."""

    group: str  # the process group's name: torch numbers them in the order every rank creates them ("0")
    seq: int
    op: str  # "all_reduce", without the backend's prefix ("gloo:", "nccl:")
    sizes: tuple[tuple[int, ...], ...]  # each input tensor's shape
    done: bool  # torch retired it: every rank took part (a hung one is not)
    frames: tuple[Frame, ...] = ()  # where it was called, innermost first (empty without stacks)
    group_desc: str = ""  # what the group was created as: "default_pg", "undefined" (new_group's default)

    @property
    def signature(self) -> tuple[str, tuple[tuple[int, ...], ...]]:
        """What the ranks must agree on at one sequence number."""
        return self.op, self.sizes


class Arrival(NamedTuple):
    """When a rank called one collective, from its flight recorder's poll (rules.speed.arrivals). A tuple:
    the rank watch keeps hundreds a rank, made anew each poll."""

    group: str  # as CollectiveCall's
    seq: int
    op: str
    created_ns: int  # torch's time_created_ns: the node's wall clock when the rank called it
    duration_ms: float | None = None  # how long it ran on the device, where torch timed it (NCCL)


@dataclass(frozen=True)
class RankRecorder:
    """A rank's flight recorder, as its hooks dumped it on the shim's request during a hang."""

    pid: int
    rank: int | None
    at: float
    calls: tuple[CollectiveCall, ...]  # oldest first
