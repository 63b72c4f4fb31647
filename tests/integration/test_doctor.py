"""`jobwarden doctor` on this machine, and the probes it runs: they really try (attach, pidfd exit info,
a cgroup) and change nothing; a corrupt store and a shared home are caught."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobwarden.control.doctor.hostfacts import find_interpreters, probe_containment, store_facts
from jobwarden.osapi import capabilities as caps
from jobwarden.store import Store
from jobwarden.store.schema import LATEST
from tests.conftest import Jobwarden

pytestmark = pytest.mark.integration


def checks(jw: Jobwarden) -> dict[str, dict[str, str]]:
    result = jw("doctor", "--json")
    report = json.loads(result.stdout)
    assert result.returncode == (0 if report["ok"] else 1)
    return {c["name"]: c for c in report["checks"]}


def _in_a_container() -> bool:
    """What a container runtime leaves behind (some CI machines are built from container images too)."""
    markers = ("/.dockerenv", "/run/.containerenv")
    return any(Path(m).exists() for m in markers) or "KUBERNETES_SERVICE_HOST" in os.environ


def test_doctor_on_a_fresh_home_fails_nothing_and_creates_nothing(jw: Jobwarden) -> None:
    found = checks(jw)
    inside = _in_a_container()
    assert len(found) == 14 + inside
    assert ("container" in found) == inside  # said first, inside a container
    assert found["config file"]["message"].startswith("none at ")  # run's built-in defaults apply
    assert all(c["status"] in ("ok", "warn") for c in found.values())
    assert all(c["fix"] for c in found.values() if c["status"] == "warn")
    assert found["store"]["message"].startswith("no database yet")
    assert found["store location"]["status"] == "ok"  # a home on local disk keeps its database
    assert not jw.home.exists()  # doctor never creates the store
    text = jw("doctor", check=True).stdout
    assert text.splitlines()[0].split()[1:3] == (["container", "in"] if inside else ["ptrace", "scope"])


def test_doctor_reads_an_existing_store_without_changing_it(jw: Jobwarden) -> None:
    jw("run", "--wait", "--", "true", check=True)
    db = jw.home / "jobwarden.db"
    before = db.stat().st_mtime_ns
    store = checks(jw)["store"]
    assert store["status"] == "ok" and f"schema {LATEST}" in store["message"]
    assert db.stat().st_mtime_ns == before


def test_a_corrupt_store_fails_with_the_fix(jw: Jobwarden) -> None:
    jw.home.mkdir(mode=0o700)
    (jw.home / "jobwarden.db").write_bytes(b"this is not a database" * 300)
    result = jw("doctor")
    assert result.returncode == 1
    line = next(x for x in result.stdout.splitlines() if x.startswith("fail"))
    assert "store" in line
    assert "fix: move it aside" in result.stdout


def test_a_home_others_can_read_is_a_warning(jw: Jobwarden) -> None:
    jw.home.mkdir()
    jw.home.chmod(0o755)
    home = checks(jw)["home"]
    assert home["status"] == "warn" and home["fix"] == f"chmod 700 {jw.home}"


# --- the probes themselves ---------------------------------------------------------------------------


def test_the_attach_probe_matches_what_this_machine_allows() -> None:
    result = caps.probe_ptrace_attach()
    scope = caps.yama_ptrace_scope()
    # the target declared us its tracer: that is enough up to scope 1; beyond, only CAP_SYS_PTRACE is
    if caps.has_capability(caps.CAP_SYS_PTRACE) or scope in (None, 0, 1):
        assert result.ok is True, result.detail
    else:
        assert result.ok is False and "EPERM" in result.detail


def test_the_pidfd_exit_probe_matches_the_kernel() -> None:
    result = caps.probe_pidfd_exit_info()
    if caps.kernel_version() >= (6, 15):
        assert result.ok is True, result.detail
    else:
        assert result.ok is not True


def test_kernel_versions_parse() -> None:
    assert caps.kernel_version("6.18.44-fc-v669") == (6, 18)
    assert caps.kernel_version("5.15.0-91-generic") == (5, 15)
    assert caps.kernel_version("6.9") == (6, 9)
    assert caps.kernel_version("garbage") == (0, 0)


def test_the_containment_probe_leaves_no_cgroup_behind() -> None:
    found = probe_containment()
    if found is not None:
        assert found.startswith("cgroup-v") and not Path(found.split(" ", 1)[1]).exists()


def test_interpreters_report_their_own_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "python3.99"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 3.99.1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    (found,) = find_interpreters()
    assert (found.path, found.version, found.source) == (str(fake), (3, 99, 1), "PATH")


def test_store_facts_of_a_real_store(tmp_path: Path) -> None:
    with Store(tmp_path / "home") as store:
        facts = store_facts(store.layout.database)
    assert (facts.exists, facts.integrity, facts.schema, facts.latest) == (True, "ok", LATEST, LATEST)


def test_doctor_reports_a_working_nvml(jw: Jobwarden, tmp_path: Path) -> None:
    from jobwarden.probes import fakenvml

    nvml = tmp_path / "nvml.json"
    fakenvml.write_state(nvml, {"devices": [fakenvml.device(0), fakenvml.device(1)]})
    jw.env[fakenvml.FAKE_NVML_ENV] = str(nvml)
    gpu = checks(jw)["GPU (NVML)"]
    assert gpu["status"] == "ok" and "2 GPUs" in gpu["message"]
