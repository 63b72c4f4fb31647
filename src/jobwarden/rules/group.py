"""One verdict for a distributed job from its ranks' group records (store.groupdir): who failed first.

Causal class first, clocks only inside a class (docs/cluster.md, research §3): a rank that died of its own
cause (OOM kill, exception, crash, a non-zero exit that no teardown caused, a node that went silent) starts
the story, and the earliest of them is the root cause; ranks killed after it, hung in a collective, or
aborted by NCCL's watchdog are collateral. With no own death, a rank killed from outside is the root; with
no death at all, the hang leader (the rank that is elsewhere while the others wait in a collective, else
the one that stopped progressing first); an engine stop only when nothing else came first. Nodes' clocks
differ: two deaths closer than the tolerance are "at about the same time", ordered by the monotonic clock
only when both come from one boot of one machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

DEFAULT_CLOCK_TOLERANCE_S = 2.0
NODE_SILENT_S = 150.0  # a live rank writes `alive` every minute: silent for longer while its peers ended
RETRYABLE_RULES = ("killed-externally", "node-lost", "supervisor-lost")
_OWN_FINAL_RULES = ("cuda-oom", "python-exception", "native-crash", "oom-kill", "dataloader-worker-killed")
_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT")
_KILL_SIGNALS = ("SIGTERM", "SIGKILL", "SIGINT", "SIGHUP")
# a rank's exception that says a peer went away: the peer is the story, this rank its victim
_PEER_ERRORS = (
    "DistBackendError",
    "DistNetworkError",
    "NCCL",
    "ProcessGroup",
    "gloo",
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
)
_WATCHDOG = ("Watchdog caught collective operation timeout", "NCCL communicator was aborted")
_CUDA_OOM = ("CUDA out of memory", "OutOfMemoryError")


class Cause(IntEnum):
    """A rank's outcome by causal class; lower starts the story."""

    OWN = 1  # died of its own cause
    EXTERNAL = 2  # killed from outside with no OOM, or its supervisor lost: the root only if no own death
    HUNG = 3  # hung (and then stopped): collateral, or the hang leader when nobody died
    COLLATERAL = 4  # torn down after a peer, or ended by a peer's error
    ENGINE = 5  # ended by the engine (scancel, time limit) or by `jobwarden stop`
    SUCCEEDED = 6
    RUNNING = 7


@dataclass(frozen=True)
class Outcome:
    cause: Cause
    rule: str | None
    text: str  # "was OOM-killed", "hung in all_reduce"
    at: float | None  # wall time on its node
    mono: float | None = None  # monotonic time of the same moment, on its boot


@dataclass
class RankStory:
    """The records of one rank (or of a node whose ranks are unknown), in file order."""

    label: str
    records: list[dict[str, Any]]
    rank: int | None = None
    node: str | None = None
    pid: int | None = None
    boot_id: str | None = None
    by_kind: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def of(cls, label: str, records: Sequence[dict[str, Any]]) -> RankStory:
        # a shim that restarts the job (--restart, --on-hang restart) writes each run from its `started`
        # on, in the same file: the last run is the rank's story, an earlier run's end is not its end
        starts = [i for i, r in enumerate(records) if r.get("kind") == "started"]
        records = records[starts[-1] :] if starts else records
        story = cls(label, list(records))
        for record in records:
            story.by_kind.setdefault(str(record.get("kind")), []).append(record)
            story.rank = _int(record.get("rank"), story.rank)
            story.node = record.get("node") or story.node
            story.boot_id = record.get("boot_id") or story.boot_id
        started, ended = story.first("started"), story.first("ended")
        story.pid = _int((ended or started or {}).get("pid"), None)
        return story

    @property
    def provisional(self) -> bool:
        """A node's records before its launcher's ranks appeared: no rank, or only Slurm's task number."""
        return self.rank is None or any(r.get("rank_from") == "slurm-task" for r in self.records)

    def first(self, kind: str) -> dict[str, Any] | None:
        found = self.by_kind.get(kind)
        return found[0] if found else None

    def last_wall(self) -> float | None:
        walls = [r["wall"] for r in self.records if isinstance(r.get("wall"), int | float)]
        return max(walls) if walls else None


