"""Gather the facts `jobwarden doctor` judges: by reading settings, and by trying (a ptrace attach, a
pidfd exit status, a cgroup made and removed). Nothing here is changed for good."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import sys
from pathlib import Path

from jobwarden import config
from jobwarden.control.doctor.facts import ConfigFacts, HostFacts, Interpreter, StoreFacts, Tool
from jobwarden.osapi import capabilities as caps
from jobwarden.osapi.cgroup import create_job_cgroup, enclosing_cgroup
from jobwarden.osapi.shell import python_version, version_of
from jobwarden.paths import Layout
from jobwarden.store.schema import LATEST

_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?")


def gather(home: Path) -> HostFacts:
    """Probes that fork come first: nothing here starts a thread or opens the store before them."""
    attach = caps.probe_ptrace_attach()
    pidfd_exit = caps.probe_pidfd_exit_info()
    proc_events = probe_proc_events()
    disabled = os.environ.get(config.CGROUP_ENV, "auto") == "off"
    container, pid1, pid_namespace, enclosing_oom, kernel_log = container_fields()
    mode = uid = None
    with contextlib.suppress(OSError):
        st = home.stat()
        mode, uid = st.st_mode, st.st_uid
    return HostFacts(
        euid=os.geteuid(),
        yama_scope=caps.yama_ptrace_scope(),
        cap_sys_ptrace=caps.has_capability(caps.CAP_SYS_PTRACE),
        ptrace_attach=(attach.ok, attach.detail),
        pyspy=find_tool("py-spy"),
        gdb=find_tool("gdb"),
        cgroup_disabled=disabled,
        containment=None if disabled else probe_containment(),
        nvml=probe_nvml(),
        nvidia_driver=Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists(),
        kernel=caps.kernel_version(),
        kernel_release=os.uname().release,
        pidfd_exit=(pidfd_exit.ok, pidfd_exit.detail),
        proc_events=proc_events,
        proc_events_disabled=os.environ.get(config.PROC_EVENTS_ENV, "auto") == "off",
        interpreters=tuple(find_interpreters()),
        store=store_facts(Layout(home).database),
        database_fs=Layout(home).database_place.fs_type,
        database_moved=Layout(home).database_place.moved,
        home=home,
        home_mode=mode,
        home_uid=uid,
        free_bytes=free_bytes(home),
        config=config_facts(),
        container=container,
        pid1=pid1,
        pid_namespace=pid_namespace,
        enclosing_oom=enclosing_oom,
        kernel_log=kernel_log,
    )


def container_fields() -> tuple[tuple[str, ...], str | None, bool, tuple[str, int | None] | None, str | None]:
    """What says we are in a container, and what can be seen there: the cgroup we run in (does it count
    OOM kills, what is its limit), the kernel log, the pid namespace."""
    from jobwarden.osapi.container import container_facts
    from jobwarden.probes.kmsg import KernelLog

    facts = container_facts(os.environ)
    markers = (*facts.markers, "PID 1") if facts.pid == 1 and not facts.markers else facts.markers
    enclosing = enclosing_cgroup()
    stats = enclosing.memory_stats() if enclosing is not None else None
    log = KernelLog()
    log.open_after(None)
    log.close()
    pid1 = None
    with contextlib.suppress(OSError):
        pid1 = Path("/proc/1/comm").read_text().strip()
    where = f"cgroup-v{enclosing.version} {enclosing.path}" if enclosing is not None else None
    return (
        markers if facts.inside else (),
        pid1,
        not caps.in_initial_pid_namespace(),
        (where, stats.limit_bytes if stats else None) if where is not None else None,
        log.error,
    )


def config_facts() -> ConfigFacts:
    from jobwarden.control.configfile import config_path, load_config
    from jobwarden.errors import JobwardenError

    path = config_path()
    try:
        found = load_config()
    except JobwardenError as err:
        return ConfigFacts(path, True, error=err.message)
    if found is None:
        return ConfigFacts(path, False)
    return ConfigFacts(path, True, tuple(found.shown()))


def probe_proc_events() -> tuple[bool, str]:
    from jobwarden.osapi.procevents import probe

    return probe()


def find_tool(name: str) -> Tool | None:
    """On PATH, or next to the running interpreter (a virtual environment's bin/, where pip puts it)."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    return Tool(path, version_of(path)) if path else None


def probe_containment() -> str | None:
    """Make the cgroup `run` would make, and remove it again."""
    cgroup = create_job_cgroup(f"jobwarden-doctor-{os.getpid()}")
    if cgroup is None:
        return None
    cgroup.remove()
    return f"cgroup-v{cgroup.version} {cgroup.path}"


def probe_nvml() -> tuple[str, str, str]:
    """(status, what was found, the fix): "ok", "no-module" (nvidia-ml-py missing) or "unavailable"."""
    from jobwarden.probes.gpu import GpuProbe, try_open_gpu_probe

    try:
        probe = try_open_gpu_probe()
    except Exception as err:  # a broken driver must not break doctor
        return ("unavailable", f"{type(err).__name__}: {err}", "check that `nvidia-smi` works")
    if not isinstance(probe, GpuProbe):
        status = "no-module" if "not installed" in probe.reason else "unavailable"
        return (status, probe.reason, probe.remedy)
    try:
        count = len(probe.devices())
    except Exception as err:
        return (
            "unavailable",
            f"NVML started but cannot list the GPUs: {err}",
            "check that `nvidia-smi` works",
        )
    finally:
        probe.close()
    where = "" if probe.source == "nvml" else f" ({probe.source})"
    return ("ok", f"NVML works{where}: {config.counted(count, 'GPU')}", "")


def find_interpreters() -> list[Interpreter]:
    """python, python3, python3.X on PATH, and every pyenv version; each asked its own version."""
    candidates: list[tuple[str, str]] = []
    for directory in os.environ.get("PATH", os.defpath).split(os.pathsep):
        if Path(directory).name == "shims":
            continue  # pyenv's shims are scripts naming whichever version is selected: seen below
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(directory or ".")):
                if _PYTHON_NAME.fullmatch(entry):
                    candidates.append((os.path.join(directory, entry), "PATH"))
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    with contextlib.suppress(OSError):
        for version_dir in sorted(pyenv.iterdir()):
            for name in ("python", "python3"):
                if (version_dir / "bin" / name).exists():
                    candidates.append((str(version_dir / "bin" / name), "pyenv"))
                    break
    found, seen = [], set()
    for path, source in candidates:
        real = os.path.realpath(path)
        if real in seen or not os.access(path, os.X_OK) or os.path.isdir(path):
            continue
        seen.add(real)
        found.append(Interpreter(path, python_version(path), source))
    return found


def store_facts(database: Path) -> StoreFacts:
    """Read-only: doctor never migrates or creates the store."""
    if not database.exists():
        return StoreFacts(database, exists=False, latest=LATEST)
    try:
        conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error as err:
        return StoreFacts(database, True, latest=LATEST, error=str(err))
    try:
        rows = conn.execute("PRAGMA integrity_check").fetchall()
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.Error as err:
        return StoreFacts(database, True, latest=LATEST, error=str(err))
    finally:
        conn.close()
    problems = [str(r[0]) for r in rows]
    integrity = "ok" if problems == ["ok"] else "; ".join(problems[:3])
    return StoreFacts(database, True, integrity, version, LATEST)


def free_bytes(home: Path) -> int | None:
    """Free space for us under the home, or under its nearest existing parent."""
    path = home
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None
