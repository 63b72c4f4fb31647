"""`jobwarden doctor`: what jobwarden can do on this machine, each check one line with ok/warn/fail and
the fix. The checks are pure functions of the facts `control.doctor.hostfacts` gathers, so each is tested
with facts written by hand: a Yama scope of 2, a 3.9 interpreter, a corrupt store.
"""

from __future__ import annotations

from pathlib import Path

from jobwarden.config import format_size
from jobwarden.control.doctor.facts import (
    FAIL as FAIL,
)
from jobwarden.control.doctor.facts import (
    OK as OK,
)
from jobwarden.control.doctor.facts import (
    WARN as WARN,
)
from jobwarden.control.doctor.facts import (
    Check as Check,
)
from jobwarden.control.doctor.facts import (
    ConfigFacts as ConfigFacts,
)
from jobwarden.control.doctor.facts import (
    HostFacts as HostFacts,
)
from jobwarden.control.doctor.facts import (
    Interpreter as Interpreter,
)
from jobwarden.control.doctor.facts import (
    StoreFacts as StoreFacts,
)
from jobwarden.control.doctor.facts import (
    Tool as Tool,
)

MIN_FREE_BYTES = 256 << 20  # below this a long job's log (and the store) will soon fill the disk
LOW_FREE_BYTES = 2 << 30
HOOKS_PYTHONS = ((3, 8), (3, 14))  # the injected hooks run on these (DESIGN: Python hooks)


# --- ptrace -----------------------------------------------------------------------------------------


def check_ptrace_scope(scope: int | None, cap_sys_ptrace: bool) -> Check:
    name = "ptrace scope"
    if scope is None:
        return Check(name, OK, "no Yama: the classic rules apply (same user, or CAP_SYS_PTRACE)")
    if scope == 0:
        return Check(name, OK, "Yama ptrace_scope=0: the classic rules apply (same user)")
    if scope == 1:
        if cap_sys_ptrace:
            return Check(
                name, OK, "Yama ptrace_scope=1, and we hold CAP_SYS_PTRACE: any process can be traced"
            )
        return Check(
            name,
            WARN,
            "Yama ptrace_scope=1: py-spy may attach only to processes that name the supervisor as their "
            "tracer; jobwarden's Python hooks do (PR_SET_PTRACER), so jobs run with --no-py-hooks and "
            "non-Python processes get no py-spy stacks",
            "keep the hooks on; for the rest run as root, or: sudo sysctl kernel.yama.ptrace_scope=0",
        )
    if scope == 2:
        if cap_sys_ptrace:
            return Check(name, OK, "Yama ptrace_scope=2 (admin only), and we hold CAP_SYS_PTRACE")
        return Check(
            name,
            WARN,
            "Yama ptrace_scope=2: only CAP_SYS_PTRACE may trace; py-spy cannot dump stacks, jobwarden "
            "falls back to faulthandler (Python frames only, no native ones)",
            "run jobwarden as root, or: sudo sysctl kernel.yama.ptrace_scope=1",
        )
    return Check(
        name,
        WARN,
        f"Yama ptrace_scope={scope}: ptrace is disabled until reboot; stacks come from faulthandler only",
        "set kernel.yama.ptrace_scope=1 in /etc/sysctl.d/ and reboot (3 cannot be lowered at run time)",
    )


def check_ptrace_attach(result: tuple[bool | None, str], scope: int | None) -> Check:
    name = "ptrace attach"
    ok, detail = result
    if ok:
        return Check(
            name, OK, "a child of ours attached to a sibling that declared us its tracer (as py-spy will)"
        )
    if ok is None:
        return Check(name, WARN, f"the attach probe could not run: {detail}")
    fix = (
        "in a container, add the capability: docker run --cap-add SYS_PTRACE (Kubernetes: "
        "securityContext.capabilities.add: [SYS_PTRACE])"
    )
    if scope is not None and scope >= 2:
        fix = "see ptrace scope above"
    return Check(
        name,
        WARN,
        f"attaching failed with {detail}: py-spy cannot dump stacks, jobwarden falls back to faulthandler",
        fix,
    )


# --- tools ------------------------------------------------------------------------------------------


