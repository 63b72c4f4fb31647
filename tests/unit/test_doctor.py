"""The doctor's checks as pure functions of hand-written facts: each verdict, and each fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobwarden.control.doctor import checks as doctor
from jobwarden.control.doctor.checks import (
    FAIL,
    OK,
    WARN,
    HostFacts,
    Interpreter,
    StoreFacts,
    Tool,
    check_containment,
    check_disk,
    check_home,
    check_interpreters,
    check_nvml,
    check_pidfd_exit,
    check_ptrace_attach,
    check_ptrace_scope,
    check_pyspy,
    check_store,
    report_json,
    run_checks,
)

HOME = Path("/home/ana/.local/state/jobwarden")
DB = HOME / "jobwarden.db"


def py(
    version: tuple[int, int, int] | None, path: str = "/usr/bin/python3", source: str = "PATH"
) -> Interpreter:
    return Interpreter(path, version, source)


# --- ptrace -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "cap", "status", "words"),
    [
        (None, False, OK, "no Yama"),
        (0, False, OK, "ptrace_scope=0"),
        (1, False, WARN, "PR_SET_PTRACER"),
        (1, True, OK, "CAP_SYS_PTRACE"),
        (2, False, WARN, "only CAP_SYS_PTRACE"),
        (2, True, OK, "CAP_SYS_PTRACE"),
        (3, True, WARN, "disabled until reboot"),
    ],
)
def test_ptrace_scope(scope: int | None, cap: bool, status: str, words: str) -> None:
    check = check_ptrace_scope(scope, cap)
    assert (check.status, words in check.message) == (status, True)
    assert bool(check.fix) == (status != OK)


def test_scope_2_names_the_sysctl_that_lowers_it() -> None:
    assert "kernel.yama.ptrace_scope=1" in check_ptrace_scope(2, False).fix


def test_a_failed_attach_points_at_the_container_capability() -> None:
    check = check_ptrace_attach((False, "EPERM (Operation not permitted)"), None)
    assert check.status == WARN and "EPERM" in check.message and "SYS_PTRACE" in check.fix
    assert check_ptrace_attach((True, "attached"), None).status == OK
    assert check_ptrace_attach((None, "fork failed"), None).status == WARN


# --- tools, containment, GPU, kernel --------------------------------------------------------------------


def test_py_spy_missing_says_how_to_install_it() -> None:
    assert "pip install py-spy" in check_pyspy(None).fix
    found = check_pyspy(Tool("/venv/bin/py-spy", "py-spy 0.4.3"))
    assert found.status == OK and "py-spy 0.4.3 at /venv/bin/py-spy" in found.message


def test_containment() -> None:
    cgroup = check_containment("cgroup-v1 /sys/fs/cgroup/memory/user/jobwarden-doctor-9", False)
    assert (
        cgroup.status == OK
        and "cgroup-v1" in cgroup.message
        and "/sys/fs/cgroup/memory/user" in cgroup.message
    )
    none = check_containment(None, False)
    assert none.status == WARN and "subreaper" in none.message and "Delegate=yes" in none.fix
    assert check_containment(None, True).status == OK


@pytest.mark.parametrize(
    ("nvml", "driver", "status", "words"),
    [
        (
            ("no-module", "pynvml is not installed", "pip install nvidia-ml-py"),
            False,
            OK,
            "no GPUs here: no NVIDIA",
        ),
        (("no-module", "pynvml is not installed", "pip install nvidia-ml-py"), True, WARN, "not installed"),
        (("unavailable", "NVML cannot start", "reboot"), True, WARN, "NVML could not be used"),
        (("ok", "NVML works: 8 GPUs", ""), True, OK, "8 GPUs"),
    ],
)
def test_nvml(nvml: tuple[str, str, str], driver: bool, status: str, words: str) -> None:
    check = check_nvml(nvml, driver)
    assert check.status == status and words in check.message
    assert check.fix == ("" if status == OK else nvml[2])


def test_pidfd_exit_info_needs_6_15() -> None:
    old = check_pidfd_exit((6, 1), "6.1.0", (False, "the kernel does not report PIDFD_INFO_EXIT"))
    assert old.status == WARN and "needs 6.15" in old.message and "6.15" in old.fix
    assert check_pidfd_exit((6, 18), "6.18.4", (True, "read back")).status == OK
    broken = check_pidfd_exit((6, 16), "6.16.0", (False, "wrong status"))
    assert broken.status == WARN and "probe failed" in broken.message


# --- interpreters ------------------------------------------------------------------------------------


def test_pythons_3_8_to_3_11_are_flagged_with_the_fork_deadlock_remedy() -> None:
    check = check_interpreters(
        (
            py((3, 11, 2)),
            py((3, 9, 18), "/p/3.9.18/bin/python", "pyenv"),
            py((3, 12, 1), "/p/3.12/bin/python", "pyenv"),
        )
    )
    assert check.status == WARN
    assert "3.11.2 (/usr/bin/python3)" in check.message and "pyenv 3.9.18" in check.message
    assert "3.12.1" not in check.message
    assert "gh-74580" in check.message and "deadlock" in check.message
    assert "spawn" in check.fix and "3.12" in check.fix


def test_pythons_3_12_and_later_pass() -> None:
    check = check_interpreters((py((3, 12, 1)), py((3, 13, 0), "/usr/bin/python3.13")))
    assert check.status == OK and "3.12.1" in check.message


def test_pythons_older_than_the_hooks_are_named() -> None:
    check = check_interpreters((py((2, 7, 18), "/p/2.7/bin/python", "pyenv"),))
    assert check.status == WARN and "older than 3.8" in check.message and "gh-74580" not in check.message


def test_an_interpreter_that_would_not_say_its_version_is_not_flagged() -> None:
    assert check_interpreters((py(None),)).status == OK
    assert check_interpreters(()).status == OK


# --- store, home, disk -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("facts", "status", "words"),
    [
        (StoreFacts(DB, False, latest=3), OK, "no database yet"),
        (StoreFacts(DB, True, "ok", 3, 3), OK, "integrity ok, schema 3"),
        (StoreFacts(DB, True, "ok", 2, 3), OK, "migrated to 3"),
        (StoreFacts(DB, True, "ok", 4, 3), FAIL, "newer than this jobwarden"),
        (StoreFacts(DB, True, "*** in database main *** Page 3: btree", 3, 3), FAIL, "integrity_check"),
        (StoreFacts(DB, True, latest=3, error="file is not a database"), FAIL, "not a database"),
    ],
)
def test_store(facts: StoreFacts, status: str, words: str) -> None:
    check = check_store(facts)
    assert check.status == status and words in check.message


def test_a_corrupt_store_is_moved_aside() -> None:
    assert f"mv {DB} {DB}.corrupt" in check_store(StoreFacts(DB, True, "bad", 3, 3)).fix


def test_home_permissions() -> None:
    assert check_home(HOME, None, None, 1000).status == OK
    assert check_home(HOME, 0o40700, 1000, 1000).status == OK
    shared = check_home(HOME, 0o40755, 1000, 1000)
    assert shared.status == WARN and "0755" in shared.message and shared.fix == f"chmod 700 {HOME}"
    assert check_home(HOME, 0o40700, 0, 1000).status == FAIL


def test_disk_space_thresholds() -> None:
    assert check_disk(HOME, 100 << 30).status == OK
    assert check_disk(HOME, 1 << 30).status == WARN
    full = check_disk(HOME, 10 << 20)
    assert full.status == FAIL and "10.0M free" in full.message
    assert check_disk(HOME, None).status == WARN


# --- the whole report ------------------------------------------------------------------------------


def facts(**changes: object) -> HostFacts:
    base: dict[str, object] = {
        "euid": 1000,
        "yama_scope": None,
        "cap_sys_ptrace": False,
        "ptrace_attach": (True, "attached"),
        "pyspy": Tool("/usr/bin/py-spy", "py-spy 0.4.3"),
        "gdb": Tool("/usr/bin/gdb", "GNU gdb 13.1"),
        "cgroup_disabled": False,
        "containment": "cgroup-v2 /sys/fs/cgroup/user.slice/jobwarden-1",
        "nvml": ("no-module", "pynvml is not installed", "pip install nvidia-ml-py"),
        "nvidia_driver": False,
        "kernel": (6, 18),
        "kernel_release": "6.18.0",
        "pidfd_exit": (True, "read back"),
        "proc_events": (True, "netlink CN_PROC"),
        "proc_events_disabled": False,
        "interpreters": (py((3, 12, 1)),),
        "store": StoreFacts(DB, True, "ok", 3, 3),
        "home": HOME,
        "home_mode": 0o40700,
        "home_uid": 1000,
        "free_bytes": 50 << 30,
        **changes,
    }
    return HostFacts(**base)  # type: ignore[arg-type]


def test_a_healthy_machine_passes_every_check() -> None:
    checks = run_checks(facts())
    assert [c.status for c in checks] == [OK] * len(checks)
    assert report_json(checks)["ok"] is True
    assert len({c.name for c in checks}) == len(checks) == 13


def test_warnings_do_not_fail_the_report_but_a_failure_does() -> None:
    warned = report_json(run_checks(facts(pyspy=None, yama_scope=2)))
    assert (warned["ok"], warned["failed"], warned["warnings"]) == (True, 0, 2)
    failed = report_json(run_checks(facts(free_bytes=1 << 20)))
    assert (failed["ok"], failed["failed"]) == (False, 1)


def test_every_check_has_a_stable_name() -> None:
    names = [c.name for c in run_checks(facts())]
    assert names == [
        "ptrace scope",
        "ptrace attach",
        "py-spy",
        "gdb",
        "containment",
        "GPU (NVML)",
        "exit status of non-children",
        "short-lived processes",
        "Python fork-lock",
        "store",
        "store location",
        "home",
        "disk space",
    ]
    assert doctor.MIN_FREE_BYTES < doctor.LOW_FREE_BYTES


def test_doctor_json_parses() -> None:
    from jobwarden.cli.main import build_parser

    assert build_parser().parse_args(["doctor", "--json"]).json is True


def test_the_text_report_puts_each_fix_under_its_check() -> None:
    from jobwarden.text.render import doctor_report

    lines = list(doctor_report(report_json(run_checks(facts(pyspy=None)))))
    at = next(i for i, line in enumerate(lines) if line.startswith("warn  py-spy"))
    assert (
        lines[at + 1].strip() == "fix: pip install py-spy (into jobwarden's environment, or anywhere on PATH)"
    )
    assert lines[-1] == "no failures; 1 warning: jobwarden works, with the limits above"


def test_in_the_initial_pid_namespace_nvml_pids_are_ours(tmp_path: Path) -> None:
    from jobwarden.osapi.capabilities import in_initial_pid_namespace

    assert in_initial_pid_namespace(str(tmp_path)) is False  # unreadable: assume a container


def test_without_kernel_process_events_short_lives_rest_on_the_hooks() -> None:
    (check,) = [
        c
        for c in run_checks(facts(proc_events=(False, "not the initial pid namespace")))
        if "short" in c.name
    ]
    assert check.status == WARN
    assert "Python hooks" in check.message and "not the initial pid namespace" in check.message
    off = next(c for c in run_checks(facts(proc_events_disabled=True)) if "short" in c.name)
    assert off.status == WARN and "JOBWARDEN_PROC_EVENTS=off" in off.message


def test_the_store_location_says_why_the_database_left_a_network_home() -> None:
    moved = run_checks(facts(home=Path("/home/u/jw"), database_fs="nfs4", database_moved=True))
    place = next(c for c in moved if c.name == "store location")
    assert place.status == OK
    assert "local disk" in place.message and "nfs4" in place.message and "/home/u/jw" in place.message