@dataclass(frozen=True)
class RankVerdict:
    story: RankStory
    outcome: Outcome
    role: str  # root | collateral | independent | unknown


@dataclass(frozen=True)
class GroupVerdict:
    state: str  # succeeded | failed | stopped | running | unknown
    root: RankVerdict | None
    ranks: tuple[RankVerdict, ...]
    missing_nodes: tuple[str, ...]
    clock_tolerance_s: float
    simultaneous: tuple[RankVerdict, ...] = ()  # own deaths within the tolerance of the root's

    @property
    def retryable(self) -> bool:
        return self.root is not None and self.root.outcome.rule in RETRYABLE_RULES


def merge(
    stories: Sequence[RankStory],
    expected_nodes: Iterable[str] = (),
    tolerance_s: float = DEFAULT_CLOCK_TOLERANCE_S,
    over: bool = False,
) -> GroupVerdict:
    """`over`: the job is known to have ended (a batch script asks after srun returned), so a rank with
    no end is lost, not running."""
    ranked = {s.node for s in stories if not s.provisional}
    # a launcher's node writes to its node (or Slurm task) file until its first rank appears: then the
    # ranks tell the rest
    stories = [s for s in stories if not s.provisional or s.node not in ranked]
    ends = [_float(e.get("wall")) for s in stories if (e := s.first("ended"))]
    latest_end = max((w for w in ends if w is not None), default=None)
    outcomes = {id(s): classify(s, latest_end, over) for s in stories}
    reporting = {s.node for s in stories if s.node}
    missing = tuple(sorted(set(expected_nodes) - reporting))
    root, simultaneous = _root(stories, outcomes, tolerance_s)
    ranks = tuple(
        RankVerdict(s, outcomes[id(s)], _role(s, outcomes[id(s)], root)) for s in sorted(stories, key=_order)
    )
    root_verdict = next((r for r in ranks if root is not None and r.story is root), None)
    state = _state(root_verdict, ranks)
    together = tuple(r for r in ranks if any(r.story is s for s in simultaneous))
    return GroupVerdict(state, root_verdict, ranks, missing, tolerance_s, together)


def classify(story: RankStory, latest_end: float | None = None, over: bool = False) -> Outcome:
    """One rank's outcome and its causal class, from its own records (and when the last peer ended)."""
    ended = story.first("ended")
    hung = story.first("hung")
    if ended is None:
        return _no_end(story, latest_end, over)
    at = _float(ended.get("died_at")) or _float(ended.get("wall"))
    mono = _mono_at(ended, at)
    reason = str(ended.get("end_reason"))
    signal, code = ended.get("signal"), ended.get("exit_code")
    if ended.get("oom"):
        return Outcome(Cause.OWN, "oom-kill", "was OOM-killed", at, mono)
    if reason == "engine-stop" or any(_stops(r) for r in story.by_kind.get("engine-signal", ())):
        # the shim asks Slurm why only once the end is recorded: its answer is a record of its own
        state = ended.get("engine_state") or (story.first("engine-state") or {}).get("state")
        text = f"was stopped by the engine ({state})" if state else "was stopped by the engine"
        return Outcome(Cause.ENGINE, "cancelled-by-engine", text, at, mono)
    if hung is not None or reason == "hung":
        op = (hung or {}).get("collective")
        rules = (hung or {}).get("rules") or []
        rule = "collective-hang" if op else (rules[0] if rules else "no-progress")
        text = f"hung in {op}" if op else "hung"
        return Outcome(
            Cause.HUNG, rule, text, _float((hung or ended).get("wall")), _mono_at(hung or ended, None)
        )
    if signal is None and code == 0:
        return Outcome(Cause.SUCCEEDED, None, "succeeded", at, mono)
    if reason == "timeout":
        return Outcome(Cause.OWN, "timeout", "ran past its --timeout", at, mono)
    return _death(story, ended, at, mono)