def check_pyspy(tool: Tool | None) -> Check:
    name = "py-spy"
    if tool is None:
        return Check(
            name,
            WARN,
            "py-spy not found: hung jobs get faulthandler stacks only (Python frames, no native ones, "
            "none from a process stuck in C without the hooks)",
            "pip install py-spy (into jobwarden's environment, or anywhere on PATH)",
        )
    return Check(name, OK, f"{tool.version or 'version unknown'} at {tool.path}")


def check_gdb(tool: Tool | None) -> Check:
    name = "gdb"
    if tool is None:
        return Check(
            name,
            WARN,
            "gdb not found: no native stacks of non-Python processes (a hung C++ launcher, a shell)",
            "install it: sudo apt-get install gdb (or dnf install gdb)",
        )
    return Check(name, OK, f"{tool.version or 'version unknown'} at {tool.path}")


# --- containment, GPU, kernel -----------------------------------------------------------------------


def check_containment(
    containment: str | None,
    disabled: bool,
    enclosing: tuple[str, int | None] | None = None,
    in_container: bool = False,
) -> Check:
    """`enclosing`: the cgroup we run in, when it counts OOM kills (a container's own, read-only)."""
    name = "containment"
    if disabled:
        return Check(
            name,
            OK,
            "JOBWARDEN_CGROUP=off: jobs are contained by subreaper + /proc scanning (no --mem-limit, "
            "no cgroup OOM counters)",
        )
    if containment:
        kind, _, path = containment.partition(" ")
        return Check(
            name,
            OK,
            f"jobs get a {kind} cgroup under {Path(path).parent}: whole-tree containment, memory limits",
        )
    if enclosing is not None:
        from jobwarden.control.doctor.container import enclosing_counts

        message = (
            "no writable cgroup: jobs are contained by subreaper + /proc scanning (setsid and double forks "
            f"are still caught), --mem-limit by watching the tree's memory; {enclosing_counts(enclosing)}"
        )
        if in_container:  # nothing to fix: the container's own cgroup is the job's, read-only inside
            return Check(name, OK, message)
        return Check(
            name,
            WARN,
            message,
            "delegate a cgroup v2 subtree to your user (systemd-run --user --scope -p Delegate=yes ...), "
            "or run as root",
        )
    return Check(
        name,
        WARN,
        "no writable cgroup: jobs are contained by subreaper + /proc scanning (setsid and double forks "
        "are still caught), but --mem-limit and cgroup OOM counters are unavailable",
        "delegate a cgroup v2 subtree to your user (systemd-run --user --scope -p Delegate=yes ...), "
        "or run as root",
    )


def check_nvml(nvml: tuple[str, str, str], driver: bool) -> Check:
    name = "GPU (NVML)"
    status, detail, fix = nvml
    if status == "ok":
        return Check(name, OK, detail)
    if not driver:
        # one sentence, whatever else NVML's absence was put down to: no driver is the reason
        from jobwarden.probes.gpu import DRIVER_FILES

        missing = " and ".join(DRIVER_FILES)
        return Check(name, OK, f"no GPUs here: no NVIDIA driver ({missing} are missing); nothing to watch")
    if status == "no-module":
        return Check(
            name,
            WARN,
            f"{detail}: GPU memory, utilisation and stray GPU holders are not watched",
            fix or "pip install nvidia-ml-py (into jobwarden's environment)",
        )
    return Check(name, WARN, f"NVML could not be used: {detail}", fix or "check that `nvidia-smi` works")


def check_pidfd_exit(kernel: tuple[int, int], release: str, probe: tuple[bool | None, str]) -> Check:
    name = "exit status of non-children"
    ok, detail = probe
    if ok:
        return Check(name, OK, f"Linux {release}: PIDFD_INFO_EXIT works ({detail})")
    meaning = (
        "the exit status of processes jobwarden did not start itself (an adopted job, a Pool worker) is "
        "read from /proc while they are zombies, and is lost when their parent reaps them first"
    )
    if kernel < (6, 15):
        return Check(
            name,
            WARN,
            f"Linux {release} has no PIDFD_INFO_EXIT (needs 6.15): {meaning}",
            "upgrade the kernel to 6.15 or later",
        )
    return Check(name, WARN, f"Linux {release}: the PIDFD_INFO_EXIT probe failed ({detail}): {meaning}")


