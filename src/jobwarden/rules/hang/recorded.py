"""`collective-hang` from the ranks' flight recorders: the finding that names the rank the others wait for,
the call it made instead (or that it made none) and where, from the comparison in rules.hang.desync."""

from __future__ import annotations

import os

from jobwarden.model import Finding
from jobwarden.observations import CollectiveCall, Frame, ProcessStack, RankRecorder
from jobwarden.rules import frames
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.hang import desync
from jobwarden.rules.lookup import Lookup

MAX_LINES = 8
_C10D = "torch/distributed/distributed_c10d.py"


def finding(ev: RunEvidence, look: Lookup, remedy_tail: str) -> Finding | None:
    """The finding where the recorders show the ranks parting, None where they do not (or none answered)."""
    found = desync.first_divergence(ev.recorders)
    if found is None:
        return None
    culprit = found.culprits[0]
    evidence = [_rank_line(found, r, look) for r in [*found.culprits, *found.waiting][:MAX_LINES]]
    if found.agreed is not None:
        evidence.append(f"the ranks agree up to {found.agreed.op} #{found.agreed.seq}")
    evidence.append(f"from each rank's PyTorch flight recorder, process group {_group(found)}")
    return Finding(
        "collective-hang",
        _title(found, look),
        _summary(found),
        "error",
        tuple(evidence),
        _remedy(found, look) + remedy_tail,
        tuple(dict.fromkeys(r.pid for r in [*found.culprits, *found.waiting])),
        rank=culprit.rank,
    )


def ranks_text(ranks: list[int]) -> str:
    """'rank 1', 'ranks 0 and 1', 'ranks 0, 1 and 2'."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"


def _who(recorders: tuple[RankRecorder, ...]) -> str:
    ranks = [r.rank for r in recorders]
    if all(r is not None for r in ranks):
        return ranks_text([r for r in ranks if r is not None])
    return "pid " + ", ".join(str(r.pid) for r in recorders)


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _site(call: CollectiveCall | None, stack: ProcessStack | None) -> Frame | None:
    """The job's own frame that made the call (torch's frames are the library's). The recorder has the
    call's stack only once torch has symbolised it (its first time costs a rank a second or more, which a
    judgement does not always wait for); the rank's own stack shows the same call while it still waits
    in it."""
    if call is None:
        return None
    site = next((f for f in call.frames if not frames.is_library(f)), None)
    if site is not None or call.done or stack is None:
        return site
    for thread in stack.threads:
        if any(not f.native and frames.name(f) == call.op and frames.is_in(f, _C10D) for f in thread.frames):
            return frames.call_site(thread)
    return None


def _short_site(call: CollectiveCall | None, stack: ProcessStack | None) -> str:
    site = _site(call, stack)
    if site is None:
        return ""
    line = f":{site.line}" if site.line is not None else ""
    return f" ({os.path.basename(site.file)}{line})"


def _shape(call: CollectiveCall) -> str:
    return ", ".join(str(list(s)) for s in call.sizes) or "no tensor"


def _title(d: desync.Divergence, look: Lookup) -> str:
    who, others = _who(d.culprits), _who(d.waiting)
    verb = "wait" if len(d.waiting) > 1 else "waits"
    want = f"{d.expected.op} #{d.seq}"
    if d.missing:
        waiter = d.waiting[0].pid
        site = _short_site(d.expected, look.stacks.get(waiter))
        return f"{_capital(who)} never called {want}, where {others} {verb}{site}"
    stray = d.calls[d.culprits[0].pid]
    stray_site = _short_site(stray, look.stacks.get(d.culprits[0].pid))
    assert stray is not None
    if stray.op == d.expected.op:  # another shape
        return (
            f"{_capital(who)} called {stray.op} on {_shape(stray)}{stray_site} where {others} {verb} "
            f"in {want} on {_shape(d.expected)}"
        )
    return f"{_capital(who)} called {stray.op}{stray_site} where {others} {verb} in {want}"


def _summary(d: desync.Divergence) -> str:
    who, others = _who(d.culprits), _who(d.waiting)
    want = f"{d.expected.op} #{d.seq}"
    if d.missing:
        return (
            f"{_capital(others)} called {want} and {who} never did: it is behind (computing, loading data, "
            "stuck outside any collective) or skipped a collective the others made; they wait for it."
        )
    strays = sorted({c.op for r in d.culprits if (c := d.calls[r.pid]) is not None})
    text = (
        f"At collective #{d.seq} of process group {_group(d)}, {others} called {d.expected.op} and {who} "
        f"called {' and '.join(strays)}: the ranks took different code paths, and each waits for peers that "
        "will never join its call."
    )
    if not d.sure:
        basis = (
            f"the ranks' last common collective (#{d.agreed.seq}) was {d.agreed.op} too"
            if d.agreed is not None and d.agreed.op == d.expected.op
            else f"{d.expected.op} is the collective every data-parallel step calls"
        )
        text += (
            f" As many ranks are on each side: {who} is named as the one that strayed because {basis}; if "
            f"{others} strayed instead, the same evidence shows it."
        )
    return text


def _group(d: desync.Divergence) -> str:
    desc = d.expected.group_desc
    return f"{d.group} ({desc})" if desc and desc != "undefined" else d.group


def _rank_line(d: desync.Divergence, r: RankRecorder, look: Lookup) -> str:
    who = f"rank {r.rank} (pid {r.pid})" if r.rank is not None else f"pid {r.pid}"
    call = d.calls.get(r.pid)
    if call is None:
        last = max((c for c in r.calls if c.group == d.group), key=lambda c: c.seq, default=None)
        text = f"{who}: no collective #{d.seq}"
        if last is not None:
            text += f"; its last is {last.op} #{last.seq}{_called(last)}"
        stack = look.stacks.get(r.pid)
        thread = frames.main_thread(stack) if stack else None
        if thread is not None and thread.frames:
            text += f"; now at {frames.path_of(thread.frames, 3)}"
        return text
    state = "done" if call.done else "waiting"
    return f"{who}: {call.op} #{d.seq} on {_shape(call)}{_called(call, look.stacks.get(r.pid))}, {state}"


def _called(call: CollectiveCall, stack: ProcessStack | None = None) -> str:
    site = _site(call, stack)
    return f", called from {frames.where(site)}" if site else ""


def _remedy(d: desync.Divergence, look: Lookup) -> str:
    who = _who(d.culprits[:1])
    site = _site(d.calls.get(d.culprits[0].pid), look.stacks.get(d.culprits[0].pid))
    where = f" at {frames.where(site)}" if site else ""
    if d.missing:
        return (
            f"Start with {who}: find why it did not reach {d.expected.op} #{d.seq} (its stack shows where it "
            "is), or which condition made it skip a collective the others call. "
        )
    return (
        f"Start with {who}{where}: every rank must call the same collectives in the same order with the "
        "same shapes; a branch that depends on the rank, or on data that differs between ranks, breaks "
        "that. "
    )