def _death(story: RankStory, ended: dict[str, Any], at: float | None, mono: float | None) -> Outcome:
    signal, code = ended.get("signal"), ended.get("exit_code")
    tail = [str(line) for line in ended.get("output_tail") or ()]
    stopping = _float(ended.get("stopping_at"))
    reason = str(ended.get("end_reason"))
    torn_down = stopping is not None and at is not None and at >= stopping
    if reason == "stopped":
        return Outcome(Cause.ENGINE, "stopped-by-user", "was stopped with `jobwarden stop`", at, mono)
    if signal in _CRASH_SIGNALS:
        if signal == "SIGABRT" and any(w in line for line in tail for w in _WATCHDOG):
            return Outcome(Cause.COLLATERAL, "collective-hang", "was aborted by NCCL's watchdog", at, mono)
        return Outcome(Cause.OWN, "native-crash", f"crashed ({signal})", at, mono)
    if signal is not None:
        if torn_down:
            return Outcome(Cause.COLLATERAL, None, f"was stopped by jobwarden ({signal})", at, mono)
        return Outcome(Cause.EXTERNAL, "killed-externally", f"was killed by {signal}", at, mono)
    if torn_down:
        return Outcome(Cause.COLLATERAL, "exit-code", f"exited {code} while being stopped", at, mono)
    exception = ended.get("exception")
    final = {f.get("rule") for f in story.by_kind.get("finding", ()) if f.get("final")}
    if any(c in line for line in tail for c in _CUDA_OOM) or "cuda-oom" in final:
        return Outcome(Cause.OWN, "cuda-oom", "ran out of GPU memory", at, mono)
    if exception:
        if any(p in str(exception) for p in _PEER_ERRORS):
            return Outcome(Cause.COLLATERAL, "python-exception", f"lost a peer: {exception}", at, mono)
        return Outcome(Cause.OWN, "python-exception", f"raised {exception}", at, mono)
    own = next((r for r in _OWN_FINAL_RULES if r in final), None)
    return Outcome(Cause.OWN, own or "exit-code", f"exited {code}", at, mono)


def _stops(record: dict[str, Any]) -> bool:
    """An engine signal that ends the job (shim.run.enginestop: action "stop"); a forwarded SIGUSR1 (a
    checkpoint before the time limit) does not."""
    return record.get("action") == "stop"


def _no_end(story: RankStory, latest_end: float | None, over: bool) -> Outcome:
    """No end recorded: still running, its supervisor killed while stopping, or its node gone (silent for
    longer than a node writes `alive`, while its peers have ended)."""
    last = story.last_wall()
    stopping = story.first("stopping")
    if stopping is not None:
        return Outcome(
            Cause.EXTERNAL,
            "supervisor-lost",
            "lost its supervisor while stopping",
            _float(stopping.get("wall")),
        )
    silent = latest_end is not None and (last is None or latest_end - last > NODE_SILENT_S)
    if over or silent:
        return Outcome(Cause.OWN, "node-lost", "went silent (no end recorded)", last)
    return Outcome(Cause.RUNNING, None, "running", last)


def _root(
    stories: Sequence[RankStory], outcomes: dict[int, Outcome], tolerance_s: float
) -> tuple[RankStory | None, list[RankStory]]:
    for cause in (Cause.OWN, Cause.EXTERNAL, Cause.HUNG, Cause.ENGINE):
        candidates = [s for s in stories if outcomes[id(s)].cause == cause]
        if not candidates:
            continue
        if cause == Cause.HUNG:
            first = _hang_leader(candidates, outcomes, tolerance_s)
            return first, []
        first = _earliest(candidates, outcomes, tolerance_s)
        close = [
            s
            for s in candidates
            if s is not first and _within(outcomes[id(s)], outcomes[id(first)], tolerance_s)
        ]
        return first, close
    return None, []