def check_short_lives(probe: tuple[bool, str], disabled: bool) -> Check:
    """How a process that lives a few milliseconds is still seen: the kernel's process events where this
    user may read them, the Python hooks' announcements and reaping reports always, for Python jobs."""
    name = "short-lived processes"
    ok, detail = probe
    if ok and not disabled:
        return Check(name, OK, f"seen by the kernel's process events ({detail}) and the Python hooks")
    why = "JOBWARDEN_PROC_EVENTS=off" if disabled else detail
    return Check(
        name,
        WARN,
        f"no kernel process events ({why}): a process that dies before the 1 s scan is known only from the "
        "Python hooks (its own announcement, or its Python parent's reaping); a non-Python child of a "
        "non-Python parent is missed",
        ""
        if disabled
        else "run on the host (not in a container's pid namespace), as root or on Linux >= 6.6",
    )


def check_interpreters(interpreters: tuple[Interpreter, ...]) -> Check:
    """The fork deadlock class of seed case S2: CPython 3.8-3.11 can deadlock a child forked while
    another thread holds an interpreter lock (gh-74580, gh-112275); 3.12 fixed the interpreter's own
    locks and warns about forking with threads."""
    name = "Python fork-lock"
    if not interpreters:
        return Check(name, OK, "no Python interpreter found on PATH or under pyenv")
    ordered = sorted(interpreters, key=lambda i: (i.source == "pyenv", i.version or (0, 0, 0)))
    affected = [i for i in ordered if i.version and (3, 8) <= i.version[:2] < (3, 12)]
    old = [i for i in ordered if i.version and i.version[:2] < HOOKS_PYTHONS[0]]
    if not affected and not old:
        versions = ", ".join(sorted({_v(i) for i in interpreters}))
        return Check(name, OK, f"interpreters found ({versions}) are past the fork-deadlock fixes (3.12+)")
    parts = []
    if affected:
        parts.append(
            f"{_list(affected)}: a fork() while another thread runs can deadlock the child inside the "
            "interpreter (CPython gh-74580 / gh-112275, 3.8-3.11); jobs on these can hang in fork-started "
            "multiprocessing or DataLoader workers (jobwarden names that fork-deadlock)"
        )
    if old:
        parts.append(f"{_list(old)}: older than 3.8, jobwarden's Python hooks do not run there")
    return Check(
        name,
        WARN,
        "; ".join(parts),
        "start workers with spawn or forkserver (jobwarden run --mp-start spawn, or "
        "multiprocessing.set_start_method('spawn')), and prefer Python 3.12 or later",
    )


def _v(i: Interpreter) -> str:
    return ".".join(str(n) for n in i.version) if i.version else "?"


def _list(interpreters: list[Interpreter]) -> str:
    """'3.11.2 (/usr/bin/python3), pyenv 3.9.18, 3.10.13': pyenv's own paths say nothing new."""
    on_path = [f"{_v(i)} ({i.path})" for i in interpreters if i.source != "pyenv"]
    pyenv = [_v(i) for i in interpreters if i.source == "pyenv"]
    return ", ".join(on_path + ([f"pyenv {', '.join(pyenv)}"] if pyenv else []))


# --- the store --------------------------------------------------------------------------------------


def check_store(store: StoreFacts) -> Check:
    name = "store"
    db = store.database
    if not store.exists:
        return Check(name, OK, f"no database yet at {db} (the first `jobwarden run` creates it)")
    corrupt_fix = f"move it aside (mv {db} {db}.corrupt); jobwarden starts a new one, logs stay under jobs/"
    if store.error:
        return Check(name, FAIL, f"cannot read {db}: {store.error}", corrupt_fix)
    if store.integrity != "ok":
        return Check(name, FAIL, f"{db} failed PRAGMA integrity_check: {store.integrity}", corrupt_fix)
    schema = store.schema or 0
    if schema > store.latest:
        return Check(
            name,
            FAIL,
            f"{db} has schema {schema}, newer than this jobwarden knows ({store.latest})",
            "upgrade jobwarden, or point JOBWARDEN_HOME at another directory",
        )
    if schema < store.latest:
        return Check(
            name, OK, f"{db}: integrity ok, schema {schema} (migrated to {store.latest} on next use)"
        )
    return Check(name, OK, f"{db}: integrity ok, schema {schema}")


