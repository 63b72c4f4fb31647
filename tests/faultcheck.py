"""What probes.faultdump checks before it sends a job's Python its fault signal, as one question for the
tests of the hooks' adverts (unit and integration): would the process handle the signal now?"""

from __future__ import annotations

from jobwarden.errors import AccessDenied
from jobwarden.osapi import asking
from jobwarden.osapi.procfs import ProcFS
from jobwarden.probes.pyhooks import HookAdvert, writes_to_its_file


def may_signal(advert: HookAdvert, procfs: ProcFS) -> bool:
    """`osapi.asking`: the same process, the same interpreter, and the signal caught; and the descriptor
    faulthandler writes to still the advertised stacks file."""
    if not advert.dumps_on_signal or not writes_to_its_file(advert, procfs):
        return False
    try:
        answer = asking.will_handle(procfs, advert.process, advert.fault_signal, advert.program)
    except AccessDenied:
        return False
    return answer is asking.Answer.HANDLED