def _hang_leader(candidates: list[RankStory], outcomes: dict[int, Outcome], tolerance_s: float) -> RankStory:
    """The rank that is elsewhere while the others wait in a collective; else the one whose last progress
    (output, heartbeat) is oldest; else the one judged hung first."""
    elsewhere = [s for s in candidates if not (s.first("hung") or {}).get("collective")]
    if elsewhere and len(elsewhere) < len(candidates):
        candidates = elsewhere
    progress = {id(s): _float((s.first("hung") or {}).get("last_progress")) for s in candidates}
    if all(p is not None for p in progress.values()):
        by_progress = {id(s): Outcome(Cause.HUNG, None, "", progress[id(s)]) for s in candidates}
        return _earliest(candidates, by_progress, tolerance_s)
    return _earliest(candidates, outcomes, tolerance_s)


def _earliest(candidates: list[RankStory], outcomes: dict[int, Outcome], tolerance_s: float) -> RankStory:
    """The first by wall clock; within the tolerance, by the monotonic clock where both share a boot."""
    ordered = sorted(candidates, key=lambda s: (_wall_key(outcomes[id(s)]), _order(s)))
    first = ordered[0]
    for other in ordered[1:]:
        a, b = outcomes[id(first)], outcomes[id(other)]
        same_boot = first.boot_id is not None and first.boot_id == other.boot_id
        comparable = same_boot and a.mono is not None and b.mono is not None
        if comparable and _within(a, b, tolerance_s) and b.mono < a.mono:  # type: ignore[operator]
            first = other
    return first


def _within(a: Outcome, b: Outcome, tolerance_s: float) -> bool:
    return a.at is not None and b.at is not None and abs(a.at - b.at) <= tolerance_s


def _role(story: RankStory, outcome: Outcome, root: RankStory | None) -> str:
    if root is None:
        return "independent" if outcome.cause == Cause.SUCCEEDED else "unknown"
    if story is root:
        return "root"
    if outcome.cause in (Cause.OWN, Cause.SUCCEEDED):
        return "independent"
    if outcome.cause == Cause.RUNNING:
        return "unknown"
    return "collateral"


def _state(root: RankVerdict | None, ranks: Sequence[RankVerdict]) -> str:
    if not ranks:
        return "unknown"
    if root is None:
        running = any(r.outcome.cause == Cause.RUNNING for r in ranks)
        return "running" if running else "succeeded"
    if root.outcome.cause == Cause.ENGINE:
        return "stopped"
    return "failed"


def _order(story: RankStory) -> tuple[int, int, str]:
    return (0 if story.rank is not None else 1, story.rank or 0, story.label)


def _wall_key(outcome: Outcome) -> float:
    return outcome.at if outcome.at is not None else float("inf")


def _mono_at(record: dict[str, Any], at: float | None) -> float | None:
    """The monotonic time of `at` on the record's machine (the record says both clocks at its writing)."""
    mono, wall = _float(record.get("mono")), _float(record.get("wall"))
    if mono is None or wall is None:
        return None
    return mono - (wall - at) if at is not None else mono


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: object, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


MAX_NODES = 65_536  # names one nodelist may expand to (Slurm's own limit on a job's nodes is lower)
_MAX_INDEX_DIGITS = 9


def expand_nodelist(text: object, limit: int = MAX_NODES) -> list[str]:
    """Slurm's compact host list ("n[1-3,7],gpu-a01") as names; what it cannot read, it keeps as is. At
    most `limit` names: a list that names more (`n[0-99999999]`, read from a shared file) is cut there,
    never expanded to gigabytes."""
    if not isinstance(text, str) or not text:
        return []
    names: list[str] = []
    for part in _split_top(text):
        for name in _expand(part):
            if len(names) >= limit:
                return names
            names.append(name)
    return names


def _expand(part: str) -> Iterator[str]:
    """One host or one bracketed range of hosts, lazily."""
    head, bracket, rest = part.partition("[")
    if not bracket or not rest.endswith("]"):
        yield part
        return
    for piece in rest[:-1].split(","):
        low, dash, high = piece.partition("-")
        if dash and _index(low) and _index(high):
            yield from (f"{head}{n:0{len(low)}d}" for n in range(int(low), int(high) + 1))
        else:
            yield head + piece


def _index(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= _MAX_INDEX_DIGITS


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]
