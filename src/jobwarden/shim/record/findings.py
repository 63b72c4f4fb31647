"""Findings with a life. The shim records each live finding once, when it becomes true, and marks it
resolved, with the moment, when it stops being true: the stopped process was continued, the hung run
showed progress again, the GPU computes again. `ps`, `top` and the web show only the current ones;
`explain` tells a run that recovered apart from one that is stuck.

The same finding (rule and pids) is not recorded twice while it is current; once resolved, it may come
back, as a new finding with a moment of its own. While current it is kept as last seen (`refresh`): a
speed finding's figures move as the job goes on, and a stale "3.0x" would mislead.

Any rule that is judged again and again (the speed rules too) resolves its findings the same way:
`resolve_where` with what is still true.

Every write goes through the shim's writer (shim.record.recorder), which keeps them, in order and with their
own moments, while another process holds the store's lock: a resolution or an update names its finding
by the finding itself (its moment and body), not by a row id that a deferred insert does not have yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from jobwarden.model import Finding
from jobwarden.store import Store

Key = tuple[str, tuple[int, ...]]

# A current finding is rewritten at once when its title or severity changes; when only its summary or
# evidence moved (a share, a count), at most this often: those move at every judgement
REFRESH_EVERY_S = 60.0


def key_of(finding: Finding) -> Key:
    return finding.rule, tuple(sorted(finding.pids))


class LiveFindings:
    """The current findings of one run, as recorded in the store. `write(method, *args)` calls a Store
    method for the run (job id and run prepended), now or once the store's lock is free."""

    def __init__(self, store: Store, write: Callable[..., bool]) -> None:
        self.store, self.write = store, write
        self._current: dict[Key, Finding] = {}
        self._written_at: dict[Key, float] = {}  # when each current finding's text was last stored
        # told of each batch of findings recorded as new (the automatic profile on a speed finding)
        self.listeners: list[Callable[[list[Finding]], None]] = []

    def is_new(self, finding: Finding) -> bool:
        return key_of(finding) not in self._current

    def record(self, findings: Sequence[Finding], at: float) -> list[Finding]:
        """Store the findings not already current, as true since `at` (or their own `at`); those stored."""
        new = []
        for finding in findings:
            key = key_of(finding)
            if key in self._current:
                continue
            since = finding.at if finding.at is not None else at
            finding = finding._replace(at=since, resolved_at=None)
            self.write(self.store.add_finding, since, finding)
            self._current[key] = finding
            self._written_at[key] = at
            new.append(finding)
        if new:
            for listener in self.listeners:
                listener(new)
        return new

    def refresh(self, findings: Iterable[Finding], at: float) -> list[Finding]:
        """Keep the current findings among `findings` as last seen (same moment, the latest text); those
        rewritten. A finding not current is left to `record`."""
        rewritten = []
        for finding in findings:
            key = key_of(finding)
            stored = self._current.get(key)
            if stored is None:
                continue
            latest = finding._replace(at=stored.at, resolved_at=None)
            if latest == stored:
                continue
            headline_moved = (latest.title, latest.severity) != (stored.title, stored.severity)
            if not headline_moved and at - self._written_at.get(key, at) < REFRESH_EVERY_S:
                continue
            self.write(self.store.update_finding, stored, latest)
            self._current[key], self._written_at[key] = latest, at
            rewritten.append(latest)
        return rewritten

    def resolve_where(self, stopped_being_true: Callable[[Finding], bool], at: float) -> list[Finding]:
        """Mark resolved at `at` every current finding for which `stopped_being_true` says so; those."""
        done = []
        for key, finding in list(self._current.items()):
            if not stopped_being_true(finding):
                continue
            del self._current[key]
            self._written_at.pop(key, None)
            self.write(self.store.resolve_finding, finding, at)
            done.append(finding._replace(resolved_at=at))
        return done

    def resolve_rules(self, rules: Iterable[str], at: float) -> list[Finding]:
        wanted = frozenset(rules)
        return self.resolve_where(lambda f: f.rule in wanted, at)

    def current(self, rule: str | None = None) -> list[Finding]:
        return [f for f in self._current.values() if rule is None or f.rule == rule]
