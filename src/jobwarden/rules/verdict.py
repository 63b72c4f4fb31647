"""Every rule family over one run's evidence, combined into one list: the root cause first. The rules and
their order are one table, rules.table.

The order follows causality, as an incident report is read:
1. resources that ran out (oom-kill, cuda-oom): they kill workers and processes;
2. a worker that died (pool-worker-lost, dataloader-worker-killed): its parent then hangs or fails;
3. processes that cannot run (process-stopped, uninterruptible-io): whatever waits on them hangs;
4. hang signatures (fork-deadlock, then collective-hang: a rank stuck on a fork deadlock leaves its peers
   waiting in the collective), and no-progress only when nothing above explains the hang;
5. how the run ended: one exit-status finding (stopped-by-user, timeout, python-exception, ...), which is
   often the consequence of the above (the user stopped the hung run; the DataLoader's RuntimeError);
6. symptoms (gpu-idle) and the aftermath (orphans-left, supervisor-lost).
"""

from __future__ import annotations

from collections.abc import Sequence

from jobwarden.model import Finding, root_cause_rank
from jobwarden.rules import arrange, death
from jobwarden.rules.disk import disk_full_cause
from jobwarden.rules.evidence import RunEvidence
from jobwarden.rules.table import CAUSES, EXPLAINS_A_HANG, ORDER, RULES

__all__ = ["ORDER", "collect", "explain", "order", "rank"]
rank = root_cause_rank  # a rule's place in ORDER; strays come last


def explain(ev: RunEvidence) -> list[Finding]:
    """Every family's findings, the root cause first."""
    return order(collect(ev), ev)


def order(found: Sequence[Finding], ev: RunEvidence) -> list[Finding]:
    """The families' order, then the causal one across the tree (rules.causal, rules.arrange): a process
    that failed before the others leads, whatever its rule. Each finding carries the rank of the process
    it is about."""
    ranked = sorted(found, key=_place)
    return [_with_rank(f, ev) for f in arrange.arrange(found, ev, ranked)]


def _place(finding: Finding) -> int:
    """A finding's place in the order: its rule's, but a full disk that ended the run takes the place
    of the exit-status finding it replaced (rules.disk)."""
    if finding.rule == "disk-full" and finding.severity == "error":
        return rank("exit-code")
    return rank(finding.rule)


def _with_rank(finding: Finding, ev: RunEvidence) -> Finding:
    if finding.rank is not None or not finding.pids:
        return finding
    pid = finding.pids[0]
    ranks = [d.rank for d in ev.deaths if d.pid == pid] + [p.rank for p in ev.processes if p.pid == pid]
    return finding._replace(rank=next((r for r in ranks if r is not None), None))


def collect(ev: RunEvidence) -> list[Finding]:
    """Every family's findings over one run, in no particular order."""
    found: list[Finding] = []
    for rule in RULES:
        if rule.judge is None or (rule.if_unexplained and any(f.rule in EXPLAINS_A_HANG for f in found)):
            continue
        finding = rule.judge(ev)
        if finding is not None:
            found.append(finding)
    ended = death.exit_finding(ev)
    causes = [f for f in found if f.rule in CAUSES]
    # a bare "exited with code N" says "no clearer sign why": not when there is one (a cause, or the disk
    # still full when the job exited, which then takes its place)
    disk = None if causes else disk_full_cause(ev, ended)
    if ended is not None and not (ended.rule == "exit-code" and ev.signal is None and (causes or disk)):
        found.append(ended)
    found += death.aftermath_findings(ev, disk)
    return found