def check_store_place(home: Path, database: Path, fs_type: str | None, moved: bool) -> Check:
    """Where the database is, and why: SQLite's WAL needs every user of a database on one host."""
    name = "store location"
    if moved:
        return Check(
            name,
            OK,
            f"database on local disk at {database}: {home} is on {fs_type} (no SQLite WAL there); "
            f"logs and group records stay under {home}",
        )
    return Check(name, OK, f"database in {home} ({fs_type or 'file system type unknown'}, local)")


def check_home(home: Path, mode: int | None, uid: int | None, euid: int) -> Check:
    name = "home"
    if mode is None:
        return Check(name, OK, f"{home} does not exist yet (created 0700 on first use)")
    if uid is not None and uid != euid:
        return Check(
            name,
            FAIL,
            f"{home} belongs to uid {uid}, not to you (uid {euid})",
            "point JOBWARDEN_HOME at a directory you own, or fix the owner: sudo chown -R $USER " + str(home),
        )
    if mode & 0o077:
        return Check(
            name,
            WARN,
            f"{home} has mode {mode & 0o777:04o}: other users can read job logs and command lines",
            f"chmod 700 {home}",
        )
    return Check(name, OK, f"{home} is private (0700)")


def check_disk(home: Path, free: int | None) -> Check:
    name = "disk space"
    if free is None:
        return Check(name, WARN, f"cannot tell the free space under {home}")
    if free < MIN_FREE_BYTES:
        return Check(
            name,
            FAIL,
            f"only {format_size(free)} free under {home}: job logs and the store will fill it",
            "free space there, or point JOBWARDEN_HOME at a larger filesystem",
        )
    if free < LOW_FREE_BYTES:
        return Check(
            name, WARN, f"{format_size(free)} free under {home}: a chatty job can fill it", "free some space"
        )
    return Check(name, OK, f"{format_size(free)} free under {home}")


def check_config(config: ConfigFacts) -> Check:
    name = "config file"
    if config.error:
        what = config.error.removeprefix("config file ")  # the check's name says it
        return Check(name, FAIL, what, f"fix it, or move it aside: mv {config.path} {config.path}.off")
    if not config.exists:
        return Check(name, OK, f"none at {config.path}: run's built-in defaults apply")
    sets = "; ".join(config.settings) if config.settings else "nothing"
    return Check(name, OK, f"{config.path} sets {sets} (a flag given to `run` wins)")


def run_checks(facts: HostFacts) -> list[Check]:
    """Every check, in a stable order; the container's only inside one, the config file's where it was
    looked for (`doctor` does; facts written by hand in tests may not)."""
    from jobwarden.control.doctor.container import check_container

    inside = [check_container(facts)] if facts.container else []
    config = [] if facts.config is None else [check_config(facts.config)]
    return [
        *inside,
        check_ptrace_scope(facts.yama_scope, facts.cap_sys_ptrace),
        check_ptrace_attach(facts.ptrace_attach, facts.yama_scope),
        check_pyspy(facts.pyspy),
        check_gdb(facts.gdb),
        check_containment(
            facts.containment, facts.cgroup_disabled, facts.enclosing_oom, bool(facts.container)
        ),
        check_nvml(facts.nvml, facts.nvidia_driver),
        check_pidfd_exit(facts.kernel, facts.kernel_release, facts.pidfd_exit),
        check_short_lives(facts.proc_events, facts.proc_events_disabled),
        check_interpreters(facts.interpreters),
        check_store(facts.store),
        check_store_place(facts.home, facts.store.database, facts.database_fs, facts.database_moved),
        check_home(facts.home, facts.home_mode, facts.home_uid, facts.euid),
        check_disk(facts.home, facts.free_bytes),
        *config,
    ]


def report_json(checks: list[Check]) -> dict[str, object]:
    return {
        "ok": all(c.status != FAIL for c in checks),
        "failed": sum(c.status == FAIL for c in checks),
        "warnings": sum(c.status == WARN for c in checks),
        "checks": [c.to_json() for c in checks],
    }
